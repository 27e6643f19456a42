"""The real nodes' NetworkPolicy enforcer (markers ``k8s`` and ``netpol``; ``scripts/kube up --pods``).

``devcluster/enforcer.py`` runs Cilium on every real node (chained after the nodes' bridge plugin).
These tests are the enforcer's own readiness proof, not the lab's policies: a TCP connection
between real pods in two namespaces opens with no policy, is dropped once a default-deny
NetworkPolicy selects the server, and opens again when an allow policy selects the client; on the
same node and across nodes.

Connections are made from inside the client pod's network namespace (``nsenter --net`` into the
pid of its container, as root on this machine): the packets are the pod's own, leave by its veth,
and the test knows at once whether the connection opened.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from devcluster import enforcer, network, node
from tests.realkube import require_or_skip, wait_for
from tests.test_k8s_pods import TASK_IMAGE, _restricted_pod
from tests.test_kube_nodes import _on, _real_nodes, _running

pytestmark = [pytest.mark.k8s, pytest.mark.netpol]

BOUND = 600.0
PORT = 8080
#: how long a policy may take to reach the datapath of every node
SETTLE = 60.0

SERVER = f"""
import socket
s = socket.create_server(("0.0.0.0", {PORT}))
while True:
    c, a = s.accept()
    print("from", a[0], flush=True)
    c.sendall(b"hello")
    c.close()
"""

CONNECT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as s:
        print(s.recv(5).decode())
except OSError as e:
    print("refused" if isinstance(e, ConnectionRefusedError) else "dropped", repr(e))
"""


def _cluster():
    from devcluster.cluster import Cluster

    return Cluster()


@pytest.fixture(scope="module")
def enforcing(realkube):
    """Two Ready real nodes holding the task image, each with its Cilium agent ready."""
    names = _real_nodes(realkube)
    if len(names) < 2:
        require_or_skip(f"the devcluster has {len(names)} Ready real node(s), not 2: scripts/kube up --pods")
    nodes = {n.name: n for n in node.layouts(_cluster())}
    for name in names[:2]:
        images = {i for im in realkube.core.read_node(name).status.images or [] for i in im.names or []}
        if TASK_IMAGE not in images:
            require_or_skip(
                f"{TASK_IMAGE} is not on {name}: scripts/build_images.py task, then scripts/kube up --pods"
            )
        if not enforcer.agent_ready(nodes[name]):
            require_or_skip(f"the Cilium agent of {name} is not ready: see {nodes[name].state / 'logs'}")
    return realkube, [nodes[n] for n in names[:2]]


def _container_pid(n, pod) -> int:
    """The pid of the pod's container on its node (from the node's containerd)."""
    cid = pod.status.container_statuses[0].container_id.split("://", 1)[1]
    out = node.ctr(n, "tasks", "list").stdout.decode().split("\n")
    for line in out[1:]:
        parts = line.split()
        if parts and parts[0] == cid:
            return int(parts[1])
    raise AssertionError(f"container {cid} of {pod.metadata.name} not among {out}")


def _connect(pid: int, ip: str, port: int = PORT, timeout: float = 3.0) -> str:
    """A TCP connection from the pod whose container is ``pid``: ``hello``, ``refused`` or ``dropped``."""
    argv = [sys.executable, "-c", CONNECT, ip, str(port), str(timeout)]
    r = subprocess.run(
        ["nsenter", f"--net=/proc/{pid}/ns/net", "--", *argv],
        capture_output=True,
        text=True,
        timeout=timeout + 30,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.split()[0]


def _settles(pid: int, ip: str, want: str) -> list[str]:
    """Connect until the answer is ``want`` three times in a row (a policy takes a moment to land)."""
    seen: list[str] = []
    deadline = time.monotonic() + SETTLE
    while time.monotonic() < deadline:
        seen.append(_connect(pid, ip, timeout=2.0))
        if seen[-3:] == [want] * 3:
            return seen
    raise AssertionError(f"the connection to {ip} did not settle on {want!r}: {seen}")


def _policy(name: str, ingress: list[dict]) -> dict:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name},
        "spec": {
            "podSelector": {"matchLabels": {"app": "srv"}},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def test_every_real_node_runs_a_ready_cilium_agent_that_manages_its_pods(enforcing):
    kube, nodes = enforcing
    for n in nodes:
        status = enforcer.agent_api(n, "/v1/healthz")
        assert status["cilium"]["state"] == "Ok", status
        assert status["kubernetes"]["state"] == "Ok", status
        assert enforcer.agent_api(n, "/v1/config")["status"]["realized"]["policy-enforcement"] == "default"
        # its own process, inside its node's network namespace
        assert n.procs.pid(enforcer.AGENT) in network.pids_in(n.net)
        chain = json.loads((n.cni_dir / "10-tfk8s.conflist").read_text())["plugins"]
        assert [p["type"] for p in chain][-1] == "cilium-cni", chain


def test_a_default_deny_policy_drops_a_connection_between_namespaces_and_an_allow_policy_reopens_it(
    enforcing,
):
    kube, (first, second) = enforcing
    core = kube.core
    a = kube.namespace("netpol-a")
    b = kube.namespace("netpol-b")
    server = _on(_restricted_pod("srv", TASK_IMAGE, ["python3", "-c", SERVER]), first.name)
    server["metadata"]["labels"] = {"app": "srv"}
    core.create_namespaced_pod(a, server)
    clients = {}
    for where, n in (("same", first), ("cross", second)):
        pod = _on(_restricted_pod(f"cli-{where}", TASK_IMAGE, ["sleep", "3600"]), n.name)
        pod["metadata"]["labels"] = {"app": "cli"}
        core.create_namespaced_pod(b, pod)
        clients[where] = n
    srv_ip = _running(core, a, "srv", BOUND).status.pod_ip
    pids = {w: _container_pid(n, _running(core, b, f"cli-{w}", BOUND)) for w, n in clients.items()}
    # the server is one of Cilium's endpoints on its node
    wait_for(
        lambda: any(
            (e.get("status") or {}).get("networking", {}).get("addressing", [{}])[0].get("ipv4") == srv_ip
            for e in enforcer.agent_api(first, "/v1/endpoint")
        ),
        SETTLE,
        1,
        f"the server {srv_ip} among the endpoints of {first.name}'s agent",
    )

    # no policy: open from the same node and from the other node
    for w, pid in pids.items():
        assert _connect(pid, srv_ip) == "hello", w

    # default deny on the server's namespace: both connections are dropped
    kube.apply([{**_policy("deny", []), "metadata": {"name": "deny", "namespace": a}}])
    for w, pid in pids.items():
        seen = _settles(pid, srv_ip, "dropped")
        assert "hello" not in seen[-3:], (w, seen)

    # an allow policy selecting the clients' namespace: open again, from both nodes
    allow = _policy(
        "allow-b",
        [
            {
                "from": [
                    {
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": b}},
                        "podSelector": {"matchLabels": {"app": "cli"}},
                    }
                ],
                "ports": [{"protocol": "TCP", "port": PORT}],
            }
        ],
    )
    kube.apply([{**allow, "metadata": {"name": "allow-b", "namespace": a}}])
    for pid in pids.values():
        _settles(pid, srv_ip, "hello")
    # the allow policy names one port: another port of the same server stays closed to them (no
    # listener there, so without the policy the answer would be a refusal, not silence)
    for w, pid in pids.items():
        assert _connect(pid, srv_ip, PORT + 1, timeout=2.0) == "dropped", w


OPENS = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("open")
except OSError as e:
    print("refused" if isinstance(e, ConnectionRefusedError) else "dropped", repr(e))
"""


def _opens(pid: int, ip: str, port: int, timeout: float = 3.0) -> str:
    """Whether a TCP connection from the pod whose container is ``pid`` opens (the API server speaks
    only after the client's TLS hello): ``open``, ``refused`` or ``dropped``."""
    r = subprocess.run(
        ["nsenter", f"--net=/proc/{pid}/ns/net", "--", sys.executable, "-c", OPENS, ip, str(port),
         str(timeout)], capture_output=True, text=True, timeout=timeout + 30)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout.split()[0]


def _backends(n, ip: str, port: int) -> list[str]:
    """The backends Cilium's load balancing on node ``n`` has for the Service address ``ip:port``."""
    return [f"{b['ip']}:{b.get('port')}" for s in enforcer.agent_api(n, "/v1/service")
            if (s["spec"]["frontend-address"]["ip"], s["spec"]["frontend-address"]["port"]) == (ip, port)
            for b in s["spec"].get("backend-addresses") or []]  # fmt: skip


def test_pods_reach_the_api_server_only_through_the_kubernetes_services_endpoint(enforcing):
    """With no NetworkPolicy anywhere near it, a pod reaches 10.96.0.1:443 because the ``kubernetes``
    Service has an endpoint (the host's end of the node bridge, as an API server's reconciler
    writes its address), which Cilium labels ``reserved:kube-apiserver``. Without that endpoint
    Cilium's own load balancing, which sees the pod's packets before any rule of the node, drops
    them: the pod cannot reach the API server at all."""
    from kubernetes import client

    kube, (first, _) = enforcing
    disc = client.DiscoveryV1Api(kube.admin)
    ns = kube.namespace("apiserver")  # no NetworkPolicy in it
    pod = _on(_restricted_pod("cli", TASK_IMAGE, ["sleep", "3600"]), first.name)
    kube.core.create_namespaced_pod(ns, pod)
    pid = _container_pid(first, _running(kube.core, ns, "cli", BOUND))
    eps = disc.read_namespaced_endpoint_slice("kubernetes", "default")
    ((address,),) = [e.addresses for e in eps.endpoints]
    (port,) = [p.port for p in eps.ports]
    assert address == node.slot_of(_cluster()).host_ip, address
    endpoint = f"{address}:{port}"
    assert _backends(first, network.API_SERVICE_IP, 443) == [endpoint]
    (ident,) = [e["identity"] for e in enforcer.agent_api(first, "/v1/ip") if e["cidr"] == f"{address}/32"]
    labels = enforcer.agent_api(first, f"/v1/identity/{ident}")["labels"]
    assert "reserved:kube-apiserver" in labels, labels
    assert _opens(pid, network.API_SERVICE_IP, 443) == "open"

    body = kube.admin.sanitize_for_serialization(eps)
    for k in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
        body["metadata"].pop(k, None)
    disc.delete_namespaced_endpoint_slice("kubernetes", "default")
    try:
        wait_for(lambda: _backends(first, network.API_SERVICE_IP, 443) == [], SETTLE, 1,
                 "Cilium's Service 10.96.0.1:443 without a backend")  # fmt: skip
        answers = [_opens(pid, network.API_SERVICE_IP, 443, timeout=2.0) for _ in range(3)]
        assert "open" not in answers, answers
        assert _opens(pid, address, port) == "open"  # the API server itself still answers the pod
    finally:
        disc.create_namespaced_endpoint_slice("default", body)
    wait_for(lambda: _backends(first, network.API_SERVICE_IP, 443) == [endpoint], SETTLE, 1,
             "the endpoint back in Cilium's Service")  # fmt: skip
    wait_for(lambda: _opens(pid, network.API_SERVICE_IP, 443) == "open", SETTLE, 1, "10.96.0.1 open again")
