"""Object storage (issue 15): URL checks, fetch/sync/upload through fsspec (memory://), the spec's fields,
the command line the Kubernetes init container runs.  The S3 tests against a real endpoint are in
tests/test_storage_s3.py."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import uuid

import pytest

fsspec = pytest.importorskip("fsspec", reason="the storage extra (fsspec) is not installed")

from tfk8s_magics import api, storage  # noqa: E402
from tfk8s_magics.errors import SpecError, StorageError  # noqa: E402
from tfk8s_magics.spec import ClusterSpec  # noqa: E402

SCRIPT = "import os\nprint('from storage', os.environ.get('TFK8S_TASK'))\n"


@pytest.fixture
def mem():
    """A fresh memory:// prefix (the memory filesystem is process-wide) and its filesystem."""
    fs = fsspec.filesystem("memory")
    prefix = f"t{uuid.uuid4().hex[:8]}"
    yield fs, prefix
    fs.rm(f"/{prefix}", recursive=True) if fs.exists(f"/{prefix}") else None


@pytest.mark.parametrize("url, flag, writable, wanted", [
    ("s3://AKIAXXX:topsecret@bucket/x.py", "--script", False, "carries a password"),
    ("https://host/x.py?X-Amz-Signature=abc&X-Amz-Credential=AKIA", "--script", False, "carries credentials"),
    ("https://me:pw@host/x.py", "--file", False, "carries a password"),
    ("https://token@host/x.py", "--file", False, "carries credentials"),
    ("ftp://host/x", "--data-dir", False, "is not supported"),
    ("https://host/out", "--backup", True, "read-only"),
    ("s3://", "--backup", True, "names no bucket"),
])
def test_bad_urls_are_one_sentence_without_the_secret(url, flag, writable, wanted):
    with pytest.raises(StorageError) as e:
        storage.check_url(flag, url, writable=writable)
    text = str(e.value)
    assert wanted in text and flag in text
    for secret in ("topsecret", "AKIAXXX", "abc", ":pw", "AKIA"):
        assert secret not in text
    assert text.count(". ") <= 1 or text.endswith(".")


def test_fetch_text_records_size_and_sha256(mem):
    fs, p = mem
    fs.pipe(f"/{p}/train.py", SCRIPT.encode())
    got = storage.fetch_text(f"memory://{p}/train.py", 1000)
    assert got.text == SCRIPT
    assert got.source() == {"url": f"memory://{p}/train.py", "size": len(SCRIPT),
                            "sha256": hashlib.sha256(SCRIPT.encode()).hexdigest()}


def test_fetch_text_refuses_missing_big_and_directories(mem):
    fs, p = mem
    fs.pipe(f"/{p}/big.py", b"#" * 101)
    fs.pipe(f"/{p}/dir/a.py", b"x = 1\n")
    for url, wanted in ((f"memory://{p}/nope.py", "does not exist"),
                        (f"memory://{p}/big.py", "more than 100"),
                        (f"memory://{p}/dir", "is a directory")):
        with pytest.raises(StorageError, match=wanted):
            storage.fetch_text(url, 100)


def test_a_missing_package_is_one_sentence_naming_it():
    with pytest.raises(StorageError, match=r"gs:// URLs need the gcsfs package.*pip install gcsfs"):
        storage.open_fs("gs://bucket/x")


def test_sync_down_and_upload_round_trip_with_progress(mem, tmp_path):
    fs, p = mem
    fs.pipe(f"/{p}/ds/a.txt", b"a" * 10)
    fs.pipe(f"/{p}/ds/sub/b.bin", b"b" * 1000)
    seen = []
    done = storage.sync_down(f"memory://{p}/ds", tmp_path / "data", progress=lambda d, t: seen.append((d, t)))
    assert done == {"files": 2, "bytes": 1010}
    assert (tmp_path / "data/a.txt").read_bytes() == b"a" * 10
    assert (tmp_path / "data/sub/b.bin").read_bytes() == b"b" * 1000
    assert seen[-1] == (1010, 1010) and all(t == 1010 for _, t in seen)
    assert not [n for n in os.listdir(tmp_path / "data") if n.startswith(".")]  # no temporary left
    up = storage.upload(tmp_path / "data", f"memory://{p}/backup/run1")
    assert up == {"files": 2, "bytes": 1010}
    assert fs.cat(f"/{p}/backup/run1/sub/b.bin") == b"b" * 1000


def test_a_url_naming_one_object_lands_as_that_file(mem, tmp_path):
    fs, p = mem
    fs.pipe(f"/{p}/ds/one.csv", b"1,2\n")
    assert storage.sync_down(f"memory://{p}/ds/one.csv", tmp_path / "d") == {"files": 1, "bytes": 4}
    assert os.listdir(tmp_path / "d") == ["one.csv"]


def test_a_failed_sync_leaves_nothing_behind(mem, tmp_path):
    with pytest.raises(StorageError, match="does not exist"):
        storage.sync_down(f"memory://{mem[1]}/nothing", tmp_path / "data")
    assert not (tmp_path / "data").exists()


def test_the_command_line_fetches_and_uploads_with_progress_lines(tmp_path):
    # memory:// lives in one process: the command line is tested here against a local fsspec URL
    # scheme it refuses, and against S3 in tests/test_storage_s3.py.
    run = subprocess.run([sys.executable, "-m", "tfk8s_magics.storage", "fetch", "ftp://h/x",
                          str(tmp_path / "d")], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()}, timeout=120)
    assert run.returncode == 1
    assert run.stderr.strip().count("\n") == 0 and "ftp:// is not supported" in run.stderr
    assert not (tmp_path / "d").exists()


def test_spec_moves_a_data_url_and_checks_the_storage_fields():
    spec = ClusterSpec("s", script="print(1)", data_dir="s3://bkt/ds", data_sync=True,
                       log_dir="s3://bkt/run1", credentials_secret="s3-creds")
    assert (spec.data_url, spec.data_dir, spec.backup_url, spec.log_dir) == ("s3://bkt/ds", None,
                                                                          "s3://bkt/run1", None)
    again = ClusterSpec.from_dict(spec.to_dict())
    assert (again.data_url, again.data_sync, again.backup_url, again.credentials_secret) == (
        "s3://bkt/ds", True, "s3://bkt/run1", "s3-creds")
    for kwargs, wanted in (
        ({"data_sync": True}, "--data-sync copies a --data-dir URL"),
        ({"backup_url": "https://h/x"}, "read-only"),
        ({"credentials_secret": "creds"}, "goes with a URL"),
        ({"credentials_secret": "Bad_Name", "backup_url": "s3://b/x"}, "not a valid Secret name"),
        ({"env": {"TFK8S_DATA_URL": "x"}}, "cannot be overridden"),
        ({"sources": {"script.py": {"url": "s3://b/x.py", "size": 1, "sha256": "nope"}}}, "sha256"),
    ):
        with pytest.raises(SpecError, match=wanted):
            ClusterSpec("s", script="print(1)", **kwargs)


def test_make_spec_fetches_script_and_files_once_and_records_them(mem):
    fs, p = mem
    fs.pipe(f"/{p}/code/train.py", b"import helper\nprint(helper.X)\n")
    fs.pipe(f"/{p}/code/helper.py", b"X = 42\n")
    spec = api.make_spec("s", script_path=f"memory://{p}/code/train.py", files=[f"memory://{p}/code/helper.py"],
                         backup_url=f"memory://{p}/out")
    assert spec.script.startswith("import helper") and spec.files == {"helper.py": "X = 42\n"}
    assert spec.sources["script.py"]["url"] == f"memory://{p}/code/train.py"
    assert spec.sources["helper.py"]["sha256"] == hashlib.sha256(b"X = 42\n").hexdigest()
    assert spec.sources["helper.py"]["size"] == 7
    with pytest.raises(SpecError, match="does not exist"):
        api.make_spec("s", script_path=f"memory://{p}/code/missing.py")


class _Sup:
    """What ClusterStorage uses of a supervisor for a streaming cluster."""

    def __init__(self, spec, data_dir):
        self.spec, self.record = spec, {"data_dir": str(data_dir), "log_dir": str(data_dir.parent / "logs")}


def test_a_streaming_task_gets_the_url_and_only_storage_credentials(mem, tmp_path, monkeypatch):
    """(The supervisor's --data-sync copy runs as a child process: tests/test_storage_s3.py.)"""
    from tfk8s_magics.backends.local import storage as local_storage

    fs, p = mem
    # Streaming (no --data-sync): the task gets the URL and this environment's storage credentials only.
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t")
    monkeypatch.setenv("UNRELATED_TOKEN", "x")
    streaming = ClusterSpec("s", script="print(1)", data_dir=f"memory://{p}/ds")
    env = local_storage.ClusterStorage(_Sup(streaming, tmp_path / "d3")).task_env()
    assert env["TFK8S_DATA_URL"] == f"memory://{p}/ds" and env["AWS_SECRET_ACCESS_KEY"] == "s3cr3t"
    assert "UNRELATED_TOKEN" not in env


def _export(fs, root, model="m", version="1"):
    fs.pipe(f"{root}/{model}/{version}/saved_model.pb", b"pb" * 50)
    fs.pipe(f"{root}/{model}/{version}/variables/variables.index", b"ix")


def test_fetch_models_takes_a_backup_urls_models_or_a_models_dir(mem, tmp_path):
    """``serve --from``: a --backup URL (its models/ is taken) or the models dir itself, into a
    destination that may exist already (the serving pod's emptyDir)."""
    fs, p = mem
    _export(fs, f"/{p}/run1/models")
    fs.pipe(f"/{p}/run1/checkpoints/ckpt-1.index", b"c")  # not a model: never fetched
    (tmp_path / "a").mkdir()
    done = storage.fetch_models(f"memory://{p}/run1", tmp_path / "a", model="m")
    assert done == {"files": 2, "bytes": 102}
    assert sorted(str(f.relative_to(tmp_path / "a")) for f in (tmp_path / "a").rglob("*") if f.is_file()) == [
        "m/1/saved_model.pb", "m/1/variables/variables.index"]
    storage.fetch_models(f"memory://{p}/run1/models", tmp_path / "b")
    assert (tmp_path / "b" / "m" / "1" / "saved_model.pb").read_bytes() == b"pb" * 50
    assert not [f for f in (tmp_path / "b").iterdir() if f.name.startswith(".")]


def test_fetch_models_without_the_model_is_one_sentence_and_keeps_nothing(mem, tmp_path):
    fs, p = mem
    _export(fs, f"/{p}/run1/models")
    fs.pipe(f"/{p}/run1/models/half/2/variables/variables.index", b"ix")  # no saved_model.pb yet
    (tmp_path / "pod").mkdir()  # an emptyDir exists: it stays, empty
    for model, dest in (("other", tmp_path / "pod"), ("half", tmp_path / "new")):
        with pytest.raises(StorageError) as err:
            storage.fetch_models(f"memory://{p}/run1", dest, model=model)
        assert str(err.value) == (
            f"--from 'memory://{p}/run1' holds no complete export of model {model!r} (found: m): give one "
            "of those with --model, or the URL of a --backup or of a models dir "
            "(<model>/<version>/saved_model.pb).")
    assert list((tmp_path / "pod").iterdir()) == [] and not (tmp_path / "new").exists()
    with pytest.raises(StorageError, match=f"--from 'memory://{p}/gone' does not exist"):
        storage.fetch_models(f"memory://{p}/gone", tmp_path / "gone")
    assert not (tmp_path / "gone").exists()


def test_the_fetch_models_command_line(mem, tmp_path, capsys):
    """What the serving pod's init container runs (in-process here: memory:// is per process)."""
    from tfk8s_magics.storage.__main__ import main

    fs, p = mem
    _export(fs, f"/{p}/run1/models")
    assert main(["fetch-models", f"memory://{p}/run1", str(tmp_path / "m"), "--model", "m"]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines()[-1].startswith("tfk8s-storage: done: 2 file(s), 102 B in ")
    assert main(["fetch-models", f"memory://{p}/run1", str(tmp_path / "x"), "--model", "y"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"tfk8s-storage: --from 'memory://{p}/run1' holds no")
    assert not (tmp_path / "x").exists()


def test_local_serve_refuses_a_kubernetes_secret_in_one_sentence(local):
    with pytest.raises(SpecError) as err:
        local.serve("any", source_url="s3://b/run", credentials_secret="s3-creds")
    assert str(err.value) == ("--credentials-secret 's3-creds' names a Kubernetes Secret; the local backend "
                              "reads storage credentials from your environment or fsspec's config: drop it.")
    assert not list(local.state_dir.iterdir())


@pytest.mark.parametrize("url, package, extra", [
    ("gs://bucket/x", "gcsfs", "gcs"), ("gcs://bucket/x", "gcsfs", "gcs"),
    ("abfs://container/x", "adlfs", "azure"), ("abfss://container/x", "adlfs", "azure"),
    ("az://container/x", "adlfs", "azure"), ("hdfs://namenode:8020/x", "pyarrow", "hdfs"),
])
def test_each_missing_filesystem_package_is_one_sentence_naming_its_extra(url, package, extra, tmp_path):
    import importlib.util

    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here")
    kind = url.partition(":")[0]
    want = (f"{kind}:// URLs need the {package} package, which is not installed: "
            f"pip install 'tfk8s-magics[{extra}]' (or pip install {package}).")
    with pytest.raises(StorageError) as err:
        storage.sync_down(url, tmp_path / "data")
    assert str(err.value) == want
    assert not (tmp_path / "data").exists()
    with pytest.raises(StorageError) as err:
        api.make_spec("p", script_path=url)
    assert str(err.value) == want


def test_the_extras_named_exist_in_pyproject():
    import tomllib
    from pathlib import Path

    extras = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]
    for package, extra in storage.urls.EXTRAS.items():
        via_s3fs = package == "aiohttp" and any(r.startswith("s3fs") for r in extras[extra])
        assert any(r.startswith(package) for r in extras[extra]) or via_s3fs, (package, extra)
