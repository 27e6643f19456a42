"""KubernetesBackend against the API double (tests/kubeapi) where the real cluster's tier 1 cannot
stand in: pod logs (kwok's pods write none), progress lines and stall detection from log timestamps,
and a cluster without the JobSet API (the test cluster always serves it).

Everything else the backend does on Kubernetes runs on the real cluster as the user's ServiceAccount:
objects, GC, reads, rollback, RBAC, quota, restarts, reattach, in-graph ownership, stop, the delete
race and the watches' request count in tests/test_kube_backend.py; JobSet's and Kueue's decisions in
tests/test_kube_controlplane.py; logs followed through a quiet period on real pods in
tests/test_k8s_pods.py.

The double creates the pods a JobSet asks for and never decides anything a
JobSet would (restarts, success, the end of parameter servers): where a test
needs that, it says what JobSet did (``kube.jobsets.finish``)."""

from __future__ import annotations

import threading
import time

import pytest

from tfk8s_magics.backends.base import Phase
from tfk8s_magics.backends.kubernetes import KubernetesBackend
from tfk8s_magics.backends.kubernetes.rbac import backend_role
from tfk8s_magics.errors import LaunchFailed
from tfk8s_magics.spec import ClusterSpec

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


def pod(kube, name, task):
    role, _, index = task.rpartition("-")
    return kube.jobsets.pod_name(NS, name, role, int(index))


def run_all(kube, name):
    for p in kube.jobsets.pods(NS, name):
        kube.kubelet.run(NS, p["metadata"]["name"])


def kinds(kube, name):
    out = []
    for kind in ("configmaps", "services", "persistentvolumeclaims", "pods",
                 "networkpolicies", "deployments", "jobsets"):
        out += [(kind, o["metadata"]["name"])
                for o in kube.list_objects(kind, NS, f"tfk8s.io/cluster={name}")]
    return sorted(out)


def test_launch_without_the_jobset_api_says_what_to_install(make_kube):
    kube = make_kube(jobset=False)
    kube.create_namespace(NS)
    backend = KubernetesBackend(namespace=NS, api_client=kube.api_client, user="alice")
    with pytest.raises(LaunchFailed, match=r"does not serve the JobSet API .* install JobSet v0.7"):
        backend.launch(spec(), detach=True)
    assert kinds(kube, "mnist") == []
    backend.close()


def test_between_graph_status_logs_progress_and_success(cluster_env):
    kube, backend = cluster_env
    backend.launch(spec(), detach=True)
    stop = threading.Event()
    lines = []
    follower = threading.Thread(
        target=lambda: lines.extend(backend.follow_logs("mnist", stop)), daemon=True)
    follower.start()  # asked while every pod is still pending
    run_all(kube, "mnist")
    status = wait_until(backend, "mnist", lambda s: s.phase == Phase.RUNNING, what="running")
    assert [t.phase for t in status.tasks] == [Phase.RUNNING] * 3
    w0, w1 = pod(kube, "mnist", "worker-0"), pod(kube, "mnist", "worker-1")
    kube.kubelet.log(NS, w0, "epoch 1")
    kube.kubelet.log(NS, w0, '@tfk8s-progress {"step": 5, "total": 10, "rate": 2.0, "metrics": '
                     '{"loss": 0.5}, "task": "worker-0", "time": 1.0}')
    kube.kubelet.log(NS, w1, "hello from 1")
    kube.kubelet.succeed(NS, w0)
    kube.kubelet.succeed(NS, w1)
    # Workers done: still running until JobSet says the JobSet completed.
    status = wait_until(backend, "mnist", lambda s: s.task("worker-1").phase == Phase.SUCCEEDED)
    assert status.phase == Phase.RUNNING
    kube.jobsets.finish(NS, "mnist")  # JobSet: Completed, the PS Job deleted
    status = wait_until(backend, "mnist", lambda s: s.phase == Phase.SUCCEEDED, what="success")
    assert (status.task("ps-0").phase, status.task("ps-0").reason) == (
        Phase.SUCCEEDED, "ended when the JobSet succeeded")
    assert status.progress is not None and (status.progress.step, status.progress.total) == (5, 10)
    follower.join(10)
    assert not follower.is_alive(), "follow_logs did not end with the cluster"
    texts = {(line.task, line.text) for line in lines}
    assert ("worker-0", "epoch 1") in texts and ("worker-1", "hello from 1") in texts
    assert not any("@tfk8s-progress" in line.text for line in lines)
    kept = backend.read_logs("mnist", "worker-0")
    assert [(line.task, line.text) for line in kept] == [("worker-0", "epoch 1")]


def test_a_stalled_cluster_is_reported_from_pod_log_timestamps(cluster_env, monkeypatch):
    """Every pod running, no log line for the timeout: status says stalled, events say so."""
    kube, backend = cluster_env
    monkeypatch.setenv("TFK8S_STALL_TIMEOUT", "1")
    backend.launch(spec(), detach=True)
    run_all(kube, "mnist")
    kube.kubelet.log(NS, pod(kube, "mnist", "worker-0"), "waiting for the others")
    watch = backend._watcher("mnist")
    watch.stalls.period = 0.2  # the backend re-reads the log tails at most this often
    status = wait_until(backend, "mnist", lambda s: s.stall is not None, what="a stall")
    assert status.shown_phase == "stalled" and status.phase == Phase.RUNNING
    assert "worker-0: 'waiting for the others'" in status.stall_text()
    assert any(e.reason == "Stalled" for e in backend.events("mnist"))
    kube.kubelet.log(NS, pod(kube, "mnist", "worker-1"), "and now we go on")
    status = wait_until(backend, "mnist", lambda s: s.stall is None, what="the stall to clear")
    assert any(e.reason == "Resumed" for e in backend.events("mnist"))
