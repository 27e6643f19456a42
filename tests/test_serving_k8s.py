"""TF Serving on Kubernetes: the pure builders against literal dicts, strict schemas, restricted PSS,
and the backend's serve / stop against the API test double."""

from __future__ import annotations

import kubernetes_validate
import pytest

from tfk8s_magics.backends.kubernetes import manifests as m
from tfk8s_magics.backends.kubernetes import serving as s
from tfk8s_magics.backends.kubernetes.settings import K8sSettings
from tfk8s_magics.errors import SpecError
from tfk8s_magics.spec import ClusterSpec

SETTINGS = K8sSettings(namespace="alice", image="tfk8s/tensorflow-task:0.1.0", user="alice")
SPEC = ClusterSpec(name="mnist", workers=2, script="print(1)\n", owner="alice")
LABELS = {"app.kubernetes.io/managed-by": "tfk8s", "app.kubernetes.io/name": "tfk8s",
          "app.kubernetes.io/part-of": "tfk8s-lab", "app.kubernetes.io/instance": "mnist",
          "app.kubernetes.io/component": "serving", "tfk8s.io/cluster": "mnist", "tfk8s.io/user": "alice",
          "tfk8s.io/component": "serving"}


def test_deployment_is_exactly_this():
    dep = s.serving_deployment(SPEC, SETTINGS, s.serving_options("mnist", replicas=2, cpu="1", memory="1Gi"))
    assert dep == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "mnist-serving", "namespace": "alice", "labels": LABELS},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"tfk8s.io/cluster": "mnist", "tfk8s.io/component": "serving"}},
            "template": {
                "metadata": {"labels": LABELS, "annotations": {"tfk8s.io/model": "mnist"}},
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                        "fsGroup": 1000, "fsGroupChangePolicy": "OnRootMismatch",
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "serving",
                        "image": "tensorflow/serving:2.20.0",
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["tensorflow_model_server"],
                        "args": ["--port=8500", "--rest_api_port=8501", "--model_name=mnist",
                                 "--model_base_path=/log/models/mnist", "--file_system_poll_wait_seconds=5"],
                        "ports": [{"name": "grpc", "containerPort": 8500, "protocol": "TCP"},
                                  {"name": "rest", "containerPort": 8501, "protocol": "TCP"}],
                        "readinessProbe": {"httpGet": {"path": "/v1/models/mnist", "port": "rest"},
                                           "periodSeconds": 5, "failureThreshold": 3},
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}},
                        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}},
                        "volumeMounts": [{"name": "log", "mountPath": "/log", "readOnly": True},
                                         {"name": "tmp", "mountPath": "/tmp"}],
                    }],
                    "volumes": [{"name": "log", "persistentVolumeClaim": {"claimName": "mnist-log",
                                                                          "readOnly": True}},
                                {"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


def test_service_is_a_cluster_ip_never_a_node_port():
    svc = s.serving_service(SPEC, SETTINGS)
    assert svc["spec"] == {
        "type": "ClusterIP",
        "selector": {"tfk8s.io/cluster": "mnist", "tfk8s.io/component": "serving"},
        "ports": [{"name": "grpc", "port": 8500, "targetPort": "grpc", "protocol": "TCP"},
                  {"name": "rest", "port": 8501, "targetPort": "rest", "protocol": "TCP"}],
    }


def test_shared_claim_puts_models_under_the_cluster_dir():
    spec = ClusterSpec(name="mnist", workers=1, script="print(1)\n", log_claim="shared")
    dep = s.serving_deployment(spec, SETTINGS, s.serving_options("mnist"))
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert "--model_base_path=/log/mnist/models/mnist" in container["args"]
    assert dep["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "shared"


@pytest.mark.parametrize("bad, sentence", [
    ({"model": "../etc"}, "--model '../etc' is not a valid model name"),
    ({"model": "Big"}, "--model 'Big' is not a valid model name"),
    ({"model": "m", "replicas": 0}, "--replicas 0 is out of range: give a count from 1 to 50"),
    ({"model": "m", "cpu": "lots"}, "--cpu 'lots' is not a Kubernetes quantity"),
    ({"model": "m", "memory": "1 GB"}, "--memory '1 GB' is not a Kubernetes quantity"),
])
def test_bad_serving_options_are_one_sentence(bad, sentence):
    with pytest.raises(SpecError) as err:
        s.serving_options(**bad)
    assert str(err.value).startswith(sentence)


@pytest.mark.parametrize("version", ["1.29", "1.37"])
def test_serving_manifests_validate_strictly(version):
    root = {**m.root_configmap(SPEC, SETTINGS)}
    root["metadata"] = {**root["metadata"], "uid": "0000-1111"}
    for doc in s.serving_manifests(SPEC, SETTINGS, s.serving_options("mnist", replicas=3, memory="2Gi")):
        kubernetes_validate.validate(m.with_owner(doc, m.owner_reference(root)), version, strict=True)


# -- the restricted Pod Security Standard (v1.29+ rules) --------------------------
_ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                    "projected", "secret"}


def restricted_violations(pod_spec: dict) -> list[str]:
    """What the *restricted* Pod Security profile forbids in ``pod_spec`` (empty: it passes)."""
    out = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(key):
            out.append(f"{key} is true")
    for vol in pod_spec.get("volumes", []):
        kinds = set(vol) - {"name"}
        if not kinds <= _ALLOWED_VOLUMES:
            out.append(f"volume {vol['name']} uses {kinds - _ALLOWED_VOLUMES}")
    pod_sc = pod_spec.get("securityContext", {})
    for c in pod_spec.get("initContainers", []) + pod_spec.get("containers", []):
        sc = c.get("securityContext", {})
        if sc.get("privileged"):
            out.append(f"{c['name']}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{c['name']}: allowPrivilegeEscalation is not false")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            out.append(f"{c['name']}: capabilities do not drop ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{c['name']}: adds capabilities")
        if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            out.append(f"{c['name']}: runAsNonRoot is not true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            out.append(f"{c['name']}: runs as user 0")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{c['name']}: seccompProfile is {seccomp}")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"{c['name']}: uses a hostPort")
    return out


def test_serving_pod_passes_the_restricted_profile():
    dep = s.serving_deployment(SPEC, SETTINGS, s.serving_options("mnist"))
    assert restricted_violations(dep["spec"]["template"]["spec"]) == []


def test_the_restricted_check_catches_what_it_must():
    dep = s.serving_deployment(SPEC, SETTINGS, s.serving_options("mnist"))
    pod = dep["spec"]["template"]["spec"]
    pod["hostNetwork"] = True
    pod["securityContext"].pop("seccompProfile")
    pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    pod["volumes"].append({"name": "h", "hostPath": {"path": "/"}})
    found = restricted_violations(pod)
    assert len(found) == 4, found


def test_render_includes_serving_when_asked():
    from tfk8s_magics import api
    from tfk8s_magics.backends.kubernetes import KubernetesBackend

    be = KubernetesBackend(settings=SETTINGS)
    kinds = [(o["kind"], o["metadata"]["name"]) for o in api.render_serving(SPEC, "mnist", be, replicas=2)]
    assert kinds == [("Deployment", "mnist-serving"), ("Service", "mnist-serving")]


def test_backend_serves_and_stops_against_the_api_double(kube, monkeypatch):
    """serve creates Deployment + Service owned by the root (the shipped Role allows every request),
    reuses them, stops them, and a cluster delete cascades to them."""
    from tfk8s_magics.backends.kubernetes import KubernetesBackend
    from tfk8s_magics.backends.kubernetes.rbac import backend_role

    ns = "alice"
    kube.create_namespace(ns)
    kube.set_role(backend_role(ns), ns, service_account="jupyter")
    backend = KubernetesBackend(namespace=ns, api_client=kube.api_client, user="alice",
                                storage_class="standard")
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/alice/")
    try:
        backend.launch(ClusterSpec(name="mnist", workers=1, script="print(1)\n"), detach=True)
        info = backend.serve("mnist", replicas=2)
        assert (info.model, info.reused, info.replicas) == ("mnist", False, 2)
        assert info.rest_url == "/user/alice/proxy/mnist-serving.alice.svc:8501/"
        assert info.grpc_address == "mnist-serving.alice.svc:8500"
        assert info.base_path == "/log/models/mnist"
        dep = kube.get_object("deployments", "mnist-serving", ns)
        root = kube.get_object("configmaps", "mnist", ns)
        assert dep["metadata"]["ownerReferences"][0]["uid"] == root["metadata"]["uid"]
        assert kube.get_object("services", "mnist-serving", ns)["spec"]["type"] == "ClusterIP"
        assert backend.serve("mnist").reused is True
        assert backend.serving("mnist").model == "mnist"
        assert backend.stop_serving("mnist") is True
        kube.wait_for(lambda: kube.get_object("deployments", "mnist-serving", ns) is None, message="removed")
        assert kube.get_object("services", "mnist-serving", ns) is None
        assert backend.stop_serving("mnist") is False and backend.serving("mnist") is None
        backend.serve("mnist")
        backend.delete("mnist")
        kube.wait_for(lambda: kube.get_object("deployments", "mnist-serving", ns) is None,
                      message="cascade delete of serving")
    finally:
        backend.close()
    for r in kube.requests:
        assert r.allowed, f"{r.method} {r.path} was denied by the shipped Role"
