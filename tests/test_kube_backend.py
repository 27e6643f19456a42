"""KubernetesBackend's objects, reads, rollback and watches on the REAL cluster (``scripts/kube up``).

Every call is made as the user's own ServiceAccount in a namespace bootstrapped as the hub does it;
what the backend sent is read back from the API server's audit log. The owner references are
followed by the real garbage collector, the pods are made by JobSet's and the Job controller's own
hands, the scheduler says why a pod waits, and RBAC refuses what the Role does not give.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from kubernetes import client

from tests.realkube import wait_for
from tests.test_kube_controlplane import jobset, spec, task_pods
from tfk8s_magics.backends.base import Phase
from tfk8s_magics.backends.kubernetes import KubernetesBackend
from tfk8s_magics.backends.kubernetes.rbac import backend_role
from tfk8s_magics.errors import ClusterExists, ClusterNotFound, LaunchFailed
from tfk8s_magics.spec import Resources

pytestmark = pytest.mark.k8s

KINDS = ("configmaps", "services", "persistentvolumeclaims", "pods", "networkpolicies", "deployments",
         "jobsets")


@pytest.fixture
def user(kube_user):
    return kube_user("alice")


def objects(realkube, ns: str, name: str, with_pods: bool = False) -> list[tuple[str, str]]:
    """(kind, name) of every object labelled as cluster ``name``, not being deleted."""
    sel = f"tfk8s.io/cluster={name}"
    core, apps = realkube.core, client.AppsV1Api(realkube.admin)
    found = []
    lists = {
        "configmaps": core.list_namespaced_config_map, "services": core.list_namespaced_service,
        "persistentvolumeclaims": core.list_namespaced_persistent_volume_claim,
        "networkpolicies": client.NetworkingV1Api(realkube.admin).list_namespaced_network_policy,
        "deployments": apps.list_namespaced_deployment,
    }
    if with_pods:
        lists["pods"] = core.list_namespaced_pod
    for kind, call in lists.items():
        found += [(kind, o.metadata.name) for o in call(ns, label_selector=sel).items
                  if o.metadata.deletion_timestamp is None]
    found += [("jobsets", o["metadata"]["name"]) for o in realkube.custom.list_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", ns, "jobsets", label_selector=sel)["items"]
        if not o["metadata"].get("deletionTimestamp")]
    return sorted(found)


JOBSETS = ("jobset.x-k8s.io", "v1alpha2")


def writes(ns, since: int = 0) -> list[str]:
    return [f"{r.verb} {r.uri}" for r in ns.requests()[since:] if r.verb not in ("get", "list", "watch")]


def test_launch_creates_a_root_two_claims_and_one_jobset_the_gc_follows(realkube, user):
    ns, backend = user
    status = backend.launch(spec(), detach=True)
    assert status.backend == "kubernetes" and status.phase == Phase.PENDING
    ours = objects(realkube, ns.name, "mnist")
    assert ours == [
        ("configmaps", "mnist"),
        ("jobsets", "mnist"),
        ("persistentvolumeclaims", "mnist-data"),
        ("persistentvolumeclaims", "mnist-log"),
    ]
    root_uid = realkube.core.read_namespaced_config_map("mnist", ns.name).metadata.uid
    js = jobset(realkube, ns.name, "mnist")
    assert [r["uid"] for r in js["metadata"]["ownerReferences"]] == [root_uid]
    for claim in ("mnist-data", "mnist-log"):
        refs = realkube.core.read_namespaced_persistent_volume_claim(claim, ns.name).metadata.owner_references
        assert [r.uid for r in refs] == [root_uid]
    assert js["spec"]["failurePolicy"]["maxRestarts"] == 2
    assert js["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["worker"]}
    # the pods are JobSet's (through its Jobs), never the user's requests
    pods = wait_for(lambda: len(p := task_pods(realkube, ns.name, "mnist")) == 3 and p, 90, message="3 pods")
    assert sorted(p.spec.hostname for p in pods) == ["mnist-ps-0-0", "mnist-worker-0-0", "mnist-worker-0-1"]
    assert not [r for r in ns.requests() if r.resource == "pods" and r.verb == "create"]
    # the garbage collector follows the owner references from the root alone
    realkube.core.delete_namespaced_config_map("mnist", ns.name, propagation_policy="Background")
    wait_for(lambda: not objects(realkube, ns.name, "mnist", with_pods=True), 90,
             message="the GC to delete every object owned by the root")


def test_pending_reason_surfaces_from_the_scheduler(realkube, user):
    ns, backend = user
    backend.launch(spec(resources={"worker": Resources(gpus=1)}), detach=True)
    status = wait_for(
        lambda: (s := backend.status("mnist")).task("worker-0")
        and any(w in s.task("worker-0").reason for w in ("Insufficient", "nodes are available"))
        and s, 90, message="the scheduler's FailedScheduling reason in the status")
    assert status.task("worker-0").phase == Phase.PENDING
    assert any(e.reason == "FailedScheduling" and e.task == "worker-0" for e in backend.events("mnist"))


def test_reading_never_writes(realkube, user):
    """status/list/events/spec/attach, from the launching backend and a fresh one, only read —
    pending, running, restarted by JobSet, gone."""
    ns, backend = user
    backend.launch(spec(), detach=True)
    reader = KubernetesBackend(namespace=ns.name, api_client=ns.api_client, user="alice")

    def read_everything():
        before = len(ns.requests())
        for b in (backend, reader):
            b.status("mnist")
            b.list_clusters()
            b.events("mnist")
            b.spec("mnist")
        reader.attach("mnist")
        assert writes(ns, before) == []

    try:
        read_everything()  # pending
        wait_for(lambda: reader.status("mnist").phase == Phase.RUNNING, 90, message="running")
        read_everything()
        w0 = task_pods(realkube, ns.name, "mnist", "worker")[0]
        realkube.exit_pod(ns.name, w0.metadata.name, 137)
        wait_for(lambda: jobset(realkube, ns.name, "mnist").get("status", {}).get("restarts", 0) >= 1,
                 90, message="JobSet to restart the cluster")
        read_everything()  # a failed pod is JobSet's to replace, never the reader's
        realkube.custom.delete_namespaced_custom_object(*JOBSETS, ns.name, "jobsets", "mnist")
        wait_for(lambda: reader.status("mnist").phase == Phase.STOPPED, 60, message="gone")
        read_everything()
    finally:
        reader.close()


def test_in_graph_tensorboard_and_no_network_policy(realkube, user, monkeypatch, tmp_path):
    ns, backend = user
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))  # where TensorBoard's token is kept
    backend.launch(spec("ig", mode="in-graph"), detach=True)
    # NetworkPolicies are additive: a per-cluster one could not narrow the namespace's isolation
    assert not [k for k in objects(realkube, ns.name, "ig") if k[0] == "networkpolicies"]
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/alice/")
    tb = backend.tensorboard("ig")
    # the user's own server's proxy, which adds TensorBoard's token (tfk8s_magics.sidebar.tbproxy)
    assert tb.url == f"/user/alice/tfk8s/tensorboard/ig-tensorboard.{ns.name}.svc:6006/"
    assert tb.reused is False and tb.logdir == "/log"
    assert backend.tensorboard("ig").reused is True
    assert ("deployments", "ig-tensorboard") in objects(realkube, ns.name, "ig")
    backend.delete("ig")
    assert objects(realkube, ns.name, "ig", with_pods=True) == []


def test_a_name_in_use_is_refused_before_anything_is_created(user):
    ns, backend = user
    backend.launch(spec(), detach=True)
    before = len(ns.requests())
    with pytest.raises(ClusterExists, match="already exists"):
        backend.launch(spec(), detach=True)
    assert not [r for r in ns.requests()[before:] if r.verb == "create"]


def test_conflict_midway_rolls_back_with_the_api_reason(realkube, user):
    ns, backend = user
    realkube.core.create_namespaced_persistent_volume_claim(ns.name, {
        "metadata": {"name": "mnist-log"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
    with pytest.raises(LaunchFailed, match="PersistentVolumeClaim mnist-log already exists") as e:
        backend.launch(spec(), detach=True)
    assert e.value.__cause__ is not None
    wait_for(lambda: objects(realkube, ns.name, "mnist", with_pods=True) == [], 60,
             message="everything this launch created to go")
    assert realkube.core.read_namespaced_persistent_volume_claim("mnist-log", ns.name)


def test_forbidden_is_reported_and_rolled_back(realkube, user):
    ns, _ = user
    # the shipped Role without create on JobSets, bound instead of the chart's ClusterRole
    rbac = client.RbacAuthorizationV1Api(realkube.admin)
    role = backend_role(ns.name)
    role["rules"] = [r for r in role["rules"] if "jobsets" not in r["resources"]]
    role["rules"].append({"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"],
                          "verbs": ["get", "list", "watch"]})
    role["metadata"]["name"] = "no-jobsets"
    rbac.create_namespaced_role(ns.name, role)
    for rb in rbac.list_namespaced_role_binding(ns.name).items:
        rbac.delete_namespaced_role_binding(rb.metadata.name, ns.name)
    rbac.create_namespaced_role_binding(ns.name, {
        "metadata": {"name": "no-jobsets"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "no-jobsets"},
        "subjects": [{"kind": "ServiceAccount", "name": ns.service_account, "namespace": ns.name}]})
    backend = KubernetesBackend(namespace=ns.name, api_client=ns.api_client, user="alice",
                                storage_class="standard")
    try:
        with pytest.raises(LaunchFailed, match="may not create JobSet mnist"):
            backend.launch(spec(), detach=True)
    finally:
        backend.close()
    wait_for(lambda: objects(realkube, ns.name, "mnist", with_pods=True) == [], 60, message="the rollback")
    assert [r.code for r in ns.requests() if r.resource == "jobsets" and r.verb == "create"] == [403]
    ns.audit_offset = realkube.audit_size()  # the 403 was this test's point, not the Role's gap


def test_preflight_quota_refuses_before_creating_anything(realkube, user):
    ns, backend = user
    realkube.core.create_namespaced_resource_quota(ns.name, {
        "metadata": {"name": "user-quota"}, "spec": {"hard": {"requests.cpu": "2", "pods": "10"}}})
    wait_for(lambda: realkube.core.read_namespaced_resource_quota("user-quota", ns.name).status.hard,
             30, message="the quota controller's status")
    big = spec(resources={"worker": Resources(cpu="1"), "ps": Resources(cpu="1")})
    before = len(ns.requests())
    with pytest.raises(LaunchFailed, match="needs requests.cpu 3 but ResourceQuota user-quota"):
        backend.launch(big, detach=True)
    assert not [r for r in ns.requests()[before:] if r.verb == "create"]




def running(realkube, ns, name, n=3):
    return wait_for(lambda: len(p := task_pods(realkube, ns, name)) == n
                    and all(x.status.phase == "Running" for x in p) and p, 90,
                    message=f"{n} running pods of {name}")


def wait_status(backend, name, predicate, what, timeout=90):
    return wait_for(lambda: predicate(s := backend.status(name)) and s, timeout, message=what)


def test_restarts_are_jobsets_and_read_as_such(realkube, user):
    """A killed worker: the status says restarting (the budget left) and reading it writes nothing;
    JobSet's restart makes every task's attempt 1; a script error then fails the run at once."""
    ns, backend = user
    backend.launch(spec(restart_budget=1), detach=True)
    running(realkube, ns.name, "mnist")
    w0 = task_pods(realkube, ns.name, "mnist", "worker")[0]
    before = len(ns.requests())
    realkube.exit_pod(ns.name, w0.metadata.name, 137)
    status = wait_status(backend, "mnist", lambda s: s.reason.startswith("restarting")
                         or s.task("worker-0").restarts == 1, "the restart")
    if status.reason.startswith("restarting"):  # seen before JobSet's new attempt ran
        assert status.reason == "restarting: worker-0 failed: killed by SIGKILL (1 restarts left)"
        assert status.phase == Phase.STARTING
    assert not [r for r in ns.requests()[before:] if r.verb not in ("get", "list", "watch")]
    status = wait_status(backend, "mnist", lambda s: s.phase == Phase.RUNNING
                         and s.task("worker-0").restarts == 1, "the new attempt running")
    assert [t.restarts for t in status.tasks] == [1, 1, 1]
    running(realkube, ns.name, "mnist")
    w1 = task_pods(realkube, ns.name, "mnist", "worker")[1]
    realkube.exit_pod(ns.name, w1.metadata.name, 1)  # the script raised
    status = wait_status(backend, "mnist", lambda s: s.phase == Phase.FAILED, "failed")
    assert status.reason.startswith("worker-1 failed: the script raised an exception (exit code 1)")
    assert status.task("worker-1").exit_code == 1
    assert any(e.reason == "Restarted" for e in backend.events("mnist"))


def test_reattach_after_kernel_restart_reads_everything_from_the_cluster(realkube, user):
    ns, backend = user
    backend.launch(spec(), detach=True)
    running(realkube, ns.name, "mnist")
    backend.close()
    fresh = KubernetesBackend(namespace=ns.name, api_client=ns.api_client, user="alice")
    try:
        assert [c.name for c in fresh.list_clusters()] == ["mnist"]
        assert fresh.spec("mnist") == backend.spec("mnist")
        wait_status(fresh, "mnist", lambda s: s.task("ps-0").phase == Phase.RUNNING, "ps-0 running")
        assert fresh.addresses("mnist") == {
            "ps": [f"mnist-ps-0-0.mnist.{ns.name}.svc:2222"],
            "worker": [f"mnist-worker-0-0.mnist.{ns.name}.svc:2222",
                       f"mnist-worker-0-1.mnist.{ns.name}.svc:2222"],
        }
        # the names resolve to the pods JobSet made (hostname + its headless Service)
        pods = task_pods(realkube, ns.name, "mnist")
        assert sorted(f"{p.spec.hostname}.{p.spec.subdomain}" for p in pods) == [
            "mnist-ps-0-0.mnist", "mnist-worker-0-0.mnist", "mnist-worker-0-1.mnist"]
    finally:
        fresh.close()


def test_in_graph_is_owned_by_the_notebook_pod_and_the_gc_removes_it_with_the_pod(
        realkube, user, monkeypatch):
    ns, backend = user
    notebook = realkube.core.create_namespaced_pod(ns.name, {
        "metadata": {"name": "jupyter-alice", "labels": {"component": "singleuser-server"}},
        "spec": {"containers": [{"name": "notebook", "image": "tfk8s/notebook:0.1.0",
                                 "securityContext": {"allowPrivilegeEscalation": False,
                                                     "capabilities": {"drop": ["ALL"]},
                                                     "runAsNonRoot": True, "runAsUser": 1000,
                                                     "seccompProfile": {"type": "RuntimeDefault"}}}]}})
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("HOSTNAME", "jupyter-alice")
    backend.launch(spec("ig", mode="in-graph"), detach=True)
    root = realkube.core.read_namespaced_config_map("ig", ns.name)
    assert [(r.api_version, r.kind, r.name, r.uid) for r in root.metadata.owner_references] == [
        ("v1", "Pod", "jupyter-alice", notebook.metadata.uid)]
    js = jobset(realkube, ns.name, "ig")
    assert js["spec"]["successPolicy"] == {"operator": "All"}  # servers never exit 0
    wait_for(lambda: task_pods(realkube, ns.name, "ig"), 90, message="the servers' pods")
    # the hub stops (or culls) the server: the real GC takes the cluster with the notebook's pod
    realkube.core.delete_namespaced_pod("jupyter-alice", ns.name)
    wait_for(lambda: not objects(realkube, ns.name, "ig", with_pods=True), 120,
             message="the GC to delete the cluster with the notebook's pod")


def test_in_graph_client_progress_and_kept_logs_location(user):
    ns, backend = user
    backend.launch(spec("ig", mode="in-graph"), detach=True)
    coordinator = backend.coordinator("ig")
    assert coordinator.address.rsplit(":", 1)[1].isdigit() and coordinator.task == "chief-0"
    coordinator.progress('{"step": 7, "total": 10, "metrics": {}, "task": "chief-0", "time": 1}')
    assert backend.status("ig").progress.step == 7  # report_progress in the kernel shows here
    kept = backend.delete("ig", keep_logs=True)
    assert (kept.path, kept.volume) == ("/log", "ig-log")
    with pytest.raises(TypeError, match="not a path on this machine"):
        Path(kept)


def test_stop_deletes_the_jobset_keeps_record_and_volumes(realkube, user):
    ns, backend = user
    backend.launch(spec(), detach=True)
    backend.launch(spec("other", ps=0, workers=1), detach=True)
    running(realkube, ns.name, "mnist")
    status = backend.stop("mnist")
    # its pods have not ended when stop returns: stopping until they have, then stopped
    assert status.phase == Phase.STOPPING, status
    assert wait_for(lambda: backend.status("mnist").phase == Phase.STOPPED, 90, message="stopped")
    # the JobSet goes at once; its Jobs and pods after it, by the garbage collector
    wait_for(lambda: [k for k, _ in objects(realkube, ns.name, "mnist", with_pods=True)] == [
        "configmaps", "persistentvolumeclaims", "persistentvolumeclaims"], 90,
        message="only the record and the claims left")
    assert backend.status("mnist").phase == Phase.STOPPED
    fresh = KubernetesBackend(namespace=ns.name, api_client=ns.api_client, user="alice")
    try:
        assert fresh.status("mnist").phase == Phase.STOPPED  # final from any process
    finally:
        fresh.close()
    backend.delete("mnist", keep_logs=True)
    assert objects(realkube, ns.name, "mnist", with_pods=True) == [("persistentvolumeclaims", "mnist-log")]
    with pytest.raises(ClusterNotFound):
        backend.status("mnist")
    assert len(objects(realkube, ns.name, "other")) == 4  # untouched
    backend.delete("other")
    assert objects(realkube, ns.name, "other", with_pods=True) == []


HOLD = "tfk8s.test/hold"  # a finalizer of the test's: the pod stays Terminating until it goes


def release(realkube, ns: str, pod: str) -> None:
    """Take the test's finalizer off ``pod`` (a JSON patch: finalizers merge in a strategic one)."""
    try:
        finalizers = realkube.core.read_namespaced_pod(pod, ns).metadata.finalizers or []
    except client.ApiException as e:
        if e.status == 404:
            return
        raise
    if HOLD in finalizers:
        i = finalizers.index(HOLD)
        realkube.core.patch_namespaced_pod(pod, ns, [
            {"op": "test", "path": f"/metadata/finalizers/{i}", "value": HOLD},
            {"op": "remove", "path": f"/metadata/finalizers/{i}"}])


def test_delete_waits_for_terminating_pods_and_a_relaunch_meeting_them_says_so(realkube, user):
    ns, backend = user
    other = KubernetesBackend(namespace=ns.name, api_client=ns.api_client, user="alice")
    w0 = None
    try:
        backend.launch(spec(), detach=True)
        w0 = running(realkube, ns.name, "mnist")[0].metadata.name
        realkube.core.patch_namespaced_pod(w0, ns.name, {"metadata": {"finalizers": [HOLD]}})
        done = threading.Event()
        deleter = threading.Thread(target=lambda: (backend.delete("mnist"), done.set()), daemon=True)
        deleter.start()
        wait_for(lambda: realkube.core.read_namespaced_pod(w0, ns.name).metadata.deletion_timestamp,
                 60, message="the pod held Terminating")
        assert not done.wait(2)  # a pod is terminating: delete has not returned
        with pytest.raises(ClusterExists, match="is still being deleted"):
            other.launch(spec(), detach=True)  # a relaunch meeting the leftovers says so
        release(realkube, ns.name, w0)
        assert done.wait(120), "delete did not return once the objects were gone"
        assert objects(realkube, ns.name, "mnist", with_pods=True) == []
        backend.launch(spec(), detach=True)  # the same name works at once
        deleter.join(5)
    finally:
        if w0:
            release(realkube, ns.name, w0)
        other.close()


def test_watch_requests_do_not_grow_with_tasks_or_clusters(realkube, user):
    """The namespace's two watches serve every cluster: one list and one watch of the JobSets and
    of the task pods, whether the backend watches one cluster of 2 tasks or two, one of 32."""
    ns, backend = user

    def reads(stage="ResponseComplete"):
        return [r for r in ns.requests(stage) if r.verb in ("list", "watch")
                and r.resource in ("pods", "jobsets") and r.subresource is None]

    for n in (2, 32):
        name = f"w{n}"
        backend.launch(spec(name, ps=0, workers=n), detach=True)
        stop = threading.Event()
        for status in backend.watch(name, stop):
            if status.phase == Phase.RUNNING:
                break
        stop.set()
        wait_for(lambda: len([r for r in reads("ResponseStarted") if r.verb == "watch"]) >= 2, 30,
                 message="both watches open")
        time.sleep(1)
        started = sorted((r.resource, r.verb) for r in reads("ResponseStarted") if r.verb == "watch")
        lists = sorted((r.resource, r.verb) for r in reads() if r.verb == "list")
        assert started == [("jobsets", "watch"), ("pods", "watch")], n
        assert lists == [("jobsets", "list"), ("pods", "list")], n
        assert all("tfk8s.io%2Fcluster" not in r.uri and "tfk8s.io/cluster" not in r.uri
                   for r in reads("ResponseStarted")), n


def pod_and_jobset_lists(ns, since: int) -> list[str]:
    """The pod and JobSet LISTs the ServiceAccount made since request ``since`` (once the
    records' LIST after them is in the audit log: it is written when a response completes)."""
    wait_for(lambda: any(r.verb == "list" and r.resource == "configmaps"
                         for r in ns.requests()[since:]), 10, message="the listing in the audit log")
    return sorted(r.resource for r in ns.requests()[since:]
                  if r.verb == "list" and r.resource in ("pods", "jobsets"))


def test_a_listing_takes_jobsets_and_pods_from_the_watches_and_still_shows_a_fresh_launch(
        realkube, user):
    """Once the namespace's two watches have listed, ``list_clusters`` asks the API for the
    records only. A cluster launched a moment ago, by this backend or by another process, is
    listed at once all the same, and a cluster deleted and launched again under its name is not
    shown with its predecessor's JobSet while the watch still holds that one."""
    ns, backend = user
    backend.launch(spec("one"), detach=True)
    running(realkube, ns.name, "one")
    wait_for(lambda: [t.phase for t in backend.list_clusters()[0].tasks] == [Phase.RUNNING] * 3, 60,
             message="the listing to show one's tasks running")
    before = len(ns.requests())
    [one] = backend.list_clusters()
    assert (one.name, one.phase) == ("one", Phase.RUNNING)
    assert pod_and_jobset_lists(ns, before) == []  # served from the watches

    other = KubernetesBackend(namespace=ns.name, api_client=ns.api_client, user="alice",
                              storage_class="standard")
    try:
        other.launch(spec("two"), detach=True)  # another kernel, the CLI
        assert [c.name for c in backend.list_clusters()] == ["two", "one"]
        backend.launch(spec("three"), detach=True)
        assert [c.name for c in backend.list_clusters()] == ["three", "two", "one"]

        feed = backend._feed
        wait_for(lambda: "two" in feed.snapshot()[1], 30, message="two's JobSet in the watch")
        old = feed.snapshot()[1]["two"]
        other.delete("two")
        other.launch(spec("two"), detach=True)
        running(realkube, ns.name, "two")
        uid = realkube.core.read_namespaced_config_map("two", ns.name).metadata.uid
        wait_for(lambda: feed.snapshot()[1].get("two", {}).get("metadata", {}).get(
            "ownerReferences", [{}])[0].get("uid") == uid, 30, message="the new two's JobSet in the watch")
        # the watch lags behind: it still holds the JobSet of the deleted two, which had failed,
        # and has not seen the new one yet
        failed = {**old, "status": {**(old.get("status") or {}), "conditions": [{
            "type": "Failed", "status": "True", "reason": "FailedJobs", "message": "jobs failed",
            "lastTransitionTime": old["metadata"]["creationTimestamp"]}]}}

        class Lagging(dict):
            def __setitem__(self, name, jobset):
                if name != "two":
                    super().__setitem__(name, jobset)

            def pop(self, name, *default):
                return self.get(name, *default) if name == "two" else super().pop(name, *default)

        with feed._lock:
            feed._jobsets = Lagging({**feed._jobsets, "two": failed})
        before = len(ns.requests())
        listed = {c.name: c for c in backend.list_clusters()}
        assert listed["two"].phase != Phase.FAILED, listed["two"]
        assert pod_and_jobset_lists(ns, before) == ["jobsets", "pods"]  # asked the API instead
    finally:
        other.close()


def test_the_sidebar_discovers_from_the_watches_a_launch_and_a_delete_by_another_process(
        realkube, user):
    """The sidebar's discovery pass on the real API server: a cluster another process launches
    shows at the next pass, one it deletes goes at the next pass, and once the watches have
    listed a pass lists only the records."""
    from tfk8s_magics.sidebar.monitor import ClusterMonitor

    ns, backend = user
    other = KubernetesBackend(namespace=ns.name, api_client=ns.api_client, user="alice",
                              storage_class="standard")
    monitor = ClusterMonitor(backend=backend)
    try:
        other.launch(spec("a"), detach=True)
        monitor.discover()
        assert [r["name"] for r in monitor.snapshot()] == ["a"]
        running(realkube, ns.name, "a")
        wait_for(lambda: monitor.discover() or monitor.snapshot()[0]["ready"] == 3, 60,
                 message="a's row to show 3 ready tasks")
        before = len(ns.requests())
        monitor.discover()
        assert pod_and_jobset_lists(ns, before) == []
        other.launch(spec("b"), detach=True)
        monitor.discover()
        assert [r["name"] for r in monitor.snapshot()] == ["b", "a"]
        other.delete("a")
        monitor.discover()
        assert [r["name"] for r in monitor.snapshot()] == ["b"]
    finally:
        monitor.close()
        other.close()


def test_launch_without_the_jobset_api_says_what_to_install(realkube, user, monkeypatch):
    """A cluster that does not serve the JobSet API: the real API server's discovery answers 404 for
    an API it does not serve (asked here for a JobSet version no release serves); one sentence,
    nothing created."""
    from tfk8s_magics.backends.kubernetes import backend as kb

    ns, backend = user
    monkeypatch.setattr(kb, "API_VERSION", "jobset.x-k8s.io/v1alpha9")
    before = len(ns.requests())
    with pytest.raises(LaunchFailed, match=r"does not serve the JobSet API .* install JobSet v0.7"):
        backend.launch(spec(), detach=True)
    asked = [(r.verb, r.uri, r.code) for r in ns.requests()[before:]]
    assert ("get", "/apis/jobset.x-k8s.io/v1alpha9", 404) in asked, asked
    assert not [a for a in asked if a[0] == "create"]
    assert objects(realkube, ns.name, "mnist", with_pods=True) == []


def test_the_sidebars_first_pass_watches_from_the_records_it_listed(realkube, user, monkeypatch):
    """The sidebar's discovery pass lists the records once and watches every running cluster
    from the record it listed: no record is read again per cluster (a fresh server's first pass
    with 50 clusters read each twice). Without that reuse the same pass GETs each record; a
    listing older than ``LISTED_FRESH`` is not trusted, and a cluster deleted since is not found."""
    from tfk8s_magics import api
    from tfk8s_magics.backends.kubernetes import backend as backend_mod
    from tfk8s_magics.sidebar.monitor import ClusterMonitor

    ns, backend = user
    names = ("a", "b", "c")
    fresh_for = backend_mod.LISTED_FRESH
    for name in names:
        backend.launch(spec(name, ps=0, workers=1), detach=True)

    def record_reads(fresh_within: float) -> list[str]:
        monkeypatch.setattr(backend_mod, "LISTED_FRESH", fresh_within)
        fresh = KubernetesBackend(namespace=ns.name, api_client=ns.api_client, user="alice",
                                  storage_class="standard")
        monitor = ClusterMonitor(backend=fresh)
        try:
            before = len(ns.requests())
            monitor.discover()
            wait_for(lambda: sorted(fresh._watches) == sorted(names), 60, message="a watch per cluster")
            fresh.list_clusters()  # its record LIST is logged after every read made before it
            wait_for(lambda: [r.verb for r in ns.requests()[before:] if r.resource == "configmaps"
                              ].count("list") == 2, 10, message="the second listing in the audit log")
            return [f"{r.verb} {r.uri.split('?')[0].rsplit('/', 1)[-1]}" for r in ns.requests()[before:]
                    if r.resource == "configmaps"]
        finally:
            monitor.close()
            fresh.close()

    # the defence removed: every listing is too old to stand for a read
    reads = record_reads(-1.0)
    assert sorted(r for r in reads if r.startswith("get")) == sorted(f"get {n}" for n in names * 2), reads
    # the pass watches from what it listed
    assert record_reads(fresh_for) == ["list configmaps", "list configmaps"]

    # a cluster this backend changed is read again, however fresh its listing
    fresh = KubernetesBackend(namespace=ns.name, api_client=ns.api_client, user="alice",
                              storage_class="standard")
    try:
        monkeypatch.setattr(backend_mod, "LISTED_FRESH", fresh_for)
        assert {c.name for c in fresh.list_clusters()} == set(names)
        fresh.delete("b")
        with pytest.raises(ClusterNotFound, match="no cluster named 'b'"):
            api.get("b", fresh)
        # an old listing is read again: a cluster another process deleted since is not found
        monkeypatch.setattr(backend_mod, "LISTED_FRESH", 0.0)
        assert {c.name for c in fresh.list_clusters()} == {"a", "c"}
        backend.delete("c")
        with pytest.raises(ClusterNotFound, match="no cluster named 'c'"):
            api.get("c", fresh)
    finally:
        fresh.close()
