"""What an administrator's settings make of a user's clusters on Kubernetes: the cluster's
default StorageClass when the class is empty, claim sizes from --data-size/--log-size or the
hub's defaults, Kubernetes' own image pull policy, and the notebook's fsGroup on every pod.
Pure builders against literal values."""

from __future__ import annotations

import sys
from pathlib import Path

import tfk8s_magics as tk
from tfk8s_magics.backends.kubernetes import manifests as m
from tfk8s_magics.backends.kubernetes.jobset import cluster_manifests
from tfk8s_magics.backends.kubernetes.settings import K8sSettings, settings_from_env

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "hub_config"))


def _spec(**kw):
    return tk.make_spec("mnist", script="print(1)\n", **kw)


def _claim_specs(spec, settings):
    return {c["metadata"]["name"]: c["spec"] for c in m.claims(spec, settings)}


def test_an_empty_storage_class_is_the_clusters_default_and_names_no_class(monkeypatch):
    spec = _spec()
    assert _claim_specs(spec, K8sSettings(namespace="u", storage_class="")) == {
        "mnist-data": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}},
        "mnist-log": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}},
    }
    # what the hub sets for lab.storage_class "" reaches the notebook as "", not as glusterfs
    monkeypatch.setenv("TFK8S_STORAGE_CLASS", "")
    assert settings_from_env(namespace="u").storage_class == ""
    monkeypatch.delenv("TFK8S_STORAGE_CLASS")
    assert settings_from_env(namespace="u").storage_class == "glusterfs"  # no hub: the built-in


def test_claim_sizes_come_from_the_launch_else_the_hubs_defaults(monkeypatch):
    settings = K8sSettings(namespace="u", storage_class="filestore")
    sizes = {n: s["resources"]["requests"]["storage"]
             for n, s in _claim_specs(_spec(data_size="1Ti", log_size="50Gi"), settings).items()}
    assert sizes == {"mnist-data": "1Ti", "mnist-log": "50Gi"}
    monkeypatch.setenv("TFK8S_DATA_SIZE", "2Gi")  # lab.data_size, through the hub
    monkeypatch.setenv("TFK8S_LOG_SIZE", "3Gi")
    sizes = {n: s["resources"]["requests"]["storage"] for n, s in _claim_specs(_spec(), settings).items()}
    assert sizes == {"mnist-data": "2Gi", "mnist-log": "3Gi"}
    assert _claim_specs(_spec(data_claim="shared"), settings).keys() == {"mnist-log"}


def test_user_images_get_kubernetes_own_pull_policy():
    spec = _spec(workers=1)
    settings = K8sSettings(namespace="u", image="registry.example/task:latest")
    containers = [c for obj in cluster_manifests(spec, settings) if obj["kind"] == "JobSet"
                  for job in obj["spec"]["replicatedJobs"]
                  for c in job["template"]["spec"]["template"]["spec"]["containers"]]
    containers += m.tensorboard_deployment(spec, settings)["spec"]["template"]["spec"]["containers"]
    assert containers and all("imagePullPolicy" not in c for c in containers)
    pinned = K8sSettings(namespace="u", image_pull_policy="Always")
    assert m.pod_spec(spec, pinned, "worker", [], None)["containers"][0]["imagePullPolicy"] == "Always"


def test_tasks_and_the_notebook_share_one_fs_group():
    from tfk8s_hub.settings import LabSettings
    from tfk8s_hub.spawner import kubespawner_config

    notebook = kubespawner_config(LabSettings())["fs_gid"]
    spec, settings = _spec(), K8sSettings(namespace="u")
    pods = [m.pod_spec(spec, settings, "worker", [], None),
            m.tensorboard_deployment(spec, settings)["spec"]["template"]["spec"]]
    assert [p["securityContext"]["fsGroup"] for p in pods] == [notebook, notebook] == [100, 100]
