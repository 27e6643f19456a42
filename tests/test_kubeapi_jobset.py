"""The fake API server (tests/kubeapi, a TEST DOUBLE) serves JobSets like a cluster with JobSet installed.

CRUD, watch, status subresource, discovery and CRD-schema validation (422)
through the official client's ``CustomObjectsApi``; the pods it creates for
a JobSet (names, hostnames, labels as JobSet and the Job controller set
them); and what it does *not* do on its own (restart, replace, finish).
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests.kubeapi.resources import lookup
from tfk8s_magics.backends.kubernetes import jobset as j
from tfk8s_magics.backends.kubernetes.settings import K8sSettings
from tfk8s_magics.lifecycle import LifecyclePolicy
from tfk8s_magics.spec import ClusterSpec

NS = "alice"
GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"


def jobset_manifest(name: str = "mnist", **kw) -> dict:
    spec = ClusterSpec(name=name, ps=1, workers=2, script="print(1)\n", owner="alice", **kw)
    return j.jobset(spec, K8sSettings(namespace=NS, image="task:1", user="alice"),
                    LifecyclePolicy.of(spec))


@pytest.fixture
def custom(kube):
    kube.create_namespace(NS)
    return client.CustomObjectsApi(kube.api_client)


def create(custom, body: dict) -> dict:
    return custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)


def test_crud_and_status_subresource(kube, custom):
    created = create(custom, jobset_manifest())
    assert created["metadata"]["uid"] and created["metadata"]["generation"] == 1
    got = custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "mnist")
    assert got["spec"] == jobset_manifest()["spec"]
    listed = custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL,
                                                  label_selector="tfk8s.io/cluster=mnist")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["mnist"]
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, NS, PLURAL, "mnist",
                                                 {"status": {"restarts": 1}})
    patched = custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "mnist",
                                                    {"spec": {"suspend": True}})
    assert patched["status"]["restarts"] == 1 and patched["spec"]["suspend"] is True
    assert patched["metadata"]["generation"] == 2
    custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "mnist")
    with pytest.raises(ApiException) as info:
        custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "mnist")
    assert info.value.status == 404
    assert json.loads(info.value.body)["message"] == 'jobsets.jobset.x-k8s.io "mnist" not found'


def test_schema_violation_and_undeclared_field_are_422_like_a_crd(kube, custom):
    bad = jobset_manifest()
    bad["spec"]["replicatedJobs"][0]["replicas"] = "one"
    bad["spec"]["successPolicy"]["operater"] = "All"
    with pytest.raises(ApiException) as info:
        create(custom, bad)
    status = json.loads(info.value.body)
    assert (info.value.status, status["reason"]) == (422, "Invalid")
    assert status["message"].startswith('JobSet.jobset.x-k8s.io "mnist" is invalid: ')
    assert 'spec.replicatedJobs[0].replicas in body must be of type integer: "string"' \
        in status["message"]
    fields = {c["field"] for c in status["details"]["causes"]}
    assert fields == {"spec.replicatedJobs[0].replicas", "spec.successPolicy.operater"}
    assert kube.list_objects("jobsets", NS) == []


def test_job_templates_are_checked_as_jobs_of_the_cluster_version(make_kube):
    # Job.spec.managedBy exists in the CRD's embedded Job schema and in
    # Kubernetes 1.37, not in 1.29: the Jobs JobSet makes would be refused there.
    body = jobset_manifest()
    body["spec"]["replicatedJobs"][0]["template"]["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
    for version, accepted in (("1.29", False), ("1.37", True)):
        kube = make_kube(kubernetes_version=version)
        kube.create_namespace(NS)
        custom = client.CustomObjectsApi(kube.api_client)
        if accepted:
            create(custom, body)
        else:
            with pytest.raises(ApiException) as info:
                create(custom, body)
            assert info.value.status == 422
            assert 'Job "mnist-ps-0" is invalid' in json.loads(info.value.body)["message"]


def test_watch_streams_jobset_events(kube, custom):
    start = custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["metadata"][
        "resourceVersion"]
    create(custom, jobset_manifest())
    kube.jobsets.finish(NS, "mnist")
    custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "mnist")
    seen = [(e["type"], (e["object"].get("status") or {}).get("terminalState"))
            for e in watch.Watch().stream(custom.list_namespaced_custom_object, GROUP, VERSION,
                                          NS, PLURAL, resource_version=start, timeout_seconds=1)]
    assert seen[0] == ("ADDED", None)
    assert ("MODIFIED", "Completed") in seen
    assert seen[-1][0] == "DELETED"


def test_discovery_lists_the_jobset_group(kube):
    resources = client.CustomObjectsApi(kube.api_client).get_api_resources(GROUP, VERSION)
    assert resources.group_version == f"{GROUP}/{VERSION}"
    assert {r.name for r in resources.resources} == {"jobsets", "jobsets/status"}
    groups = client.ApisApi(kube.api_client).get_api_versions()
    assert GROUP in [g.name for g in groups.groups]


def test_pods_and_service_as_jobset_and_the_job_controller_make_them(kube, custom):
    created = create(custom, jobset_manifest())
    pods = kube.jobsets.pods(NS, "mnist")
    assert [p["spec"]["hostname"] for p in pods] == [
        "mnist-ps-0-0", "mnist-worker-0-0", "mnist-worker-0-1"]
    worker = pods[2]
    assert worker["metadata"]["name"].startswith("mnist-worker-0-1-")
    assert len(worker["metadata"]["name"]) == len("mnist-worker-0-1-") + 5
    assert worker["spec"]["subdomain"] == "mnist"
    labels = worker["metadata"]["labels"]
    assert labels["jobset.sigs.k8s.io/jobset-name"] == "mnist"
    assert labels["jobset.sigs.k8s.io/jobset-uid"] == created["metadata"]["uid"]
    assert labels["jobset.sigs.k8s.io/replicatedjob-name"] == "worker"
    assert labels["jobset.sigs.k8s.io/job-index"] == "0"
    assert labels["jobset.sigs.k8s.io/restart-attempt"] == "0"
    assert labels["batch.kubernetes.io/job-completion-index"] == "1"
    assert labels["batch.kubernetes.io/job-name"] == "mnist-worker-0"
    assert labels["tfk8s.io/role"] == "worker"  # the template's own labels are kept
    assert worker["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "1"
    env = worker["spec"]["containers"][0]["env"]
    assert env[-1] == {"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}
    assert j.task_of_pod(labels).name == "worker-1"
    svc = kube.get_object("services", "mnist", NS)
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {"jobset.sigs.k8s.io/jobset-name": "mnist"}
    assert svc["metadata"]["ownerReferences"][0]["kind"] == "JobSet"
    # Deleting the JobSet takes its pods and Service with it (garbage collection).
    custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "mnist")
    assert kube.jobsets.pods(NS, "mnist") == []
    assert kube.get_object("services", "mnist", NS) is None


def test_the_double_decides_nothing_a_test_says_what_jobset_did(kube, custom):
    create(custom, jobset_manifest())
    w1 = kube.jobsets.pod_name(NS, "mnist", "worker", 1)
    kube.kubelet.run(NS, w1)
    kube.kubelet.succeed(NS, w1, exit_code=137)
    ps = kube.jobsets.pod_name(NS, "mnist", "ps", 0)
    kube.store.delete(lookup("pods"), NS, ps)
    # No restart, no replacement, no status: those are JobSet's and the Job controller's.
    assert kube.jobsets.pod_name(NS, "mnist", "worker", 1) == w1
    with pytest.raises(KeyError):
        kube.jobsets.pod_name(NS, "mnist", "ps", 0)
    assert "status" not in kube.get_object("jobsets", "mnist", NS) or \
        not kube.get_object("jobsets", "mnist", NS)["status"].get("conditions")
    kube.jobsets.finish(NS, "mnist", "Failed", "ReachedMaxRestarts",
                        "jobset failed due to reaching max number of restarts")
    js = kube.get_object("jobsets", "mnist", NS)
    assert js["status"]["conditions"][0]["type"] == "Failed"
    # a finished JobSet's active Jobs are deleted; an ended pod stays as it ended
    assert [p["metadata"]["name"] for p in kube.jobsets.pods(NS, "mnist")] == [w1]


def test_rbac_covers_jobsets(kube, custom):
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "r", "namespace": NS},
            "rules": [{"apiGroups": [GROUP], "resources": ["jobsets"], "verbs": ["get", "list"]}]}
    kube.set_role(role, NS, "notebook")
    with pytest.raises(ApiException) as info:
        create(custom, jobset_manifest())
    assert info.value.status == 403
    assert 'cannot create resource "jobsets" in API group "jobset.x-k8s.io"' in \
        json.loads(info.value.body)["message"]
    assert custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["items"] == []


def test_foreground_deletion_removes_the_owner_with_its_dependents(kube, custom):
    """(A pod held Terminating, the owner waiting for it: tests/test_kube_backend.py, real.)"""
    core = client.CoreV1Api(kube.api_client)
    root = core.create_namespaced_config_map(NS, {"metadata": {"name": "mnist"}})
    body = jobset_manifest()
    body["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap",
                                            "name": "mnist", "uid": root.metadata.uid,
                                            "blockOwnerDeletion": True}]
    create(custom, body)
    for pod in kube.jobsets.pods(NS, "mnist"):
        kube.kubelet.run(NS, pod["metadata"]["name"])
    answer = core.delete_namespaced_config_map(
        "mnist", NS, body=client.V1DeleteOptions(propagation_policy="Foreground"))
    assert answer is not None
    for kind in ("configmaps", "jobsets", "pods", "services"):
        assert kube.list_objects(kind, NS) == [], kind
    core.create_namespaced_config_map(NS, {"metadata": {"name": "mnist"}})  # free again


def test_background_deletion_is_immediate_for_the_owner(kube, custom):
    create(custom, jobset_manifest())
    custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "mnist",
                                           body=client.V1DeleteOptions(
                                               propagation_policy="Foreground"))
    # Without graceful pods every dependent goes at once, so the owner does too.
    assert kube.list_objects("jobsets", NS) == [] and kube.jobsets.pods(NS, "mnist") == []
