"""Traffic across the test cluster's real nodes (marker ``k8s``, tier 2: ``scripts/kube up --pods``).

Each real node is its own network namespace with its own containerd, kubelet, kube-proxy and
node-local DNS cache (``devcluster/node.py``). Here pods are placed on given nodes and talk: pod
to pod by address and through a Service, names resolved through the node-local cache on
169.254.25.10, an MWMS all-reduce with one worker per node, and a task pod that JobSet recreates
on the other node when its node is drained or its kubelet stops.
"""

from __future__ import annotations

import ipaddress
import json
import re

import pytest

import tests.test_k8s_pods as pods_tests
from devcluster import network, node
from tests.realkube import require_or_skip, wait_for
from tests.test_k8s_pods import TASK_IMAGE, _claims, _pod_log, _restricted_pod, _wait

user = pods_tests.user

pytestmark = pytest.mark.k8s

BOUND = 600.0


def _nets():
    from devcluster.cluster import Cluster

    return {n.name: n.net for n in node.layouts(Cluster())}


def _real_nodes(kube) -> list[str]:
    """The Ready real nodes (not kwok's), by name."""
    out = []
    for n in kube.core.list_node().items:
        if (n.metadata.annotations or {}).get("kwok.x-k8s.io/node") == "fake":
            continue
        if {c.type: c.status for c in n.status.conditions or []}.get("Ready") == "True":
            out.append(n.metadata.name)
    return sorted(out)


@pytest.fixture(scope="module")
def realnode(realkube):
    """The devcluster with its first real node Ready and the task image in its containerd
    (these tests run the task image only)."""
    try:
        n = realkube.core.read_node(node.NODE_NAME, _request_timeout=10)
    except Exception as e:  # noqa: BLE001 - any failure means: no real node here
        require_or_skip(f"the devcluster has no real node {node.NODE_NAME!r} ({e}): scripts/kube up --pods")
    if TASK_IMAGE not in {name for i in n.status.images or [] for name in i.names or []}:
        require_or_skip(f"{TASK_IMAGE} is not in the nodes' containerd: scripts/build_images.py task")
    return realkube


@pytest.fixture
def two(realnode):
    names = _real_nodes(realnode)
    if len(names) < 2:
        require_or_skip(f"the devcluster has {len(names)} Ready real node(s), not 2: scripts/kube up --pods")
    return names[:2]


def _on(pod: dict, node_name: str) -> dict:
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node_name}
    return pod


def _running(core, ns, name, timeout=BOUND):
    def ip():
        p = core.read_namespaced_pod(name, ns)
        return p if p.status.phase == "Running" and p.status.pod_ip else None

    return wait_for(ip, timeout, 1, f"pod {name} running")


SERVER = """
import http.server, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        print("from", self.client_address[0], flush=True)
        body = os.environ["HOSTNAME"].encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()
"""

CLIENT = """
import os, socket, urllib.request
print("resolv", open("/etc/resolv.conf").read().replace("\\n", " | "), flush=True)
for url in os.environ["URLS"].split():
    try:
        print("got", url, urllib.request.urlopen(url, timeout=10).read().decode(), flush=True)
    except Exception as e:
        print("failed", url, repr(e), flush=True)
for name in os.environ.get("NAMES", "").split():
    try:
        print("resolved", name, socket.gethostbyname(name), flush=True)
    except OSError as e:
        print("unresolved", name, e.errno, flush=True)
"""


def realnode_cluster():
    from devcluster.cluster import Cluster

    return Cluster()


def test_at_least_two_real_nodes_each_with_its_own_address_and_runtime(two, realnode):
    nodes = {n.metadata.name: n for n in realnode.core.list_node().items if n.metadata.name in two}
    addresses = {
        name: [a.address for a in n.status.addresses if a.type == "InternalIP"] for name, n in nodes.items()
    }
    assert addresses == {name: [_nets()[name].ip] for name in two}, addresses
    for n in nodes.values():
        assert n.status.node_info.container_runtime_version.startswith("containerd://"), n.status.node_info
    # each node's containerd, kubelet and cache run in that node's network namespace only
    for name in two:
        procs = node.node_procs(realnode_cluster(), name)
        pids = set(network.pids_in(_nets()[name]))
        for proc in ("containerd", "kubelet", "kube-proxy", "nodelocaldns"):
            assert procs.alive(proc), (name, proc)
            assert procs.pid(proc) in pids, (name, proc)


def test_a_pod_reaches_a_pod_on_the_other_node_by_address_and_through_a_service(two, user):
    first, second = two
    core, ns = user.core, user.ns
    server = _on(_restricted_pod("srv", TASK_IMAGE, ["python", "-c", SERVER]), second)
    server["metadata"]["labels"] = {"app": "srv"}
    server["spec"]["restartPolicy"] = "Always"
    core.create_namespaced_pod(ns, server)
    core.create_namespaced_service(
        ns,
        {
            "metadata": {"name": "srv"},
            "spec": {"selector": {"app": "srv"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    srv = _running(core, ns, "srv")
    assert ipaddress.ip_address(srv.status.pod_ip) in ipaddress.ip_network(_nets()[second].pod_cidr)
    cluster_ip = core.read_namespaced_service("srv", ns).spec.cluster_ip
    urls = [
        f"http://{srv.status.pod_ip}:8080/",
        f"http://{cluster_ip}/",
        f"http://srv.{ns}.svc.cluster.local/",
    ]
    client = _on(
        _restricted_pod("cli", TASK_IMAGE, ["python", "-c", CLIENT], env={"URLS": " ".join(urls)}), first
    )
    core.create_namespaced_pod(ns, client)
    phase, log = _pod_log(core, ns, "cli")
    assert phase == "Succeeded", log
    for url in urls:
        assert f"got {url} srv" in log, log
    cli_ip = core.read_namespaced_pod("cli", ns).status.pod_ip
    assert ipaddress.ip_address(cli_ip) in ipaddress.ip_network(_nets()[first].pod_cidr)
    # no address translation on the way: the server saw the client pod's own address each time
    seen = [
        line.split()[1]
        for line in core.read_namespaced_pod_log("srv", ns).splitlines()
        if line.startswith("from ")
    ]
    assert seen == [cli_ip] * len(urls), (seen, cli_ip)


def test_names_resolve_through_the_node_local_cache_and_not_without_it(two, user, realnode):
    """A pod's only resolver is 169.254.25.10 (its node's cache): it resolves cluster names; with
    that node's cache stopped the same lookup fails, and it works again once the cache is back."""
    core, ns = user.core, user.ns
    names = "kubernetes.default.svc.cluster.local kube-dns.kube-system.svc.cluster.local"
    for i, name in enumerate(two):
        pod = _on(
            _restricted_pod(
                f"dns-{i}", TASK_IMAGE, ["python", "-c", CLIENT], env={"URLS": "", "NAMES": names}
            ),
            name,
        )
        core.create_namespaced_pod(ns, pod)
        phase, log = _pod_log(core, ns, f"dns-{i}")
        assert phase == "Succeeded", log
        assert "nameserver 169.254.25.10 |" in log and log.count("nameserver") == 1, log
        assert "resolved kubernetes.default.svc.cluster.local 10.96.0.1" in log, log
        assert "resolved kube-dns.kube-system.svc.cluster.local 10.96.0.10" in log, log
    # the cache is the path: without it the node's pods resolve nothing
    procs = node.node_procs(realnode_cluster(), two[1])
    procs.stop("nodelocaldns")
    try:
        pod = _on(
            _restricted_pod(
                "dns-off", TASK_IMAGE, ["python", "-c", CLIENT], env={"URLS": "", "NAMES": names}
            ),
            two[1],
        )
        core.create_namespaced_pod(ns, pod)
        phase, log = _pod_log(core, ns, "dns-off")
        assert phase == "Succeeded", log
        assert "unresolved kubernetes.default.svc.cluster.local" in log, log
    finally:
        procs.restart("nodelocaldns")
        from devcluster import dns

        wait_for(lambda: _ready(dns, _nets()[two[1]].ip), 60, 1, "the cache back")


def _ready(dns, address) -> bool:
    try:
        return dns.ready(address)
    except OSError:
        return False


def test_tf1_parameter_servers_on_one_node_serve_the_workers_on_the_other(two, user):
    """PS traffic across nodes: both PS pods on the first node, both workers on the second
    (the lab's own ``node_affinity``); the variables live on the PS, 40 global steps."""
    from tests.test_k8s_pods import SCRIPTS
    from tfk8s_magics.spec import ClusterSpec

    first, second = two
    backend = user.backend()
    try:
        spec = ClusterSpec(
            name="tf1x",
            ps=2,
            workers=2,
            ps_grace_period=0,
            script=(SCRIPTS / "tf1_ps.py").read_text(),
            node_affinity={
                "ps": (f"kubernetes.io/hostname={first}",),
                "worker": (f"kubernetes.io/hostname={second}",),
            },
            **_claims(),
        )
        backend.launch(spec, detach=True)
        # Where each pod lands is read while they run: the PS are recycled (deleted) once the
        # workers finish, so a listing after the end may find only the workers.
        placed: dict[str, tuple[str, str]] = {}

        def all_placed():
            for p in user.core.list_namespaced_pod(user.ns, label_selector="tfk8s.io/cluster=tf1x").items:
                if p.spec.node_name:
                    placed[p.metadata.name] = (p.metadata.labels.get("tfk8s.io/role"), p.spec.node_name)
            return len(placed) >= 4

        wait_for(all_placed, BOUND, 0.5, "the four tf1x pods placed on nodes")
        status = _wait(backend, "tf1x", lambda s: s.terminal)
        text = "\n".join(f"[{ln.task}] {ln.text}" for ln in backend.read_logs("tf1x"))
        assert status.phase == "succeeded", (status, text[-3000:])
        devices = dict(re.findall(r"\[worker-0\] DEVICE (\S+) (\S+)", text))
        assert set(devices) == {"global_step", "w", "b"}, text[-3000:]
        assert all(d.startswith("/job:ps/task:") for d in devices.values())
        assert {d.split("/task:")[1][0] for d in devices.values()} == {"0", "1"}  # both PS hold some
        assert text.count("GLOBAL_STEP 40") == 2, text[-3000:]
        assert len(placed) == 4, placed
        assert set(placed.values()) == {("ps", first), ("worker", second)}, placed
        backend.delete("tf1x")
    finally:
        backend.close()


LONG = """
import os, time
print("on", os.environ.get("NODE", "?"), flush=True)
time.sleep(3600)
"""


def _task_pod(core, ns, cluster):
    pods = [
        p
        for p in core.list_namespaced_pod(ns, label_selector=f"tfk8s.io/cluster={cluster}").items
        if p.status.phase == "Running" and not p.metadata.deletion_timestamp
    ]
    return pods[0] if len(pods) == 1 else None


def _uncordon(core, name):
    core.patch_node(name, {"spec": {"unschedulable": False}})


def test_a_task_pod_moves_to_the_other_node_when_its_node_is_drained(two, user):
    from tfk8s_magics.spec import ClusterSpec

    core, ns = user.core, user.ns
    backend = user.backend()
    cordoned = None
    try:
        backend.launch(
            ClusterSpec(name="drain", workers=1, script=LONG, restart_budget=3, **_claims()), detach=True
        )
        pod = wait_for(lambda: _task_pod(core, ns, "drain"), BOUND, 1, "the task pod running")
        cordoned = pod.spec.node_name
        other = next(n for n in two if n != cordoned)
        core.patch_node(cordoned, {"spec": {"unschedulable": True}})
        core.create_namespaced_pod_eviction(
            pod.metadata.name, ns, {"metadata": {"name": pod.metadata.name, "namespace": ns}}
        )
        moved = wait_for(
            lambda: (p := _task_pod(core, ns, "drain")) and p.metadata.uid != pod.metadata.uid and p,
            BOUND,
            1,
            "the task pod recreated and running",
        )
        assert moved.spec.node_name == other, (moved.spec.node_name, cordoned)
        assert ipaddress.ip_address(moved.status.pod_ip) in ipaddress.ip_network(_nets()[other].pod_cidr)
        backend.delete("drain")
    finally:
        if cordoned:
            _uncordon(core, cordoned)
        backend.close()


OUT_OF_SERVICE = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}
UNREACHABLE = (
    {
        "key": "node.kubernetes.io/unreachable",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 5,
    },
    {
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 5,
    },
)


def test_a_task_pod_moves_to_the_other_node_when_its_kubelet_stops(two, user, realnode):
    """The node stops reporting; the node lifecycle controller taints it and evicts the pod (which
    tolerates that for 5 s instead of the default 300 s). The evicted pod stays Terminating (no
    kubelet confirms it), and the Job JobSet made replaces a pod only once it has failed
    (``podReplacementPolicy: Failed``), so, as an operator does for a node that is gone
    (non-graceful node shutdown), the node gets the ``out-of-service`` taint: the pod GC deletes
    its pods and the Job puts a new one on the other node."""
    from tfk8s_magics.spec import ClusterSpec

    core, ns = user.core, user.ns
    backend = user.backend()
    stopped = None
    try:
        spec = ClusterSpec(
            name="lost", workers=1, script=LONG, restart_budget=3, tolerations=UNREACHABLE, **_claims()
        )
        backend.launch(spec, detach=True)
        pod = wait_for(lambda: _task_pod(core, ns, "lost"), BOUND, 1, "the task pod running")
        stopped = pod.spec.node_name
        other = next(n for n in two if n != stopped)
        node.node_procs(realnode_cluster(), stopped).stop("kubelet")
        wait_for(
            lambda: core.read_namespaced_pod(pod.metadata.name, ns).metadata.deletion_timestamp,
            BOUND,
            2,
            "the pod on the silent node evicted",
        )
        core.patch_node(
            stopped, {"spec": {"taints": [*(core.read_node(stopped).spec.taints or []), OUT_OF_SERVICE]}}
        )
        moved = wait_for(
            lambda: (p := _task_pod(core, ns, "lost")) and p.metadata.uid != pod.metadata.uid and p,
            BOUND,
            2,
            "the task pod recreated on another node",
        )
        assert moved.spec.node_name == other, (moved.spec.node_name, stopped)
        backend.delete("lost")
    finally:
        if stopped:
            taints = [t for t in core.read_node(stopped).spec.taints or [] if t.key != OUT_OF_SERVICE["key"]]
            keep = [realnode.admin.sanitize_for_serialization(t) for t in taints]
            core.patch_node(stopped, {"spec": {"taints": keep or None}})
            procs = node.node_procs(realnode_cluster(), stopped)
            if not procs.alive("kubelet"):
                procs.restart("kubelet")
            wait_for(lambda: stopped in _real_nodes(realnode), BOUND, 2, f"{stopped} Ready again")
        backend.close()


def test_status_reports_every_real_node():
    out = node.status(realnode_cluster())
    if not out:
        require_or_skip("no real nodes here: scripts/kube up --pods")
    assert json.dumps(out)  # plain data
    assert out["dns"] == {"coredns": True}
    assert {k for k in out if k != "dns"} >= {node.NODE_NAMES[0], node.NODE_NAMES[1]}
