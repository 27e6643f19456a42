"""KubernetesBackend's objects, reads, rollback and watches on the REAL cluster (``scripts/kube up``).

Every call is made as the user's own ServiceAccount in a namespace bootstrapped as the hub does it;
what the backend sent is read back from the API server's audit log. The owner references are
followed by the real garbage collector, the pods are made by JobSet's and the Job controller's own
hands, the scheduler says why a pod waits, and RBAC refuses what the Role does not give.
"""

from __future__ import annotations

import threading

import pytest
from kubernetes import client

from tests.realkube import wait_for
from tfk8s_magics.backends.base import Phase
from tfk8s_magics.backends.kubernetes import KubernetesBackend
from tfk8s_magics.backends.kubernetes.rbac import backend_role
from tfk8s_magics.errors import ClusterExists, LaunchFailed
from tfk8s_magics.spec import ClusterSpec, Resources

pytestmark = pytest.mark.k8s

SCRIPT = "print('training')\n"
KINDS = ("configmaps", "services", "persistentvolumeclaims", "pods", "networkpolicies", "deployments",
         "jobsets")


@pytest.fixture
def user(realkube):
    ns = realkube.user_namespace("alice")
    backend = KubernetesBackend(namespace=ns.name, api_client=ns.api_client, user="alice",
                                storage_class="standard")
    yield ns, backend
    backend.close()
    for r in ns.requests():
        assert r.code != 403, f"{r.verb} {r.uri} was denied to the user: the shipped Role lacks it"
        assert r.namespace in (ns.name, None), f"{r.verb} {r.uri} left the namespace {ns.name}"


def spec(name="mnist", **kw) -> ClusterSpec:
    kw.setdefault("ps", 1)
    kw.setdefault("workers", 2)
    kw.setdefault("ps_grace_period", 0.5)
    if kw.get("mode") != "in-graph":
        kw.setdefault("script", SCRIPT)
    return ClusterSpec(name=name, **kw)


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


def jobset(realkube, ns: str, name: str) -> dict:
    return realkube.custom.get_namespaced_custom_object(*JOBSETS, ns, "jobsets", name)


def writes(ns, since: int = 0) -> list[str]:
    return [f"{r.verb} {r.uri}" for r in ns.requests()[since:] if r.verb not in ("get", "list", "watch")]


def task_pods(realkube, ns, name, role=None):
    sel = f"jobset.sigs.k8s.io/jobset-name={name}"
    if role:
        sel += f",jobset.sigs.k8s.io/replicatedjob-name={role}"
    return [p for p in realkube.pods(ns, sel) if p.metadata.deletion_timestamp is None]


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


def test_delete_then_relaunch_under_the_same_name(realkube, user):
    ns, backend = user
    backend.launch(spec(), detach=True)
    wait_for(lambda: len(task_pods(realkube, ns.name, "mnist")) == 3, 90, message="pods")
    done = threading.Event()
    deleter = threading.Thread(target=lambda: (backend.delete("mnist"), done.set()), daemon=True)
    deleter.start()
    assert done.wait(120), "delete did not return"
    assert objects(realkube, ns.name, "mnist", with_pods=True) == []  # delete waited for the GC
    backend.launch(spec(), detach=True)  # the same name works at once
    deleter.join(5)


def test_in_graph_tensorboard_and_no_network_policy(realkube, user, monkeypatch):
    ns, backend = user
    backend.launch(spec("ig", mode="in-graph"), detach=True)
    # NetworkPolicies are additive: a per-cluster one could not narrow the namespace's isolation
    assert not [k for k in objects(realkube, ns.name, "ig") if k[0] == "networkpolicies"]
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/alice/")
    tb = backend.tensorboard("ig")
    assert tb.url == f"/user/alice/proxy/ig-tensorboard.{ns.name}.svc:6006/"
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


