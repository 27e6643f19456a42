"""The pure manifest builders, against literal expected dicts and the official schemas."""

from __future__ import annotations

import dataclasses
import json

import kubernetes_validate
import pytest
import yaml

from tfk8s_magics.backends.kubernetes import manifests as m
from tfk8s_magics.backends.kubernetes.settings import K8sSettings
from tfk8s_magics.errors import SpecError
from tfk8s_magics.spec import ClusterSpec, Resources, Task

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
CLUSTER = {
    "ps": ["ps-0.mnist.alice.svc:2222"],
    "worker": ["worker-0.mnist.alice.svc:2222", "worker-1.mnist.alice.svc:2222"],
}


def test_worker_pod_is_exactly_this():
    spec = between(
        resources={"worker": Resources(cpu="2", memory="4Gi", gpus=1)},
        node_selector={"gpu": "a100"},
        tolerations=({"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},),
        env={"EPOCHS": "3"},
    )
    pod = m.task_pod(spec, SETTINGS, Task("worker", 1))
    assert pod == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "mnist-worker-1",
            "namespace": "alice",
            "labels": {
                **labels("task"),
                "tfk8s.io/role": "worker",
                "tfk8s.io/index": "1",
            },
            "annotations": {"tfk8s.io/attempt": "0"},
        },
        "spec": {
            "hostname": "worker-1",
            "subdomain": "mnist",
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "runAsGroup": 1000,
                "fsGroup": 1000,
                "fsGroupChangePolicy": "OnRootMismatch",
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "tensorflow",
                    # the worker asks for a GPU: the tensorflow[and-cuda] image, not the CPU one
                    "image": "tfk8s/tensorflow-task-gpu:0.1.0",
                    "imagePullPolicy": "IfNotPresent",
                    "command": [
                        "python", "-m", "tfk8s_magics.backends.kubernetes.logcopy",
                        "/log/tasks/worker-1.log", "--",
                        "python", "-m", "tfk8s_magics.runtime.task",
                    ],
                    "workingDir": "/data",
                    "env": [
                        {
                            "name": "TF_CONFIG",
                            "value": json.dumps(
                                {"cluster": CLUSTER, "task": {"type": "worker", "index": 1}},
                                sort_keys=True,
                            ),
                        },
                        {"name": "TFK8S_TASK", "value": "worker-1"},
                        {"name": "TFK8S_CLUSTER", "value": "mnist"},
                        {"name": "TFK8S_LOG_DIR", "value": "/log"},
                        {"name": "TFK8S_DATA_DIR", "value": "/data"},
                        {"name": "TFK8S_CHECKPOINT_DIR", "value": "/log/checkpoints"},
                        {"name": "TFK8S_READY_FILE", "value": "/tmp/tfk8s-ready"},
                        {"name": "HOME", "value": "/tmp"},
                        {"name": "PYTHONUNBUFFERED", "value": "1"},
                        {"name": "TFK8S_SCRIPT", "value": "/etc/tfk8s/script.py"},
                        {"name": "TFK8S_SCRIPT_DIR", "value": "/etc/tfk8s"},
                        {"name": "TF_USE_LEGACY_KERAS", "value": "1"},
                        {"name": "TF_CPP_MIN_LOG_LEVEL", "value": "2"},
                        {"name": "GLOG_minloglevel", "value": "2"},
                        {"name": "ABSL_MIN_LOG_LEVEL", "value": "2"},
                        {"name": "EPOCHS", "value": "3"},
                    ],
                    "ports": [{"name": "grpc", "containerPort": 2222, "protocol": "TCP"}],
                    "readinessProbe": {
                        "exec": {"command": ["test", "-f", "/tmp/tfk8s-ready"]},
                        "periodSeconds": 2,
                        "failureThreshold": 1,
                    },
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [
                        {"name": "data", "mountPath": "/data"},
                        {"name": "log", "mountPath": "/log"},
                        {"name": "tmp", "mountPath": "/tmp"},
                        {"name": "script", "mountPath": "/etc/tfk8s", "readOnly": True},
                    ],
                    "resources": {
                        "requests": {"cpu": "2", "memory": "4Gi"},
                        "limits": {"memory": "4Gi", "nvidia.com/gpu": "1"},
                    },
                }
            ],
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "mnist-data"}},
                {"name": "log", "persistentVolumeClaim": {"claimName": "mnist-log"}},
                {"name": "tmp", "emptyDir": {}},
                {
                    "name": "script",
                    "configMap": {
                        "name": "mnist",
                        "items": [{"key": "script.py", "path": "script.py"}],
                    },
                },
            ],
            "nodeSelector": {"gpu": "a100"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }


def test_parameter_server_runs_no_script_and_retry_pods_keep_the_dns_name():
    spec = between(legacy_keras=False)
    pod = m.task_pod(spec, SETTINGS, Task("ps", 0), attempt=2)
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert "TFK8S_SCRIPT" not in env
    assert "TF_USE_LEGACY_KERAS" not in env
    assert pod["metadata"]["name"] == "mnist-ps-0-r2"
    assert pod["metadata"]["annotations"] == {"tfk8s.io/attempt": "2"}
    assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == ("ps-0", "mnist")
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["data", "log", "tmp"]
    assert "resources" not in pod["spec"]["containers"][0]


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


def test_headless_service():
    assert m.headless_service(between(), SETTINGS) == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "mnist",
            "namespace": "alice",
            "labels": labels("dns"),
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"tfk8s.io/cluster": "mnist", "tfk8s.io/component": "task"},
            "ports": [{"port": 2222, "targetPort": 2222, "protocol": "TCP"}],
        },
    }


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
    pod = m.task_pod(spec, settings, Task("worker", 0))
    assert pod["spec"]["volumes"][:2] == [
        {"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}},
        {"name": "log", "persistentVolumeClaim": {"claimName": "shared-logs"}},
    ]
    # a shared log claim: each cluster writes in its own directory of it
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert (env["TFK8S_LOG_DIR"], env["TFK8S_CHECKPOINT_DIR"]) == (
        "/log/mnist", "/log/mnist/checkpoints")
    assert container["command"][3] == "/log/mnist/tasks/worker-0.log"
    assert m.tensorboard_deployment(spec, settings)["spec"]["template"]["spec"][
        "containers"][0]["command"][2] == "/log/mnist"


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
    assert pod["containers"][0]["command"] == [
        "tensorboard", "--logdir", "/log", "--bind_all", "--port", "6006",
    ]
    assert pod["volumes"][0] == {
        "name": "log", "persistentVolumeClaim": {"claimName": "mnist-log", "readOnly": True},
    }
    assert pod["containers"][0]["volumeMounts"][0] == {
        "name": "log", "mountPath": "/log", "readOnly": True,
    }
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_cluster_manifests_order_counts_and_common_labels():
    spec = between()
    kinds = [(x["kind"], x["metadata"]["name"]) for x in m.cluster_manifests(spec, SETTINGS)]
    assert kinds == [
        ("ConfigMap", "mnist"),
        ("Service", "mnist"),
        ("PersistentVolumeClaim", "mnist-data"),
        ("PersistentVolumeClaim", "mnist-log"),
        ("Pod", "mnist-ps-0"),
        ("Pod", "mnist-worker-0"),
        ("Pod", "mnist-worker-1"),
    ]
    # N tasks → N + 4 objects, in-graph too (no per-cluster NetworkPolicy); TensorBoard adds 2
    assert len(m.cluster_manifests(in_graph(), SETTINGS)) == 2 + 4
    assert len(m.cluster_manifests(spec, SETTINGS, tensorboard=True)) == 3 + 4 + 2
    for obj in m.cluster_manifests(spec, SETTINGS, tensorboard=True):
        assert obj["metadata"]["labels"].items() >= LABELS.items(), obj["metadata"]["name"]
        assert obj["metadata"]["namespace"] == "alice"


def test_with_owner_copies_and_points_at_the_root():
    root = {**m.root_configmap(between(), SETTINGS)}
    root["metadata"] = {**root["metadata"], "uid": "u-1"}
    svc = m.headless_service(between(), SETTINGS)
    owned = m.with_owner(svc, m.owner_reference(root))
    assert owned["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "mnist", "uid": "u-1",
         "blockOwnerDeletion": True}
    ]
    assert "ownerReferences" not in svc["metadata"]


def test_builders_are_pure():
    spec = between()
    assert m.cluster_manifests(spec, SETTINGS, True) == m.cluster_manifests(spec, SETTINGS, True)


def test_render_yaml_round_trips():
    spec = between()
    docs = list(yaml.safe_load_all(m.render_yaml(spec, SETTINGS)))
    assert docs == m.cluster_manifests(spec, SETTINGS)


def test_long_names_fit_kubernetes_limits():
    spec = ClusterSpec(name="a" * 40, ps=1, workers=256, evaluator=1, script=SCRIPT)
    for obj in m.cluster_manifests(spec, SETTINGS, tensorboard=True):
        assert len(obj["metadata"]["name"]) <= 63
    pod = m.task_pod(spec, SETTINGS, Task("worker", 255), attempt=100)
    assert len(pod["metadata"]["name"]) <= 63
    assert len(pod["spec"]["hostname"]) <= 63


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
    docs = m.cluster_manifests(specs[which], SETTINGS, tensorboard=True)
    root = {**docs[0], "metadata": {**docs[0]["metadata"], "uid": "0000-1111"}}
    docs = [docs[0]] + [m.with_owner(d, m.owner_reference(root)) for d in docs[1:]]
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_strict_validation_catches_an_unknown_field():
    pod = m.task_pod(between(), SETTINGS, Task("worker", 0))
    pod["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, "1.37", strict=True)


def test_gpus_select_the_gpu_image_and_cpu_roles_keep_the_cpu_image():
    spec = between(resources={"worker": Resources(gpus=1)})
    images = {t.name: m.task_pod(spec, SETTINGS, t)["spec"]["containers"][0]["image"]
              for t in spec.tasks()}
    assert images == {"ps-0": "tfk8s/tensorflow-task:0.1.0",
                      "worker-0": "tfk8s/tensorflow-task-gpu:0.1.0",
                      "worker-1": "tfk8s/tensorflow-task-gpu:0.1.0"}
    # TensorBoard needs no GPU
    tb = m.tensorboard_deployment(spec, SETTINGS)["spec"]["template"]["spec"]["containers"][0]
    assert tb["image"] == "tfk8s/tensorflow-task:0.1.0"
    # a user's own image wins; with no GPU image configured, --gpus is refused in one sentence
    named = between(resources={"worker": Resources(gpus=1)}, image="reg/tf-cuda:1")
    assert m.task_pod(named, SETTINGS, Task("worker", 0))["spec"]["containers"][0]["image"] == \
        "reg/tf-cuda:1"
    no_gpu_image = K8sSettings(namespace="alice", gpu_image="")
    with pytest.raises(SpecError, match="no GPU task image is configured"):
        m.cluster_manifests(spec, no_gpu_image)
    assert m.cluster_manifests(between(), no_gpu_image)  # CPU clusters do not care


def test_gpu_image_from_the_environment(monkeypatch):
    from tfk8s_magics.backends.kubernetes.settings import settings_from_env

    assert settings_from_env(namespace="x").gpu_image == "tfk8s/tensorflow-task-gpu:0.1.0"
    monkeypatch.setenv("TFK8S_GPU_IMAGE", "reg/gpu:2")
    assert settings_from_env(namespace="x").gpu_image == "reg/gpu:2"


def test_files_travel_with_the_script_beside_it_and_quiet_is_one_setting():
    spec = ClusterSpec(name="mnist", workers=1, script="import helper\n",
                       files={"helper.py": "X = 1\n", "labels.txt": "a\nb\n"})
    root = m.root_configmap(spec, SETTINGS)
    assert root["data"]["helper.py"] == "X = 1\n" and root["data"]["labels.txt"] == "a\nb\n"
    assert json.loads(root["data"]["spec.json"])["files"] == ["helper.py", "labels.txt"]
    pod = m.task_pod(spec, SETTINGS, Task("worker", 0))
    script_volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "script")
    assert script_volume["configMap"]["items"] == [
        {"key": "script.py", "path": "script.py"},
        {"key": "helper.py", "path": "helper.py"},
        {"key": "labels.txt", "path": "labels.txt"},
    ]
    loud = dataclasses.replace(SETTINGS, quiet=False)
    env = {e["name"] for e in m.task_pod(spec, loud, Task("worker", 0))["spec"]["containers"][0]["env"]}
    assert "TF_CPP_MIN_LOG_LEVEL" not in env
