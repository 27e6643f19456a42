"""The test cluster's image registry (devcluster/registry.py): its pure builders against literal
values, then the real ``registry`` binary (distribution, built from its module) on 127.0.0.1 with
htpasswd and TLS signed by a cluster CA, pushed to and pulled from by podman. No Kubernetes here:
tests/test_k8s_registry.py has a real node pull from it with an image pull Secret.
"""

from __future__ import annotations

import base64
import json
import shutil
import ssl
import subprocess
import tomllib
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import bcrypt
import psutil
import pytest
import yaml

from devcluster import hostfiles, registry


def test_the_registry_is_pinned_and_built_from_its_module():
    from devcluster import build
    from devcluster.versions import versions

    assert versions()["DISTRIBUTION"].startswith("v3.1.")
    comp = build.COMPONENTS["registry"]
    assert (comp.version_key, comp.binaries) == ("DISTRIBUTION", ("registry",))


def test_config_serves_tls_with_htpasswd_on_the_address_given(tmp_path):
    cfg = registry.config(
        "127.0.0.1:5000",
        tmp_path / "data",
        tmp_path / "r.crt",
        tmp_path / "r.key",
        tmp_path / "htpasswd",
        "s3",
    )
    assert cfg == {
        "version": 0.1,
        "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": True}},
        "storage": {
            "filesystem": {"rootdirectory": str(tmp_path / "data")},
            "delete": {"enabled": True},
            "maintenance": {"uploadpurging": {"enabled": False}},
        },
        "http": {
            "addr": "127.0.0.1:5000",
            "secret": "s3",
            "tls": {"certificate": str(tmp_path / "r.crt"), "key": str(tmp_path / "r.key")},
            "headers": {"X-Content-Type-Options": ["nosniff"]},
        },
        "auth": {"htpasswd": {"realm": "tfk8s-devcluster registry", "path": str(tmp_path / "htpasswd")}},
    }


def test_htpasswd_line_is_a_bcrypt_hash_of_the_password():
    line = registry.htpasswd_line("tfk8s", "correct horse")
    user, _, digest = line.rstrip("\n").partition(":")
    assert user == "tfk8s" and digest.startswith("$2b$")
    assert bcrypt.checkpw(b"correct horse", digest.encode())
    assert not bcrypt.checkpw(b"wrong horse", digest.encode())


def test_hosts_toml_maps_the_name_to_the_address_and_trusts_the_ca(tmp_path):
    assert tomllib.loads(registry.hosts_toml("127.0.0.1:5000", tmp_path / "ca.crt")) == {
        "server": "https://127.0.0.1:5000",
        "ca": str(tmp_path / "ca.crt"),
        "capabilities": ["pull", "resolve"],
    }


def test_pull_secret_holds_the_credentials_for_the_registry_name():
    s = registry.pull_secret("regcred", "alice", "tfk8s", "pw:with:colons")
    assert (s["type"], s["metadata"]) == (
        "kubernetes.io/dockerconfigjson",
        {"name": "regcred", "namespace": "alice"},
    )
    conf = json.loads(base64.b64decode(s["data"][".dockerconfigjson"]))
    assert conf == {
        "auths": {"registry.tfk8s.test": {"auth": base64.b64encode(b"tfk8s:pw:with:colons").decode()}}
    }


# -- the real registry --------------------------------------------------------------------------

PODMAN = ["podman", "--runtime", "/usr/sbin/runc"]


def _podman(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([*PODMAN, *args], capture_output=True, text=True, check=check)


@pytest.fixture(scope="module")
def reg(tmp_path_factory):
    """A registry started as ``scripts/kube up --pods`` starts it, in a throwaway cluster directory."""
    from devcluster import build
    from devcluster.cluster import Cluster

    if not build.COMPONENTS["registry"].is_built() and shutil.which("go") is None:
        pytest.skip("the registry is not built and Go is missing: scripts/kube build registry")
    cluster = Cluster(tmp_path_factory.mktemp("cluster"))
    r = registry.up(cluster, log=lambda *_: None)
    yield cluster, r
    cluster.procs.stop(registry.PROCESS)


@pytest.fixture(scope="module")
def small_image():
    """The node's pause image (a few hundred kB) in podman, to push without waiting on gigabytes."""
    if shutil.which("podman") is None:
        pytest.skip("podman is missing: scripts/bootstrap containers")
    from devcluster import images, nodes

    if _podman("image", "exists", nodes.PAUSE_IMAGE, check=False).returncode:
        _podman("load", "-i", str(images.build_pause(log=lambda *_: None)))
    return nodes.PAUSE_IMAGE


def _get(url: str, ca: Path | None, auth: tuple[str, str] | None = None) -> int:
    ctx = ssl.create_default_context(cafile=str(ca)) if ca else ssl.create_default_context()
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_it_listens_on_loopback_only_with_a_certificate_of_the_cluster_ca(reg):
    cluster, r = reg
    pid = json.loads((cluster.root / "procs" / "registry.json").read_text())["pid"]
    listening = {c.laddr for c in psutil.Process(pid).net_connections("inet") if c.status == "LISTEN"}
    assert {a.ip for a in listening} == {"127.0.0.1"}, listening
    assert r.address.startswith("127.0.0.1:")
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        _get(f"https://{r.address}/v2/", ca=None)  # the system's roots do not know the cluster CA
    assert _get(f"https://{r.address}/v2/", ca=r.ca) == 401


def test_credentials_are_required_and_checked(reg):
    _, r = reg
    assert registry.ready(r.address, r.ca) == 401
    assert registry.ready(r.address, r.ca, registry.USER, r.password + "x") == 401
    assert registry.ready(r.address, r.ca, "someone", r.password) == 401
    assert registry.ready(r.address, r.ca, registry.USER, r.password) == 200
    for f in (r.password_file, r.htpasswd, r.authfile):
        assert f.stat().st_mode & 0o077 == 0, f"{f} is readable by others"


def test_push_and_pull_need_the_credentials(reg, small_image, tmp_path):
    cluster, r = reg
    repo = f"tfk8s-test/pause:{uuid.uuid4().hex[:8]}"
    anonymous = tmp_path / "empty-auth.json"
    anonymous.write_text("{}")
    tls = ["--cert-dir", str(r.cert_dir)]

    refused = _podman(
        "push", *tls, "--authfile", str(anonymous), small_image, f"docker://{r.push_ref(repo)}", check=False
    )
    assert refused.returncode != 0 and "unauthorized" in refused.stderr.lower(), refused.stderr

    assert registry.podman_push(r, small_image, repo) == f"registry.tfk8s.test/{repo}"
    manifest = f"https://{r.address}/v2/{repo.replace(':', '/manifests/')}"
    assert _get(manifest, r.ca) == 401
    assert _get(manifest, r.ca, (registry.USER, r.password)) == 200

    local = f"localhost/tfk8s-test/pulled:{uuid.uuid4().hex[:8]}"
    try:
        denied = _podman(
            "pull", *tls, "--authfile", str(anonymous), f"docker://{r.push_ref(repo)}", check=False
        )
        assert denied.returncode != 0 and "unauthorized" in denied.stderr.lower(), denied.stderr
        pulled = _podman("pull", "-q", *tls, "--authfile", str(r.authfile), f"docker://{r.push_ref(repo)}")
        _podman("tag", pulled.stdout.strip(), local)
        assert (
            _podman("image", "inspect", "--format", "{{.Id}}", local).stdout
            == _podman("image", "inspect", "--format", "{{.Id}}", small_image).stdout
        )
    finally:
        _podman("rmi", local, r.push_ref(repo), check=False)

    # the attack, with the defence removed: the same store served without htpasswd gives the image
    # to anyone, so the 401s above are the htpasswd's doing and nothing else
    conf = yaml.safe_load((r.root / "config.yml").read_text())
    del conf["auth"]
    open_port = hostfiles.free_port("127.0.0.1")
    conf["http"]["addr"] = f"127.0.0.1:{open_port}"
    (tmp_path / "open.yml").write_text(yaml.safe_dump(conf))
    from devcluster import build

    cluster.procs.start(
        "registry-open",
        [str(build.COMPONENTS["registry"].path("registry")), "serve", str(tmp_path / "open.yml")],
    )
    try:
        from tests.realkube import wait_for

        url = f"https://127.0.0.1:{open_port}/v2/{repo.replace(':', '/manifests/')}"

        def anonymous_get() -> int:
            try:
                return _get(url, r.ca)
            except urllib.error.URLError:
                return 0

        assert wait_for(anonymous_get, 30, message="the registry without htpasswd") == 200
    finally:
        cluster.procs.stop("registry-open")


def test_a_registry_started_for_no_node_is_restarted_for_the_slots_address(tmp_path):
    """``node.up`` starts the registry once the slot is known: one started before (for the host
    only, or for another slot) is restarted with a certificate naming the slot's host address,
    and the nodes' hosts.toml points there."""
    import ipaddress

    from cryptography import x509

    from devcluster import build
    from devcluster.cluster import Cluster

    if not build.COMPONENTS["registry"].is_built() and shutil.which("go") is None:
        pytest.skip("the registry is not built and Go is missing: scripts/kube build registry")
    cluster = Cluster(tmp_path / "cluster")
    try:
        pid = lambda: json.loads((cluster.root / "procs" / "registry.json").read_text())["pid"]  # noqa: E731
        first = registry.up(cluster, log=lambda *_: None)
        first_pid = pid()
        assert registry.up(cluster, log=lambda *_: None) == first and pid() == first_pid  # left alone
        second = registry.up(cluster, node_ip="10.246.7.1", log=lambda *_: None)
        assert second.node_ip == "10.246.7.1" and pid() != first_pid
        assert not psutil.pid_exists(first_pid)
        assert registry.ready(second.address, second.ca) == 401
        served = ssl.get_server_certificate(("127.0.0.1", second.port))
        sans = (
            x509.load_pem_x509_certificate(served.encode())
            .extensions.get_extension_for_class(x509.SubjectAlternativeName)
            .value
        )
        assert ipaddress.ip_address("10.246.7.1") in sans.get_values_for_type(x509.IPAddress)
        assert registry.NAME in sans.get_values_for_type(x509.DNSName)
        hosts = (registry.hosts_dir(cluster.root) / registry.NAME / "hosts.toml").read_text()
        assert f'server = "https://10.246.7.1:{second.port}"' in hosts
        assert registry.up(cluster, node_ip="10.246.7.1", log=lambda *_: None) == second
        assert pid() != first_pid and registry.load(cluster) == second
    finally:
        cluster.procs.stop(registry.PROCESS)
