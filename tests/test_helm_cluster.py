"""The chart's multi-tenant and operator parts: the hub's admission fence (its CEL evaluated
on real request objects), the hub/proxy NetworkPolicies, the idle culler, the image
pre-puller, Pod Security of the pods the lab runs (dry-run on the real API server, ``k8s``),
and the storage-class examples."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import kubernetes.client
import kubernetes_asyncio.client
import kubernetes_validate
import pytest
import yaml
from test_helm import CHART, by_kind, helm_binary, render, run_helm
from test_hub_spawner import kubeconfig, load_hub, make_spawner  # noqa: F401 - a fixture

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "hub_config"))
from tfk8s_hub.bootstrap import USER_NAMESPACE_LABEL, BootstrapSpec, namespace_labels  # noqa: E402
from tfk8s_hub.settings import LabSettings  # noqa: E402

HUB_SA = "system:serviceaccount:jhub:lab-tfk8s-lab-hub"


@pytest.fixture(scope="session")
def helm(request, tmp_path_factory) -> Path:
    """The helm binary, as tests/test_helm.py extracts it."""
    return helm_binary(request, tmp_path_factory)


def _fence(helm, kube_version="1.33.0", component="hub", *values):
    docs = render(helm, "--kube-version", kube_version, *values)

    def mine(kind):
        return [d for d in by_kind(docs, kind)
                if d["metadata"]["labels"]["app.kubernetes.io/component"] == component]

    return mine("ValidatingAdmissionPolicy"), mine("ValidatingAdmissionPolicyBinding")


def test_the_fence_is_rendered_from_kubernetes_1_30_and_bound_to_deny(helm):
    (policy,), (binding,) = _fence(helm)
    assert binding["spec"] == {"policyName": policy["metadata"]["name"],
                               "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert _fence(helm, "1.29.0") == ([], [])  # no ValidatingAdmissionPolicy v1 there
    assert _fence(helm, "1.33.0", "hub", "--set", "rbac.fenceHub=false") == ([], [])


class Fence:
    """The rendered policy's CEL, compiled by cel-python (celpy) and run on request objects."""

    def __init__(self, policy: dict):
        import celpy

        self.env = celpy.Environment()
        self.spec = policy["spec"]
        self.compile = lambda text: self.env.program(self.env.compile(text))

    def _run(self, text: str, activation: dict):
        import celpy

        return self.compile(text).evaluate(
            {k: celpy.json_to_cel(v) for k, v in activation.items()})

    def admits(self, user: str, operation: str, resource: str, obj=None, old=None,
               namespace=None) -> tuple[bool, list[str]]:
        """(allowed, messages) as the API server's policy plugin would decide."""
        activation = {
            "request": {"userInfo": {"username": user}, "operation": operation,
                        "namespace": (namespace or {}).get("metadata", {}).get("name", ""),
                        "resource": {"group": "", "version": "v1", "resource": resource}},
            "object": obj, "oldObject": old, "namespaceObject": namespace,
        }
        if not all(self._run(c["expression"], activation) for c in self.spec.get("matchConditions", [])):
            return True, []  # the policy does not apply to this request
        failed = [v for v in self.spec["validations"] if not self._run(v["expression"], activation)]
        messages = [str(self._run(v["messageExpression"], activation))
                    if "messageExpression" in v else v["message"] for v in failed]
        return not failed, messages


@pytest.fixture
def fence(helm):
    (policy,), _ = _fence(helm)
    return Fence(policy)


def ns(name: str, labels: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name, **labels}}}


POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "jupyter-alice"}, "spec": {}}


@pytest.mark.usefixtures("kubeconfig")
def test_the_fence_lets_the_hub_work_in_the_namespaces_kubespawner_makes(fence, tmp_path, monkeypatch):
    # the namespace exactly as KubeSpawner builds it from the lab's config
    app = load_hub(REPO / "hub_config" / "jupyterhub_config.py", {}, tmp_path, monkeypatch)
    sp = make_spawner(app, "alice")
    made = kubernetes.client.ApiClient().sanitize_for_serialization(_namespace(sp))
    assert made["metadata"]["labels"][USER_NAMESPACE_LABEL] == "jhub"
    assert fence.admits(HUB_SA, "CREATE", "namespaces", obj=made) == (True, [])
    user_ns = ns("jhub-alice", made["metadata"]["labels"])
    for op, obj, old in (("CREATE", POD, None), ("DELETE", None, POD), ("UPDATE", POD, POD)):
        assert fence.admits(HUB_SA, op, "pods", obj, old, namespace=user_ns) == (True, [])


def _namespace(spawner) -> dict:
    """KubeSpawner's own namespace manifest (what it POSTs when it creates a user's namespace)."""
    from kubespawner.objects import make_namespace

    labels = spawner._expand_all(spawner.user_namespace_labels)
    return make_namespace(spawner.namespace, labels=labels,
                          annotations=spawner._expand_all(spawner.user_namespace_annotations))


def test_the_fence_refuses_the_hub_anywhere_else(fence):
    kube_system = ns("kube-system", {})
    allowed, messages = fence.admits(HUB_SA, "CREATE", "pods", POD, namespace=kube_system)
    assert not allowed
    assert messages == ["the lab's hub may write only in its user namespaces (labelled "
                        "tfk8s.io/hub-namespace=jhub), not in namespace kube-system"]
    # another release's user namespace is not this hub's either
    other = ns("lab2-bob", namespace_labels(BootstrapSpec.from_settings(
        LabSettings(hub_namespace="lab2"))))
    assert not fence.admits(HUB_SA, "DELETE", "pods", None, POD, namespace=other)[0]
    # a namespace the hub could create to escape: unlabelled, or without Pod Security
    assert not fence.admits(HUB_SA, "CREATE", "namespaces", obj=ns("x", {}))[0]
    weak = {USER_NAMESPACE_LABEL: "jhub", "pod-security.kubernetes.io/enforce": "privileged"}
    assert not fence.admits(HUB_SA, "CREATE", "namespaces", obj=ns("x", weak))[0]
    # cluster-scoped objects other than namespaces: never
    allowed, messages = fence.admits(HUB_SA, "CREATE", "clusterrolebindings", obj={"metadata": {}})
    assert not allowed and messages[0].endswith("not in cluster scope")


def test_the_fence_leaves_everyone_else_alone(fence):
    kube_system = ns("kube-system", {})
    assert fence.admits("system:admin", "CREATE", "pods", POD, namespace=kube_system) == (True, [])
    assert fence.admits("system:serviceaccount:jhub-alice:tfk8s-user", "CREATE", "pods", POD,
                        namespace=kube_system) == (True, [])


def test_hub_and_proxy_network_policies(helm):
    docs = render(helm)
    hub, proxy = sorted(by_kind(docs, "NetworkPolicy"), key=lambda d: d["metadata"]["name"])
    assert hub["metadata"]["name"] == "lab-tfk8s-lab-hub"
    users = {"namespaceSelector": {"matchLabels": {USER_NAMESPACE_LABEL: "jhub"}}}
    (api_in,) = hub["spec"]["ingress"]
    assert api_in["ports"] == [{"protocol": "TCP", "port": 8081}]
    assert users in api_in["from"]
    # the user namespaces' labels (from the bootstrap) are what the selector matches
    labels = namespace_labels(BootstrapSpec.from_settings(LabSettings(hub_namespace="jhub")))
    assert users["namespaceSelector"]["matchLabels"].items() <= labels.items()
    egress_ports = {p["port"] for rule in hub["spec"]["egress"] for p in rule.get("ports", [])}
    assert {8001, 8888, 443, 6443, 53} <= egress_ports
    dns = next(r for r in hub["spec"]["egress"] if {"protocol": "UDP", "port": 53} in r["ports"])
    assert {"ipBlock": {"cidr": "169.254.20.10/32"}} in dns["to"]
    public, route_api = proxy["spec"]["ingress"]
    assert public == {"ports": [{"protocol": "TCP", "port": 8000}]}  # from anywhere
    assert route_api["ports"] == [{"protocol": "TCP", "port": 8001}]
    assert route_api["from"] == [{"podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "tfk8s-lab", "app.kubernetes.io/instance": "lab",
        "app.kubernetes.io/component": "hub"}}}]
    assert not by_kind(render(helm, "--set", "networkPolicy.enabled=false"), "NetworkPolicy")


@pytest.mark.usefixtures("kubeconfig")
def test_the_idle_culler_runs_as_a_hub_service_with_its_minimal_scopes(helm, tmp_path, monkeypatch):
    from jupyterhub.app import JupyterHub

    (cm,) = by_kind(render(helm, "--set", "cull.timeout=1800", "--set", "hub.baseUrl=/lab/"),
                    "ConfigMap")
    for name, text in cm["data"].items():
        (tmp_path / name).write_text(text)
    monkeypatch.setenv("TFK8S_HUB_VALUES", str(tmp_path / "values.json"))
    app = JupyterHub()
    app.load_config_file(str(tmp_path / "jupyterhub_config.py"))
    (service,) = app.config.JupyterHub.services
    assert service == {"name": "jupyterhub-idle-culler", "command": [
        sys.executable, "-m", "jupyterhub_idle_culler",
        "--url=http://127.0.0.1:8081/lab/hub/api", "--timeout=1800", "--cull-every=600",
        "--concurrency=10"]}
    (role,) = app.config.JupyterHub.load_roles
    assert role == {"name": "jupyterhub-idle-culler", "services": ["jupyterhub-idle-culler"],
                    "scopes": ["list:users", "read:users:activity", "read:servers",
                               "delete:servers"]}
    # a culled server is stopped like any other: KubeSpawner's post_stop_hook stops its clusters
    sp = make_spawner(app, "alice")
    assert sp.post_stop_hook.__name__ == "stop_user_clusters"


def test_the_culler_can_be_switched_off(helm, tmp_path):
    import json

    (cm,) = by_kind(render(helm, "--set", "cull.enabled=false"), "ConfigMap")
    assert json.loads(cm["data"]["values.json"])["hub"]["cull"]["enabled"] is False
    from tfk8s_hub.hub import culler_service

    assert culler_service({"enabled": False}) is None
    _, role = culler_service({"enabled": True, "users": True})
    assert "admin:users" in role["scopes"]


@pytest.mark.parametrize("version", ["1.29", "1.37"])
def test_the_image_pre_puller_is_optional_restricted_and_pulls_the_lab_images(helm, version):
    assert not by_kind(render(helm), "DaemonSet")
    docs = render(helm, "--set", "prePuller.enabled=true",
                  "--set", "prePuller.extraImages={reg/task-gpu:1,tfk8s/notebook:0.1.0}")
    (ds,) = by_kind(docs, "DaemonSet")
    kubernetes_validate.validate(ds, version, strict=True)
    pod = ds["spec"]["template"]["spec"]
    assert [c["image"] for c in pod["initContainers"]] == [
        "tfk8s/notebook:0.1.0", "tfk8s/tensorflow-task:0.1.0", "reg/task-gpu:1"]
    assert all(c["command"] == ["python", "-c", "pass"] for c in pod["initContainers"])
    assert [c["image"] for c in pod["containers"]] == ["registry.k8s.io/pause:3.10"]


@pytest.mark.k8s
def test_the_pre_pullers_pod_passes_pod_security_restricted_on_the_real_api_server(helm, realkube):
    docs = render(helm, "--set", "prePuller.enabled=true",
                  "--set", "prePuller.extraImages={reg/task-gpu:1,tfk8s/notebook:0.1.0}")
    (ds,) = by_kind(docs, "DaemonSet")
    assert realkube.restricted_refusal(ds["spec"]["template"]["spec"]) == ""


def test_pre_puller_schema_rejects_typos(helm):
    r = run_helm(helm, "template", "lab", str(CHART), "--set", "prePuller.enable=true",
                 check=False)
    assert r.returncode != 0 and "enable" in r.stderr


@pytest.mark.k8s
@pytest.mark.usefixtures("kubeconfig")
def test_the_notebook_pod_kubespawner_builds_passes_pod_security_restricted(realkube, tmp_path,
                                                                          monkeypatch):
    """KubeSpawner's own pod manifest, dry-run on the real API server under "restricted"."""
    app = load_hub(REPO / "hub_config" / "jupyterhub_config.py", {}, tmp_path, monkeypatch)
    sp = make_spawner(app, "alice")

    async def manifest() -> dict:
        # serialized by the client KubeSpawner sends it with (kubernetes_asyncio)
        async with kubernetes_asyncio.client.ApiClient() as api:
            return api.sanitize_for_serialization(await sp.get_pod_manifest())

    pod = asyncio.run(manifest())
    assert realkube.restricted_refusal(pod["spec"]) == ""
    security = pod["spec"]["securityContext"]
    assert (security["fsGroup"], security["fsGroupChangePolicy"]) == (100, "OnRootMismatch")
    assert pod["spec"]["containers"][0]["securityContext"]["runAsUser"] == 1000


EXAMPLES = sorted((CHART / "examples").glob("storage-*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_storage_class_examples_render_through_the_same_values(helm, example):
    values = yaml.safe_load(example.read_text())
    docs = render(helm, "-f", str(example))
    (sc,) = by_kind(docs, "StorageClass")
    assert sc["metadata"]["name"] == values["lab"]["storage_class"]
    assert sc["provisioner"] == values["storageClass"]["provisioner"]
    assert sc["provisioner"] != "kubernetes.io/glusterfs"  # removed from Kubernetes in 1.26
    for version in ("1.29", "1.37"):
        kubernetes_validate.validate(sc, version, strict=True)


def test_the_default_storage_class_name_stays_glusterfs():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["lab"]["storage_class"] == values["storageClass"]["name"] == "glusterfs"
    assert len(EXAMPLES) == 7  # kadalu, NFS-Ganesha on Gluster, CephFS, Longhorn, EFS, ...


# -- the lab namespaces' Service policy (issue 23, item 4) ------------------------------------

USER_SA = "system:serviceaccount:jhub-alice:tfk8s-user"


def _service(**spec) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "tb"},
            "spec": {"ports": [{"port": 6006}], **spec}}


def test_lab_namespaces_admit_only_cluster_ip_services_without_external_ips(helm):
    (policy,), (binding,) = _fence(helm, "1.33.0", "lab-policy")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"],
                               "validationActions": ["Deny"]}
    # scoped to the lab's user namespaces (the label KubeSpawner's namespaces carry)
    assert policy["spec"]["matchConstraints"]["namespaceSelector"] == {
        "matchLabels": {USER_NAMESPACE_LABEL: "jhub"}}
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["services"] and rule["operations"] == ["CREATE", "UPDATE"]
    lab = Fence(policy)
    user_ns = ns("jhub-alice", {USER_NAMESPACE_LABEL: "jhub"})
    for ok in (_service(), _service(type="ClusterIP"), _service(clusterIP="None")):
        assert lab.admits(USER_SA, "CREATE", "services", ok, namespace=user_ns) == (True, [])
    allowed, (message,) = lab.admits(USER_SA, "CREATE", "services", _service(type="NodePort"),
                                     namespace=user_ns)
    assert not allowed and "must be of type ClusterIP, not NodePort" in message
    assert not lab.admits(USER_SA, "UPDATE", "services", _service(type="LoadBalancer"),
                          _service(), namespace=user_ns)[0]
    allowed, (message,) = lab.admits(USER_SA, "CREATE", "services",
                                     _service(externalIPs=["10.0.0.1"]), namespace=user_ns)
    assert not allowed and "externalIPs" in message
    assert _fence(helm, "1.29.0", "lab-policy") == ([], [])
    assert _fence(helm, "1.33.0", "lab-policy", "--set", "rbac.restrictServices=false") == ([], [])


def test_cilium_gets_a_policy_for_the_in_cluster_api_server_when_asked(helm):
    assert not by_kind(render(helm, "--kube-version", "1.33.0"), "CiliumClusterwideNetworkPolicy")
    docs = render(helm, "--kube-version", "1.33.0", "--set", "networkPolicy.ciliumApiServer=true")
    (policy,) = by_kind(docs, "CiliumClusterwideNetworkPolicy")
    assert policy["apiVersion"] == "cilium.io/v2"
    assert policy["spec"]["endpointSelector"] == {"matchLabels": {
        f"k8s:io.cilium.k8s.namespace.labels.{USER_NAMESPACE_LABEL}": "jhub"}}
    assert policy["spec"]["egress"] == [
        {"toEntities": ["kube-apiserver"], "toPorts": [{"ports": [
            {"port": "443", "protocol": "TCP"}, {"port": "6443", "protocol": "TCP"}]}]},
        # a NodeLocal DNSCache in the host network is Cilium's host entity, matched by no ipBlock
        {"toEntities": ["host"], "toPorts": [{"ports": [
            {"port": "53", "protocol": "UDP"}, {"port": "53", "protocol": "TCP"}]}]}]
