"""Tenancy on the enforcing multi-node cluster (markers ``netpol`` and ``k8s``; tier 2 with its
NetworkPolicy enforcer, Cilium: ``scripts/kube up --pods``).

Every attack runs twice: first with the policies removed, where it must succeed (so the test can
fail), then with them in place, where it must be refused. The policies are the lab's own: each
user namespace's is the one the hub's bootstrap builds (``tfk8s_hub.bootstrap``, applied as the
hub applies it), the hub's and the proxy's and the Cilium policies are the chart's (``helm
template``, as ``helm install`` on a cluster serving Cilium's CRDs renders them).

- User B's pods -- a pod of B's namespace, and a cluster B's notebook launches with B's own
  token -- open no TCP connection to any of user A's servers: the TensorFlow gRPC ports of A's
  parameter server and workers, A's notebook server and kernel ports, A's TensorBoard and A's
  served model; by pod address and by DNS name (JobSet's, the Services'), from a pod on the same
  node and from one on the other node.
- What must keep working does, with the policies in place: A's own pods reach all of them on
  both nodes (A's notebook reaches A's in-graph servers), names resolve through the node-local
  cache, A's workers all-reduce across nodes (MWMS, one worker per node).
- A user pod reaches the hub's API port (as the chart intends) but no other port of the hub's
  and proxy's pods, not the cloud metadata address (169.254.169.254, except its DNS port: GKE's
  Cloud DNS), and no private address outside the cluster. Both are test hosts in network
  namespaces this test makes on the node bridge, never real ones.

The served model's pod is the backend's own serving Deployment and Service with a Python
listener in place of ``tensorflow_model_server`` (no TF Serving image on the offline nodes): what
is under test is the path of a packet to its labels and ports, not the model server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import tests.test_k8s_pods as pods_tests
import tests.test_kube_netpol as enforcer_tests
from tests.realkube import wait_for
from tests.test_k8s_pods import NOTEBOOK_IMAGE, TASK_IMAGE, User, _claims, _restricted_pod
from tests.test_kube_nodes import _on, _running

realnode, enforcing = pods_tests.realnode, enforcer_tests.enforcing

pytestmark = [pytest.mark.k8s, pytest.mark.netpol]

REPO = Path(__file__).resolve().parent.parent
BOUND = 600.0
#: How long an enforcer may take to apply a changed policy to packets.
PROPAGATION = 90.0
KERNEL_PORTS = (50001, 50002, 50003, 50004, 50005)  # shell, iopub, stdin, control, heartbeat
METADATA = "169.254.169.254"
OUTSIDE = "192.168.77.10"  # a private address outside the cluster's ranges
TEST_HOST = 250  # the test hosts' namespace on the slot's node bridge: 10.246.<slot>.250

#: Connects to every target at once, every second, forever; one JSON line per round:
#: {"start": t, "open": [...]} (every connection of the round began after ``start``).
PROBE = r"""
import json, os, socket, threading, time
targets = json.loads(os.environ["TARGETS"])
def attempt(label, host, port, opened):
    try:
        with socket.create_connection((host, int(port)), timeout=3):
            opened.append(label)
    except OSError:
        pass
while True:
    start, opened = time.time(), []
    threads = [threading.Thread(target=attempt, args=(*t, opened)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"start": start, "open": sorted(opened)}), flush=True)
    time.sleep(1)
"""

#: A notebook server and a kernel on fixed ports, as the single-user image runs them.
NOTEBOOK = """
import json, os, subprocess, sys
names = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
conn = {"ip": "0.0.0.0", "transport": "tcp", "key": os.urandom(16).hex(),
        "signature_scheme": "hmac-sha256", "kernel_name": "python3",
        **dict(zip(names, map(int, os.environ["KERNEL_PORTS"].split())))}
with open("/tmp/kernel.json", "w") as f:
    json.dump(conn, f)
subprocess.Popen([sys.executable, "-m", "ipykernel_launcher", "-f", "/tmp/kernel.json"])
os.execvp("jupyter", ["jupyter", "server", "--ip=0.0.0.0", "--port=8888", "--no-browser",
                      "--ServerApp.token=" + os.urandom(16).hex(), "--ServerApp.root_dir=/tmp"])
"""

#: Listens on the given TCP ports (a stand-in server process where no image has the real one).
LISTEN = """
import os, socket, threading
def serve(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((os.environ.get("ADDRESS", "0.0.0.0"), port)); s.listen(16)
    while True:
        c, _ = s.accept(); c.close()
for p in os.environ["PORTS"].split():
    threading.Thread(target=serve, args=(int(p),), daemon=True).start()
threading.Event().wait()
"""


# -- the lab's policies, applied and removed as an administrator would ---------------------------


def _bootstrap_policy(user: User):
    from tfk8s_hub.bootstrap import BootstrapSpec, network_policy

    spec = user.bootstrap or BootstrapSpec(hub_namespace="default")
    api = user.kube.api_server() if spec.discovers_api_server else None
    return network_policy(spec, user.ns, api)


CILIUM_KINDS = {"CiliumNetworkPolicy": "ciliumnetworkpolicies",
                "CiliumClusterwideNetworkPolicy": "ciliumclusterwidenetworkpolicies"}


def chart_policies(helm: Path, namespace: str) -> list[dict]:
    """The chart's policies for a release in ``namespace``: the hub's and the proxy's
    NetworkPolicies and the Cilium policies (the user namespaces' and the hub's)."""
    from test_helm import CHART, JOBSET_API

    out = subprocess.run([str(helm), "template", "lab", str(CHART), "--namespace", namespace,
                          "--set", "networkPolicy.ciliumApiServer=true", *JOBSET_API],
                         capture_output=True, text=True, check=True).stdout
    docs = [d for d in yaml.safe_load_all(out)
            if d and d["kind"] in ("NetworkPolicy", *CILIUM_KINDS)]
    for d in docs:
        if d["kind"] != "CiliumClusterwideNetworkPolicy":
            d["metadata"]["namespace"] = namespace
    return docs


def remove_policies(kube, namespaces: list[str], chart: list[dict] = ()) -> None:
    """Delete every NetworkPolicy of ``namespaces`` and the chart's objects ``chart`` (the defence
    removed: a Cilium policy with egress rules alone would put its pods in default deny)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    net = client.NetworkingV1Api(kube.admin)
    for ns in namespaces:
        for p in net.list_namespaced_network_policy(ns).items:
            net.delete_namespaced_network_policy(p.metadata.name, ns)
    for d in chart:
        name, ns = d["metadata"]["name"], d["metadata"].get("namespace")
        try:
            if d["kind"] == "NetworkPolicy":
                net.delete_namespaced_network_policy(name, ns)
            elif d["kind"] == "CiliumClusterwideNetworkPolicy":
                kube.custom.delete_cluster_custom_object("cilium.io", "v2", CILIUM_KINDS[d["kind"]], name)
            else:
                kube.custom.delete_namespaced_custom_object("cilium.io", "v2", ns, CILIUM_KINDS[d["kind"]],
                                                            name)
        except ApiException as e:
            if e.status != 404:
                raise


def restore_policies(kube, users: list[User], chart: list[dict] = ()) -> None:
    """Apply each user's bootstrap policy (as the hub does) and the chart's objects."""
    kube.apply([_bootstrap_policy(u) for u in users] + list(chart))


@pytest.fixture(scope="module")
def helm(request, tmp_path_factory) -> Path:
    """The helm binary, as tests/test_helm.py extracts it."""
    from test_helm import helm_binary

    return helm_binary(request, tmp_path_factory)


# -- probes --------------------------------------------------------------------------------------


class Probe:
    """A pod that connects to every target once a second and logs which ones opened."""

    def __init__(self, user: User | None, name: str, node_name: str, targets: list[tuple[str, str, int]],
                 core=None, ns: str = "", labels: dict | None = None, image: str = TASK_IMAGE):
        self.core = core or user.core
        self.ns = ns or user.ns
        self.name = name
        self.labels = [t[0] for t in targets]
        pod = _on(_restricted_pod(name, image, ["python3", "-c", PROBE],
                                  env={"TARGETS": json.dumps(targets)}), node_name)
        if labels:
            pod["metadata"]["labels"] = labels
        self.core.create_namespaced_pod(self.ns, pod)
        _running(self.core, self.ns, name)

    def rounds(self) -> list[dict]:
        log = self.core.read_namespaced_pod_log(self.name, self.ns, tail_lines=50)
        return [json.loads(line) for line in log.splitlines() if line.startswith("{")]

    def wait(self, expect: set[str], since: float, timeout: float = PROPAGATION) -> set[str]:
        """Wait until the last round begun after ``since`` opened exactly ``expect``."""
        last: set[str] | None = None

        def settled():
            nonlocal last
            late = [set(r["open"]) for r in self.rounds() if r["start"] > since]
            last = late[-1] if late else last
            return last == expect

        try:
            wait_for(settled, timeout, 1, f"{self.name} to open exactly {sorted(expect)}")
        except AssertionError:
            raise AssertionError(f"{self.name}: expected open {sorted(expect)}, last round opened "
                                 f"{sorted(last) if last is not None else 'nothing yet'}") from None
        return last

    def delete(self) -> None:
        self.core.delete_namespaced_pod(self.name, self.ns, grace_period_seconds=0)


# -- user A's servers ----------------------------------------------------------------------------


class Servers:
    """User A's servers on both real nodes, and the targets an attacker would try."""

    def __init__(self, a: User, nodes: list[str]):
        from tfk8s_magics.spec import ClusterSpec

        self.a, self.nodes = a, nodes
        core, ns = a.core, a.ns
        self.backend = a.backend()
        # an in-graph cluster: the parameter server on one node, the workers on the other
        spec = ClusterSpec(name="ig", mode="in-graph", ps=1, workers=1, node_affinity={
            "ps": (f"kubernetes.io/hostname={nodes[0]}",),
            "worker": (f"kubernetes.io/hostname={nodes[1]}",)}, **_claims())
        self.backend.launch(spec, detach=True)
        # the notebook server and its kernel, on the first node
        nb = _on(_restricted_pod("notebook", NOTEBOOK_IMAGE, ["python", "-c", NOTEBOOK],
                                 env={"KERNEL_PORTS": " ".join(map(str, KERNEL_PORTS))}), nodes[0])
        core.create_namespaced_pod(ns, nb)
        # the served model: the backend's Deployment and Service, a listener for the model server
        served = self.backend.render_serving(spec, "ig")
        for m in served:
            if m["kind"] == "Deployment":
                pod = m["spec"]["template"]["spec"]
                pod["nodeSelector"] = {"kubernetes.io/hostname": nodes[1]}
                pod.pop("initContainers", None)
                c = pod["containers"][0]
                c.update(image=TASK_IMAGE, imagePullPolicy="Never", command=["python", "-c", LISTEN],
                         args=[], env=[{"name": "PORTS", "value": "8500 8501"}])
                c.pop("readinessProbe", None)
            a.kube.apply([{**m, "metadata": {**m["metadata"], "namespace": ns}}])
        self.tb = self.backend.tensorboard("ig")
        self.serving_service = next(m for m in served if m["kind"] == "Service")["metadata"]["name"]

    def targets(self) -> list[tuple[str, str, int]]:
        """Every (label, host, port) of A's servers, by pod address and by DNS name."""
        core, ns = self.a.core, self.a.ns
        wait_for(lambda: self.backend.status("ig").phase == "running", BOUND, 2, "A's cluster running")
        out: list[tuple[str, str, int]] = []
        for role, hosts in self.backend.addresses("ig").items():
            for i, host_port in enumerate(hosts):
                host, port = host_port.rsplit(":", 1)
                out.append((f"{role}-{i} grpc by name", host, int(port)))
        for component in ("tensorboard", "serving"):  # their Deployments' pods, once running
            wait_for(lambda c=component: [p for p in core.list_namespaced_pod(
                ns, label_selector=f"tfk8s.io/cluster=ig,tfk8s.io/component={c}").items
                if p.status.phase == "Running"], BOUND, 2, f"A's {component} pod running")
        for p in core.list_namespaced_pod(ns, label_selector="tfk8s.io/cluster=ig").items:
            if p.status.phase != "Running" or not p.status.pod_ip or p.metadata.deletion_timestamp:
                continue
            labels = p.metadata.labels or {}
            role = labels.get("jobset.sigs.k8s.io/replicatedjob-name")
            if role:
                out.append((f"{role} grpc by address", p.status.pod_ip, self.backend.settings.port))
            elif labels.get("tfk8s.io/component") == "serving":
                out += [(f"served model {port} by address", p.status.pod_ip, port) for port in (8500, 8501)]
            elif labels.get("tfk8s.io/component") == "tensorboard":
                out.append(("tensorboard by address", p.status.pod_ip, self.tb.port))
        nb = _running(core, ns, "notebook")
        out.append(("notebook server by address", nb.status.pod_ip, 8888))
        out += [(f"kernel {port} by address", nb.status.pod_ip, port) for port in KERNEL_PORTS]
        tb_host = self.tb.url.rstrip("/").rsplit("/", 1)[1].split(":", 1)[0]  # .../<host>:<port>/
        out.append(("tensorboard by name", tb_host, self.tb.port))
        out += [(f"served model {port} by name", f"{self.serving_service}.{ns}.svc", port)
                for port in (8500, 8501)]
        return out


@pytest.fixture(scope="module")
def two(enforcing):
    """The names of two real nodes, each with its enforcer ready (test_kube_netpol's check)."""
    _, layouts = enforcing
    return [n.name for n in layouts]


@pytest.fixture(scope="module")
def tenants(realnode, two, tmp_path_factory, helm):
    """Users A and B, bootstrapped as the hub does (each with the bootstrap's NetworkPolicy, and the
    chart's Cilium policy for the user namespaces of a hub in ``default``), and A's servers running
    on both nodes."""
    chart = [d for d in chart_policies(helm, "default") if d["kind"] == "CiliumClusterwideNetworkPolicy"]
    a = User(realnode, tmp_path_factory.mktemp("a"), prefix="alice")
    b = User(realnode, tmp_path_factory.mktemp("b"), prefix="bob")
    try:
        restore_policies(realnode, [a, b], chart)
        servers = Servers(a, two)
        targets = servers.targets()
        yield a, b, servers, targets, chart
    finally:
        remove_policies(realnode, [], chart)
        for u in (a, b):
            u.close()


def test_user_b_reaches_none_of_user_as_servers_from_either_node(realnode, two, tenants):
    a, b, servers, targets, chart = tenants
    labels = {t[0] for t in targets}
    # the attack first succeeds: no policy in either namespace
    remove_policies(realnode, [a.ns, b.ns], chart)
    since = time.time()
    probes = [Probe(b, f"attack-{i}", node, targets) for i, node in enumerate(two)]
    try:
        for p in probes:  # same node for some servers, the other node for the rest
            p.wait(labels, since, BOUND)  # (A's servers may still be starting)
        # in place: every connection refused, from both nodes, by address and by name
        restore_policies(realnode, [a, b], chart)
        since = time.time()
        for p in probes:
            p.wait(set(), since)
        # A's ingress rule alone keeps B out: B's egress opened to every private address
        # (an administrator's privateIPs), A's policy in place
        remove_policies(realnode, [b.ns])
        since = time.time()
        for p in probes:
            p.wait(set(), since)
    finally:
        for p in probes:
            p.delete()
        restore_policies(realnode, [a, b], chart)


def test_what_b_launches_with_bs_own_token_reaches_none_of_as_servers(realnode, two, tenants):
    """B's notebook acting with B's token: a cluster B's backend launches (B's ServiceAccount),
    its two workers spread over both nodes, probing A's servers."""
    from tfk8s_magics.spec import ClusterSpec

    a, b, servers, targets, chart = tenants
    backend = b.backend()
    script = f"import os\nos.environ['TARGETS'] = {json.dumps(targets)!r}\nexec({PROBE!r})\n"
    remove_policies(realnode, [a.ns, b.ns], chart)
    try:
        backend.launch(ClusterSpec(name="steal", workers=2, script=script, spread=("worker",),
                                   **_claims()), detach=True)
        wait_for(lambda: backend.status("steal").phase == "running", BOUND, 2, "B's cluster running")
        pods = b.core.list_namespaced_pod(b.ns, label_selector="tfk8s.io/cluster=steal").items
        assert {p.spec.node_name for p in pods} == set(two)

        def opened(since: float) -> list[set[str]]:
            out = []
            for p in b.core.list_namespaced_pod(b.ns, label_selector="tfk8s.io/cluster=steal").items:
                log = b.core.read_namespaced_pod_log(p.metadata.name, b.ns, tail_lines=20)
                rounds = [json.loads(x) for x in log.splitlines() if x.startswith("{")]
                late = [set(r["open"]) for r in rounds if r["start"] > since]
                out.append(late[-1] if late else None)
            return out

        labels = {t[0] for t in targets}
        since = time.time()
        wait_for(lambda: opened(since) == [labels, labels], PROPAGATION, 2, "B's tasks reaching A")
        restore_policies(realnode, [a, b], chart)
        since = time.time()
        wait_for(lambda: opened(since) == [set(), set()], PROPAGATION, 2, "B's tasks refused")
    finally:
        restore_policies(realnode, [a, b], chart)
        backend.delete("steal")


def test_as_own_pods_reach_as_servers_and_names_resolve_through_the_node_local_cache(realnode, two, tenants):
    """With the policies in place: A's notebook (and any pod of A's) reaches A's in-graph servers,
    notebook, TensorBoard and model on both nodes; every name was resolved by the node-local cache
    (the pods' only resolver), so DNS passes the policy too."""
    a, _, _, targets, chart = tenants
    restore_policies(realnode, [a], chart)
    probes = [Probe(a, f"own-{i}", node, targets) for i, node in enumerate(two)]
    try:
        for p in probes:
            p.wait({t[0] for t in targets}, 0, BOUND)
        resolv = _resolv_conf(a, two[0])
        assert resolv == ["169.254.25.10"], resolv
    finally:
        for p in probes:
            p.delete()


def _resolv_conf(user: User, node_name: str) -> list[str]:
    from tests.test_k8s_pods import _pod_log

    pod = _on(_restricted_pod("resolv", TASK_IMAGE, ["cat", "/etc/resolv.conf"]), node_name)
    user.core.create_namespaced_pod(user.ns, pod)
    phase, log = _pod_log(user.core, user.ns, "resolv")
    assert phase == "Succeeded", log
    user.core.delete_namespaced_pod("resolv", user.ns)
    return [line.split()[1] for line in log.splitlines() if line.startswith("nameserver")]


def test_mwms_all_reduces_across_nodes_under_the_policy(realnode, enforcing, tenants):
    """A's MWMS workers, one on each node, all-reduce under the bootstrap's policy and the chart's:
    the peers are JobSet DNS names (the headless Service), resolved through the node-local cache
    to pod addresses, one in each node's pod range; delete leaves no pod. (The one MWMS test on
    the real nodes.)"""
    import ipaddress
    import re

    from tests.test_k8s_pods import MWMS, _wait
    from tfk8s_magics.spec import ClusterSpec

    a, *_, chart = tenants
    _, layouts = enforcing
    restore_policies(realnode, [a], chart)
    backend = a.backend()
    backend.launch(ClusterSpec(name="ar", workers=2, script=MWMS, spread=("worker",), **_claims()),
                   detach=True)
    status = _wait(backend, "ar", lambda s: s.terminal)
    lines = [line.text for line in backend.read_logs("ar")]
    assert status.phase == "succeeded", (status, lines)
    assert "sum 2.0 from worker-0" in lines and "sum 2.0 from worker-1" in lines, lines
    pods = a.core.list_namespaced_pod(a.ns, label_selector="tfk8s.io/cluster=ar").items
    assert {p.spec.node_name for p in pods} == {n.name for n in layouts}  # the all-reduce crossed nodes
    resolved = [line.split() for line in lines if line.startswith("resolved ")]
    assert len(resolved) == 4, lines  # each worker resolved both names
    assert not [host for _, host, _ in resolved if re.fullmatch(r"[0-9.]+", host)], resolved
    cidrs = {str(ipaddress.ip_network(f"{ip}/24", strict=False)) for *_, ip in resolved}
    assert cidrs == {n.net.pod_cidr for n in layouts}, resolved
    backend.delete("ar")
    assert not a.core.list_namespaced_pod(a.ns, label_selector="tfk8s.io/cluster=ar").items


# -- the hub, the metadata server, private addresses outside the cluster -------------------------


class OffClusterHosts:
    """A network namespace on the cluster's node bridge holding the metadata address and a private
    address outside the cluster, each listening on TCP 80 and 53; a route to each from every real
    node. Everything is removed by :meth:`close`."""

    def __init__(self, nets):
        from devcluster import network

        self.network, self.nets = network, nets
        slot = network.Slot(nets[0].slot)
        self.netns = f"tfk8s-s{slot.k}np"
        self.address = f"10.246.{slot.k}.{TEST_HOST}"
        ip = network.ip
        ip("netns", "add", self.netns)
        ip("link", "add", self.netns, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        ip("link", "set", self.netns, "master", slot.bridge, "up")
        run = ["ip", "-n", self.netns]
        for args in (["link", "set", "lo", "up"], ["addr", "add", self.address + "/24", "dev", "eth0"],
                     ["addr", "add", METADATA + "/32", "dev", "lo"],
                     ["addr", "add", OUTSIDE + "/32", "dev", "lo"], ["link", "set", "eth0", "up"]):
            subprocess.run([*run, *args], check=True)
        for n in nets:  # answers to pods go back through their node
            subprocess.run([*run, "route", "add", n.pod_cidr, "via", n.ip], check=True)
            for addr in (METADATA, OUTSIDE):
                ip("route", "replace", addr + "/32", "via", self.address, "dev", "eth0", node=n)
        self.server = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, sys.executable, "-c", LISTEN],
            env={**os.environ, "PORTS": "80 53", "ADDRESS": "0.0.0.0"})

    def close(self):
        self.server.terminate()
        self.server.wait(10)
        for n in self.nets:
            for addr in (METADATA, OUTSIDE):
                self.network.ip("route", "del", addr + "/32", node=n, check=False)
        self.network.ip("link", "del", self.netns, check=False)
        self.network.ip("netns", "del", self.netns, check=False)


@pytest.fixture(scope="module")
def test_hosts(cilium_nodes):
    from devcluster import node

    layouts = [n for n in node.layouts(enforcer_tests._cluster()) if n.name in cilium_nodes]
    hosts = OffClusterHosts([n.net for n in layouts])
    yield hosts
    hosts.close()


def test_a_user_pod_reaches_the_hub_api_only_and_neither_metadata_nor_outside_addresses(
        realkube, cilium_nodes, tmp_path_factory, test_hosts, helm):
    from tfk8s_hub.bootstrap import BootstrapSpec

    realnode, two = realkube, cilium_nodes
    image = _base_image(realkube, two[0])  # the stand-ins need python3 only

    hub_ns = realnode.namespace("hub")
    labels = {"app.kubernetes.io/name": "tfk8s-lab", "app.kubernetes.io/instance": "lab"}
    core = realnode.core
    for component, ports in (("hub", "8081 9090"), ("proxy", "8000 8001")):
        pod = _on(_restricted_pod(component, image, ["python3", "-c", LISTEN],
                                  env={"PORTS": ports}), two[1])
        pod["metadata"]["labels"] = {**labels, "app.kubernetes.io/component": component}
        pod["spec"].pop("tolerations", None)
        core.create_namespaced_pod(hub_ns, pod)
    hub, proxy = _running(core, hub_ns, "hub"), _running(core, hub_ns, "proxy")
    spec = BootstrapSpec(hub_namespace=hub_ns)
    user = User(realnode, tmp_path_factory.mktemp("c"), prefix="carol", bootstrap=spec)
    targets = [("hub api", hub.status.pod_ip, 8081), ("hub other port", hub.status.pod_ip, 9090),
               ("proxy api", proxy.status.pod_ip, 8001), ("proxy public", proxy.status.pod_ip, 8000),
               ("metadata http", METADATA, 80), ("metadata dns", METADATA, 53),
               ("outside http", OUTSIDE, 80), ("outside dns", OUTSIDE, 53)]
    # the hub's own traffic: the proxy's API (the API server: tests/test_kube_hub.py, whose hub
    # spawns through it)
    hub_targets = [("proxy api", proxy.status.pod_ip, 8001),
                   ("metadata http", METADATA, 80), ("outside http", OUTSIDE, 80)]
    chart = chart_policies(helm, hub_ns)
    probes = []
    try:
        remove_policies(realnode, [user.ns], chart)
        since = time.time()
        probes = [Probe(user, f"reach-{i}", node, targets, image=image) for i, node in enumerate(two)]
        probes.append(Probe(None, "hub-probe", two[0], hub_targets, core=core, ns=hub_ns,
                            labels={**labels, "app.kubernetes.io/component": "hub"}, image=image))
        for p in probes:
            p.wait(set(p.labels), since, BOUND)
        restore_policies(realnode, [user], chart)
        since = time.time()
        # the hub API, as the chart intends; DNS ports of private and metadata addresses
        # (dnsPortsPrivateIPs, dnsPortsCloudMetadataServer); nothing else
        for p in probes[:2]:
            p.wait({"hub api", "metadata dns", "outside dns"}, since)
        # the hub reaches the proxy's API, and neither test host
        probes[2].wait({"proxy api"}, since)
    finally:
        remove_policies(realnode, [], chart)
        for p in probes:
            p.delete()
        user.close()


# -- the same attacks on the lab's policy, with the base image only -------------------------------


def _base_image(kube, node_name: str) -> str:
    """The lab images' base (Debian with python3) as the node's containerd has it, else the task
    image built on it (``scripts/kube up --pods`` imports the lab's images only); '' if neither."""
    names = [n for i in kube.core.read_node(node_name).status.images or [] for n in i.names or []]
    base = next((n for n in names if n.startswith("localhost/tfk8s/base:")), "")
    return base or (TASK_IMAGE if TASK_IMAGE in names else "")


@pytest.fixture(scope="module")
def cilium_nodes(realkube):
    """Two Ready real nodes with their Cilium agents ready (whatever images they hold)."""
    from devcluster import enforcer, node
    from tests.realkube import require_or_skip
    from tests.test_kube_nodes import _real_nodes

    names = _real_nodes(realkube)
    if len(names) < 2:
        require_or_skip(f"the devcluster has {len(names)} Ready real node(s), not 2: scripts/kube up --pods")
    nodes = {n.name: n for n in node.layouts(enforcer_tests._cluster())}
    for name in names[:2]:
        if not enforcer.agent_ready(nodes[name]):
            require_or_skip(f"the Cilium agent of {name} is not ready: see {nodes[name].state / 'logs'}")
    return names[:2]
