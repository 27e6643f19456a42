"""The pure manifest builders, against literal expected dicts and the official schemas."""

from __future__ import annotations

import dataclasses
import json

import kubernetes_validate
import pytest
import yaml

from tests import jobset_schema as crd
from tfk8s_magics.backends.kubernetes import jobset as j
from tfk8s_magics.backends.kubernetes import manifests as m
from tfk8s_magics.backends.kubernetes.settings import K8sSettings
from tfk8s_magics.errors import SpecError
from tfk8s_magics.lifecycle import LifecyclePolicy
from tfk8s_magics.spec import ClusterSpec, Resources

SETTINGS = K8sSettings(namespace="alice", image="tfk8s/tensorflow-task:0.1.0", user="alice")
SCRIPT = "print('hi')\n"


def between(**kw) -> ClusterSpec:
    return ClusterSpec(name="mnist", ps=1, workers=2, script=SCRIPT, owner="alice", **kw)


def in_graph(**kw) -> ClusterSpec:
    return ClusterSpec(name="ig", mode="in-graph", ps=1, workers=1, owner="alice", **kw)


LABELS = {
    "app.kubernetes.io/managed-by": "tfk8s",
    "app.kubernetes.io/name": "tfk8s",
    "app.kubernetes.io/part-of": "tfk8s-lab",
    "app.kubernetes.io/instance": "mnist",
    "tfk8s.io/cluster": "mnist",
    "tfk8s.io/user": "alice",
}


def labels(component: str) -> dict[str, str]:
    """A cluster object's labels: the recommended app.kubernetes.io set and the project's own."""
    return {**LABELS, "app.kubernetes.io/component": component, "tfk8s.io/component": component}


def test_root_configmap_holds_script_and_spec_without_script():
    spec = between()
    root = m.root_configmap(spec, SETTINGS)
    record = spec.to_dict()
    del record["script"]
    record["files"] = []  # names only: each file's text is a key of its own
    assert root == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "mnist",
            "namespace": "alice",
            "labels": labels("root"),
            "annotations": {"tfk8s.io/owner": "alice"},
        },
        "data": {"spec.json": json.dumps(record, sort_keys=True), "script.py": SCRIPT},
    }
    restored = json.loads(root["data"]["spec.json"])
    restored["script"] = root["data"]["script.py"]
    restored["files"] = {n: root["data"][n] for n in restored["files"]}  # as the backend reads it
    assert ClusterSpec.from_dict(restored) == spec


def test_claims_use_storage_class_and_skip_named_claims():
    settings = K8sSettings(namespace="alice", user="alice", storage_class="kadalu", log_size="5Gi")
    assert m.claims(between(), settings) == [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": "mnist-data",
                "namespace": "alice",
                "labels": labels("data"),
            },
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "kadalu",
                "resources": {"requests": {"storage": "10Gi"}},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": "mnist-log",
                "namespace": "alice",
                "labels": labels("log"),
            },
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "kadalu",
                "resources": {"requests": {"storage": "5Gi"}},
            },
        },
    ]
    spec = between(log_claim="shared-logs", data_claim="datasets")
    assert m.claims(spec, settings) == []
    pod = m.pod_spec(spec, settings, "worker", [], None)
    assert pod["volumes"][:2] == [
        {"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}},
        {"name": "log", "persistentVolumeClaim": {"claimName": "shared-logs"}},
    ]
    # a shared log claim: each cluster writes in its own directory of it
    env = m.role_env(spec, settings, "worker")
    assert (env["TFK8S_LOG_DIR"], env["TFK8S_CHECKPOINT_DIR"]) == (
        "/log/mnist", "/log/mnist/checkpoints")
    assert pod["containers"][0]["command"][3] == "/log/mnist/tasks/{task}.log"
    command = m.tensorboard_deployment(spec, settings)["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--logdir") + 1] == "/log/mnist"


def test_tensorboard_service_and_deployment():
    spec = between()
    svc = m.tensorboard_service(spec, SETTINGS)
    assert svc == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "mnist-tensorboard",
            "namespace": "alice",
            "labels": labels("tensorboard"),
        },
        "spec": {
            "selector": {"tfk8s.io/cluster": "mnist", "tfk8s.io/component": "tensorboard"},
            "ports": [{"name": "http", "port": 6006, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    dep = m.tensorboard_deployment(spec, SETTINGS)
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    container = pod["containers"][0]
    # TensorBoard behind its token (the runner's guard), the token from the cluster's Secret
    assert container["command"] == [
        "python", "-m", "tfk8s_magics.runtime.tensorboard", "0",
        "--logdir", "/log", "--bind_all", "--port", "6006",
    ]
    assert container["env"][1] == {"name": "TFK8S_TENSORBOARD_TOKEN", "valueFrom": {
        "secretKeyRef": {"name": "mnist-tensorboard", "key": "token"}}}
    assert container["readinessProbe"]["httpGet"] == {"path": "/tfk8s-ready", "port": 6006}
    named = m.tensorboard_deployment(spec, SETTINGS, "mnist-tensorboard-abc123")
    assert named["spec"]["template"]["spec"]["containers"][0]["env"][1]["valueFrom"] == {
        "secretKeyRef": {"name": "mnist-tensorboard-abc123", "key": "token"}}
    assert m.tensorboard_secret(spec, SETTINGS, "mnist-tensorboard-abc123", "t0k") == {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "mnist-tensorboard-abc123", "namespace": "alice",
                     "labels": labels("tensorboard")},
        "type": "Opaque",
        "stringData": {"token": "t0k"},
    }
    assert pod["volumes"][0] == {
        "name": "log", "persistentVolumeClaim": {"claimName": "mnist-log", "readOnly": True},
    }
    assert pod["containers"][0]["volumeMounts"][0] == {
        "name": "log", "mountPath": "/log", "readOnly": True,
    }
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_cluster_manifests_order_counts_and_common_labels():
    spec = between()
    kinds = [(x["kind"], x["metadata"]["name"]) for x in j.cluster_manifests(spec, SETTINGS)]
    assert kinds == [
        ("ConfigMap", "mnist"),
        ("PersistentVolumeClaim", "mnist-data"),
        ("PersistentVolumeClaim", "mnist-log"),
        ("JobSet", "mnist"),
    ]
    # A constant 4 objects whatever the number of tasks (in-graph too: no
    # NetworkPolicy, the namespace's isolation is the administrator's); TensorBoard adds 2.
    big = ClusterSpec(name="big", ps=8, workers=64, script=SCRIPT)
    assert len(j.cluster_manifests(big, SETTINGS)) == 4
    assert len(j.cluster_manifests(in_graph(), SETTINGS)) == 4
    assert len(j.cluster_manifests(spec, SETTINGS, tensorboard=True)) == 4 + 2
    for obj in j.cluster_manifests(spec, SETTINGS, tensorboard=True):
        assert obj["metadata"]["labels"].items() >= LABELS.items(), obj["metadata"]["name"]
        assert obj["metadata"]["namespace"] == "alice"


def test_with_owner_copies_and_points_at_the_root():
    root = {**m.root_configmap(between(), SETTINGS)}
    root["metadata"] = {**root["metadata"], "uid": "u-1"}
    svc = m.claims(between(), SETTINGS)[0]
    owned = m.with_owner(svc, m.owner_reference(root))
    assert owned["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "mnist", "uid": "u-1",
         "blockOwnerDeletion": True}
    ]
    assert "ownerReferences" not in svc["metadata"]


def test_builders_are_pure():
    spec = between()
    assert j.cluster_manifests(spec, SETTINGS, True) == j.cluster_manifests(spec, SETTINGS, True)


def test_render_yaml_round_trips():
    spec = between()
    docs = list(yaml.safe_load_all(j.render_yaml(spec, SETTINGS)))
    assert docs == j.cluster_manifests(spec, SETTINGS)


def test_long_names_fit_kubernetes_limits():
    spec = ClusterSpec(name="a" * 40, ps=1, workers=256, evaluator=1, script=SCRIPT)
    for obj in j.cluster_manifests(spec, SETTINGS, tensorboard=True):
        assert len(obj["metadata"]["name"]) <= 63


def test_user_label_is_sanitised_and_full_name_kept_in_annotation():
    spec = ClusterSpec(name="x", workers=1, script=SCRIPT, owner="bob@example.org")
    root = m.root_configmap(spec, SETTINGS)
    assert root["metadata"]["labels"]["tfk8s.io/user"] == "bob-example.org"
    assert root["metadata"]["annotations"] == {"tfk8s.io/owner": "bob@example.org"}


@pytest.mark.parametrize("version", ["1.29", "1.37"])
@pytest.mark.parametrize("which", ["between", "in-graph", "gpu", "claims"])
def test_every_manifest_validates_strictly(version, which):
    specs = {
        "between": between(),
        "in-graph": in_graph(),
        "gpu": between(
            resources={"worker": Resources(cpu="500m", memory="1Gi", gpus=2),
                       "ps": Resources(cpu="1")},
            node_selector={"accelerator": "nvidia"},
            tolerations=({"key": "nvidia.com/gpu", "operator": "Exists",
                          "effect": "NoSchedule"},),
        ),
        "claims": between(log_claim="logs", data_claim="data"),
    }
    docs = j.cluster_manifests(specs[which], SETTINGS, tensorboard=True)
    root = {**docs[0], "metadata": {**docs[0]["metadata"], "uid": "0000-1111"}}
    docs = [docs[0]] + [m.with_owner(d, m.owner_reference(root)) for d in docs[1:]]
    for doc in docs:
        if doc["kind"] == "JobSet":  # a custom resource: its CRD schema, strictly
            assert crd.problems(doc) == []
        else:
            kubernetes_validate.validate(doc, version, strict=True)


def test_strict_validation_catches_an_unknown_field():
    claim = m.claims(between(), SETTINGS)[0]
    claim["spec"]["acessModes"] = ["ReadWriteMany"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(claim, "1.37", strict=True)


def _images(js: dict) -> dict[str, str]:
    """Role → the image of its JobSet pod template."""
    return {r["name"]: r["template"]["spec"]["template"]["spec"]["containers"][0]["image"]
            for r in js["spec"]["replicatedJobs"]}


def test_gpus_select_the_gpu_image_and_cpu_roles_keep_the_cpu_image():
    spec = between(resources={"worker": Resources(gpus=1)})
    assert _images(j.jobset(spec, SETTINGS, LifecyclePolicy.of(spec))) == {
        "ps": "tfk8s/tensorflow-task:0.1.0", "worker": "tfk8s/tensorflow-task-gpu:0.1.0"}
    # TensorBoard needs no GPU
    tb = m.tensorboard_deployment(spec, SETTINGS)["spec"]["template"]["spec"]["containers"][0]
    assert tb["image"] == "tfk8s/tensorflow-task:0.1.0"
    # a user's own image wins; with no GPU image configured, --gpus is refused in one sentence
    named = between(resources={"worker": Resources(gpus=1)}, image="reg/tf-cuda:1")
    assert _images(j.jobset(named, SETTINGS, LifecyclePolicy.of(named)))["worker"] == "reg/tf-cuda:1"
    no_gpu_image = K8sSettings(namespace="alice", gpu_image="")
    with pytest.raises(SpecError, match="no GPU task image is configured"):
        j.cluster_manifests(spec, no_gpu_image)
    assert j.cluster_manifests(between(), no_gpu_image)  # CPU clusters do not care


def test_gpu_image_from_the_environment(monkeypatch):
    from tfk8s_magics.backends.kubernetes.settings import settings_from_env

    assert settings_from_env(namespace="x").gpu_image == "tfk8s/tensorflow-task-gpu:0.1.0"
    monkeypatch.setenv("TFK8S_GPU_IMAGE", "reg/gpu:2")
    assert settings_from_env(namespace="x").gpu_image == "reg/gpu:2"


def _worker_template(spec: ClusterSpec, settings: K8sSettings) -> dict:
    js = j.jobset(spec, settings, LifecyclePolicy.of(spec))
    worker = next(r for r in js["spec"]["replicatedJobs"] if r["name"] == "worker")
    return worker["template"]["spec"]["template"]["spec"]


def test_files_travel_with_the_script_beside_it_and_quiet_is_one_setting():
    spec = ClusterSpec(name="mnist", workers=1, script="import helper\n",
                       files={"helper.py": "X = 1\n", "labels.txt": "a\nb\n"})
    root = m.root_configmap(spec, SETTINGS)
    assert root["data"]["helper.py"] == "X = 1\n" and root["data"]["labels.txt"] == "a\nb\n"
    assert json.loads(root["data"]["spec.json"])["files"] == ["helper.py", "labels.txt"]
    pod = _worker_template(spec, SETTINGS)
    script_volume = next(v for v in pod["volumes"] if v["name"] == "script")
    assert script_volume["configMap"]["items"] == [
        {"key": "script.py", "path": "script.py"},
        {"key": "helper.py", "path": "helper.py"},
        {"key": "labels.txt", "path": "labels.txt"},
    ]
    loud = dataclasses.replace(SETTINGS, quiet=False)
    env = {e["name"] for e in _worker_template(spec, loud)["containers"][0]["env"]}
    assert "TF_CPP_MIN_LOG_LEVEL" not in env
