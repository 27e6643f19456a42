"""The test cluster's Ingress controller: Traefik with its Kubernetes Ingress provider, HTTPS only.

What a production cluster exposes its web applications through: an Ingress controller that
watches Ingresses of its IngressClass and terminates TLS with each Ingress's Secret. ``traefik``
(built from its published module through the consumer module ``go/traefik``, cached by version,
:mod:`devcluster.build`) runs in the first real node's network namespace, as a node's daemons do
(:mod:`devcluster.nodes`), so it reaches pods at their own addresses (the Services' EndpointSlices,
Traefik's default load balancing), and it listens on that node's address only
(:attr:`Ingress.address`, port 443: the entrypoint ``websecure``), never on the host's.

- It reads the API server as the ServiceAccount ``tfk8s-ingress/traefik`` (:func:`objects`), whose
  ClusterRole allows only what the provider watches: Ingresses, IngressClasses, Services,
  EndpointSlices, Secrets (the Ingresses' certificates) and Nodes (its cluster-scope informer),
  list and watch only. Its token is a file (0600) a kubeconfig names (:func:`kubeconfig`).
- It serves the IngressClass :data:`CLASS` (controller :data:`CONTROLLER`): Ingresses naming it,
  with ``spec.tls`` Secrets for their hosts; every router is TLS (the entrypoint's ``http.tls``).
- Its default certificate (a request with no Ingress's host) is signed by the cluster CA
  (:mod:`devcluster.pki`) for the node's address, so :func:`ready` is a real HTTPS request that
  verifies the CA: it gets Traefik's 404 (no router matches an address).

Clients on this machine reach an Ingress's host at :attr:`Ingress.address` (``curl --resolve
lab.tfk8s.test:443:<address>``, Chromium's ``--host-resolver-rules``); the name :data:`HOST` is in
the reserved ``.test`` domain, which no resolver answers.

The pure builders (``objects``, ``kubeconfig``, ``static_config``, ``dynamic_config``,
``tls_secret``) return data; :func:`up` performs them and waits for :func:`ready`.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import build, nodes
from .hostfiles import write_private
from .pki import CA

NAMESPACE = "tfk8s-ingress"
SERVICE_ACCOUNT = "traefik"
TOKEN_SECRET = "traefik-token"
CLUSTER_ROLE = "tfk8s-ingress-traefik"
CLASS = "traefik"
CONTROLLER = "traefik.io/ingress-controller"
ENTRYPOINT = "websecure"
PORT = 443
#: the host name the suite's lab is reached by (a reserved test domain no resolver answers)
HOST = "lab.tfk8s.test"
PROCESS = "traefik"
#: what the provider's informers read (Traefik's kubernetesIngress provider, v3.6): list and watch
WATCHED = {
    "": ("services", "secrets", "nodes"),
    "discovery.k8s.io": ("endpointslices",),
    "networking.k8s.io": ("ingresses", "ingressclasses"),
}


class IngressError(RuntimeError):
    """Traefik could not be started; the message says what failed and what to do."""


@dataclass(frozen=True)
class Ingress:
    """A running (or configured) Ingress controller of one cluster directory."""

    root: Path  # <cluster>/ingress
    ip: str  # the first real node's address: where it listens
    ca: Path  # the cluster CA (its default certificate's and the Ingresses' test certificates')

    @property
    def address(self) -> str:
        """``ip:443``: where HTTPS for every Ingress host arrives."""
        return f"{self.ip}:{PORT}"


# -- pure builders ------------------------------------------------------------------------------


def objects() -> list[dict]:
    """The namespace, ServiceAccount (and its token Secret), least ClusterRole and binding, and the
    IngressClass :data:`CLASS`."""
    meta = {"namespace": NAMESPACE}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVICE_ACCOUNT, **meta}},
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/service-account-token",
            "metadata": {
                "name": TOKEN_SECRET,
                **meta,
                "annotations": {"kubernetes.io/service-account.name": SERVICE_ACCOUNT},
            },
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": CLUSTER_ROLE},
            "rules": [
                {"apiGroups": [group], "resources": list(resources), "verbs": ["list", "watch"]}
                for group, resources in WATCHED.items()
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": CLUSTER_ROLE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CLUSTER_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}],
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "IngressClass",
            "metadata": {"name": CLASS},
            "spec": {"controller": CONTROLLER},
        },
    ]


def kubeconfig(server: str, ca: Path, token_file: Path) -> dict:
    """Traefik's kubeconfig (its ``KUBECONFIG``): the ServiceAccount's token file, the cluster CA, the
    API server's certificate checked for ``localhost`` (the name it carries for every address)."""
    return nodes.api_kubeconfig(server, ca, SERVICE_ACCOUNT, {"tokenFile": str(token_file)})


def static_config(listen_ip: str, dynamic_file: Path, port: int = PORT) -> dict:
    """Traefik's static configuration: one HTTPS entrypoint on ``listen_ip``, the Ingress provider
    for :data:`CLASS`, the file of :func:`dynamic_config`; no dashboard, no outside calls.

    The entrypoint's ``http.tls`` makes every router TLS: without it, the routers of an Ingress
    (even one with ``spec.tls``) serve plain HTTP on the same port."""
    return {
        "global": {"checkNewVersion": False, "sendAnonymousUsage": False},
        "log": {"level": "INFO"},
        "entryPoints": {
            ENTRYPOINT: {"address": f"{listen_ip}:{port}", "http": {"tls": {}}},
        },
        "providers": {
            "kubernetesIngress": {"ingressClass": CLASS},
            "file": {"filename": str(dynamic_file), "watch": False},
        },
    }


def dynamic_config(cert: Path, key: Path) -> dict:
    """The default certificate (for requests matching no Ingress's TLS host), TLS 1.2 at least."""
    return {
        "tls": {
            "stores": {"default": {"defaultCertificate": {"certFile": str(cert), "keyFile": str(key)}}},
            "options": {"default": {"minVersion": "VersionTLS12"}},
        }
    }


def tls_secret(name: str, namespace: str, cert_pem: bytes, key_pem: bytes) -> dict:
    """A ``kubernetes.io/tls`` Secret (what an Ingress's ``spec.tls[].secretName`` names)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": namespace},
        "data": {
            "tls.crt": base64.b64encode(cert_pem).decode(),
            "tls.key": base64.b64encode(key_pem).decode(),
        },
    }


# -- performing ---------------------------------------------------------------------------------


def request(
    ip: str, host: str, path: str, ca: Path, sni: str | None = None, timeout: float = 10.0
) -> tuple[int, bytes, bytes]:
    """``GET https://host/path`` sent to ``ip:443`` (the name resolved as ``curl --resolve`` does),
    the certificate verified by ``ca`` for ``sni`` (default: ``host``); status, body, the served
    certificate (DER)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    raw = socket.create_connection((ip, PORT), timeout=timeout)
    with ctx.wrap_socket(raw, server_hostname=sni or host) as tls:
        served = tls.getpeercert(binary_form=True)
        conn = http.client.HTTPConnection(host, PORT, timeout=timeout)
        conn.sock = tls
        conn.request("GET", path, headers={"Host": host})
        r = conn.getresponse()
        return r.status, r.read(), served


def ready(ip: str, ca: Path) -> int:
    """The status Traefik answers ``https://<ip>/`` with, its default certificate verified by ``ca``
    (404: it serves, and no router matches a bare address)."""
    return request(ip, ip, "/", ca)[0]


def _root(cluster) -> Path:
    return cluster.root / "ingress"


def load(cluster) -> Ingress | None:
    """The Ingress controller of ``cluster`` as :func:`up` recorded it, or None."""
    try:
        rec = json.loads((_root(cluster) / "ingress.json").read_text())
    except (OSError, ValueError):
        return None
    return Ingress(root=_root(cluster), ip=rec["ip"], ca=cluster.pki / "ca.crt")


def _token(cluster, timeout: float) -> str:
    """The ServiceAccount's token, once the token controller has written it into its Secret."""
    deadline = time.monotonic() + timeout
    while True:
        r = cluster.kubectl(
            "get", "secret", TOKEN_SECRET, "-n", NAMESPACE, "-o", "jsonpath={.data.token}", check=False
        )
        if r.returncode == 0 and r.stdout.strip():
            return base64.b64decode(r.stdout.strip()).decode()
        if time.monotonic() > deadline:
            raise IngressError(
                f"the token of {NAMESPACE}/{SERVICE_ACCOUNT} was not issued within {timeout:.0f} s "
                f"(kube-controller-manager's token controller): {r.stderr.strip()}"
            )
        time.sleep(0.3)


def up(cluster, log=print, timeout: float = 60.0) -> Ingress:
    """Start Traefik in the first real node's namespace (a process of the cluster's); return it once
    :func:`ready` answers. A failed start stops it again."""
    from . import node

    try:
        node.slot_of(cluster)  # it runs in a real node's namespace: refuse before building anything
    except node.NodeError as e:
        raise IngressError(f"no Ingress controller without real nodes: {e}") from None
    comp = build.ensure("traefik")
    first = node.layout(cluster)
    old = load(cluster)
    if old and old.ip == first.net.ip and cluster.procs.alive(PROCESS):
        return old
    root = _root(cluster)
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    ing = Ingress(root=root, ip=first.net.ip, ca=cluster.pki / "ca.crt")
    t0 = time.monotonic()
    cluster.apply(objects())
    write_private(root / "token", _token(cluster, timeout))
    (root / "kubeconfig").write_text(json.dumps(kubeconfig(first.server, ing.ca, root / "token")))
    cert, key = CA(cluster.pki).issue("ingress-default", "tfk8s-ingress", ips=(ing.ip,), server=True)
    (root / "dynamic.yaml").write_text(yaml.safe_dump(dynamic_config(cert, key)))
    (root / "traefik.yaml").write_text(yaml.safe_dump(static_config(ing.ip, root / "dynamic.yaml")))
    (root / "ingress.json").write_text(json.dumps({"ip": ing.ip}))
    argv = ["nsenter", f"--net={first.net.netns_path}", "--", str(comp.path("traefik")),
            f"--configFile={root / 'traefik.yaml'}"]  # fmt: skip
    # KUBECONFIG names its client; KUBERNETES_SERVICE_HOST (in-cluster) must not override it
    cluster.procs.start(
        PROCESS, argv, env={"KUBECONFIG": str(root / "kubeconfig"), "KUBERNETES_SERVICE_HOST": ""}
    )
    try:
        cluster.procs.wait_ready(
            PROCESS,
            lambda: ready(ing.ip, ing.ca) == 404,
            timeout - (time.monotonic() - t0),  # the start's whole bound, from t0
            IngressError,
            "Traefik",
            where=f"https://{ing.address}",
        )
    except BaseException:
        cluster.procs.stop(PROCESS)
        raise
    took = time.monotonic() - t0
    log(f"devcluster: Traefik {comp.version} on https://{ing.address} (class {CLASS}) in {took:.1f} s")
    return ing


def down(cluster) -> None:
    """Stop Traefik (its cluster objects go with the cluster)."""
    cluster.procs.stop(PROCESS)
