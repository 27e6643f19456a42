"""TF Serving on Kubernetes: the pure builders against literal dicts, strict schemas, restricted PSS,
and the backend's serve / stop as the user's ServiceAccount on the real cluster (``k8s``)."""

from __future__ import annotations

import base64
import json

import kubernetes.client
import kubernetes_validate
import pytest
import yaml

from tfk8s_magics.backends.kubernetes import manifests as m
from tfk8s_magics.backends.kubernetes import serving as s
from tfk8s_magics.backends.kubernetes.settings import K8sSettings
from tfk8s_magics.errors import LaunchFailed, SpecError
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
                                        "fsGroup": 100, "fsGroupChangePolicy": "OnRootMismatch",
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "serving",
                        "image": "tensorflow/serving:2.20.0",
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


@pytest.mark.k8s
def test_backend_serves_and_stops_on_the_real_cluster(realkube, kube_user, monkeypatch):
    """serve creates Deployment + Service owned by the root (as the user's ServiceAccount, the
    shipped Role allows every request), reuses them, stops them, and a cluster delete cascades to
    them through the real garbage collector."""
    from tests.realkube import wait_for

    ns, backend = kube_user("serve")
    apps = kubernetes.client.AppsV1Api(realkube.admin)

    def deployment():
        found = [d for d in apps.list_namespaced_deployment(ns.name).items
                 if d.metadata.name == "mnist-serving" and not d.metadata.deletion_timestamp]
        return found[0] if found else None

    def service():
        found = [x for x in realkube.core.list_namespaced_service(ns.name).items
                 if x.metadata.name == "mnist-serving" and not x.metadata.deletion_timestamp]
        return found[0] if found else None

    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/alice/")
    backend.launch(ClusterSpec(name="mnist", workers=1, script="print(1)\n"), detach=True)
    info = backend.serve("mnist", replicas=2)
    assert (info.model, info.reused, info.replicas) == ("mnist", False, 2)
    assert info.rest_url == f"/user/alice/proxy/mnist-serving.{ns.name}.svc:8501/"
    assert info.grpc_address == f"mnist-serving.{ns.name}.svc:8500"
    assert info.base_path == "/log/models/mnist"
    root = realkube.core.read_namespaced_config_map("mnist", ns.name)
    assert deployment().metadata.owner_references[0].uid == root.metadata.uid
    assert service().spec.type == "ClusterIP"
    assert backend.serve("mnist").reused is True
    assert backend.serving("mnist").model == "mnist"
    assert backend.stop_serving("mnist") is True
    wait_for(lambda: deployment() is None, 60, message="the serving Deployment removed")
    assert service() is None
    assert backend.stop_serving("mnist") is False and backend.serving("mnist") is None
    backend.serve("mnist")
    backend.delete("mnist")
    wait_for(lambda: deployment() is None and service() is None, 90,
             message="the cascade delete of serving")


# -- serve --from URL: an init container of the task image fetches the models --------------
SOURCE = "s3://runs/mnist-1"
SECRET_NAME = "s3-creds"
SECRET_VALUES = {"AWS_ACCESS_KEY_ID": "AKIASERVINGTEST0001", "AWS_SECRET_ACCESS_KEY": "serving-s3cr3t-value"}


def _from_url(**kw):
    return s.serving_options("mnist", source_url=SOURCE, credentials_secret=SECRET_NAME, **kw)


def test_serving_from_a_url_is_exactly_this():
    """No claim: ``fetch`` (the task image's storage venv, the Secret's keys as its environment)
    fills an emptyDir, which TF Serving reads read-only; the source is annotated."""
    dep = s.serving_deployment(SPEC, SETTINGS, _from_url())
    template = dep["spec"]["template"]
    assert template["metadata"]["annotations"] == {"tfk8s.io/model": "mnist", "tfk8s.io/source": SOURCE}
    pod = template["spec"]
    assert list(pod) == ["automountServiceAccountToken", "enableServiceLinks", "securityContext",
                         "initContainers", "containers", "volumes"]
    assert pod["initContainers"] == [{
        "name": "fetch",
        "image": "tfk8s/tensorflow-task:0.1.0",
        "command": ["/opt/storage/bin/python", "-m", "tfk8s_magics.storage", "fetch-models", SOURCE,
                    "/models", "--model", "mnist"],
        "env": [{"name": "HOME", "value": "/tmp"}, {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "models", "mountPath": "/models"}, {"name": "tmp", "mountPath": "/tmp"}],
        "envFrom": [{"secretRef": {"name": SECRET_NAME}}],
    }]
    (serving,) = pod["containers"]
    assert "--model_base_path=/models/mnist" in serving["args"] and "envFrom" not in serving
    assert serving["volumeMounts"] == [{"name": "models", "mountPath": "/models", "readOnly": True},
                                       {"name": "tmp", "mountPath": "/tmp"}]
    assert pod["volumes"] == [{"name": "models", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}]
    # without a Secret the fetch has no envFrom (public bucket, or a node's own credentials)
    bare = s.serving_deployment(SPEC, SETTINGS, s.serving_options("mnist", source_url=SOURCE))
    assert "envFrom" not in bare["spec"]["template"]["spec"]["initContainers"][0]


@pytest.mark.parametrize("version", ["1.29", "1.37"])
def test_serving_from_a_url_validates_strictly_and_is_restricted(version):
    root = {**m.root_configmap(SPEC, SETTINGS)}
    root["metadata"] = {**root["metadata"], "uid": "0000-1111"}
    for doc in s.serving_manifests(SPEC, SETTINGS, _from_url(replicas=2)):
        kubernetes_validate.validate(m.with_owner(doc, m.owner_reference(root)), version, strict=True)
    dep = s.serving_deployment(SPEC, SETTINGS, _from_url())
    assert restricted_violations(dep["spec"]["template"]["spec"]) == []


@pytest.mark.parametrize("bad, sentence", [
    ({"source_url": "s3://AKIAX:topsecret@runs/m"}, "--from 's3://runs/m' carries a password"),
    ({"source_url": "https://h/m?X-Amz-Signature=abc"}, "--from 'https://h/m' carries credentials"),
    ({"source_url": "ftp://h/m"}, "--from 'ftp://h/m': the scheme ftp:// is not supported"),
    ({"credentials_secret": SECRET_NAME}, "--credentials-secret 's3-creds' goes with serve --from URL"),
    ({"source_url": SOURCE, "credentials_secret": "Bad_Name"}, "--credentials-secret 'Bad_Name'"),
])
def test_bad_serve_from_input_is_one_sentence_without_the_secret(bad, sentence):
    with pytest.raises(SpecError) as err:
        s.serving_options("mnist", **bad)
    text = str(err.value)
    assert text.startswith(sentence) and "topsecret" not in text and "abc" not in text
    assert text.count(". ") == 0 or text.endswith(".")  # one sentence


def test_render_shows_the_fetch_and_names_the_secret_only(capsys, tmp_path, monkeypatch):
    """``tfk8s render --serve M --from URL --credentials-secret S`` of a cluster with no URL of its
    own: the serving pod's fetch names S; the cluster's spec does not carry it."""
    from tfk8s_magics import api, cli

    monkeypatch.setattr(api, "_backends", {})  # the render's backend is this test's only

    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    assert cli.main(["render", "mnist", "--workers", "1", "--script", str(script), "--serve", "mnist",
                     "--from", SOURCE, "--credentials-secret", SECRET_NAME]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    (fetch,) = dep["spec"]["template"]["spec"]["initContainers"]
    assert fetch["envFrom"] == [{"secretRef": {"name": SECRET_NAME}}] and SOURCE in fetch["command"]
    spec_text = json.dumps([d for d in docs if d["kind"] != "Deployment"])
    assert SECRET_NAME not in spec_text


def _served_backend(kube_user, secret_get=True):
    """A restricted user namespace on the real cluster; the backend as its ServiceAccount."""
    ns, backend = kube_user("serve")
    if secret_get:  # what an administrator grants for the existence check
        ns.grant("secret-get", [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}])
    return ns, backend


@pytest.mark.k8s
def test_serve_from_a_url_on_the_real_cluster(realkube, kube_user, monkeypatch):
    """A restricted namespace admits the serving pod with its fetch; the Secret is named only, its
    values are nowhere (Deployment, pod, events, status, info); the same source is reused, another
    is refused in one sentence with nothing changed; stop removes it."""
    from tests.realkube import wait_for

    ns, backend = _served_backend(kube_user)
    apps = kubernetes.client.AppsV1Api(realkube.admin)
    realkube.core.create_namespaced_secret(ns.name, {
        "metadata": {"name": SECRET_NAME}, "type": "Opaque",
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in SECRET_VALUES.items()}})
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/alice/")

    def deployment():
        found = [d for d in apps.list_namespaced_deployment(ns.name).items
                 if d.metadata.name == "mnist-serving" and not d.metadata.deletion_timestamp]
        return realkube.admin.sanitize_for_serialization(found[0]) if found else None

    backend.launch(ClusterSpec(name="mnist", workers=1, script="print(1)\n"), detach=True)
    info = backend.serve("mnist", source_url=SOURCE, credentials_secret=SECRET_NAME)
    assert (info.model, info.reused, info.base_path) == ("mnist", False, "/models/mnist")
    pods = wait_for(lambda: realkube.pods(ns.name, "tfk8s.io/component=serving"), 90,
                    message="the serving pod admitted under restricted (made by its ReplicaSet)")
    assert [c.name for c in pods[0].spec.init_containers] == ["fetch"]
    assert backend.serve("mnist", source_url=SOURCE).reused is True  # the cluster's Secret: none
    before, asked = deployment(), len(ns.requests())
    with pytest.raises(SpecError) as err:
        backend.serve("mnist", source_url="s3://runs/other")
    assert str(err.value) == (f"cluster 'mnist' already serves model 'mnist' from {SOURCE}: "
                              "`%tfcluster serve mnist --stop` first, then serve again.")
    # nothing changed: no write of the user's, the same spec (the controller may write status)
    assert not [r for r in ns.requests()[asked:] if r.verb not in ("get", "list", "watch")]
    after = deployment()
    assert (after["spec"], after["metadata"]["generation"]) == (
        before["spec"], before["metadata"]["generation"])
    shown = [repr(backend.serving("mnist")), repr(backend.status("mnist")), repr(backend.events("mnist"))]
    written = json.dumps([deployment(),
                          realkube.admin.sanitize_for_serialization(realkube.pods(ns.name)),
                          realkube.admin.sanitize_for_serialization(realkube.events(ns.name)),
                          realkube.admin.sanitize_for_serialization(
                              realkube.core.read_namespaced_config_map("mnist", ns.name))])
    for value in [*SECRET_VALUES.values(), *(base64.b64encode(v.encode()).decode()
                                             for v in SECRET_VALUES.values())]:
        assert value not in written and not any(value in x for x in shown)
    assert backend.stop_serving("mnist") is True
    wait_for(lambda: deployment() is None, 60, message="the serving Deployment removed")


@pytest.mark.k8s
def test_serve_from_a_url_with_a_missing_secret_is_one_sentence_and_creates_nothing(realkube, kube_user):
    ns, backend = _served_backend(kube_user)
    backend.launch(ClusterSpec(name="mnist", workers=1, script="print(1)\n"), detach=True)
    created = len([r for r in ns.requests() if r.verb == "create"])
    with pytest.raises(LaunchFailed) as err:
        backend.serve("mnist", source_url=SOURCE, credentials_secret="nope")
    assert str(err.value) == (
        f"--credentials-secret 'nope': there is no Secret of that name in namespace '{ns.name}'; create "
        "it there first (e.g. `kubectl create secret generic nope --from-literal=AWS_ACCESS_KEY_ID=...`), "
        "then serve again.")
    assert len([r for r in ns.requests() if r.verb == "create"]) == created
    apps = kubernetes.client.AppsV1Api(realkube.admin)
    assert not [d for d in apps.list_namespaced_deployment(ns.name).items
                if d.metadata.name == "mnist-serving"]
    assert not [x for x in realkube.core.list_namespaced_service(ns.name).items
                if x.metadata.name == "mnist-serving"]
