"""KubernetesBackend against the API double (tests/kubeapi) where kwok cannot stand in: pod logs,
progress lines, stall detection from log timestamps, reattach, in-graph ownership, a cluster without
JobSet, the delete race with terminating pods, and the request count of watches. Objects, GC, reads,
rollback, RBAC and quota run on the real cluster: tests/test_kube_backend.py.

The double creates the pods a JobSet asks for and never decides anything a
JobSet would (restarts, success, the end of parameter servers): where a test
needs that, it says what JobSet did (``kube.jobsets.restart/finish``), and
the lifecycle itself is asserted on the JobSet the backend created."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.kubeapi.resources import lookup
from tfk8s_magics.backends.base import Phase
from tfk8s_magics.backends.kubernetes import KubernetesBackend
from tfk8s_magics.backends.kubernetes.rbac import backend_role
from tfk8s_magics.errors import ClusterExists, ClusterNotFound, LaunchFailed
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


def test_restarts_are_jobsets_and_read_as_such(cluster_env):
    kube, backend = cluster_env
    backend.launch(spec(restart_budget=1), detach=True)
    run_all(kube, "mnist")
    kube.kubelet.fail(NS, pod(kube, "mnist", "worker-0"), exit_code=137, reason="OOMKilled")
    status = wait_until(backend, "mnist", lambda s: s.reason.startswith("restarting"))
    assert status.reason == "restarting: worker-0 failed: OOMKilled (1 restarts left)"
    before = len(kube.requests)
    assert backend.status("mnist").phase == Phase.STARTING
    assert not [r for r in kube.requests[before:] if r.verb not in ("get", "list", "watch")]
    kube.jobsets.restart(NS, "mnist")  # what JobSet's failurePolicy does
    run_all(kube, "mnist")
    status = wait_until(backend, "mnist", lambda s: s.phase == Phase.RUNNING
                        and s.task("worker-0").restarts == 1, what="the new attempt")
    assert [t.restarts for t in status.tasks] == [1, 1, 1]
    kube.kubelet.fail(NS, pod(kube, "mnist", "worker-1"), exit_code=1)  # the script raised
    status = wait_until(backend, "mnist", lambda s: s.reason.startswith("failing"))
    kube.jobsets.finish(NS, "mnist", "Failed", "PodFailurePolicy",
                        'Job failed due to the podFailurePolicy rule "UserError"')
    status = wait_until(backend, "mnist", lambda s: s.phase == Phase.FAILED, what="failed")
    assert status.reason.startswith("worker-1 failed: the script raised an exception (exit code 1)")
    assert status.task("worker-1").exit_code == 1
    assert any(e.reason == "Restarted" for e in backend.events("mnist"))


def test_a_queued_cluster_says_why_kueue_holds_it(make_kube, monkeypatch):
    from tfk8s_magics.backends.kubernetes import watch

    monkeypatch.setattr(watch, "EVENT_PERIOD", 0.5)  # Events listed at most every 0.5 s, not 10
    kube = make_kube(kueue=True)
    kube.create_namespace(NS)
    kube.set_role(backend_role(NS), NS, service_account="jupyter")
    backend = KubernetesBackend(namespace=NS, api_client=kube.api_client, user="alice",
                                storage_class="standard")
    try:
        backend.launch(spec(queue="team-a"), detach=True)
        # Kueue's webhook suspended it: no pod until admitted, and the status says so
        assert kube.get_object("jobsets", "mnist", NS)["spec"]["suspend"] is True
        assert kube.jobsets.pods(NS, "mnist") == []
        status = wait_until(backend, "mnist", lambda s: s.phase == Phase.PENDING, what="pending")
        assert status.reason == "ps-0: waiting for admission by queue team-a"
        why = ("couldn't assign flavors to pod set worker: insufficient unused quota for cpu "
               "in flavor default, 2 more needed")
        kube.jobsets.kueue_pending(NS, "mnist", why)
        status = wait_until(backend, "mnist", lambda s: why in s.reason, what="Kueue's reason")
        assert status.task("worker-1").reason == f"waiting for admission by queue team-a: {why}"
        assert any(e.reason == "Pending" and e.message == why and e.type == "Warning"
                   for e in backend.events("mnist"))
        kube.jobsets.kueue_admit(NS, "mnist")
        run_all(kube, "mnist")
        wait_until(backend, "mnist", lambda s: s.phase == Phase.RUNNING, what="admitted, running")
    finally:
        backend.close()
    for r in kube.requests:
        assert r.allowed, f"{r.method} {r.path} was denied by the shipped Role"


def test_reattach_after_kernel_restart_reads_everything_from_the_cluster(cluster_env):
    kube, backend = cluster_env
    backend.launch(spec(), detach=True)
    kube.kubelet.run(NS, pod(kube, "mnist", "ps-0"))
    backend.close()
    fresh = KubernetesBackend(namespace=NS, api_client=kube.api_client, user="alice")
    try:
        assert [c.name for c in fresh.list_clusters()] == ["mnist"]
        assert fresh.spec("mnist") == backend.spec("mnist")
        assert fresh.status("mnist").task("ps-0").phase == Phase.RUNNING
        assert fresh.addresses("mnist") == {
            "ps": ["mnist-ps-0-0.mnist.alice.svc:2222"],
            "worker": ["mnist-worker-0-0.mnist.alice.svc:2222",
                       "mnist-worker-0-1.mnist.alice.svc:2222"],
        }
    finally:
        fresh.close()


def test_in_graph_is_owned_by_the_notebook_pod(cluster_env, monkeypatch):
    kube, backend = cluster_env
    notebook = kube.create_object({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "jupyter-alice", "namespace": NS, "labels": {"component": "singleuser-server"}},
        "spec": {"containers": [{"name": "notebook", "image": "nb:1"}]}})
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("HOSTNAME", "jupyter-alice")
    backend.launch(spec("ig", mode="in-graph"), detach=True)
    root = kube.get_object("configmaps", "ig", NS)
    assert root["metadata"]["ownerReferences"] == [{
        "apiVersion": "v1", "kind": "Pod", "name": "jupyter-alice",
        "uid": notebook["metadata"]["uid"]}]
    js = kube.get_object("jobsets", "ig", NS)
    assert js["spec"]["successPolicy"] == {"operator": "All"}  # servers never exit 0
    # the hub stops (or culls) the server: the cluster goes with the notebook's pod
    kube.store.delete(lookup("pods"), NS, "jupyter-alice")
    assert kinds(kube, "ig") == []


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


def test_stop_deletes_the_jobset_keeps_record_and_volumes(cluster_env):
    kube, backend = cluster_env
    backend.launch(spec(), detach=True)
    backend.launch(spec("other", ps=0, workers=1), detach=True)
    status = backend.stop("mnist")
    assert status.phase == Phase.STOPPED
    assert [k for k, _ in kinds(kube, "mnist")] == [
        "configmaps", "persistentvolumeclaims", "persistentvolumeclaims"]
    assert backend.status("mnist").phase == Phase.STOPPED
    fresh = KubernetesBackend(namespace=NS, api_client=kube.api_client, user="alice")
    assert fresh.status("mnist").phase == Phase.STOPPED  # final from any process
    fresh.close()
    backend.delete("mnist", keep_logs=True)
    assert kinds(kube, "mnist") == [("persistentvolumeclaims", "mnist-log")]
    with pytest.raises(ClusterNotFound):
        backend.status("mnist")
    assert len([k for k in kinds(kube, "other") if k[0] != "pods"]) == 4  # untouched
    backend.delete("other")
    assert kinds(kube, "other") == []


def test_delete_waits_until_the_objects_are_gone_and_relaunch_works(make_kube):
    kube = make_kube(graceful_pods=True)
    kube.create_namespace(NS)
    kube.set_role(backend_role(NS), NS, service_account="jupyter")
    backend = KubernetesBackend(namespace=NS, api_client=kube.api_client, user="alice")
    other = KubernetesBackend(namespace=NS, api_client=kube.api_client, user="alice")
    try:
        backend.launch(spec(), detach=True)
        run_all(kube, "mnist")
        done = threading.Event()
        deleter = threading.Thread(target=lambda: (backend.delete("mnist"), done.set()),
                                   daemon=True)
        deleter.start()
        kube.wait_for(lambda: (kube.get_object("configmaps", "mnist", NS) or {}).get(
            "metadata", {}).get("deletionTimestamp"), message="the Foreground deletion")
        assert not done.wait(0.5)  # pods are terminating: delete has not returned
        with pytest.raises(ClusterExists, match="is still being deleted"):
            other.launch(spec(), detach=True)  # a relaunch meeting the leftovers says so
        kube.finish_pod_termination(NS)
        assert done.wait(10), "delete did not return once the objects were gone"
        assert kinds(kube, "mnist") == []
        backend.launch(spec(), detach=True)  # the same name works at once
        deleter.join(5)
    finally:
        backend.close()
        other.close()


def test_watch_requests_do_not_grow_with_tasks_or_clusters(cluster_env):
    """The namespace's two watches serve every cluster: one list and one watch of the JobSets and
    of the task pods, whether the backend watches one cluster of 2 tasks or two, one of 32."""
    kube, backend = cluster_env
    kube.kubelet.auto(run_after=0.0)

    def reads():
        return [r for r in kube.requests if r.verb in ("list", "watch") and r.resource in ("pods", "jobsets")]

    for n in (2, 32):
        name = f"w{n}"
        backend.launch(spec(name, workers=n), detach=True)
        stop = threading.Event()
        for status in backend.watch(name, stop):
            if status.phase == Phase.RUNNING:
                break
        kube.wait_for(lambda: len([r for r in reads() if r.verb == "watch"]) >= 2,
                      message="both watches open")
        time.sleep(0.5)
        assert sorted((r.resource, r.verb) for r in reads()) == [
            ("jobsets", "list"), ("jobsets", "watch"), ("pods", "list"), ("pods", "watch")], n
        assert all("tfk8s.io/cluster" not in r.query.get("labelSelector", "") for r in reads())


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
