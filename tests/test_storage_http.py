"""``http(s)://`` URLs are read-only (issue 15, item 1): a script, a file and a data dir fetched through
fsspec's HTTP filesystem (aiohttp) from a ``http.server`` on 127.0.0.1 (its directory index is the
listing); a missing object is one sentence leaving nothing behind; writing there (``--backup``,
``--log-dir``, the ``upload`` command) is refused in one sentence before any request is sent.

``https://`` against the same server behind TLS with a certificate made here for 127.0.0.1 (a
private CA, as a company's object store has): refused in one sentence that names the fix until
``SSL_CERT_FILE`` trusts it, then fetched; a server that is not there is "cannot be reached",
never "does not exist" (fsspec reports both as a missing object)."""

from __future__ import annotations

import datetime
import functools
import hashlib
import ipaddress
import os
import ssl
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("aiohttp", reason="http(s):// URLs need aiohttp (the storage extra brings it)")

import tfk8s_magics as tk  # noqa: E402
from tfk8s_magics import api, storage  # noqa: E402
from tfk8s_magics.backends import Phase  # noqa: E402
from tfk8s_magics.errors import StorageError  # noqa: E402

TRAIN = b"""import os, pathlib, helper
data = pathlib.Path(os.environ["TFK8S_DATA_DIR"])
print("files", sorted(str(p.relative_to(data)) for p in data.rglob("*") if p.is_file()), helper.X, flush=True)
"""
PAYLOAD = bytes(range(256)) * 20


def _self_signed(dest) -> tuple[str, str]:
    """A certificate for 127.0.0.1 (its own CA) and its key, written under ``dest``: the paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tfk8s test CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=2))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    (dest / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (dest / "key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return str(dest / "cert.pem"), str(dest / "key.pem")


@pytest.fixture
def web(request, tmp_path):
    """A static web server on 127.0.0.1 over ``site/`` (code/, ds/), recording each request;
    ``tls`` (indirect parameter): behind TLS with a certificate of its own (``cert`` in the result)."""
    tls = getattr(request, "param", False)
    site = tmp_path / "site"
    (site / "code").mkdir(parents=True)
    (site / "ds" / "sub").mkdir(parents=True)
    (site / "code" / "train.py").write_bytes(TRAIN)
    (site / "code" / "helper.py").write_bytes(b"X = 42\n")
    (site / "ds" / "a.bin").write_bytes(PAYLOAD)
    (site / "ds" / "sub" / "b.txt").write_bytes(b"hello\n")
    seen: list[tuple[str, str]] = []

    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, fmt, *args):
            seen.append((self.command, self.path))

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(site)))
    cert = None
    if tls:
        cert, key = _self_signed(tmp_path)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        if tls:
            yield f"https://127.0.0.1:{server.server_port}", seen, cert
        else:
            yield f"http://127.0.0.1:{server.server_port}", seen
    finally:
        server.shutdown()
        thread.join(10)


def test_a_script_and_a_file_are_fetched_with_size_and_sha256(web):
    base, _ = web
    spec = api.make_spec("w", script_path=f"{base}/code/train.py", files=[f"{base}/code/helper.py"])
    assert spec.script == TRAIN.decode() and spec.files == {"helper.py": "X = 42\n"}
    assert spec.sources["script.py"] == {"url": f"{base}/code/train.py", "size": len(TRAIN),
                                         "sha256": hashlib.sha256(TRAIN).hexdigest()}
    assert spec.sources["helper.py"]["size"] == 7


def test_a_data_dir_is_synced_from_the_servers_index_with_its_sizes(web, tmp_path):
    base, _ = web
    seen = []
    done = storage.sync_down(f"{base}/ds", tmp_path / "data", progress=lambda d, t: seen.append((d, t)))
    total = len(PAYLOAD) + 6
    assert done == {"files": 2, "bytes": total}
    assert seen[-1] == (total, total) and all(t == total for _, t in seen)
    assert (tmp_path / "data" / "a.bin").read_bytes() == PAYLOAD
    assert (tmp_path / "data" / "sub" / "b.txt").read_bytes() == b"hello\n"
    assert sorted(os.listdir(tmp_path / "data")) == ["a.bin", "sub"]  # no temporary dir left


def test_a_missing_object_is_one_sentence_and_leaves_nothing(web, tmp_path):
    base, _ = web
    with pytest.raises(StorageError) as err:
        storage.fetch_text(f"{base}/code/missing.py", 1000)
    assert str(err.value) == f"--script '{base}/code/missing.py' does not exist: check the bucket and path."
    with pytest.raises(StorageError) as err:
        storage.sync_down(f"{base}/nothing", tmp_path / "data")
    assert str(err.value) == f"--data-dir '{base}/nothing' does not exist: check the bucket and path."
    assert not (tmp_path / "data").exists()


def test_writing_to_an_http_url_is_refused_before_any_request(web, local, tmp_path):
    base, seen = web
    for kwargs in ({"backup_url": f"{base}/out"}, {"log_dir": f"{base}/out"}):
        with pytest.raises(StorageError) as err:
            tk.launch("w", script="print(1)\n", backend=local, **kwargs)
        assert str(err.value) == (f"--backup '{base}/out': http:// is read-only; give a URL the lab can "
                                  "upload to (s3://, gs://, abfs://, hdfs://).")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "x").write_text("x")
    run = subprocess.run([sys.executable, "-m", "tfk8s_magics.storage", "upload", str(tmp_path / "ckpt"),
                          f"{base}/out"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and run.stderr.count("\n") == 1 and "http:// is read-only" in run.stderr
    assert seen == []  # not a single request reached the server
    assert not (local.state_dir / "clusters").exists() or not any((local.state_dir / "clusters").iterdir())


@pytest.mark.slow
def test_a_cluster_runs_a_script_from_http_on_data_synced_from_http(web, local, workdir):
    base, _ = web
    cluster = tk.launch("web", workers=1, script_path=f"{base}/code/train.py",
                        files=[f"{base}/code/helper.py"], data_dir=f"{base}/ds", data_sync=True,
                        backend=local, detach=True)
    st = cluster.wait(timeout=300)
    logs = cluster.logs("worker-0")
    assert st.phase == Phase.SUCCEEDED, (st.reason, logs)
    assert "files ['a.bin', 'sub/b.txt'] 42" in logs
    events = {e.reason: e.message for e in cluster.events()}
    assert f"{base}/ds → " in events["Synced"] and ": 2 file(s), 5.1 kB in " in events["Synced"]
    cluster.delete()


@pytest.mark.parametrize("web", [True], indirect=True)
def test_an_untrusted_https_server_is_one_sentence_that_names_the_fix_and_leaves_nothing(web, tmp_path):
    base, _, _ = web
    with pytest.raises(StorageError) as err:
        storage.fetch_text(f"{base}/code/train.py", 1000)
    assert str(err.value) == (
        f"--script '{base}/code/train.py': the server's TLS certificate was not accepted (self-signed "
        "certificate); if it is signed by your own CA, set SSL_CERT_FILE to that CA's certificate (PEM) "
        "where the lab runs."
    )
    with pytest.raises(StorageError) as err:
        storage.sync_down(f"{base}/ds", tmp_path / "data")
    assert "TLS certificate was not accepted" in str(err.value)
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("web", [True], indirect=True)
def test_https_with_the_servers_ca_in_ssl_cert_file_fetches_script_and_data(web, tmp_path):
    """Trust comes from the environment the lab starts in (``SSL_CERT_FILE``, read when aiohttp
    makes its TLS context): the storage command in a fresh process, as the tasks' steps run it."""
    base, seen, cert = web
    env = {**os.environ, "SSL_CERT_FILE": cert}
    run = subprocess.run([sys.executable, "-m", "tfk8s_magics.storage", "fetch", f"{base}/ds",
                          str(tmp_path / "data")], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "data" / "a.bin").read_bytes() == PAYLOAD
    assert (tmp_path / "data" / "sub" / "b.txt").read_bytes() == b"hello\n"
    code = ("import sys; from tfk8s_magics import storage; "
            "f = storage.fetch_text(sys.argv[1], 1000); print(f.size, f.sha256)")
    got = subprocess.run([sys.executable, "-c", code, f"{base}/code/train.py"], capture_output=True,
                         text=True, timeout=120, env=env, check=True)
    assert got.stdout.split() == [str(len(TRAIN)), hashlib.sha256(TRAIN).hexdigest()]
    assert ("GET", "/code/train.py") in seen


def test_a_server_that_is_not_there_cannot_be_reached_rather_than_missing(tmp_path):
    from tfk8s_magics.ports import free_ports

    port = free_ports(1)[0]  # nothing listens there
    for url in (f"http://127.0.0.1:{port}/code/train.py", f"https://127.0.0.1:{port}/code/train.py"):
        with pytest.raises(StorageError) as err:
            storage.fetch_text(url, 1000)
        assert str(err.value).startswith(f"--script '{url}': the server cannot be reached (")
        assert str(err.value).endswith("); check the host and port, and that the server is running.")
    with pytest.raises(StorageError) as err:
        storage.sync_down(f"http://127.0.0.1:{port}/ds", tmp_path / "data")
    assert "the server cannot be reached" in str(err.value)
    assert not (tmp_path / "data").exists()
