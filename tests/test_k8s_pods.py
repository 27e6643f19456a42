"""Real pods on the test cluster's real nodes (marker ``k8s``): devcluster tier 2.

Needs ``scripts/kube up --pods``: the control plane of ``devcluster/`` plus the real nodes
``devcluster/node.py`` joins to it (each in its own network namespace: containerd + runc, a
kubelet, kube-proxy, a node-local DNS cache, the pod bridge; CoreDNS on the host), with the
images of ``scripts/build_images.py`` imported into their containerd. Skips with the reason when
the first node is not there (fails instead under ``TFK8S_REQUIRE_K8S``).

Every cluster is launched through the project's Kubernetes backend acting as the user's own
ServiceAccount (bound to the shipped Role only), in a namespace under Pod Security
``restricted``. The claims are hostPath PersistentVolumes made by the admin (the nodes have no
provisioner; every node is this machine, so each mounts the same directory).

What runs: a 2-worker MultiWorkerMirroredStrategy cluster whose workers all-reduce across pods
by their JobSet DNS names; a TF1 parameter-server cluster; an in-graph cluster driven from a
notebook pod; a killed worker pod restarted by JobSet within the budget; a task's log followed
live through a quiet period longer than the client's request timeout; and, while pods talk, proof
that no packet of the node's address ranges leaves by the machine's outside interface.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from devcluster import node

pytestmark = pytest.mark.k8s

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TASK_IMAGE = os.environ.get("TFK8S_NODE_TASK_IMAGE", "localhost/tfk8s/tensorflow-task:0.1.0")
NOTEBOOK_IMAGE = os.environ.get("TFK8S_NODE_NOTEBOOK_IMAGE", "localhost/tfk8s/notebook:0.1.0")
BOUND = 600.0  # seconds any one wait may take on a loaded 2-core machine


@pytest.fixture(scope="module")
def realnode(realkube):
    """The devcluster with its real node Ready and the lab's images in the node's containerd."""
    from tests.realkube import require_or_skip

    try:
        n = realkube.core.read_node(node.NODE_NAME, _request_timeout=10)
    except Exception as e:  # noqa: BLE001 - any failure means: no real node here
        require_or_skip(
            f"the devcluster has no real node {node.NODE_NAME!r} ({e}): start it with scripts/kube up --pods"
        )
    ready = {c.type: c.status for c in n.status.conditions or []}.get("Ready")
    if ready != "True":
        require_or_skip(
            f"node {node.NODE_NAME} is not Ready ({ready}): see its logs in "
            f"{node.cache_root() / 'cluster' / 'nodes' / node.NODE_NAME / 'logs'}"
        )
    images = {name for i in n.status.images or [] for name in i.names or []}
    for image in (TASK_IMAGE, NOTEBOOK_IMAGE):
        if image not in images:
            require_or_skip(
                f"{image} is not in the node's containerd: run scripts/build_images.py "
                f"task notebook, then scripts/kube up --pods imports it"
            )
    return realkube


class User:
    """A lab user's namespace as the hub bootstraps it (Pod Security ``restricted``, ServiceAccount,
    Role, LimitRange, quota, NetworkPolicy), hostPath claims owned by the task user, and backends
    acting as the user's own ServiceAccount token."""

    def __init__(self, kube, tmp: Path, prefix: str = "pods", bootstrap=None):
        self.kube = kube
        self.admin = kube.admin
        self.core = kube.core
        self.bootstrap = bootstrap
        # pods go to the real nodes
        self.ns_obj = kube.user_namespace(prefix, bootstrap=bootstrap, kwok=False)
        self.ns = self.ns_obj.name
        self.pvs: list[str] = []
        self.paths: dict[str, Path] = {}  # claim → its hostPath on this machine
        self.backends = []
        self.expect_denied: set[str] = set()  # request paths a test makes to prove a refusal
        for claim in ("logs", "data"):
            path = tmp / f"{self.ns}-{claim}"
            path.mkdir()
            os.chown(path, 1000, 1000)  # the tasks run as 1000 (a hostPath ignores fsGroup)
            self.paths[claim] = path
            pv = f"{self.ns}-{claim}"
            self.core.create_persistent_volume(
                {
                    "metadata": {"name": pv},
                    "spec": {
                        "capacity": {"storage": "1Gi"},
                        "accessModes": ["ReadWriteMany"],
                        "persistentVolumeReclaimPolicy": "Retain",
                        "storageClassName": "",
                        "hostPath": {"path": str(path), "type": "Directory"},
                        "claimRef": {"namespace": self.ns, "name": claim},
                    },
                }
            )
            self.pvs.append(pv)
            self.core.create_namespaced_persistent_volume_claim(
                self.ns,
                {
                    "metadata": {"name": claim},
                    "spec": {
                        "accessModes": ["ReadWriteMany"],
                        "storageClassName": "",
                        "volumeName": pv,
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                },
            )

    def backend(self, **kw):
        """The Kubernetes backend as the user's ServiceAccount, with the imported task image."""
        from tfk8s_magics.backends.kubernetes import KubernetesBackend

        b = KubernetesBackend(
            namespace=self.ns, api_client=self.ns_obj.api_client, user="pods", image=TASK_IMAGE, **kw
        )
        self.backends.append(b)
        return b

    def close(self):
        for b in self.backends:
            b.close()
        for r in self.ns_obj.requests():
            if r.uri.split("?")[0] in self.expect_denied:
                continue
            assert r.code != 403, f"{r.verb} {r.uri} was denied to the user: the shipped Role lacks it"
        self.core.delete_namespace(self.ns)
        # A terminating namespace takes no new object: its pods may go at once (the test is over),
        # instead of each waiting out its grace period before the namespace can go.
        self.core.delete_collection_namespaced_pod(self.ns, grace_period_seconds=0)
        # The PVs go once their claims have (pv-protection holds them until then). The namespace
        # takes about 11 s more (the namespace controller's first pass waits 5 s, then the claims'
        # pvc-protection): the next test need not wait for it, the session's end checks it went.
        for pv in self.pvs:
            self.core.delete_persistent_volume(pv)
        self.kube.leaving.append(self.ns)


@pytest.fixture
def user(realnode, tmp_path_factory):
    u = User(realnode, tmp_path_factory.mktemp("pv"))
    try:
        yield u
    finally:
        u.close()


def _claims(**kw):
    return {"log_claim": "logs", "data_claim": "data", **kw}


def _wait(backend, name, predicate, timeout=BOUND):
    deadline = time.monotonic() + timeout
    stop = threading.Event()
    while time.monotonic() < deadline:
        for status in backend.watch(name, stop):
            if predicate(status):
                return status
            if time.monotonic() > deadline:
                break
        status = backend.status(name)
        if predicate(status):
            return status
        time.sleep(1)
    raise AssertionError(f"timed out; last status {backend.status(name)}")


def _pod_log(core, ns, pod, timeout=BOUND):
    deadline = time.monotonic() + timeout
    while core.read_namespaced_pod(pod, ns).status.phase not in ("Succeeded", "Failed"):
        assert time.monotonic() < deadline, f"pod {pod} did not finish"
        time.sleep(2)
    return core.read_namespaced_pod(pod, ns).status.phase, core.read_namespaced_pod_log(pod, ns)


def _restricted_pod(name: str, image: str, argv: list[str], env: dict[str, str] | None = None):
    """A pod that passes Pod Security ``restricted`` (as the notebook's pod does)."""
    return {
        "metadata": {"name": name, "labels": {"component": "singleuser-server"}},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "runAsGroup": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": argv,
                    "env": [{"name": k, "value": v} for k, v in {"HOME": "/tmp", **(env or {})}.items()],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }


MWMS = """
import json, os, socket
import tensorflow as tf
cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
for addr in cluster["worker"]:
    host = addr.rsplit(":", 1)[0]
    print("resolved", host, socket.gethostbyname(host), flush=True)
strategy = tf.distribute.MultiWorkerMirroredStrategy()
total = strategy.reduce(tf.distribute.ReduceOp.SUM,
                        strategy.run(lambda: tf.constant(1.0)), axis=None)
print("sum", float(total), "from", os.environ["TFK8S_TASK"], flush=True)
"""


def test_in_graph_cluster_driven_from_a_notebook_pod(user):
    from tfk8s_magics.spec import ClusterSpec

    backend = user.backend()
    try:
        backend.launch(ClusterSpec(name="ig", mode="in-graph", ps=1, workers=2, **_claims()), detach=True)
        _wait(backend, "ig", lambda s: s.phase == "running" or s.terminal)
        client_script = (
            "import json, os, socket\n"
            "import tensorflow as tf\n"
            "cluster = json.loads(os.environ['CLUSTER'])\n"
            "cluster['chief'] = [socket.gethostbyname(socket.gethostname()) + ':2223']\n"
            "resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(\n"
            "    tf.train.ClusterSpec(cluster), task_type='chief', task_id=0, rpc_layer='grpc')\n"
            "strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)\n"
            "coord = tf.distribute.coordinator.ClusterCoordinator(strategy)\n"
            "with strategy.scope():\n"
            "    v = tf.Variable(0.0)\n"
            "@tf.function\n"
            "def step():\n"
            "    v.assign_add(1.0)\n"
            "    return v.read_value()\n"
            "for _ in range(10):\n"
            "    coord.schedule(step)\n"
            "coord.join()\n"
            "print('in-graph total', float(v.numpy()), 'on', v.device, flush=True)\n"
        )
        # the notebook image (the lab's kernel), as the user's server pod runs it
        user.core.create_namespaced_pod(
            user.ns,
            _restricted_pod(
                "notebook",
                NOTEBOOK_IMAGE,
                ["python", "-c", client_script],
                {"CLUSTER": json.dumps(backend.addresses("ig"))},
            ),
        )
        phase, log = _pod_log(user.core, user.ns, "notebook")
        assert phase == "Succeeded", log[-3000:]
        assert re.search(r"in-graph total 10\.0 on /job:ps/replica:0/task:0", log), log[-3000:]
        # its servers still run when stop returns: stopping, then stopped once they have ended
        assert backend.stop("ig").phase == "stopping"
        _wait(backend, "ig", lambda s: s.phase == "stopped")
        backend.delete("ig")
    finally:
        backend.close()


def _jobset(admin, ns, name):
    from kubernetes import client

    return client.CustomObjectsApi(admin).get_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", ns, "jobsets", name
    )


def test_a_killed_worker_pod_is_restarted_by_jobset_within_the_budget(user):
    from tfk8s_magics.spec import ClusterSpec

    backend = user.backend()
    try:
        # long enough to be killed while it works; once restarted (its mark on /log is there) short
        script = (
            "import os, time\n"
            "mark = os.path.join(os.environ['TFK8S_LOG_DIR'], '.ran-' + os.environ['JOB_COMPLETION_INDEX'])\n"
            "again = os.path.exists(mark)\nopen(mark, 'w').close()\n"
            "print('working', flush=True)\ntime.sleep(2 if again else 45)\nprint('done', flush=True)\n"
        )
        backend.launch(
            ClusterSpec(name="kill", workers=2, script=script, restart_budget=2, **_claims()), detach=True
        )
        _wait(backend, "kill", lambda s: s.phase == "running" and all(t.phase == "running" for t in s.tasks))
        victim = user.core.list_namespaced_pod(
            user.ns,
            label_selector="tfk8s.io/cluster=kill,tfk8s.io/role=worker,"
            "batch.kubernetes.io/job-completion-index=0",
        ).items[0]
        # kill the container's process the hard way, as an OOM or a node fault would
        user.core.delete_namespaced_pod(victim.metadata.name, user.ns, grace_period_seconds=0)
        _wait(
            backend,
            "kill",
            lambda s: all(t.restarts == 1 for t in s.tasks) and s.phase == "running",
            timeout=300,
        )
        assert _jobset(user.admin, user.ns, "kill")["status"]["restarts"] == 1
        status = _wait(backend, "kill", lambda s: s.terminal)
        assert status.phase == "succeeded", status
        backend.delete("kill")
    finally:
        backend.close()


def test_a_log_is_followed_live_through_a_quiet_period_longer_than_the_request_timeout(user):
    from tfk8s_magics.spec import ClusterSpec

    timeout = 10.0
    quiet = 35.0  # longer than this client's request timeout and than the default 30 s
    script = (
        "import time\nprint('before the quiet', flush=True)\n"
        f"time.sleep({quiet})\nprint('after the quiet', time.time(), flush=True)\n"
    )
    backend = user.backend(request_timeout=timeout)
    stop = threading.Event()
    seen: list[tuple[float, str]] = []

    def follow():
        for line in backend.follow_logs("quiet", stop):
            seen.append((time.time(), line.text))

    try:
        backend.launch(ClusterSpec(name="quiet", workers=1, script=script, **_claims()), detach=True)
        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        status = _wait(backend, "quiet", lambda s: s.terminal)
        assert status.phase == "succeeded", status
        deadline = time.monotonic() + 60
        while not any(t.startswith("after the quiet") for _, t in seen) and time.monotonic() < deadline:
            time.sleep(0.5)
        texts = [t for _, t in seen]
        assert "before the quiet" in texts, texts
        ((arrived, after),) = [(at, t) for at, t in seen if t.startswith("after the quiet")]
        printed = float(after.split()[-1])
        assert arrived - printed < 15, f"the line came {arrived - printed:.1f} s after it was printed"
        assert texts.count("before the quiet") == 1, texts  # no line twice after a re-open
        stop.set()
        follower.join(30)
        backend.delete("quiet")
    finally:
        stop.set()
        backend.close()


def _fence_chain() -> str:
    from devcluster.cluster import Cluster

    return node.slot_of(Cluster()).fence_chain


def _fence_packets() -> int:
    """Packets dropped by the fences in the hook: ours, and the other slots' hung in front of it
    (the same drop rules: whichever comes first counts the packet)."""
    hook = subprocess.run(
        ["iptables", "-w", "-t", node.FENCE_TABLE, "-S", node.FENCE_HOOK],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    chains = [w for w in hook if w.endswith("-FENCE")]
    assert _fence_chain() in chains, hook
    total = 0
    for chain in chains:
        r = subprocess.run(
            ["iptables", "-w", "-t", node.FENCE_TABLE, "-n", "-v", "-x", "-L", chain],
            capture_output=True,
            text=True,
            check=True,
        )
        total += sum(int(line.split()[0]) for line in r.stdout.splitlines()[2:] if line.strip())
    return total


PROBE = """
import socket
print("kubernetes", socket.gethostbyname("kubernetes.default.svc.cluster.local"), flush=True)
try:
    socket.getaddrinfo("example.com", 80)
    print("outside name resolved", flush=True)
except socket.gaierror as e:
    print("outside name refused", e.errno, flush=True)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for ip in ("10.244.200.1", "10.0.0.7", "192.0.2.1"):
    try:
        s.sendto(b"probe", (ip, 9))
        print("sent", ip, flush=True)
    except OSError as e:
        print("refused", ip, e.errno, flush=True)
"""


def test_no_packet_of_the_node_ranges_leaves_by_the_outside_interface(user, tmp_path):
    """While pods resolve names and address a pod range no node has, kwok's and an outside address
    (each unreachable: no node has a default route), the outside interface carries none of the
    cluster's ranges; and a packet of those ranges that does reach a route out (one sent from the
    host's end of the node bridge) is dropped by the fence, which counts it."""
    tcpdump = shutil.which("tcpdump")
    if not tcpdump:
        from tests.realkube import require_or_skip

        require_or_skip("tcpdump is missing: scripts/bootstrap kube-node")
    outside = node.outside_interfaces()
    assert outside, "no outside interface found"
    # the fence is in place, first in its hook, before any probe is sent
    rules = subprocess.run(
        ["iptables", "-w", "-t", node.FENCE_TABLE, "-S"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    chain = _fence_chain()
    for dev in outside:
        assert f"-A {chain} -s {node.POD_RANGE} -o {dev} -j DROP" in rules, rules
    hook = [r for r in rules if r.startswith(f"-A {node.FENCE_HOOK} ")]
    assert f"-A {node.FENCE_HOOK} -j {chain}" in hook, hook
    # nothing before it accepts: every chain hung in front of it is another slot's fence (drops only)
    before = hook[: hook.index(f"-A {node.FENCE_HOOK} -j {chain}")]
    assert all(r.split()[-1].endswith("-FENCE") for r in before), hook
    ranges = " or ".join(f"net {c}" for c in node.LOCAL_RANGES)
    captures = []
    for dev in outside:
        out = tmp_path / f"fence-{dev}.pcap"
        captures.append(
            (
                out,
                subprocess.Popen(
                    [tcpdump, "-i", dev, "-Q", "out", "-n", "-U", "-w", str(out), ranges],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                ),
            )
        )
    time.sleep(2)  # tcpdump listening
    before = _fence_packets()
    try:
        pod = _restricted_pod("probe", TASK_IMAGE, ["python", "-c", PROBE])
        user.core.create_namespaced_pod(user.ns, pod)
        phase, log = _pod_log(user.core, user.ns, "probe")
        assert phase == "Succeeded", log
        assert "kubernetes 10.96.0.1" in log, log
        assert "outside name refused" in log, log  # CoreDNS has no forward
        for ip in ("10.244.200.1", "10.0.0.7", "192.0.2.1"):
            # the pod's default route takes it to its node, which has no route for it
            assert f"sent {ip}" in log or f"refused {ip}" in log, log
        # the host's end of the node bridge is in the cluster's ranges; the machine's default
        # route would take this packet out: only the fence stops it
        from devcluster.cluster import Cluster

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((node.slot_of(Cluster()).host_ip, 0))
            with contextlib.suppress(PermissionError):  # a DROP on the output path: EPERM to the sender
                s.sendto(b"probe", ("192.0.2.1", 9))
    finally:
        for _, p in captures:
            p.terminate()
            p.wait(10)
    assert _fence_packets() > before, "the fence did not see the packet from the node bridge's address"
    for out, _ in captures:
        r = subprocess.run([tcpdump, "-r", str(out), "-n"], capture_output=True, text=True)
        assert r.stdout.strip() == "", f"packets of the cluster's ranges left by {out.stem}:\n{r.stdout}"
        out.unlink()


API_PROBE = """
import os
from kubernetes import client, config
config.load_incluster_config()
ns = open("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read()
pods = client.CoreV1Api().list_namespaced_pod(ns)
print("api", os.environ["KUBERNETES_SERVICE_HOST"], [p.metadata.name for p in pods.items], flush=True)
try:
    client.CoreV1Api().list_namespaced_pod("kube-system")
    print("kube-system listed", flush=True)
except client.ApiException as e:
    print("kube-system refused", e.status, flush=True)
"""


def test_a_pod_reaches_the_api_server_as_its_service_account(user):
    """The notebook's pod talks to the API server through the kubernetes Service (as KubeSpawner's
    hub and an in-pod backend do), with its namespace's ServiceAccount and nothing more."""
    pod = _restricted_pod("api", NOTEBOOK_IMAGE, ["python", "-c", API_PROBE])
    pod["spec"]["serviceAccountName"] = user.ns_obj.service_account
    pod["spec"]["automountServiceAccountToken"] = True
    user.expect_denied.add("/api/v1/namespaces/kube-system/pods")
    user.core.create_namespaced_pod(user.ns, pod)
    phase, log = _pod_log(user.core, user.ns, "api")
    assert phase == "Succeeded", log[-3000:]
    assert "api 10.96.0.1 ['api']" in log, log[-3000:]
    assert "kube-system refused 403" in log, log[-3000:]


PROGRESS = """
import os
from tfk8s_magics.runtime.progress import report_progress
if os.environ["TFK8S_TASK"] == "worker-0":
    print("epoch 1", flush=True)
    report_progress(5, total=10, loss=0.5)
else:
    print("hello from 1", flush=True)
"""


def test_logs_progress_and_success_are_read_from_real_pods(user):
    """Followed from before any pod runs, the workers' lines arrive, the progress record is the
    status's progress and no log line, the parameter server ends when JobSet decides the run
    succeeded, the follow ends with the cluster, and the kept log holds the worker's line."""
    from tfk8s_magics.backends.base import Phase
    from tfk8s_magics.spec import ClusterSpec

    backend = user.backend()
    stop = threading.Event()
    lines: list = []
    try:
        backend.launch(ClusterSpec(name="prog", ps=1, workers=2, script=PROGRESS, **_claims()),
                       detach=True)
        follower = threading.Thread(target=lambda: lines.extend(backend.follow_logs("prog", stop)),
                                    daemon=True)
        follower.start()  # asked while every pod is still pending
        status = _wait(backend, "prog", lambda s: s.terminal)
        assert status.phase == Phase.SUCCEEDED, (status, [ln.text for ln in lines])
        assert (status.task("ps-0").phase, status.task("ps-0").reason) == (
            Phase.SUCCEEDED, "ended when the JobSet succeeded")
        assert status.progress is not None and (status.progress.step, status.progress.total) == (5, 10)
        follower.join(120)
        assert not follower.is_alive(), "follow_logs did not end with the cluster"
        texts = {(line.task, line.text) for line in lines}
        assert ("worker-0", "epoch 1") in texts and ("worker-1", "hello from 1") in texts, texts
        assert not any("@tfk8s-progress" in line.text for line in lines)
        kept = [(line.task, line.text) for line in backend.read_logs("prog", "worker-0")]
        assert kept == [("worker-0", "epoch 1")], kept
        backend.delete("prog")
    finally:
        stop.set()
        backend.close()


STALL = """
import os, pathlib, time
task = os.environ["TFK8S_TASK"]
if task == "worker-0":
    print("waiting for the others", flush=True)
while not pathlib.Path("/data/go").exists():  # the test says when the run goes on
    time.sleep(0.5)
if task == "worker-1":
    print("and now we go on", flush=True)
"""


def test_a_stalled_cluster_is_reported_from_real_pod_log_timestamps(user, monkeypatch):
    """Every pod running, no log line for the timeout: status says stalled, events say so; a new
    line clears it."""
    from tfk8s_magics.backends.base import Phase
    from tfk8s_magics.spec import ClusterSpec

    monkeypatch.setenv("TFK8S_STALL_TIMEOUT", "5")
    backend = user.backend()
    try:
        backend.launch(ClusterSpec(name="stall", ps=0, workers=2, script=STALL, **_claims()),
                       detach=True)
        backend._watcher("stall").stalls.period = 0.5  # log tails re-read at most this often
        status = _wait(backend, "stall", lambda s: s.stall is not None or s.terminal)
        assert status.shown_phase == "stalled" and status.phase == Phase.RUNNING, status
        assert "worker-0: 'waiting for the others'" in status.stall_text()
        assert any(e.reason == "Stalled" for e in backend.events("stall"))
        (user.paths["data"] / "go").touch()
        status = _wait(backend, "stall", lambda s: s.stall is None)
        assert any(e.reason == "Resumed" for e in backend.events("stall"))
        status = _wait(backend, "stall", lambda s: s.terminal)
        assert status.phase == Phase.SUCCEEDED, status
        backend.delete("stall")
    finally:
        (user.paths["data"] / "go").touch()
        backend.close()


def test_a_missing_secret_is_the_real_kubelets_sentence_in_the_status(user):
    """Without ``get`` on secrets (the shipped Role) the backend cannot check the Secret first: the
    real kubelet leaves the sync pod waiting in CreateContainerConfigError, and the status and
    `%tfcluster events` carry its words."""
    from tfk8s_magics.backends.base import Phase
    from tfk8s_magics.spec import ClusterSpec

    backend = user.backend()
    # it asks (a 403 for the shipped Role: the check is skipped, not the launch)
    user.expect_denied.add(f"/api/v1/namespaces/{user.ns}/secrets/s3-creds")
    try:
        backend.launch(ClusterSpec(name="nosecret", workers=1, script="print(1)\n",
                                   data_url="s3://bucket/datasets/mnist", data_sync=True,
                                   credentials_secret="s3-creds", **_claims()), detach=True)
        status = _wait(backend, "nosecret", lambda s: "secret" in s.reason or s.terminal)
        assert (status.phase, status.reason) == (
            Phase.PENDING, 'sync: CreateContainerConfigError: secret "s3-creds" not found')
        events = [(e.task, e.reason, e.message) for e in backend.events("nosecret")]
        assert ("sync", "Failed", 'Error: secret "s3-creds" not found') in events, events
        backend.delete("nosecret")
    finally:
        backend.close()
