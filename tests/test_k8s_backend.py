"""KubernetesBackend against the fake API server (tests/kubeapi): launch, watch,
logs, lifecycle, rollback, RBAC — every request allowed by the shipped Role."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tfk8s_magics.backends.base import Phase
from tfk8s_magics.backends.kubernetes import KubernetesBackend
from tfk8s_magics.backends.kubernetes.rbac import backend_role
from tfk8s_magics.errors import ClusterExists, ClusterNotFound, LaunchFailed
from tfk8s_magics.spec import ClusterSpec, Resources

NS = "alice"
SCRIPT = "print('training')\n"


@pytest.fixture
def cluster_env(kube):
    """A user namespace with the backend Role enforced, and a backend acting as its SA."""
    kube.create_namespace(NS)
    kube.set_role(backend_role(NS), NS, service_account="jupyter")
    backend = KubernetesBackend(namespace=NS, api_client=kube.api_client, user="alice",
                                storage_class="standard")
    yield kube, backend
    backend.close()
    # every request the backend made is allowed by the Role and stays in the namespace
    for r in kube.requests:
        assert r.allowed, f"{r.method} {r.path} was denied by the shipped Role"
        assert r.namespace == NS, f"{r.method} {r.path} left namespace {NS}"


def spec(name="mnist", **kw) -> ClusterSpec:
    kw.setdefault("ps", 1)
    kw.setdefault("workers", 2)
    kw.setdefault("ps_grace_period", 0.5)
    if kw.get("mode") != "in-graph":
        kw.setdefault("script", SCRIPT)
    return ClusterSpec(name=name, **kw)


def wait_until(backend, name, predicate, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        status = backend.status(name)
        if predicate(status):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last status {status}")
        time.sleep(0.05)


def kinds(kube, name):
    out = []
    for kind in ("configmaps", "services", "persistentvolumeclaims", "pods",
                 "networkpolicies", "deployments"):
        out += [(kind, o["metadata"]["name"])
                for o in kube.list_objects(kind, NS, f"tfk8s.io/cluster={name}")]
    return sorted(out)


def test_launch_creates_the_objects_owned_by_one_root(cluster_env):
    kube, backend = cluster_env
    status = backend.launch(spec(), detach=True)
    assert status.backend == "kubernetes" and status.phase == Phase.PENDING
    assert kinds(kube, "mnist") == [
        ("configmaps", "mnist"),
        ("persistentvolumeclaims", "mnist-data"),
        ("persistentvolumeclaims", "mnist-log"),
        ("pods", "mnist-ps-0"),
        ("pods", "mnist-worker-0"),
        ("pods", "mnist-worker-1"),
        ("services", "mnist"),
    ]
    root_uid = kube.get_object("configmaps", "mnist", NS)["metadata"]["uid"]
    for kind, name in kinds(kube, "mnist"):
        if (kind, name) != ("configmaps", "mnist"):
            refs = kube.get_object(kind, name, NS)["metadata"]["ownerReferences"]
            assert [r["uid"] for r in refs] == [root_uid]


def test_between_graph_lifecycle_logs_progress_and_ps_recycling(cluster_env):
    kube, backend = cluster_env
    backend.launch(spec(), detach=True)
    stop = threading.Event()
    lines = []
    follower = threading.Thread(
        target=lambda: lines.extend(backend.follow_logs("mnist", stop)), daemon=True)
    follower.start()  # asked while every pod is still pending
    for pod in ("mnist-ps-0", "mnist-worker-0", "mnist-worker-1"):
        kube.kubelet.run(NS, pod)
    status = wait_until(backend, "mnist", lambda s: s.phase == Phase.RUNNING, what="running")
    assert [t.phase for t in status.tasks] == [Phase.RUNNING] * 3
    kube.kubelet.log(NS, "mnist-worker-0", "epoch 1")
    kube.kubelet.log(NS, "mnist-worker-0",
                     '@tfk8s-progress {"step": 5, "total": 10, "rate": 2.0, "metrics": '
                     '{"loss": 0.5}, "task": "worker-0", "time": 1.0}')
    kube.kubelet.log(NS, "mnist-worker-1", "hello from 1")
    kube.kubelet.succeed(NS, "mnist-worker-0")
    kube.kubelet.succeed(NS, "mnist-worker-1")
    status = wait_until(backend, "mnist", lambda s: s.phase == Phase.SUCCEEDED, what="success")
    assert status.progress is not None and (status.progress.step, status.progress.total) == (5, 10)
    # the parameter server is deleted a grace period (0.5 s) after the workers finished
    kube.wait_for(lambda: kube.get_object("pods", "mnist-ps-0", NS) is None, timeout=10,
                  message="ps recycled")
    status = wait_until(backend, "mnist", lambda s: s.task("ps-0").phase == Phase.SUCCEEDED)
    assert status.task("ps-0").reason == "recycled after the workers finished"
    follower.join(10)
    assert not follower.is_alive(), "follow_logs did not end with the cluster"
    texts = {(line.task, line.text) for line in lines}
    assert ("worker-0", "epoch 1") in texts and ("worker-1", "hello from 1") in texts
    assert not any("@tfk8s-progress" in line.text for line in lines)
    assert any(e.reason == "Recycled" and e.task == "ps-0" for e in backend.events("mnist"))
    kept = backend.read_logs("mnist", "worker-0")
    assert [(line.task, line.text) for line in kept] == [("worker-0", "epoch 1")]
    assert [line.text for line in backend.read_logs("mnist", tail=1)] == [
        "epoch 1", "hello from 1"]  # ps-0 is gone: no log left in the API


def test_retryable_failure_is_replaced_user_error_is_not(cluster_env):
    kube, backend = cluster_env
    backend.launch(spec(restart_budget=1), detach=True)
    for pod in ("mnist-ps-0", "mnist-worker-0", "mnist-worker-1"):
        kube.kubelet.run(NS, pod)
    kube.kubelet.fail(NS, "mnist-worker-0", exit_code=137, reason="OOMKilled")
    kube.wait_for(lambda: kube.get_object("pods", "mnist-worker-0-r1", NS), timeout=10,
                  message="replacement pod")
    replacement = kube.get_object("pods", "mnist-worker-0-r1", NS)
    assert replacement["spec"]["hostname"] == "worker-0"
    kube.kubelet.run(NS, "mnist-worker-0-r1")
    status = wait_until(backend, "mnist", lambda s: s.task("worker-0").phase == Phase.RUNNING)
    assert status.task("worker-0").restarts == 1
    kube.kubelet.fail(NS, "mnist-worker-1", exit_code=1)  # the script raised: not retried
    status = wait_until(backend, "mnist", lambda s: s.phase == Phase.FAILED, what="failed")
    assert status.reason == ("worker-1 failed: the script raised an exception (exit code 1); "
                             "the traceback is in its log")
    assert status.task("worker-1").exit_code == 1
    # The controller acts on a failed cluster by deleting what is left at once (the
    # lifecycle policy); once it has done that, it has made no replacement for worker-1.
    kube.wait_for(lambda: kube.get_object("pods", "mnist-ps-0", NS) is None, timeout=10,
                  message="the failed cluster's remaining pods to go")
    assert kube.get_object("pods", "mnist-worker-1-r1", NS) is None
    restarted = {e.task for e in backend.events("mnist") if e.reason == "Restarted"}
    assert restarted == {"worker-0"}  # the OOM kill was retried, the script error was not


def test_pending_reason_surfaces_from_the_scheduler(cluster_env):
    kube, backend = cluster_env
    backend.launch(spec(resources={"worker": Resources(gpus=1)}), detach=True)
    kube.kubelet.unschedulable(NS, "mnist-worker-0")
    status = wait_until(backend, "mnist",
                        lambda s: "Insufficient" in s.task("worker-0").reason
                        or "nodes are available" in s.task("worker-0").reason,
                        what="FailedScheduling reason")
    assert status.task("worker-0").phase == Phase.PENDING
    events = backend.events("mnist")
    assert any(e.reason == "FailedScheduling" and e.task == "worker-0" for e in events)


def test_reattach_after_kernel_restart(cluster_env):
    kube, backend = cluster_env
    backend.launch(spec(), detach=True)
    kube.kubelet.run(NS, "mnist-ps-0")
    backend.close()
    fresh = KubernetesBackend(namespace=NS, api_client=kube.api_client, user="alice")
    try:
        assert [c.name for c in fresh.list_clusters()] == ["mnist"]
        assert fresh.spec("mnist") == backend.spec("mnist")
        assert fresh.status("mnist").task("ps-0").phase == Phase.RUNNING
        assert fresh.addresses("mnist") == {
            "ps": ["ps-0.mnist.alice.svc:2222"],
            "worker": ["worker-0.mnist.alice.svc:2222", "worker-1.mnist.alice.svc:2222"],
        }
    finally:
        fresh.close()


def test_status_only_reads_attach_takes_over_the_lifecycle(cluster_env):
    """A process that merely reads a cluster never acts on it; attach() makes it the controller."""
    kube, backend = cluster_env
    backend.launch(spec(restart_budget=1), detach=True)
    backend.close()  # the launching kernel is gone: nothing controls the cluster now
    for pod in ("mnist-ps-0", "mnist-worker-0", "mnist-worker-1"):
        kube.kubelet.run(NS, pod)
    reader = KubernetesBackend(namespace=NS, api_client=kube.api_client, user="alice")
    try:
        wait_until(reader, "mnist", lambda s: s.task("worker-1").phase == Phase.RUNNING)
        kube.kubelet.fail(NS, "mnist-worker-0", exit_code=137, reason="OOMKilled")
        status = wait_until(reader, "mnist", lambda s: s.task("worker-0").phase == Phase.FAILED,
                            what="the reader to see the kill")
        assert status.task("worker-0").reason == "OOMKilled"
        before = len(kube.requests)
        for _ in range(3):
            reader.status("mnist")
            reader.events("mnist")
        writes = [r for r in kube.requests[before:] if r.verb not in ("get", "list", "watch")]
        assert writes == []  # reading made no change to the cluster
        assert kube.get_object("pods", "mnist-worker-0-r1", NS) is None
        reader.attach("mnist")  # now this process runs the lifecycle: the kill is retried
        kube.wait_for(lambda: kube.get_object("pods", "mnist-worker-0-r1", NS), timeout=10,
                      message="replacement pod after attach")
    finally:
        reader.close()


def test_in_graph_client_progress_and_kept_logs_location(cluster_env):
    kube, backend = cluster_env
    backend.launch(spec("ig", mode="in-graph"), detach=True)
    coordinator = backend.coordinator("ig")
    assert coordinator.address.rsplit(":", 1)[1].isdigit() and coordinator.task == "chief-0"
    coordinator.progress('{"step": 7, "total": 10, "metrics": {}, "task": "chief-0", "time": 1}')
    assert backend.status("ig").progress.step == 7  # report_progress in the kernel shows here
    kept = backend.delete("ig", keep_logs=True)
    assert (kept.path, kept.volume) == ("/log", "ig-log")
    with pytest.raises(TypeError, match="not a path on this machine"):
        Path(kept)


def test_stop_keeps_record_and_volumes_delete_cascades(cluster_env):
    kube, backend = cluster_env
    backend.launch(spec(), detach=True)
    backend.launch(spec("other", ps=0, workers=1), detach=True)
    status = backend.stop("mnist")
    assert status.phase == Phase.STOPPED
    kube.wait_for(lambda: not kube.list_objects("pods", NS, "tfk8s.io/cluster=mnist"),
                  message="pods deleted")
    assert [k for k, _ in kinds(kube, "mnist")] == [
        "configmaps", "persistentvolumeclaims", "persistentvolumeclaims", "services"]
    assert backend.status("mnist").phase == Phase.STOPPED
    backend.delete("mnist", keep_logs=True)
    kube.wait_for(lambda: kinds(kube, "mnist") == [("persistentvolumeclaims", "mnist-log")],
                  message="cascade delete keeping the log claim")
    with pytest.raises(ClusterNotFound):
        backend.status("mnist")
    # the other cluster is untouched
    assert len(kinds(kube, "other")) == 5
    backend.delete("other")
    kube.wait_for(lambda: kinds(kube, "other") == [], message="cascade delete")


def test_in_graph_tensorboard_and_no_network_policy(cluster_env, monkeypatch):
    kube, backend = cluster_env
    backend.launch(spec("ig", mode="in-graph"), detach=True)
    # NetworkPolicies are additive: a per-cluster one could not narrow the namespace's
    # isolation policy, and the user's Role may not write policies at all
    assert kube.get_object("networkpolicies", "ig", NS) is None
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/alice/")
    tb = backend.tensorboard("ig")
    assert tb.url == "/user/alice/proxy/ig-tensorboard.alice.svc:6006/"
    assert tb.reused is False and tb.logdir == "/log"
    assert backend.tensorboard("ig").reused is True
    assert kube.get_object("deployments", "ig-tensorboard", NS) is not None
    backend.delete("ig")
    kube.wait_for(lambda: kinds(kube, "ig") == [], message="cascade delete incl. TensorBoard")


def test_a_name_in_use_is_refused_before_anything_is_created(cluster_env):
    kube, backend = cluster_env
    backend.launch(spec(), detach=True)
    before = len(kube.requests)
    with pytest.raises(ClusterExists, match="already exists"):
        backend.launch(spec(), detach=True)
    assert not [r for r in kube.requests[before:] if r.method == "POST"]


def test_conflict_midway_rolls_back_with_the_api_reason(cluster_env):
    kube, backend = cluster_env
    kube.create_object({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                        "metadata": {"name": "mnist-log", "namespace": NS},
                        "spec": {"accessModes": ["ReadWriteOnce"],
                                 "resources": {"requests": {"storage": "1Gi"}}}})
    with pytest.raises(LaunchFailed, match="PersistentVolumeClaim mnist-log already exists") as e:
        backend.launch(spec(), detach=True)
    assert e.value.__cause__ is not None
    assert kinds(kube, "mnist") == []  # everything this launch created is gone
    assert kube.get_object("persistentvolumeclaims", "mnist-log", NS) is not None


def test_forbidden_is_reported_and_rolled_back(kube):
    kube.create_namespace(NS)
    role = backend_role(NS)
    role["rules"] = [r for r in role["rules"] if "persistentvolumeclaims" not in r["resources"]]
    role["rules"].append({"apiGroups": [""], "resources": ["services"],
                          "verbs": ["get", "list", "watch", "create", "delete"]})
    kube.set_role(role, NS, service_account="jupyter")
    backend = KubernetesBackend(namespace=NS, api_client=kube.api_client, user="alice")
    with pytest.raises(LaunchFailed, match="may not create PersistentVolumeClaim mnist-data"):
        backend.launch(spec(), detach=True)
    assert kinds(kube, "mnist") == []


def test_preflight_quota_refuses_before_creating_anything(cluster_env):
    kube, backend = cluster_env
    kube.create_object({"apiVersion": "v1", "kind": "ResourceQuota",
                        "metadata": {"name": "user-quota", "namespace": NS},
                        "spec": {"hard": {"requests.cpu": "2", "pods": "10"}}})
    kube.wait_for(lambda: (kube.get_object("resourcequotas", "user-quota", NS)
                           .get("status") or {}).get("hard"), message="quota status")
    big = spec(resources={"worker": Resources(cpu="1"), "ps": Resources(cpu="1")})
    before = len(kube.requests)
    with pytest.raises(LaunchFailed, match="needs requests.cpu 3 but ResourceQuota user-quota"):
        backend.launch(big, detach=True)
    assert not [r for r in kube.requests[before:] if r.method == "POST"]


def test_watch_requests_do_not_grow_with_tasks(cluster_env):
    kube, backend = cluster_env
    kube.kubelet.auto(run_after=0.0)
    counts = {}
    for n in (2, 32):
        name = f"w{n}"
        backend.launch(spec(name, workers=n), detach=True)
        start = len(kube.requests)
        stop = threading.Event()
        for status in backend.watch(name, stop):
            if status.phase == Phase.RUNNING:
                break
        counts[n] = len([r for r in kube.requests[start:]
                         if r.resource == "pods" and r.verb in ("list", "watch")])
    assert counts[32] <= counts[2] + 1, counts


def test_a_stalled_cluster_is_reported_from_pod_log_timestamps(cluster_env, monkeypatch):
    """Every pod running, no log line for the timeout: status says stalled, events say so."""
    kube, backend = cluster_env
    monkeypatch.setenv("TFK8S_STALL_TIMEOUT", "1")
    backend.launch(spec(), detach=True)
    for pod in ("mnist-ps-0", "mnist-worker-0", "mnist-worker-1"):
        kube.kubelet.run(NS, pod)
    kube.kubelet.log(NS, "mnist-worker-0", "waiting for the others")
    watch = backend._watcher("mnist")
    watch.stalls.period = 0.2  # the backend re-reads the log tails at most this often
    status = wait_until(backend, "mnist", lambda s: s.stall is not None, what="a stall")
    assert status.shown_phase == "stalled" and status.phase == Phase.RUNNING
    assert "worker-0: 'waiting for the others'" in status.stall_text()
    assert any(e.reason == "Stalled" for e in backend.events("mnist"))
    kube.kubelet.log(NS, "mnist-worker-1", "and now we go on")
    status = wait_until(backend, "mnist", lambda s: s.stall is None, what="the stall to clear")
    assert any(e.reason == "Resumed" for e in backend.events("mnist"))
