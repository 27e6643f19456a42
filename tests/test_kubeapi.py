"""Proves the fake Kubernetes API server (tests/kubeapi, a TEST DOUBLE) behaves
like a real one, through the official ``kubernetes`` client."""

from __future__ import annotations

import json
import threading

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

NS = "alice"


def pod_manifest(name="p", labels=None, containers=None, resources=None, **spec):
    container = {"name": "main", "image": "python:3.11"}
    if resources:
        container["resources"] = resources
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {"containers": containers or [container], **spec}}


@pytest.fixture
def core(kube):
    kube.create_namespace(NS)
    return client.CoreV1Api(kube.api_client)


def status_of(exc: ApiException) -> dict:
    return json.loads(exc.body)


# -- CRUD and metadata --------------------------------------------------------


def test_crud_stamps_uid_resource_version_and_generation(kube, core):
    created = core.create_namespaced_config_map(
        NS, {"metadata": {"name": "cm", "labels": {"a": "1"}}, "data": {"k": "v"}})
    assert len(created.metadata.uid) == 36
    assert created.metadata.creation_timestamp is not None
    rv1 = int(created.metadata.resource_version)

    got = core.read_namespaced_config_map("cm", NS)
    assert got.metadata.uid == created.metadata.uid and got.data == {"k": "v"}

    patched = core.patch_namespaced_config_map("cm", NS, {"data": {"k": "w"}})
    assert int(patched.metadata.resource_version) > rv1
    assert patched.metadata.uid == created.metadata.uid

    got.data = {"k": "x"}
    got.metadata.resource_version = patched.metadata.resource_version
    replaced = core.replace_namespaced_config_map("cm", NS, got)
    assert replaced.data == {"k": "x"}

    assert [c.metadata.name for c in core.list_namespaced_config_map(NS).items] == ["cm"]
    status = core.delete_namespaced_config_map("cm", NS)
    assert status["status"] == "Success" and status["details"]["name"] == "cm"
    assert kube.get_object("configmaps", "cm", NS) is None


def test_generation_bumps_on_spec_change_only(kube, core):
    apps = client.AppsV1Api(kube.api_client)
    dep = apps.create_namespaced_deployment(NS, {
        "metadata": {"name": "tb"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "tb"}},
                 "template": {"metadata": {"labels": {"app": "tb"}},
                              "spec": {"containers": [{"name": "tb", "image": "tb:1"}]}}}})
    assert dep.metadata.generation == 1
    labelled = apps.patch_namespaced_deployment("tb", NS, {"metadata": {"labels": {"x": "y"}}})
    assert labelled.metadata.generation == 1
    scaled = apps.patch_namespaced_deployment("tb", NS, {"spec": {"replicas": 2}})
    assert scaled.metadata.generation == 2


def test_generate_name_and_cluster_scoped_kinds(kube, core):
    pod = core.create_namespaced_pod(NS, {**pod_manifest(), "metadata": {"generateName": "w-"}})
    assert pod.metadata.name.startswith("w-") and len(pod.metadata.name) == 7
    assert pod.status.phase == "Pending" and pod.spec.restart_policy == "Always"
    assert [n.metadata.name for n in core.list_node().items] == ["node-1"]
    storage = client.StorageV1Api(kube.api_client)
    assert [s.metadata.name for s in storage.list_storage_class().items] == ["standard"]


def test_every_kind_in_the_table_round_trips(kube, core):
    net = client.NetworkingV1Api(kube.api_client)
    rbac = client.RbacAuthorizationV1Api(kube.api_client)
    batch = client.BatchV1Api(kube.api_client)
    core.create_namespaced_service(NS, {"metadata": {"name": "svc"}, "spec": {
        "clusterIP": "None", "selector": {"a": "b"}, "ports": [{"port": 2222}]}})
    core.create_namespaced_secret(NS, {"metadata": {"name": "s"}, "stringData": {"a": "b"}})
    core.create_namespaced_service_account(NS, {"metadata": {"name": "sa"}})
    core.create_namespaced_persistent_volume_claim(NS, {"metadata": {"name": "data"}, "spec": {
        "accessModes": ["ReadWriteMany"], "storageClassName": "standard",
        "resources": {"requests": {"storage": "1Gi"}}}})
    core.create_namespaced_limit_range(NS, {"metadata": {"name": "lr"}, "spec": {"limits": []}})
    net.create_namespaced_network_policy(NS, {"metadata": {"name": "np"}, "spec": {
        "podSelector": {}, "policyTypes": ["Ingress"]}})
    rbac.create_namespaced_role(NS, {"metadata": {"name": "r"}, "rules": []})
    rbac.create_namespaced_role_binding(NS, {"metadata": {"name": "rb"}, "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
        "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": NS}]})
    batch.create_namespaced_job(NS, {"metadata": {"name": "j"}, "spec": {"template": {
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}})
    assert core.read_namespaced_service("svc", NS).spec.cluster_ip == "None"
    assert net.read_namespaced_network_policy("np", NS).spec.policy_types == ["Ingress"]
    assert rbac.read_namespaced_role_binding("rb", NS).role_ref.name == "r"
    assert batch.read_namespaced_job("j", NS).spec.selector.match_labels
    deleted = core.delete_namespaced_service("svc", NS)
    assert deleted.metadata.name == "svc"  # services answer DELETE with the object


# -- errors -------------------------------------------------------------------


def test_not_found_and_already_exists_are_status_objects(kube, core):
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod("nope", NS)
    assert exc.value.status == 404
    body = status_of(exc.value)
    assert body["kind"] == "Status" and body["reason"] == "NotFound"
    assert body["message"] == 'pods "nope" not found'

    core.create_namespaced_pod(NS, pod_manifest("dup"))
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(NS, pod_manifest("dup"))
    assert exc.value.status == 409 and status_of(exc.value)["reason"] == "AlreadyExists"

    apps = client.AppsV1Api(kube.api_client)
    with pytest.raises(ApiException) as exc:
        apps.read_namespaced_deployment("x", NS)
    assert status_of(exc.value)["message"] == 'deployments.apps "x" not found'


def test_create_in_missing_namespace_is_404(kube, core):
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod("ghost", pod_manifest())
    assert exc.value.status == 404
    assert status_of(exc.value)["message"] == 'namespaces "ghost" not found'


def test_stale_resource_version_is_conflict(kube, core):
    cm = core.create_namespaced_config_map(NS, {"metadata": {"name": "cm"}, "data": {}})
    core.patch_namespaced_config_map("cm", NS, {"data": {"a": "1"}})
    cm.data = {"b": "2"}
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_config_map("cm", NS, cm)
    assert exc.value.status == 409 and status_of(exc.value)["reason"] == "Conflict"


def raw_call(kube, method, path, body=None, content_type="application/json"):
    """Send ``body`` through the official client's transport without its model checks
    (the typed methods already refuse unknown fields client-side)."""
    api = kube.api_client
    params = api.param_serialize(method=method, resource_path=path, body=body,
                                 header_params={"Content-Type": content_type,
                                                "Accept": "application/json"})
    response = api.call_api(*params)
    response.read()
    return api.response_deserialize(response, {"2XX": "object"}).data


def test_strict_schema_rejects_unknown_field(kube, core):
    bad = pod_manifest()
    bad["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(ApiException) as exc:
        raw_call(kube, "POST", f"/api/v1/namespaces/{NS}/pods", bad)
    body = status_of(exc.value)
    assert exc.value.status == 422 and body["reason"] == "Invalid"
    assert "imagePullPolicyy" in body["message"]
    assert body["details"]["causes"][0]["field"] == "spec.containers.0"
    assert kube.get_object("pods", "p", NS) is None


def test_schema_verdicts_match_kubernetes_validate(kube):
    """The server's cached validators give kubernetes-validate's own verdicts."""
    import kubernetes_validate

    from tests.kubeapi.resources import lookup

    bad_job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
               "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i",
                                                              "resources": {"limit": {}}}]}}}}
    bad_pod = pod_manifest()
    bad_pod["spec"]["containers"][0]["ports"] = [{"containerPort": "2222"}]
    for kind, obj in (("jobs", bad_job), ("pods", bad_pod)):
        with pytest.raises(kubernetes_validate.ValidationError) as lib:
            kubernetes_validate.validate(obj, "1.29", strict=True)
        with pytest.raises(Exception) as ours:
            kube.validator.validate(lookup(kind), obj)
        assert ours.value.code == 422 and lib.value.message in ours.value.message


def test_invalid_names_and_labels_are_422(kube, core):
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(NS, pod_manifest("Worker_0"))
    assert exc.value.status == 422 and "RFC 1123" in status_of(exc.value)["message"]
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(NS, pod_manifest("ok", labels={"user": "alice@example.com"}))
    assert exc.value.status == 422 and "metadata.labels" in status_of(exc.value)["message"]


def test_kubernetes_version_is_an_option(make_kube):
    # PodSpec.hostUsers arrived in the schema of 1.25+; 1.25's strict schema has it,
    # but resizePolicy on containers only exists from 1.27.
    manifest = pod_manifest()
    manifest["spec"]["containers"][0]["resizePolicy"] = [
        {"resourceName": "cpu", "restartPolicy": "NotRequired"}]
    for version, ok in (("1.25", False), ("1.29", True)):
        kube = make_kube(kubernetes_version=version)
        kube.create_namespace(NS)
        api = client.CoreV1Api(kube.api_client)
        if ok:
            api.create_namespaced_pod(NS, manifest)
        else:
            with pytest.raises(ApiException) as exc:
                api.create_namespaced_pod(NS, manifest)
            assert exc.value.status == 422 and "resizePolicy" in exc.value.body


# -- selectors ----------------------------------------------------------------


@pytest.mark.parametrize("selector, expected", [
    ("role=worker", ["w0", "w1"]),
    ("role==worker,index=1", ["w1"]),
    ("role!=worker", ["ps0", "tb"]),
    ("role in (ps, worker)", ["ps0", "w0", "w1"]),
    ("role notin (ps,worker)", ["tb"]),
    ("role", ["ps0", "w0", "w1"]),
    ("!role", ["tb"]),
])
def test_label_selectors(kube, core, selector, expected):
    for name, labels in (("w0", {"role": "worker", "index": "0"}),
                         ("w1", {"role": "worker", "index": "1"}),
                         ("ps0", {"role": "ps", "index": "0"}), ("tb", {"app": "tb"})):
        core.create_namespaced_pod(NS, pod_manifest(name, labels))
    found = core.list_namespaced_pod(NS, label_selector=selector).items
    assert sorted(p.metadata.name for p in found) == expected


def test_field_selectors_and_bad_selectors(kube, core):
    for name in ("a", "b"):
        core.create_namespaced_pod(NS, pod_manifest(name))
    kube.kubelet.run(NS, "a")
    running = core.list_namespaced_pod(NS, field_selector="status.phase=Running").items
    assert [p.metadata.name for p in running] == ["a"]
    named = core.list_namespaced_pod(NS, field_selector="metadata.name!=a").items
    assert [p.metadata.name for p in named] == ["b"]
    events = core.list_namespaced_event(NS, field_selector="involvedObject.name=a").items
    assert events and all(e.involved_object.name == "a" for e in events)
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_pod(NS, field_selector="spec.bogus=1")
    assert exc.value.status == 400
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_pod(NS, label_selector="a in (b")
    assert exc.value.status == 400


# -- watch --------------------------------------------------------------------


def test_watch_streams_added_modified_deleted(kube, core):
    start = core.list_namespaced_pod(NS).metadata.resource_version
    core.create_namespaced_pod(NS, pod_manifest("w", {"r": "x"}))
    kube.kubelet.run(NS, "w")
    core.delete_namespaced_pod("w", NS)
    seen = []
    for event in watch.Watch().stream(core.list_namespaced_pod, NS, label_selector="r=x",
                                      resource_version=start, timeout_seconds=1):
        seen.append((event["type"], event["object"].status.phase))
    types = [t for t, _ in seen]
    assert types[0] == "ADDED" and types[-1] == "DELETED" and "MODIFIED" in types
    assert ("MODIFIED", "Running") in seen


def test_watch_delivers_live_events_and_honours_timeout(kube, core):
    w = watch.Watch()
    got = []

    def consume():
        for event in w.stream(core.list_namespaced_config_map, NS, timeout_seconds=5):
            got.append((event["type"], event["object"].metadata.name))
            if event["type"] == "DELETED":
                w.stop()

    t = threading.Thread(target=consume)
    t.start()
    kube.wait_for(lambda: any(r.verb == "watch" for r in kube.requests), message="watch open")
    core.create_namespaced_config_map(NS, {"metadata": {"name": "live"}})
    core.delete_namespaced_config_map("live", NS)
    t.join(timeout=10)
    assert not t.is_alive()
    assert got == [("ADDED", "live"), ("DELETED", "live")]

    # an idle watch ends after timeoutSeconds
    events = list(watch.Watch().stream(core.list_namespaced_secret, NS, timeout_seconds=1))
    assert events == []


def test_watch_without_resource_version_lists_first_and_selector_transitions(kube, core):
    core.create_namespaced_pod(NS, pod_manifest("old", {"team": "a"}))
    core.create_namespaced_pod(NS, pod_manifest("moving", {"team": "a"}))
    core.patch_namespaced_pod("moving", NS, {"metadata": {"labels": {"team": "b"}}})
    rv = core.list_namespaced_pod(NS).metadata.resource_version
    initial = [(e["type"], e["object"].metadata.name) for e in watch.Watch().stream(
        core.list_namespaced_pod, NS, label_selector="team=a", timeout_seconds=1)]
    assert initial == [("ADDED", "old")]
    core.patch_namespaced_pod("old", NS, {"metadata": {"labels": {"team": "c"}}})
    left = [e["type"] for e in watch.Watch().stream(
        core.list_namespaced_pod, NS, label_selector="team=a", resource_version=rv,
        timeout_seconds=1)]
    assert left == ["DELETED"]  # an object leaving the selector is DELETED for this watch


def test_watch_too_old_resource_version_is_410(make_kube):
    kube = make_kube(history_size=5)
    kube.create_namespace(NS)
    core = client.CoreV1Api(kube.api_client)
    for i in range(10):
        core.create_namespaced_config_map(NS, {"metadata": {"name": f"c{i}"}})
    with pytest.raises(ApiException) as exc:
        list(watch.Watch().stream(core.list_namespaced_config_map, NS, resource_version="1",
                                  timeout_seconds=1))
    assert exc.value.status == 410 and "too old resource version" in exc.value.reason


# -- garbage collection -------------------------------------------------------


def test_deleting_owner_cascades(kube, core):
    root = core.create_namespaced_config_map(NS, {"metadata": {"name": "root"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "root",
           "uid": root.metadata.uid, "controller": True}
    svc = core.create_namespaced_service(NS, {"metadata": {"name": "svc",
                                                           "ownerReferences": [ref]},
                                              "spec": {"clusterIP": "None",
                                                       "ports": [{"port": 1}]}})
    grandchild_ref = {"apiVersion": "v1", "kind": "Service", "name": "svc",
                      "uid": svc.metadata.uid}
    core.create_namespaced_pod(NS, {**pod_manifest("child"), "metadata": {
        "name": "child", "ownerReferences": [grandchild_ref]}})
    core.create_namespaced_pod(NS, pod_manifest("bystander"))
    core.delete_namespaced_config_map("root", NS)
    assert kube.get_object("services", "svc", NS) is None
    assert kube.get_object("pods", "child", NS) is None
    assert kube.get_object("pods", "bystander", NS) is not None


def test_orphan_propagation_keeps_dependents(kube, core):
    root = core.create_namespaced_config_map(NS, {"metadata": {"name": "root"}})
    core.create_namespaced_secret(NS, {"metadata": {"name": "s", "ownerReferences": [{
        "apiVersion": "v1", "kind": "ConfigMap", "name": "root", "uid": root.metadata.uid}]}})
    core.delete_namespaced_config_map("root", NS, propagation_policy="Orphan")
    assert kube.get_object("secrets", "s", NS)["metadata"]["ownerReferences"] == []


def test_deleting_namespace_deletes_contents(kube, core):
    core.create_namespaced_pod(NS, pod_manifest())
    core.delete_namespace(NS)
    assert kube.get_object("pods", "p", NS) is None
    assert kube.get_object("namespaces", NS) is None


# -- RBAC ---------------------------------------------------------------------

ROLE = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "backend", "namespace": NS},
        "rules": [{"apiGroups": [""], "resources": ["pods", "pods/log"],
                   "verbs": ["get", "list", "watch", "create", "delete"]}]}


def test_rbac_denies_outside_role_and_records_requests(kube, core):
    kube.create_namespace("other")
    kube.set_role(ROLE, NS, service_account="jupyter")
    core.create_namespaced_pod(NS, pod_manifest())
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod("other", pod_manifest())
    body = status_of(exc.value)
    assert exc.value.status == 403 and body["reason"] == "Forbidden"
    assert body["message"] == (
        'pods is forbidden: User "system:serviceaccount:alice:jupyter" cannot create resource '
        '"pods" in API group "" in the namespace "other"')
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map(NS, {"metadata": {"name": "c"}})
    assert exc.value.status == 403
    with pytest.raises(ApiException) as exc:
        core.list_node()
    assert "at the cluster scope" in status_of(exc.value)["message"]
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod("p", NS, {"metadata": {"labels": {"a": "b"}}})
    assert status_of(exc.value)["message"].startswith('pods "p" is forbidden')

    # admin clients bypass RBAC
    client.CoreV1Api(kube.admin_api_client).create_namespaced_config_map(
        NS, {"metadata": {"name": "by-admin"}})

    reqs = [r for r in kube.requests if r.user != "system:admin"]
    assert [(r.verb, r.resource, r.namespace, r.allowed, r.code) for r in reqs] == [
        ("create", "pods", NS, True, 201),
        ("create", "pods", "other", False, 403),
        ("create", "configmaps", NS, False, 403),
        ("list", "nodes", None, False, 403),
        ("patch", "pods", NS, False, 403),
    ]
    assert reqs[0].user == "system:serviceaccount:alice:jupyter"


def test_rbac_subresource_rules(kube, core):
    core.create_namespaced_pod(NS, pod_manifest())
    kube.kubelet.run(NS, "p")
    kube.set_role({"rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}, NS)
    core.read_namespaced_pod("p", NS)
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod_log("p", NS)
    assert 'cannot get resource "pods/log"' in status_of(exc.value)["message"]
    assert kube.requests[-1].resource_path == "pods/log"


# -- quota and limit ranges ---------------------------------------------------


def test_resource_quota_rejects_and_tracks_usage(kube, core):
    core.create_namespaced_resource_quota(NS, {"metadata": {"name": "q"}, "spec": {"hard": {
        "pods": "2", "requests.cpu": "1", "requests.memory": "1Gi", "limits.cpu": "2",
        "limits.memory": "2Gi", "requests.nvidia.com/gpu": "1"}}})
    res = {"requests": {"cpu": "500m", "memory": "256Mi"},
           "limits": {"cpu": "1", "memory": "512Mi"}}
    core.create_namespaced_pod(NS, pod_manifest("a", resources=res, restartPolicy="Never"))
    used = core.read_namespaced_resource_quota("q", NS).status.used
    assert used["pods"] == "1" and used["requests.cpu"] == "500m"
    assert used["requests.memory"] == str(256 * 2**20)

    big = {"requests": {"cpu": "600m", "memory": "256Mi"},
           "limits": {"cpu": "1", "memory": "512Mi"}}
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(NS, pod_manifest("b", resources=big))
    body = status_of(exc.value)
    assert exc.value.status == 403 and body["reason"] == "Forbidden"
    assert body["message"] == ('pods "b" is forbidden: exceeded quota: q, requested: '
                               'requests.cpu=600m, used: requests.cpu=500m, limited: '
                               'requests.cpu=1')

    gpus = {"limits": {"cpu": "100m", "memory": "64Mi", "nvidia.com/gpu": "2"}}
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(NS, pod_manifest("g", resources=gpus))
    assert "requests.nvidia.com/gpu" in status_of(exc.value)["message"]

    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(NS, pod_manifest("noreq"))
    assert "failed quota: q: must specify" in status_of(exc.value)["message"]

    # terminal pods release their share; deletes too
    kube.kubelet.succeed(NS, "a")
    kube.wait_for(lambda: kube.get_object("resourcequotas", "q", NS)["status"]["used"]["pods"]
                  == "0", message="quota released")
    core.create_namespaced_pod(NS, pod_manifest("b", resources=big))


def test_pod_count_quota(kube, core):
    core.create_namespaced_resource_quota(NS, {"metadata": {"name": "q"},
                                               "spec": {"hard": {"pods": "1"}}})
    core.create_namespaced_pod(NS, pod_manifest("a"))
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(NS, pod_manifest("b"))
    assert "exceeded quota: q, requested: pods=1, used: pods=1, limited: pods=1" in \
        status_of(exc.value)["message"]


# -- kubelet ------------------------------------------------------------------


def reasons(kube, name):
    return [e["reason"] for e in kube.events(NS, name)]


def test_kubelet_lifecycle_with_events(kube, core):
    core.create_namespaced_pod(NS, pod_manifest("w", restartPolicy="Never"))
    kube.kubelet.schedule(NS, "w", node="node-1")
    pod = core.read_namespaced_pod("w", NS)
    assert pod.spec.node_name == "node-1" and pod.status.phase == "Pending"
    kube.kubelet.run(NS, "w")
    pod = core.read_namespaced_pod("w", NS)
    assert pod.status.phase == "Running" and pod.status.pod_ip.startswith("10.")
    cs = pod.status.container_statuses[0]
    assert cs.ready and cs.state.running is not None
    assert {c.type: c.status for c in pod.status.conditions}["Ready"] == "True"
    kube.kubelet.succeed(NS, "w")
    pod = core.read_namespaced_pod("w", NS)
    term = pod.status.container_statuses[0].state.terminated
    assert pod.status.phase == "Succeeded" and term.reason == "Completed" and term.exit_code == 0
    assert reasons(kube, "w") == ["Scheduled", "Pulling", "Pulled", "Created", "Started"]
    scheduled = kube.events(NS, "w", "Scheduled")[0]
    assert scheduled["source"]["component"] == "default-scheduler"


def test_a_deleted_running_pod_is_killed(kube, core):
    core.create_namespaced_pod(NS, pod_manifest("k"))
    kube.kubelet.run(NS, "k")
    core.delete_namespaced_pod("k", NS, grace_period_seconds=30)
    assert kube.events(NS, "k", "Killing")[0]["message"] == "Stopping container main"


def test_pod_log_read_tail_timestamps_and_errors(kube, core):
    core.create_namespaced_pod(NS, pod_manifest("w"))
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod_log("w", NS)
    assert exc.value.status == 400
    assert status_of(exc.value)["message"] == \
        'container "main" in pod "w" is waiting to start: ContainerCreating'
    kube.kubelet.run(NS, "w")
    kube.kubelet.log(NS, "w", "one\ntwo\nthree")
    assert core.read_namespaced_pod_log("w", NS) == "one\ntwo\nthree\n"
    assert core.read_namespaced_pod_log("w", NS, tail_lines=1) == "three\n"
    stamped = core.read_namespaced_pod_log("w", NS, timestamps=True).splitlines()
    assert stamped[0].endswith("Z one") and stamped[0][:4].isdigit()

    two = pod_manifest("two", containers=[{"name": "a", "image": "i"},
                                          {"name": "b", "image": "i"}])
    core.create_namespaced_pod(NS, two)
    kube.kubelet.run(NS, "two")
    kube.kubelet.log(NS, "two", "from b", container="b")
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod_log("two", NS)
    assert "a container name must be specified" in status_of(exc.value)["message"]
    assert core.read_namespaced_pod_log("two", NS, container="b") == "from b\n"


def test_pod_log_follow_streams_until_termination(kube, core):
    core.create_namespaced_pod(NS, pod_manifest("w", restartPolicy="Never"))
    kube.kubelet.run(NS, "w")
    kube.kubelet.log(NS, "w", "before")
    resp = core.read_namespaced_pod_log("w", NS, follow=True, _preload_content=False)
    chunks = resp.stream(amt=None, decode_content=False)
    assert next(chunks) == b"before\n"
    kube.kubelet.log(NS, "w", "live 1")
    assert next(chunks) == b"live 1\n"

    def finish():
        kube.kubelet.log(NS, "w", "last")
        kube.kubelet.succeed(NS, "w")

    timer = threading.Timer(0.05, finish)
    timer.start()
    rest = b"".join(chunks)  # ends by itself once the container terminates
    timer.join(timeout=5)
    resp.release_conn()
    assert rest == b"last\n"

    lines = list(watch.Watch().stream(core.read_namespaced_pod_log, "w", NS))
    assert lines == ["before", "live 1", "last"]


def test_request_log_counts_for_rate_measurement(kube, core):
    kube.clear_requests()
    for _ in range(3):
        core.list_namespaced_pod(NS)
    reqs = kube.requests
    assert [r.verb for r in reqs] == ["list"] * 3
    assert reqs[-1].time >= reqs[0].time


def test_status_subresource_and_main_resource_are_separate(kube, core):
    core.create_namespaced_pod(NS, pod_manifest())
    core.patch_namespaced_pod_status("p", NS, {"status": {"phase": "Running"}})
    assert core.read_namespaced_pod("p", NS).status.phase == "Running"
    # a write to the main resource cannot change status (as with real strategies)
    patched = core.patch_namespaced_pod("p", NS, {"metadata": {"labels": {"a": "b"}},
                                                  "status": {"phase": "Failed"}})
    assert patched.status.phase == "Running" and patched.metadata.labels == {"a": "b"}


def test_json_patch_and_delete_collection(kube, core):
    core.create_namespaced_config_map(NS, {"metadata": {"name": "cm", "labels": {"x": "1"}},
                                           "data": {"a": "1"}})
    patched = raw_call(kube, "PATCH", f"/api/v1/namespaces/{NS}/configmaps/cm",
                       [{"op": "add", "path": "/data/b", "value": "2"},
                        {"op": "remove", "path": "/data/a"}],
                       content_type="application/json-patch+json")
    assert patched["data"] == {"b": "2"}
    core.create_namespaced_config_map(NS, {"metadata": {"name": "keep"}})
    core.delete_collection_namespaced_config_map(NS, label_selector="x=1")
    assert [c["metadata"]["name"] for c in kube.list_objects("configmaps", NS)] == ["keep"]
    assert kube.requests[-1].verb == "deletecollection"
