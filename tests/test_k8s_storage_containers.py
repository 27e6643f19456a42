"""The backup step and the task's marker as real containers (podman; markers containers, slow).

What ``render`` produces for a cluster with ``--backup`` and
``--credentials-secret``, run one container per pod by ``tests/containers``
exactly as written: the worker's PID 1 (``logcopy``) leaves its marker on the
shared log claim when the script exits 0, the ``backup`` container (read-only
claim, restricted security context, the Secret's keys as its environment via
``envFrom``) waits for it and then uploads; the worker never sees the Secret.
The upload itself needs ``tfk8s_magics.storage`` and an S3 endpoint: with
nothing to upload the step says so and succeeds, and a failing upload is the
step's non-zero exit (what fails the JobSet).
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import tfk8s_magics as tk
from tfk8s_magics.backends.kubernetes import KubernetesBackend
from tfk8s_magics.spec import ClusterSpec

pytestmark = [pytest.mark.containers, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "lab-test"
SECRET = {"AWS_ACCESS_KEY_ID": "AKIACONTAINERTEST01", "AWS_SECRET_ACCESS_KEY": "c0ntainer-secret-value"}
SCRIPT = '''import os, pathlib
print("SECRET_IN_ENV", "AWS_SECRET_ACCESS_KEY" in os.environ, flush=True)
if os.environ.get("WRITE_CHECKPOINT"):
    d = pathlib.Path(os.environ["TFK8S_CHECKPOINT_DIR"]); d.mkdir(parents=True, exist_ok=True)
    (d / "ckpt-1.index").write_text("x")
    m = pathlib.Path(os.environ["TFK8S_LOG_DIR"]) / "models" / "m" / "1"; m.mkdir(parents=True)
    (m / "saved_model.pb").write_bytes(bytes(range(256)) * 40)
print("DONE", flush=True)
'''


@pytest.fixture(scope="module")
def task_image() -> str:
    """The task image with this checkout's code (built once, then found by its input hash)."""
    if not shutil.which("podman"):
        if os.environ.get("CI") == "true":
            pytest.fail("CI must run the container tests: podman is not installed")
        pytest.skip("podman is not installed: run scripts/bootstrap containers")
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "build_images.py"), "task"],
                       capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stderr[-4000:]
    return dict(line.split() for line in r.stdout.splitlines())["task"]


@pytest.fixture
def pods(tmp_path):
    from tests.containers.podman import PodmanRun

    run = PodmanRun(f"tfk8s-{os.getpid()}-{secrets.token_hex(3)}", tmp_path / "podman")
    try:
        yield run
    finally:
        run.cleanup()
    assert not run.leftovers(), f"left in podman: {run.leftovers()}"


def rendered(image: str, secret: dict[str, str] = SECRET, bucket: str = "tfk8s-test-bucket",
             **env) -> list[dict]:
    spec = ClusterSpec(name="bk", workers=1, script=SCRIPT, image=image, env=env,
                       backup_url=f"s3://{bucket}/runs/bk", credentials_secret="s3-creds")
    text = tk.render(spec, KubernetesBackend(namespace=NAMESPACE, user="alice"))
    secret = {"apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": "s3-creds", "namespace": NAMESPACE},
              "data": {k: base64.b64encode(v.encode()).decode() for k, v in secret.items()}}
    return [*(d for d in yaml.safe_load_all(text) if d), secret]


@pytest.fixture
def s3():
    """A moto S3 server on 127.0.0.1 (bucket ``data`` made): (the env a Secret gives, a client)."""
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    import boto3

    from tfk8s_magics.ports import free_port

    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_DEFAULT_REGION": "us-east-1"}
        client = boto3.client("s3", endpoint_url=creds["AWS_ENDPOINT_URL"], region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket="data")
        yield creds, client
    finally:
        server.stop()


def _run_worker_and_backup(pods, objects, backup_network: str | None = None
                           ) -> tuple[dict[str, int], dict[str, str]]:
    plans = {p.pod.name: p for p in pods.plans(objects)}
    assert sorted(plans) == ["bk-backup-0-0", "bk-worker-0-0"]
    backup, worker = plans["bk-backup-0-0"], plans["bk-worker-0-0"]
    if backup_network:  # the endpoint listens on the host's loopback only; the rest is as written
        from tests.containers.pods import container_plan

        backup = container_plan(backup.pod, objects, prefix=pods.prefix, network=backup_network,
                                image_user=pods.image_user(backup.image))
        # podman gives no DNS aliases on the host's network; the backup pod dials no peer anyway
        args = backup.run_args
        drop = {i for i, a in enumerate(args) if a == "--network-alias"}
        backup.run_args = [a for i, a in enumerate(args) if i not in drop and i - 1 not in drop]
    pods.start(backup)  # first: it must wait for the worker's marker
    pods.start(worker)
    codes = {n: pods.wait_exit(p.container, timeout=600) for n, p in
             (("worker", worker), ("backup", backup))}
    logs = {n: pods.logs(p.container) for n, p in (("worker", worker), ("backup", backup))}
    return codes, logs


def test_the_backup_waits_for_the_workers_marker_and_only_it_has_the_secret(task_image, pods):
    codes, logs = _run_worker_and_backup(pods, rendered(task_image))
    assert codes == {"worker": 0, "backup": 0}, logs
    assert "SECRET_IN_ENV False" in logs["worker"]
    assert "backup waits for worker-0 to finish" in logs["backup"]
    assert "nothing to upload: no checkpoints or models under /log" in logs["backup"]
    for value in SECRET.values():
        assert value not in logs["worker"] + logs["backup"]


def test_a_failing_upload_is_the_backup_steps_exit_code(task_image, pods):
    codes, logs = _run_worker_and_backup(pods, rendered(task_image, WRITE_CHECKPOINT="1"))
    assert codes["worker"] == 0, logs
    # No S3 endpoint reachable from the pod's network here: the storage venv's upload cannot
    # succeed, and the step must not say it did.
    assert codes["backup"] != 0, logs
    assert "uploading /log/checkpoints to s3://tfk8s-test-bucket/runs/bk/checkpoints" in logs["backup"]
    assert "backup done" not in logs["backup"]


def test_the_backup_step_uploads_checkpoints_and_models_to_s3(task_image, pods, s3):
    """The rendered backup pod, its upload run by the image's storage venv against moto's S3 on
    127.0.0.1 (host network): both folders land under the backup URL, byte for byte."""
    creds, client = s3
    objects = rendered(task_image, creds, bucket="data", WRITE_CHECKPOINT="1")
    codes, logs = _run_worker_and_backup(pods, objects, backup_network="host")
    assert codes == {"worker": 0, "backup": 0}, logs
    assert "backup done: checkpoints, models uploaded to s3://data/runs/bk" in logs["backup"]
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket="data", Prefix="runs/bk/")["Contents"])
    assert keys == ["runs/bk/checkpoints/ckpt-1.index", "runs/bk/models/m/1/saved_model.pb"]
    body = client.get_object(Bucket="data", Key="runs/bk/models/m/1/saved_model.pb")["Body"].read()
    assert body == bytes(range(256)) * 40
    assert "SECRET_IN_ENV False" in logs["worker"]


def test_an_upload_to_a_missing_bucket_fails_the_step_in_one_sentence(task_image, pods, s3):
    creds, client = s3
    codes, logs = _run_worker_and_backup(pods, rendered(task_image, creds, bucket="no-such-bucket",
                                                        WRITE_CHECKPOINT="1"), backup_network="host")
    assert codes["worker"] == 0 and codes["backup"] == 1, logs
    errors = [ln for ln in logs["backup"].splitlines() if ln.startswith("tfk8s-storage: --backup")]
    assert len(errors) == 1 and "s3://no-such-bucket/runs/bk/checkpoints" in errors[0], logs["backup"]
    assert "backup done" not in logs["backup"] and "Traceback" not in logs["backup"]


def _image_has(pods, image: str, modules: str) -> bool:
    """Whether the image's storage venv (what the step containers run) imports ``modules``."""
    from tests.containers.podman import build_images

    r = pods.run("run", "--rm", "--network", "none", *build_images.run_flags(), "--entrypoint",
                 '["/opt/storage/bin/python", "-c"]', image, f"import {modules}", check=False)
    return r.returncode == 0


def test_the_sync_pods_init_container_fetches_from_s3_before_its_app_container(task_image, pods):
    """The rendered sync pod as written: its init container ``fetch`` (the Secret's keys as
    its environment, restricted) copies a bucket prefix from a moto S3 server on 127.0.0.1
    into the data claim; then ``synced`` reads the claim and reports what landed."""
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    assert _image_has(pods, task_image, "tfk8s_magics.storage, s3fs"), (
        "the task image's storage venv (/opt/storage) must carry tfk8s_magics.storage and s3fs")
    import boto3

    from tests.containers.pods import container_plan, pod_instances
    from tfk8s_magics.ports import free_port

    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
        s3.create_bucket(Bucket="data")
        payload = os.urandom(1 << 20)
        s3.put_object(Bucket="data", Key="ds/a.txt", Body=b"hello\n")
        s3.put_object(Bucket="data", Key="ds/sub/b.bin", Body=payload)
        spec = ClusterSpec(name="sy", workers=1, script=SCRIPT, image=task_image,
                           data_url="s3://data/ds", data_sync=True, credentials_secret="s3-creds")
        text = tk.render(spec, KubernetesBackend(namespace=NAMESPACE, user="alice"))
        creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_DEFAULT_REGION": "us-east-1"}
        objects = [*(d for d in yaml.safe_load_all(text) if d), {
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s3-creds", "namespace": NAMESPACE},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in creds.items()}}]
        (pod,) = [p for p in pod_instances(objects) if p.name == "sy-sync-0-0"]
        # The endpoint listens on the host's loopback only: the init container shares the
        # host's network (as the pod would reach an in-cluster endpoint); the rest is as written.
        host_plan = container_plan(pod, objects, prefix=pods.prefix, network="host",
                                   image_user=pods.image_user(task_image))
        (fetch,) = host_plan.init
        pods._start(fetch)
        assert pods.wait_exit(fetch.container, timeout=600) == 0, pods.logs(fetch.container)
        (synced,) = [p for p in pods.plans(objects) if p.pod.name == "sy-sync-0-0"]
        synced.init = []  # done above; the app container runs next, as the kubelet starts it
        pods.start(synced)
        assert pods.wait_exit(synced.container, timeout=300) == 0
        assert f"/data holds 2 files, {len(payload) + 6} bytes" in pods.logs(synced.container)
        for value in ("testing",):
            assert f"AWS_SECRET_ACCESS_KEY={value}" not in pods.logs(fetch.container)
    finally:
        server.stop()


def _serving_fetch(pods, task_image, creds, url, model):
    """The rendered serve --from Deployment's init container ``fetch`` run as written (the
    Secret's keys via ``envFrom``, restricted, the models emptyDir), on the host's network for
    the endpoint on 127.0.0.1: (exit code, log)."""
    from tests.containers.pods import container_plan, pod_instances
    from tfk8s_magics import api

    spec = ClusterSpec(name="sv", workers=1, script=SCRIPT, image=task_image)
    be = KubernetesBackend(namespace=NAMESPACE, user="alice")
    objects = [*api.render_serving(spec, model, be, source_url=url, credentials_secret="s3-creds"), {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3-creds", "namespace": NAMESPACE},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in creds.items()}}]
    (pod,) = pod_instances(objects)
    plan = container_plan(pod, objects, prefix=pods.prefix, network="host",
                          image_user=pods.image_user(task_image))
    (fetch,) = plan.init
    assert fetch.image == task_image
    pods._start(fetch)
    code, log = pods.wait_exit(fetch.container, timeout=600), pods.logs(fetch.container)
    pods.run("rm", fetch.container)  # the next call's container takes the same name
    return code, log


def test_the_serving_pods_fetch_gets_the_model_from_s3(task_image, pods, s3):
    creds, client = s3
    client.put_object(Bucket="data", Key="runs/sv/models/m/1/saved_model.pb", Body=b"pb" * 500)
    client.put_object(Bucket="data", Key="runs/sv/models/m/1/variables/variables.index", Body=b"ix")
    code, log = _serving_fetch(pods, task_image, creds, "s3://data/runs/sv", "m")
    assert code == 0, log
    assert "tfk8s-storage: done: 2 file(s), 1.0 kB" in log
    code, log = _serving_fetch(pods, task_image, creds, "s3://data/runs/sv", "other")
    assert code == 1, log
    errors = [ln for ln in log.splitlines() if ln.startswith("tfk8s-storage: --from")]
    assert errors == ["tfk8s-storage: --from 's3://data/runs/sv' holds no complete export of model 'other' "
                      "(found: m): give one of those with --model, or the URL of a --backup or of a models "
                      "dir (<model>/<version>/saved_model.pb)."], log
    assert "testing" not in log.replace("tfk8s-test", "")
