"""HTTPS to the chart's hub through the cluster's Ingress controller (tier 2, the real node).

``scripts/kube up --pods`` starts Traefik (devcluster/ingress.py) in the first real node's network
namespace, on that node's address. Here the chart is installed as an admin installs it behind an
Ingress (Zero-to-JupyterHub's values): ``ingress.enabled``, ``ingress.hosts: [lab.tfk8s.test]``,
``ingress.ingressClassName: traefik`` and ``ingress.tls`` naming a ``kubernetes.io/tls`` Secret
signed by the cluster CA, with the chart's NetworkPolicies in force (Cilium). A client on this
machine then reaches ``https://lab.tfk8s.test/hub/login`` at the node's address (the name resolved
as ``curl --resolve`` does), verifying the certificate against the cluster CA, and gets
JupyterHub's login page; a host with no Ingress rule gets Traefik's 404, and plain HTTP gets no
page. Only the hub and the proxy run (no notebook is spawned): their images are imported into the
node, ``pullPolicy: Never`` (as tests/test_kube_hub.py does).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import ssl
import subprocess
import time

import pytest
from cryptography import x509
from test_helm import CHART, helm_binary

from devcluster import ingress, node
from tests.realkube import podman_cluster, require_or_skip, wait_for

pytestmark = pytest.mark.k8s

HUB_NS, RELEASE, TLS_SECRET = "labingress", "lab", "lab-tls"
FULLNAME = f"{RELEASE}-tfk8s-lab"
BOUND = 600.0  # seconds any one wait may take on a loaded 2-core machine
ATTACK_PORT = 8443  # the node's port of the Traefik started without TLS on its entrypoint

import test_containers  # noqa: E402 - after the fixtures' imports, as test_kube_hub does

images = test_containers.images  # the lab's images, built once per session from this tree


@pytest.fixture(scope="module")
def controller(realkube):
    """The devcluster's real node and its Ingress controller run."""
    cluster = podman_cluster()
    ing = ingress.load(cluster)
    if not node.running(cluster) or ing is None or not cluster.procs.alive(ingress.PROCESS):
        require_or_skip(
            f"the real node or the Ingress controller of {cluster.root} is not running: "
            "start them with scripts/kube up --pods"
        )
    return cluster, ing


@pytest.fixture(scope="module")
def hub_images(controller, images, tmp_path_factory):
    """The hub image and the proxy stand-in, from podman into the real node's containerd."""
    from test_container_hub import base_image, proxy_standin

    from tests.containers.podman import PodmanRun

    tmp = tmp_path_factory.mktemp("ingressimages")
    pods = PodmanRun(f"tfk8s-ingress-{os.getpid()}", tmp / "podman")
    try:
        chp = proxy_standin(pods, base_image(), tmp)
    finally:
        pods.cleanup()
    refs = {"hub": images["hub"], "proxy": chp}
    imported = node.import_images(controller[0], tuple(refs.values()))
    assert set(refs.values()) <= set(imported), imported
    return refs


def _values(refs: dict[str, str], password: str) -> dict:
    def image(ref: str) -> dict:
        repository, tag = ref.rsplit(":", 1)
        return {"repository": repository, "tag": tag, "pullPolicy": "Never"}

    return {
        "hub": {"image": image(refs["hub"]), "db": {"storageClass": "standard"}},
        "proxy": {"image": image(refs["proxy"])},
        "auth": {"sharedPassword": password},
        # no server is spawned here: the notebook image is never pulled
        "lab": {"notebook_image": refs["hub"], "storage_class": "standard"},
        "ingress": {
            "enabled": True,
            "ingressClassName": ingress.CLASS,
            "hosts": [ingress.HOST],
            "tls": [{"hosts": [ingress.HOST], "secretName": TLS_SECRET}],
        },
    }


@pytest.fixture(scope="module")
def release(realkube, controller, hub_images, request, tmp_path_factory):
    """The chart installed with an Ingress of class traefik and a TLS Secret of the cluster CA."""
    from devcluster.pki import CA

    cluster, ing = controller
    kube = realkube
    kube.clear_namespaces(HUB_NS)  # a previous run's leftovers
    kube.core.create_namespace({"metadata": {"name": HUB_NS}})
    crt, key = CA(cluster.pki).issue("ingress-test-lab", ingress.HOST, dns=(ingress.HOST,), server=True)
    kube.apply([ingress.tls_secret(TLS_SECRET, HUB_NS, crt.read_bytes(), key.read_bytes())])
    helm = helm_binary(request, tmp_path_factory)
    values = tmp_path_factory.mktemp("values") / "values.json"
    values.write_text(json.dumps(_values(hub_images, secrets.token_urlsafe(16))))
    helm_cmd = [str(helm), "--kubeconfig", kube.kubeconfig, "-n", HUB_NS]
    r = subprocess.run(
        [
            *helm_cmd,
            "install",
            RELEASE,
            str(CHART),
            "-f",
            str(values),
            "--wait",
            "--timeout",
            f"{int(BOUND)}s",
        ],
        capture_output=True,
        text=True,
        timeout=BOUND + 60,
    )
    if r.returncode:
        pods = cluster.kubectl("get", "pods,events", "-n", HUB_NS, "-o", "wide", check=False).stdout
        pytest.fail(f"helm install failed: {r.stderr[-2000:]}\n{pods[-4000:]}")
    try:
        yield {"ing": ing, "cert": x509.load_pem_x509_certificate(crt.read_bytes())}
    finally:
        subprocess.run([*helm_cmd, "uninstall", RELEASE, "--wait"], capture_output=True, timeout=BOUND)
        if kube.namespace_exists(HUB_NS):
            kube.core.delete_namespace(HUB_NS)


def _through(ing, host: str, path: str, **kw) -> tuple[int, bytes, bytes]:
    return ingress.request(ing.ip, host, path, ing.ca, **kw)


def test_https_through_traefik_reaches_the_hub_login_with_the_ingress_certificate(realkube, release):
    ing = release["ing"]
    got = {}

    def routed() -> bool:  # Traefik applies an Ingress once its informers saw it and its endpoints
        try:
            got["r"] = _through(ing, ingress.HOST, "/hub/login")
        except OSError as e:  # before its Secret is loaded the default certificate does not name the host
            got["r"] = e
            return False
        return got["r"][0] == 200

    t0 = time.monotonic()
    wait_for(
        routed, 120, 0.5, f"https://{ingress.HOST}/hub/login through Traefik (last: {got.get('r')!r:.300})"
    )
    status, body, served = got["r"]
    page = body.decode()
    # JupyterHub's login form, served by the hub behind the proxy behind Traefik
    assert 'action="/hub/login' in page and 'name="username"' in page and 'name="password"' in page, page[
        -800:
    ]
    # the certificate is the Ingress's Secret's (verified against the cluster CA for the host name)
    assert x509.load_der_x509_certificate(served) == release["cert"]
    print(f"routed through Traefik {time.monotonic() - t0:.1f} s after helm install --wait")
    # the controller read the cluster with its own ServiceAccount since it started, only listing and
    # watching, and nothing it asked was refused
    sa = f"system:serviceaccount:{ingress.NAMESPACE}:{ingress.SERVICE_ACCOUNT}"
    asked = [r for r in realkube.audit(0) if r.user == sa and r.resource]
    assert {r.resource for r in asked} >= {"ingresses", "services", "endpointslices", "secrets"}, asked[:20]
    assert not [r for r in asked if r.code == 403], [r for r in asked if r.code == 403][:5]
    assert {r.verb for r in asked} <= {"list", "watch"}, {r.verb for r in asked}


def test_a_host_without_an_ingress_rule_gets_traefiks_404(release):
    ing = release["ing"]
    # the default certificate (the node's address, cluster CA) is served; no rule has this host
    status, body, served = _through(ing, "other.tfk8s.test", "/hub/login", sni=ing.ip)
    assert status == 404 and b"hub" not in body.lower(), (status, body[:300])
    assert x509.load_der_x509_certificate(served) != release["cert"]
    # and no certificate for that name: a client checking it refuses the connection
    with pytest.raises(ssl.SSLCertVerificationError):
        _through(ing, "other.tfk8s.test", "/hub/login")


def test_plain_http_on_the_https_port_gets_traefiks_404_never_the_hub(release):
    # every router is TLS (the entrypoint's http.tls): a plain-HTTP request on :443 meets Traefik's
    # HTTP handler with no router at all, which answers 404 (Traefik has no TLS-only port mode)
    ing = release["ing"]
    with socket.create_connection((ing.ip, ingress.PORT), timeout=10) as s:
        s.sendall(f"GET /hub/login HTTP/1.1\r\nHost: {ingress.HOST}\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404 "), answer[:300]
    assert body == b"404 page not found\n", body[:300]


def test_without_tls_on_the_entrypoint_plain_http_would_get_the_hub(controller, release, tmp_path):
    """The defence removed: the same Traefik, ServiceAccount and Ingress, with the entrypoint's
    ``http.tls`` left out (on another port of the node): the Ingress's routers serve the hub's
    login page over plain HTTP. With it (the tests above) they do not."""
    import http.client

    import yaml

    from devcluster import build

    cluster, ing = controller
    cfg = ingress.static_config(ing.ip, ing.root / "dynamic.yaml", port=ATTACK_PORT)
    del cfg["entryPoints"][ingress.ENTRYPOINT]["http"]
    (tmp_path / "traefik.yaml").write_text(yaml.safe_dump(cfg))
    first = node.layout(cluster)
    traefik = build.COMPONENTS["traefik"].path("traefik")
    argv = [
        "nsenter",
        f"--net={first.net.netns_path}",
        "--",
        str(traefik),
        f"--configFile={tmp_path / 'traefik.yaml'}",
    ]
    env = {**os.environ, "KUBECONFIG": str(ing.root / "kubeconfig"), "KUBERNETES_SERVICE_HOST": ""}
    with open(tmp_path / "traefik.log", "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    got = {}

    def served() -> bool:
        conn = http.client.HTTPConnection(ing.ip, ATTACK_PORT, timeout=10)
        try:
            conn.request("GET", "/hub/login", headers={"Host": ingress.HOST})
            r = conn.getresponse()
            got["r"] = (r.status, r.read().decode(errors="replace"))
        except OSError as e:
            got["r"] = e
            return False
        finally:
            conn.close()
        return got["r"][0] == 200

    try:
        wait_for(
            served,
            120,
            0.5,
            f"plain HTTP to the hub through the unfenced Traefik (last: {got.get('r')!r:.300})",
        )
    finally:
        proc.terminate()
        proc.wait(15)
    assert 'name="password"' in got["r"][1], got["r"][1][-500:]


def test_traefik_listens_on_the_node_address_only(controller):
    cluster, ing = controller
    pid = cluster.procs.pid(ingress.PROCESS)
    first = node.layout(cluster)
    r = subprocess.run(
        ["nsenter", f"--net={first.net.netns_path}", "--", "ss", "-Hltnup"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    mine = [line.split()[4] for line in r.stdout.splitlines() if f"pid={pid}," in line]
    assert mine == [f"{ing.ip}:{ingress.PORT}"], r.stdout
    # and nothing on the host's side: it runs in the node's namespace alone
    host = subprocess.run(["ss", "-Hltnup"], capture_output=True, text=True).stdout
    assert f"pid={pid}," not in host, host
