"""Issue 23 on the REAL control plane (``scripts/kube up``), as the lab user's own ServiceAccount.

The RBAC items are decided by the real authorizer (``kubectl auth can-i --as`` and real requests
with real tokens), the Service policy by the real ValidatingAdmissionPolicy plugin (the chart's
CEL), FailedCreate and PriorityClass refusals by the real Job controller and Priority plugin, the
strict JobSet creation by JobSet's real CRD, and the stop hook's selectors by the real API server.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import kubernetes.client
import pytest
from kubernetes.client.rest import ApiException

from tests.realkube import wait_for
from tfk8s_magics.backends.base import Phase
from tfk8s_magics.backends.kubernetes import KubernetesBackend
from tfk8s_magics.errors import LaunchFailed
from tfk8s_magics.spec import ClusterSpec

pytestmark = pytest.mark.k8s

REPO = Path(__file__).resolve().parent.parent
SCRIPT = "print('training')\n"
HUB_NS = "i23hub"  # a release of its own: tests/test_kube_chart.py installs one in jhub
HUB_SA = "lab-tfk8s-lab-hub"


@pytest.fixture
def user(kube_user):
    # not strict: refusals by the real authorizer are what several tests here ask for
    return kube_user("i23", strict=False)


def spec(name="mnist", **kw) -> ClusterSpec:
    kw.setdefault("ps", 0)
    kw.setdefault("workers", 1)
    kw.setdefault("script", SCRIPT)
    return ClusterSpec(name=name, **kw)


@pytest.fixture(scope="module")
def chart(realkube, request, tmp_path_factory):
    """The chart's cluster-scoped RBAC and policies, rendered by helm and applied as admin."""
    sys.path.insert(0, str(REPO / "tests"))
    from test_helm import helm_binary, render

    helm = helm_binary(request, tmp_path_factory)
    docs = render(helm, "--kube-version", "1.33.0", namespace=HUB_NS)
    wanted = {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
              "ValidatingAdmissionPolicyBinding"}
    objs = [d for d in docs if d["kind"] in wanted]
    try:
        realkube.core.create_namespace({"metadata": {"name": HUB_NS}})
    except ApiException as e:
        if e.status != 409:
            raise
    sa = {"apiVersion": "v1", "kind": "ServiceAccount",
          "metadata": {"name": HUB_SA, "namespace": HUB_NS}}
    realkube.apply([sa, *objs])
    yield {d["metadata"]["labels"]["app.kubernetes.io/component"] + "/" + d["kind"]: d
           for d in objs}
    from devcluster.cluster import Cluster

    for d in objs:
        Cluster().kubectl("delete", d["kind"].lower(), d["metadata"]["name"],
                          "--ignore-not-found", "--wait=false", check=False)
    realkube.core.delete_namespace(HUB_NS)


def can_i(realkube, user: str, *args: str) -> bool:
    from devcluster.cluster import Cluster

    r = Cluster().kubectl("auth", "can-i", *args, "--as", user, check=False)
    assert r.stdout.strip() in ("yes", "no"), r.stderr
    return r.stdout.strip() == "yes"


# -- 5. the hub's ClusterRole ---------------------------------------------------------------

def test_the_hub_reads_no_configmap_and_binds_only_the_backend_role(realkube, chart):
    from tfk8s_hub.bootstrap import BootstrapSpec

    # a user namespace of this release (the hub's fence admits its writes only there)
    ns = realkube.user_namespace("i23rbac", bootstrap=BootstrapSpec(hub_namespace=HUB_NS))
    hub = f"system:serviceaccount:{HUB_NS}:{HUB_SA}"
    backend_role = chart["backend-rbac/ClusterRole"]["metadata"]["name"]
    assert not can_i(realkube, hub, "get", "configmaps", "-n", "kube-system")
    assert not can_i(realkube, hub, "list", "configmaps", "-A")
    assert not can_i(realkube, hub, "get", "pods", "--subresource=log", "-n", "kube-system")
    assert not can_i(realkube, hub, "get", "secrets", "-n", "kube-system")
    assert can_i(realkube, hub, "bind", f"clusterroles/{backend_role}")
    assert not can_i(realkube, hub, "bind", "clusterroles/cluster-admin")
    assert can_i(realkube, hub, "create", "rolebindings", "-n", ns.name)
    # for real, with the hub's own token: a binding to the backend's ClusterRole is created
    # (bind, no escalation); one to cluster-admin is refused by the RBAC escalation check
    hub_client = realkube.client_with_token(realkube.token(HUB_NS, HUB_SA))
    rbac = kubernetes.client.RbacAuthorizationV1Api(hub_client)

    def binding(name, role):
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": name, "namespace": ns.name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": "tfk8s-user",
                              "namespace": ns.name}]}

    rbac.create_namespaced_role_binding(ns.name, binding("by-hub", backend_role))
    with pytest.raises(ApiException) as e:
        rbac.create_namespaced_role_binding(ns.name, binding("escalate", "cluster-admin"))
    assert e.value.status == 403
    # and the user's notebook still does everything it needs, with its own token
    user_sa = ns.username
    for verb, resource in (("create", "jobsets.jobset.x-k8s.io"), ("get", "pods/log"),
                           ("create", "services"), ("patch", "configmaps"),
                           ("patch", "persistentvolumeclaims"), ("list", "events"),
                           ("list", "resourcequotas"), ("create", "deployments.apps")):
        args = [verb, resource.replace("pods/log", "pods"), "-n", ns.name]
        if resource == "pods/log":
            args.append("--subresource=log")
        assert can_i(realkube, user_sa, *args), (verb, resource)
    # the verbs nothing used are gone (issue 23, item 4)
    for verb, resource in (("patch", "jobsets.jobset.x-k8s.io"), ("patch", "services"),
                           ("watch", "events"), ("watch", "resourcequotas"),
                           ("watch", "limitranges")):
        assert not can_i(realkube, user_sa, verb, resource, "-n", ns.name), (verb, resource)
    assert not can_i(realkube, user_sa, "get", "configmaps", "-n", "kube-system")


# -- 4. Services in lab namespaces ------------------------------------------------------------

def test_the_lab_namespaces_refuse_node_ports_load_balancers_and_external_ips(realkube, chart):
    from tfk8s_hub.bootstrap import BootstrapSpec

    ns = realkube.user_namespace("i23svc", bootstrap=BootstrapSpec(hub_namespace=HUB_NS))
    core = kubernetes.client.CoreV1Api(ns.api_client)

    def service(name, **extra):
        return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                "spec": {"ports": [{"port": 6006}], "selector": {"app": name}, **extra}}

    def refused(body):
        with pytest.raises(ApiException) as e:
            core.create_namespaced_service(ns.name, body)
        assert e.value.status in (403, 422), e.value.body
        return e.value.body

    def allowed():
        return wait_for(lambda: _created(core, ns.name, service("tb")), 30,
                        message="a ClusterIP Service admitted")

    allowed()
    # the policy binding takes a moment to reach the admission plugin: wait for the first refusal
    body = wait_for(lambda: _refusal(core, ns.name, service("np", type="NodePort")), 30,
                    message="the ValidatingAdmissionPolicy to refuse a NodePort")
    assert "must be of type ClusterIP, not NodePort" in body
    assert "must be of type ClusterIP" in refused(service("lb", type="LoadBalancer"))
    assert "externalIPs" in refused(service("ext", externalIPs=["10.0.0.9"]))
    core.create_namespaced_service(ns.name, service("headless", clusterIP="None"))


def _created(core, ns, body):
    try:
        core.create_namespaced_service(ns, body)
    except ApiException as e:
        if e.status == 409:
            return True
        raise
    return True


def _refusal(core, ns, body):
    try:
        core.create_namespaced_service(ns, body)
    except ApiException as e:
        if e.status in (403, 422) and "ClusterIP" in (e.body or ""):
            return e.body
        raise
    core.delete_namespaced_service(body["metadata"]["name"], ns)  # not refused yet: again
    return None


# -- 2. pods the Job controller cannot create; --priority ------------------------------------

def test_an_unknown_priority_class_is_the_failed_create_reason_on_the_real_job_controller(
        realkube, user, monkeypatch):
    ns, backend = user
    # as where the chart's rbac.readPriorityClasses is off (the notebook cannot check first);
    # the chart fixture of this module, or a release in the cluster, may have turned it on
    monkeypatch.setattr(KubernetesBackend, "_check_priority", lambda self, spec: None)
    backend.launch(spec("prio", priority="does-not-exist"), detach=True)
    reason = wait_for(lambda: re.search(
        r"FailedCreate: .*no PriorityClass with name does-not-exist was found",
        backend.status("prio").task("worker-0").reason), 120,
        message="the Job controller's FailedCreate as the task's reason")
    assert reason
    listed = {c.name: c for c in backend.list_clusters()}
    assert "no PriorityClass with name does-not-exist" in listed["prio"].task("worker-0").reason
    # after the grace, the cluster says it (like a stall), and records it once
    from tfk8s_magics.backends.kubernetes import state

    monkeypatch.setattr(state, "CREATE_GRACE", 0.0)
    snap = backend.status("prio")
    assert snap.phase == Phase.PENDING
    assert snap.reason.startswith("pods cannot be created for ") and "does-not-exist" in snap.reason
    assert [e.reason for e in backend.events("prio") if e.reason == "FailedCreate" and not e.task]


def test_with_the_charts_reader_a_mistyped_priority_is_refused_before_anything(
        realkube, chart, user):
    ns, backend = user
    with pytest.raises(LaunchFailed, match=r"--priority 'hihg': the cluster has no PriorityClass"):
        backend.launch(spec("prio2", priority="hihg"), detach=True)
    assert realkube.core.list_namespaced_config_map(
        ns.name, label_selector="tfk8s.io/cluster=prio2").items == []
    # an existing class passes the check and the Priority plugin gives the pods its value
    sched = kubernetes.client.SchedulingV1Api(realkube.admin)
    high = f"high-{ns.name}"
    sched.create_priority_class({"metadata": {"name": high}, "value": 1000})
    try:
        backend.launch(spec("prio3", priority=high), detach=True)
        pods = wait_for(lambda: realkube.pods(ns.name, "tfk8s.io/cluster=prio3"), 90,
                        message="the task pod")
        assert pods[0].spec.priority == 1000 and pods[0].spec.priority_class_name == high
        backend.delete("prio3")
    finally:
        sched.delete_priority_class(high)


# -- 6. a name another Service has -------------------------------------------------------------

def test_a_cluster_named_like_an_existing_service_is_refused(realkube, user):
    ns, backend = user
    kubernetes.client.CoreV1Api(ns.api_client).create_namespaced_service(ns.name, {
        "metadata": {"name": "taken"}, "spec": {"ports": [{"port": 80}], "selector": {"a": "b"}}})
    with pytest.raises(LaunchFailed, match=r"cluster name 'taken' is taken by a Service"):
        backend.launch(spec("taken"), detach=True)
    assert realkube.core.list_namespaced_config_map(
        ns.name, label_selector="tfk8s.io/cluster=taken").items == []
    # another cluster's TensorBoard Service: the sentence says whose it is
    realkube.core.create_namespaced_service(ns.name, {"metadata": {
        "name": "mnist", "labels": {"tfk8s.io/cluster": "other", "tfk8s.io/component": "tensorboard"}},
        "spec": {"ports": [{"port": 6006}], "selector": {"app": "tb"}}})
    with pytest.raises(LaunchFailed, match=r"cluster name 'mnist' is taken by the tensorboard "
                       r"Service of cluster 'other' .* choose another name"):
        backend.launch(spec("mnist"), detach=True)
    assert not [r for r in ns.requests() if r.verb == "create" and r.resource != "services"]
    sel = "tfk8s.io/cluster=mnist"
    assert realkube.core.list_namespaced_config_map(ns.name, label_selector=sel).items == []
    assert realkube.core.list_namespaced_persistent_volume_claim(ns.name, label_selector=sel).items == []
    assert realkube.custom.list_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", ns.name, "jobsets", label_selector=sel)["items"] == []


# -- 8. the JobSet is created strictly; the real CRD (v0.12) knows every field ------------------

def test_the_jobset_is_created_with_strict_field_validation_and_accepted(realkube, user):
    ns, backend = user
    backend.launch(spec("strict"), detach=True)
    js = realkube.custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns.name,
                                                      "jobsets", "strict")
    assert js["spec"]["failurePolicy"]["restartStrategy"] == "Recreate"
    creates = [r for r in ns.requests() if r.resource == "jobsets" and r.verb == "create"]
    assert creates and all("fieldValidation=Strict" in r.uri for r in creates)
    # unknown fields are refused, not dropped: an older CRD would refuse restartStrategy
    body = {**js, "metadata": {"name": "strict2"}}
    body["spec"] = {**js["spec"], "failurePolicy": {**js["spec"]["failurePolicy"], "nope": 1}}
    with pytest.raises(ApiException) as e:
        kubernetes.client.CustomObjectsApi(ns.api_client).create_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", ns.name, "jobsets", body, field_validation="Strict")
    message = json.loads(e.value.body)["message"]
    assert e.value.status == 400 and 'strict decoding error: unknown field ' \
        '"spec.failurePolicy.nope"' in message
    # the sentence a launch on JobSet v0.6 gets from the same refusal of restartStrategy
    from tfk8s_magics.backends.kubernetes.apply import JOBSET_TOO_OLD, failure_sentence

    e.value.body = e.value.body.replace("nope", "restartStrategy")
    assert failure_sentence(e.value, body, ns.name).startswith(JOBSET_TOO_OLD)


# -- 3. the hub's stop hook ----------------------------------------------------------------------

def test_the_stop_hook_keeps_detached_clusters_on_the_real_api_server(realkube, user):
    from tfk8s_hub.settings import LabSettings
    from tfk8s_hub.spawner import make_post_stop_hook

    ns, backend = user
    backend.launch(spec("away"), detach=True)
    backend.launch(spec("here"), detach=False)
    apps = kubernetes.client.AppsV1Api(realkube.admin)
    for name, component in (("away-serving", "serving"), ("here-tensorboard", "tensorboard")):
        labels = {"app.kubernetes.io/managed-by": "tfk8s", "tfk8s.io/component": component, "app": name}
        apps.create_namespaced_deployment(ns.name, {
            "metadata": {"name": name, "labels": labels},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "c", "image": "x:1"}]}}}})
    apis = {"AppsV1Api": apps, "CustomObjectsApi": realkube.custom}
    hook = make_post_stop_hook(LabSettings(), api=apis.__getitem__)
    asyncio.run(hook(SimpleNamespace(namespace=ns.name, log=SimpleNamespace(info=lambda *a: None))))

    def names():
        items = realkube.custom.list_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", ns.name, "jobsets")["items"]
        return sorted(j["metadata"]["name"] for j in items
                      if not j["metadata"].get("deletionTimestamp"))

    wait_for(lambda: names() == ["away"], 60, message="only the detached JobSet left")
    st = backend.status("away")
    assert st.detached and st.phase != Phase.STOPPED

    def deployments():
        return sorted(d.metadata.name for d in apps.list_namespaced_deployment(ns.name).items
                      if not d.metadata.deletion_timestamp)

    wait_for(lambda: deployments() == ["away-serving"], 60,
             message="the served model kept, the attached cluster's TensorBoard gone")


def test_the_notebook_cannot_list_nodes_and_the_node_check_says_so(user):
    """The preflight's node check as the user's ServiceAccount: the real 403 on nodes is one
    sentence about the nodes, not about quota."""
    from tfk8s_magics.backends.kubernetes.apply import preflight

    ns, backend = user
    with pytest.raises(LaunchFailed, match=r"the node check \(check_nodes\) needs to list the "
                       r"cluster's nodes, which the notebook's service account may not") as e:
        preflight(backend.api, backend.render(spec()), check_nodes=True)
    assert "quota" not in str(e.value)
    assert [(r.verb, r.code) for r in ns.requests() if r.resource == "nodes"] == [("list", 403)]


def test_detached_runs_get_the_admin_default_ttl_and_an_own_ttl_wins(realkube, user, monkeypatch):
    ns, backend = user
    monkeypatch.setenv("TFK8S_DETACHED_TTL", "86400")
    backend.launch(spec("away"), detach=True)
    backend.launch(spec("mine", ttl_after_finished=30), detach=True)

    def ttl(name):
        return realkube.custom.get_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", ns.name, "jobsets", name)["spec"]["ttlSecondsAfterFinished"]

    assert (ttl("away"), ttl("mine")) == (86400, 30)


def test_a_binding_an_older_hub_made_to_a_role_is_recreated_to_the_cluster_role(realkube, user):
    from tfk8s_hub.bootstrap import BootstrapSpec, bootstrap_objects
    from tfk8s_hub.spawner import Applier

    ns, _ = user
    rbac = kubernetes.client.RbacAuthorizationV1Api(realkube.admin)
    rbac.delete_namespaced_role_binding("tfk8s-backend", ns.name)
    old = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
           "metadata": {"name": "tfk8s-backend", "namespace": ns.name},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gone"},
           "subjects": [{"kind": "ServiceAccount", "name": "tfk8s-user", "namespace": ns.name}]}
    rbac.create_namespaced_role_binding(ns.name, old)
    binding = next(o for o in bootstrap_objects(BootstrapSpec(), ns.name)
                   if o["kind"] == "RoleBinding")
    apis = {"RbacAuthorizationV1Api": rbac}
    assert asyncio.run(Applier(apis.__getitem__).apply(binding)) == "recreated"
    assert rbac.read_namespaced_role_binding("tfk8s-backend", ns.name).role_ref.kind == "ClusterRole"
