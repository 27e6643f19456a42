"""Object storage against a real S3-compatible endpoint on 127.0.0.1 (moto's threaded server, with IAM
authentication on: a wrong secret is refused as by S3): scripts and files fetched, data synced before the
tasks, checkpoints and a SavedModel uploaded after them, one sentence and nothing left behind for a
missing object or a wrong credential, and the secret in no file the lab writes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests

pytest.importorskip("s3fs", reason="the storage extra (s3fs) is not installed")
moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")

import boto3  # noqa: E402
from moto.core.authorization import enable_iam_authentication  # noqa: E402

import tfk8s_magics as tk  # noqa: E402
from tfk8s_magics import api  # noqa: E402
from tfk8s_magics.backends import Phase  # noqa: E402
from tfk8s_magics.errors import SpecError, StorageError  # noqa: E402

BUCKET = "tfk8s-test"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on 127.0.0.1 with IAM authentication, and the env of a user allowed s3:*."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    base = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_DEFAULT_REGION": "us-east-1"}
    admin = {**base, "aws_access_key_id": "setup", "aws_secret_access_key": "setup"}
    kw = {"endpoint_url": admin["AWS_ENDPOINT_URL"], "region_name": "us-east-1",
          "aws_access_key_id": "setup", "aws_secret_access_key": "setup"}
    iam = boto3.client("iam", **kw)
    iam.create_user(UserName="lab")
    iam.put_user_policy(UserName="lab", PolicyName="s3", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName="lab")["AccessKey"]
    s3c = boto3.client("s3", **kw)
    s3c.create_bucket(Bucket=BUCKET)
    s3c.put_object(Bucket=BUCKET, Key="code/train.py", Body=b"import helper\nprint('answer', helper.X)\n")
    s3c.put_object(Bucket=BUCKET, Key="code/helper.py", Body=b"X = 42\n")
    s3c.put_object(Bucket=BUCKET, Key="ds/a.txt", Body=b"a" * 100)
    s3c.put_object(Bucket=BUCKET, Key="ds/sub/b.bin", Body=os.urandom(300_000))
    env = {**base, "AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
    del admin
    with enable_iam_authentication():
        yield env, boto3.client("s3", endpoint_url=base["AWS_ENDPOINT_URL"], region_name="us-east-1",
                                aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                                aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
    server.stop()


@pytest.fixture
def creds(s3, monkeypatch):
    env, client = s3
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env, client


def _keys(client, prefix):
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", []))


def test_script_and_files_are_fetched_with_size_and_sha256(creds):
    spec = api.make_spec("s3code", script_path=f"s3://{BUCKET}/code/train.py",
                         files=[f"s3://{BUCKET}/code/helper.py"])
    assert spec.files == {"helper.py": "X = 42\n"}
    assert spec.sources["script.py"]["size"] == len(spec.script.encode())
    assert spec.sources["helper.py"] == {
        "url": f"s3://{BUCKET}/code/helper.py", "size": 7, "sha256": hashlib.sha256(b"X = 42\n").hexdigest()}


def test_a_missing_object_and_a_wrong_secret_are_one_sentence(creds, monkeypatch):
    with pytest.raises(StorageError, match=r"^--script 's3://tfk8s-test/code/nope.py' does not exist"):
        api.make_spec("s3code", script_path=f"s3://{BUCKET}/code/nope.py")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-value")
    with pytest.raises(StorageError) as e:
        api.make_spec("s3code", script_path=f"s3://{BUCKET}/code/train.py")
    assert "access was refused" in str(e.value) and "wrong-secret-value" not in str(e.value)
    assert "\n" not in str(e.value)


def _cli(args, env, timeout=120):
    return subprocess.run([sys.executable, "-m", "tfk8s_magics.storage", *args], capture_output=True,
                          text=True, timeout=timeout,
                          env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), **env})


def test_the_command_line_fetches_and_uploads_and_fails_in_one_sentence(creds, tmp_path):
    env, client = creds
    run = _cli(["fetch", f"s3://{BUCKET}/ds", str(tmp_path / "data")], env)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "data/a.txt").read_bytes() == b"a" * 100
    assert (tmp_path / "data/sub/b.bin").stat().st_size == 300_000
    lines = run.stdout.splitlines()
    assert lines[-2].startswith("tfk8s-storage: fetched 300.1 kB of 300.1 kB (100%)")
    assert lines[-1].startswith("tfk8s-storage: done: 2 file(s), 300.1 kB in ")
    run = _cli(["upload", str(tmp_path / "data"), f"s3://{BUCKET}/copy/run1"], env)
    assert run.returncode == 0, run.stderr
    assert _keys(client, "copy/run1/") == ["copy/run1/a.txt", "copy/run1/sub/b.bin"]
    for args in (["fetch", f"s3://{BUCKET}/missing", str(tmp_path / "d2")],
                 ["fetch", f"s3://{BUCKET}/ds", str(tmp_path / "d3")]):
        bad = {**env, "AWS_SECRET_ACCESS_KEY": "wrong-secret-value"} if args[2].endswith("d3") else env
        run = _cli(args, bad)
        assert run.returncode == 1 and run.stdout == ""
        assert run.stderr.count("\n") == 1 and run.stderr.startswith("tfk8s-storage: --data-dir ")
        assert "wrong-secret-value" not in run.stderr
        assert not Path(args[2]).exists()
    run = _cli(["upload", str(tmp_path / "data"), f"s3://{BUCKET}/copy/run2"],
               {**env, "AWS_SECRET_ACCESS_KEY": "wrong-secret-value"})
    assert run.returncode == 1 and "access was refused" in run.stderr
    assert _keys(client, "copy/run2/") == []


def test_launch_refuses_a_wrong_credential_or_missing_data_and_leaves_nothing(creds, local, monkeypatch):
    with pytest.raises(StorageError, match="does not exist"):
        tk.launch("nodata", script="print(1)\n", data_dir=f"s3://{BUCKET}/nothing-here", data_sync=True,
                  backend=local)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-value")
    with pytest.raises(StorageError, match="access was refused"):
        tk.launch("badkey", script="print(1)\n", backup_url=f"s3://{BUCKET}/out", backend=local)
    with pytest.raises(SpecError, match="credentials-secret .* names a Kubernetes Secret"):
        tk.launch("secret", script="print(1)\n", backup_url=f"s3://{BUCKET}/out",
                  credentials_secret="s3-creds", backend=local)
    assert not (local.state_dir / "clusters").exists() or not any((local.state_dir / "clusters").iterdir())


TRAIN = """
import os, pathlib, tensorflow as tf
data = pathlib.Path(os.environ["TFK8S_DATA_DIR"])
print("data files", sorted(str(p.relative_to(data)) for p in data.rglob("*") if p.is_file()), flush=True)
assert (data / "sub/b.bin").stat().st_size == 300_000
v = tf.Variable(3.0)
tf.train.Checkpoint(v=v).save(os.path.join(os.environ["TFK8S_CHECKPOINT_DIR"], "ckpt"))
m = tf.Module(); m.v = v
m.f = tf.function(lambda x: x * m.v, input_signature=[tf.TensorSpec([None], tf.float32)])
tf.saved_model.save(m, os.path.join(os.environ["TFK8S_LOG_DIR"], "models", "m", "1"))
print("trained", flush=True)
"""


@pytest.mark.slow
def test_data_synced_before_the_tasks_and_results_backed_up_after(creds, local, workdir):
    env, client = creds
    cluster = tk.launch("synced", workers=1, script=TRAIN, data_dir=f"s3://{BUCKET}/ds", data_sync=True,
                        backup_url=f"s3://{BUCKET}/backup/run1", backend=local, detach=True)
    st = cluster.wait(timeout=300)
    logs = cluster.logs("worker-0")
    assert st.phase == Phase.SUCCEEDED, (st.reason, logs)
    assert "data files ['a.txt', 'sub/b.bin']" in logs and "trained" in logs
    events = {e.reason: e.message for e in cluster.events()}
    assert events["Synced"].startswith(f"s3://{BUCKET}/ds → ") and "2 file(s), 300.1 kB" in events["Synced"]
    assert "BackedUp" in events, events
    keys = _keys(client, "backup/run1/")
    assert "backup/run1/models/m/1/saved_model.pb" in keys
    assert any(k.startswith("backup/run1/checkpoints/ckpt-1.index") for k in keys), keys
    assert "backup/run1/checkpoints/checkpoint" in keys
    # Credentials never leak: not in the spec, the record, status, events, logs or anything the lab wrote.
    secret = env["AWS_SECRET_ACCESS_KEY"].encode()
    leaked = [str(p) for p in local.state_dir.rglob("*") if p.is_file() and secret in p.read_bytes()]
    assert not leaked
    spec = cluster.spec
    assert (spec.data_url, spec.data_sync, spec.backup_url) == (f"s3://{BUCKET}/ds", True,
                                                                f"s3://{BUCKET}/backup/run1")
    isolation_mode = local._raw_status(local._dir("synced"), local._record("synced"))["isolation"]["mode"]
    assert isolation_mode in ("netns", "userns+netns")  # synced: the tasks keep their private network
    # The volumes are gone: %tfcluster serve --from the backup URL serves the uploaded SavedModel.
    shutil.rmtree(Path(cluster.status().log_dir.path) / "models")
    info = cluster.serve(source_url=f"s3://{BUCKET}/backup/run1")
    try:
        assert (info.model, info.version) == ("m", 1)
        r = requests.post(f"{info.rest_local}/v1/models/m:predict", json={"instances": [1.0, 2.0]},
                          timeout=30)
        assert r.json() == {"predictions": [3.0, 6.0]}, r.text
    finally:
        cluster.serve(stop=True)
    cluster.delete()


STREAM = """
import os, fsspec
url = os.environ["TFK8S_DATA_URL"]
with fsspec.open(url + "/a.txt", "rb") as f:
    print("streamed", len(f.read()), "bytes from", url, flush=True)
"""


@pytest.mark.slow
def test_an_unsynced_data_url_is_streamed_by_the_tasks(creds, local, workdir):
    cluster = tk.launch("streamed", workers=1, script=STREAM, data_dir=f"s3://{BUCKET}/ds", backend=local,
                        detach=True)
    st = cluster.wait(timeout=300)
    logs = cluster.logs("worker-0")
    assert st.phase == Phase.SUCCEEDED, (st.reason, logs)
    assert f"streamed 100 bytes from s3://{BUCKET}/ds" in logs
    assert not list((local._dir("streamed").default_data_dir).iterdir())  # nothing synced
    isolation = local._raw_status(local._dir("streamed"), local._record("streamed"))["isolation"]
    assert "TFK8S_DATA_URL" in isolation["reason"]
    cluster.delete()


@pytest.mark.slow
def test_a_failed_sync_fails_the_cluster_in_one_sentence_and_leaves_the_data_dir_empty(creds, local, workdir,
                                                                                      monkeypatch):
    env, client = creds
    client.put_object(Bucket=BUCKET, Key="gone/x.bin", Body=b"x" * 10)
    cluster = tk.launch("gone", workers=1, script="print('never')\n", data_dir=f"s3://{BUCKET}/gone",
                        data_sync=True, backend=local, detach=True)
    client.delete_object(Bucket=BUCKET, Key="gone/x.bin")  # may race the sync: then it succeeds
    st = cluster.wait(timeout=120)
    if st.phase == Phase.SUCCEEDED:
        pytest.skip("the sync finished before the object was removed (a race this test cannot force)")
    assert st.phase == Phase.FAILED and st.reason.startswith("sync: --data-dir ")
    assert not [p for p in local._dir("gone").default_data_dir.rglob("*")]
    cluster.delete()


# -- the supervisor's --data-sync copy: a child it can stop at once ------------------------------

class _Sup:
    """What ClusterStorage uses of a supervisor (a real selector; ``pump`` dispatches like its own,
    and ``stop_when()`` plays the owner's exit or a stop), recording every status it would write."""

    def __init__(self, spec, data_dir, stop_when=lambda: False):
        import selectors

        self.spec, self.record = spec, {"data_dir": str(data_dir), "log_dir": str(data_dir.parent / "logs")}
        self.reason, self.written, self.events, self.failed, self.stop_reason = "", [], [], None, ""
        self.sel, self.stop_when = selectors.DefaultSelector(), stop_when

    def write_status(self):
        self.written.append(self.reason)

    def event(self, task, reason, message, type_="Normal"):
        self.events.append((reason, message))

    def fail(self, why):
        self.failed = why

    def pump(self, timeout):
        for key, _ in self.sel.select(0.05 if timeout is None else timeout):
            key.data[1]()
        if self.stop_when():
            self.stop_reason = "stopped by the user"


def test_the_supervisors_sync_shows_progress_as_the_reason_and_fails_in_one_sentence(creds, tmp_path):
    from tfk8s_magics.backends.local import storage as local_storage
    from tfk8s_magics.spec import ClusterSpec

    url = f"s3://{BUCKET}/ds"
    sup = _Sup(ClusterSpec("s", script="print(1)", data_dir=url, data_sync=True), tmp_path / "data")
    assert local_storage.ClusterStorage(sup).before_tasks()
    progress = [r for r in sup.written if r.startswith(f"sync: fetching {url}: ")]
    assert progress[-1] == f"sync: fetching {url}: 300.1 kB of 300.1 kB (100%)"
    assert sup.written[-1] == "" and sup.failed is None
    assert sup.events[0][0] == "Synced"
    assert sup.events[0][1].startswith(f"{url} → {tmp_path / 'data'}: 2 file(s), 300.1 kB in ")
    assert sorted(str(p.relative_to(tmp_path / "data")) for p in (tmp_path / "data").rglob("*")) == [
        "a.txt", "sub", "sub/b.bin"]
    gone = f"s3://{BUCKET}/gone-for-good"
    sup = _Sup(ClusterSpec("s", script="print(1)", data_dir=gone, data_sync=True), tmp_path / "data2")
    assert not local_storage.ClusterStorage(sup).before_tasks()
    assert sup.failed == f"sync: --data-dir '{gone}' does not exist: check the bucket and path."
    assert sup.events[-1][0] == "SyncFailed" and not (tmp_path / "data2").exists()


class _HeldS3:
    """A second S3 endpoint on 127.0.0.1 over moto's process-wide backends (same buckets, same
    IAM) whose GET of one key sends its first 64 kB and then holds the rest until the test
    releases it: a transfer that is under way for exactly as long as the test says."""

    def __init__(self, key: str):
        import threading

        from werkzeug.serving import make_server

        self.key, self.started, self.release = key, threading.Event(), threading.Event()
        app = moto_server.DomainDispatcherApplication(moto_server.create_backend_app)
        self.server = make_server("127.0.0.1", 0, self._held(app), True,
                                  request_handler=moto_server.MotoRequestHandler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _held(self, app):
        def wsgi(environ, start_response):
            body = app(environ, start_response)
            if environ["REQUEST_METHOD"] != "GET" or not environ["PATH_INFO"].endswith(self.key):
                return body
            data = b"".join(body)

            def held():
                yield data[:65536]
                self.started.set()
                self.release.wait(300)
                yield data[65536:]
            return held()
        return wsgi

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.thread.join(30)


@pytest.fixture
def held(creds, monkeypatch):
    """The held endpoint in this test's environment (what the owner and the supervisor inherit), a
    2 MB object under ``slow/``."""
    env, client = creds
    client.put_object(Bucket=BUCKET, Key="slow/big.bin", Body=os.urandom(2_000_000))
    server = _HeldS3("slow/big.bin")
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    try:
        yield server
    finally:
        server.close()


def _fetch_processes(marker: str) -> list[int]:
    import psutil

    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "tfk8s_magics.storage" in cmd and any(marker in a for a in cmd):
            out.append(p.pid)
    return out


def test_a_stop_during_the_copy_kills_it_and_keeps_nothing(held, tmp_path):
    from tfk8s_magics.backends.local import storage as local_storage
    from tfk8s_magics.spec import ClusterSpec

    url = f"s3://{BUCKET}/slow"
    sup = _Sup(ClusterSpec("s", script="print(1)", data_dir=url, data_sync=True), tmp_path / "data",
               stop_when=held.started.is_set)
    assert not local_storage.ClusterStorage(sup).before_tasks()
    assert not held.release.is_set()  # the transfer was still held when the copy was ended
    assert sup.events[-1][0] == "SyncAborted" and "nothing of it was kept" in sup.events[-1][1]
    assert sup.failed is None and not (tmp_path / "data").exists()
    assert _fetch_processes(str(tmp_path / "data")) == []


OWNER = """
import sys
import tfk8s_magics as tk
tk.launch("slow", workers=1, script="print('never')\\n", data_dir=sys.argv[1], data_sync=True,
          backend="local")
print("launched", flush=True)
sys.stdin.read()
"""


def _start_owner(url: str) -> subprocess.Popen:
    owner = subprocess.Popen([sys.executable, "-c", OWNER, url], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert owner.stdout.readline().strip() == "launched"
    return owner


def _supervisor_done(local, name: str) -> dict:
    raw = local._raw_status(local._dir(name), local._record(name))
    return raw if raw.get("supervisor_done") else {}


@pytest.mark.slow
def test_the_owners_exit_during_a_long_sync_stops_it_at_once(held, local, workdir):
    """The kernel dies while the copy is held mid-object: the supervisor sees it in the same wait,
    kills the copy, removes what it wrote, and writes a final status — without the transfer
    ever being released."""
    from tests.conftest import wait_for

    owner = _start_owner(f"s3://{BUCKET}/slow")
    try:
        assert held.started.wait(120), "the copy never started"
        data_dir = local._record("slow")["data_dir"]
        wait_for(lambda: local.status("slow").reason.startswith(f"sync: fetching s3://{BUCKET}/slow: "),
                 timeout=60, what="progress as the reason")
    finally:
        owner.kill()
        owner.wait()
    raw = wait_for(lambda: _supervisor_done(local, "slow"), timeout=60, what="a final status")
    assert not held.release.is_set()
    assert raw["phase"] == Phase.STOPPED and "owner" in raw["reason"], raw["reason"]
    assert not os.path.exists(data_dir) or not os.listdir(data_dir)
    assert _fetch_processes(data_dir) == []
    events = {e.reason: e.message for e in local.events("slow")}
    assert "nothing of it was kept" in events["SyncAborted"]
    local.delete("slow")


@pytest.mark.slow
def test_delete_during_a_long_sync_stops_it_at_once(held, local, workdir):
    owner = _start_owner(f"s3://{BUCKET}/slow")
    try:
        assert held.started.wait(120), "the copy never started"
        data_dir = local._record("slow")["data_dir"]
        local.delete("slow")
        assert not held.release.is_set()
        assert "slow" not in [c.name for c in local.list_clusters()]
        assert not os.path.exists(data_dir)
        assert _fetch_processes(data_dir) == []
        assert owner.poll() is None  # the owner lives on; only its cluster went
    finally:
        owner.kill()
        owner.wait()
