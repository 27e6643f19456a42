"""One user cannot keep every other user off a node or zone: the bootstrap's quota of no pods in
the ``CrossNamespacePodAffinity`` scope, on the REAL API server (tier 1: ``scripts/kube up``).

Each attack is made with the user's own ServiceAccount token, through objects the shipped Role
lets a user create (a Deployment, a JobSet), first with the quota deleted (the pod is made: the
attack works, so the test can fail), then with it in place (the controller's pod is refused by
quota admission, after JobSet's own webhook injected the term). The lab's own launches, whose
spreading is a same-namespace preference, still pass the same quota and the GPU quota of 0.
"""

from __future__ import annotations

import kubernetes.client
import pytest

from tests.realkube import wait_for
from tfk8s_magics.backends.base import Phase
from tfk8s_magics.spec import ClusterSpec

pytestmark = pytest.mark.k8s

QUOTA = "tfk8s-no-cross-namespace-affinity"
EXCLUSIVE = "alpha.jobset.sigs.k8s.io/exclusive-topology"
#: A pod that passes Pod Security "restricted" (kwok runs it; nothing is pulled).
CONTAINER = {
    "name": "c", "image": "registry.k8s.io/pause:3.10",
    "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": 1000,
                        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
}
EVERY_NAMESPACE_ANTI_AFFINITY = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
    {"labelSelector": {"matchLabels": {"hog": "yes"}}, "topologyKey": "kubernetes.io/hostname",
     "namespaceSelector": {}}]}}


def deployment(name: str) -> dict:
    """A Deployment whose pods keep every other namespace's "hog" pods off their node."""
    labels = {"app": name, "hog": "yes"}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"affinity": EVERY_NAMESPACE_ANTI_AFFINITY,
                                           "containers": [CONTAINER]}}}}


def exclusive_jobset(name: str) -> dict:
    """A JobSet asking for a node of its own (JobSet's webhook injects the affinity terms)."""
    pod = {"restartPolicy": "Never", "containers": [CONTAINER]}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "annotations": {EXCLUSIVE: "kubernetes.io/hostname"}},
            "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": {
                "parallelism": 1, "completions": 1, "backoffLimit": 0, "completionMode": "Indexed",
                "template": {"spec": pod}}}}]}}


def quota_ready(kube, ns: str, name: str) -> None:
    """Quota admission refuses every pod of a namespace whose quota has no status yet."""
    wait_for(lambda: (kube.core.read_namespaced_resource_quota(name, ns).status.hard or None), 60,
             message=f"ResourceQuota {name}'s status")


def pods(kube, ns: str, selector: str) -> list:
    return kube.pods(ns, selector)


def refused(kube, ns: str, owner_kind: str) -> str:
    """The quota refusal a controller recorded creating a pod (FailedCreate), or ''."""
    for e in kube.events(ns, reason="FailedCreate"):
        if e.involved_object.kind == owner_kind and QUOTA in (e.message or ""):
            return e.message
    return ""


@pytest.fixture
def attacker(realkube):
    """A bootstrapped user namespace, its bootstrap spec, and clients acting as its ServiceAccount."""
    from tfk8s_hub.bootstrap import BootstrapSpec, affinity_quota

    spec = BootstrapSpec(hub_namespace="default", quota={"pods": "10", "requests.cpu": "4",
                                                         "requests.memory": "8Gi"},
                         default_requests={"cpu": "100m", "memory": "64Mi"})
    ns = realkube.user_namespace("hog", bootstrap=spec)
    quota_ready(realkube, ns.name, QUOTA)
    apps = kubernetes.client.AppsV1Api(ns.api_client)
    custom = kubernetes.client.CustomObjectsApi(ns.api_client)

    def remove_quota():
        realkube.core.delete_namespaced_resource_quota(QUOTA, ns.name)

    def restore_quota():
        realkube.apply([affinity_quota(spec, ns.name)])
        quota_ready(realkube, ns.name, QUOTA)

    return ns, apps, custom, remove_quota, restore_quota


def test_a_deployment_with_every_namespace_anti_affinity_is_refused(realkube, attacker):
    ns, apps, _, remove_quota, restore_quota = attacker
    # the defence removed: the user's pod is made, with its term over every namespace
    remove_quota()
    apps.create_namespaced_deployment(ns.name, deployment("hog-a"))
    (made,) = wait_for(lambda: pods(realkube, ns.name, "app=hog-a"), 60, message="hog-a's pod")
    assert made.spec.affinity.pod_anti_affinity.required_during_scheduling_ignored_during_execution[
        0].namespace_selector is not None
    # in place: the ReplicaSet's pod is refused by quota admission, and none is made
    restore_quota()
    apps.create_namespaced_deployment(ns.name, deployment("hog-b"))
    message = wait_for(lambda: refused(realkube, ns.name, "ReplicaSet"), 60,
                       message="the ReplicaSet's FailedCreate")
    assert "exceeded quota" in message and "pods=0" in message.replace(" ", ""), message
    assert not pods(realkube, ns.name, "app=hog-b")


def test_jobsets_exclusive_topology_annotation_is_refused(realkube, attacker):
    ns, _, custom, remove_quota, restore_quota = attacker
    sel = "jobset.sigs.k8s.io/jobset-name={}"
    remove_quota()
    custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns.name, "jobsets",
                                           exclusive_jobset("own-a"))
    (made,) = wait_for(lambda: pods(realkube, ns.name, sel.format("own-a")), 60,
                       message="own-a's leader pod")
    # JobSet's webhook gave the leader pod terms over every namespace
    terms = made.spec.affinity.pod_anti_affinity.required_during_scheduling_ignored_during_execution
    assert terms[0].namespace_selector is not None and terms[0].topology_key == "kubernetes.io/hostname"
    restore_quota()
    custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns.name, "jobsets",
                                           exclusive_jobset("own-b"))
    message = wait_for(lambda: refused(realkube, ns.name, "Job"), 90,
                       message="the Job's FailedCreate")
    assert "exceeded quota" in message, message
    assert not pods(realkube, ns.name, sel.format("own-b"))


def test_the_labs_own_launch_passes_the_affinity_and_gpu_quotas(realkube, kube_user):
    from tfk8s_hub.bootstrap import BootstrapSpec
    from tfk8s_hub.settings import LabSettings

    # the default bootstrap: the affinity quota and requests.nvidia.com/gpu 0
    spec = BootstrapSpec.from_settings(LabSettings(hub_namespace="default"))
    assert spec.quota["requests.nvidia.com/gpu"] == "0"
    ns, backend = kube_user("lab", bootstrap=spec)
    quota_ready(realkube, ns.name, QUOTA)
    quota_ready(realkube, ns.name, "tfk8s-quota")
    # spread: the lab's own anti-affinity, a same-namespace preference, is not in the scope
    backend.launch(ClusterSpec(name="spread", ps=1, workers=2, script="print(1)\n",
                               spread=("worker",), ps_grace_period=0.5))
    sel = "jobset.sigs.k8s.io/jobset-name=spread"
    wait_for(lambda: len([p for p in pods(realkube, ns.name, sel) if p.status.phase == "Running"]) == 3,
             90, message="3 running task pods")
    assert backend.status("spread").phase == Phase.RUNNING
    assert not refused(realkube, ns.name, "Job")
