"""The ``glusterfs`` class's pure builders (devcluster/storage.py) against literal values; no cluster.
tests/test_k8s_storage_gluster.py runs the volume, its mount and the provisioner for real."""

from __future__ import annotations

import yaml

from devcluster import storage


def test_the_provisioner_is_pinned_and_built_from_its_module():
    from devcluster import build
    from devcluster.versions import versions

    assert versions()["LOCAL_PATH_PROVISIONER"] == "v0.0.30"
    assert build.COMPONENTS["local-path-provisioner"].binaries == ("local-path-provisioner",)
    assert "local-path-provisioner" in build.TIER2_PARTS  # scripts/kube build --pods builds it


def test_glusterd_listens_on_the_slots_node_bridge_only_with_its_own_directory_and_socket(tmp_path):
    from devcluster.network import Slot

    vol = storage.glusterd_vol(tmp_path / "work", tmp_path / "g.socket", Slot(3).host_ip)
    options = dict(
        line.split()[1:3]
        for line in vol.splitlines()
        if line.strip().startswith("option") and len(line.split()) == 3
    )
    assert options["transport.socket.bind-address"] == "10.246.3.1"  # never 0.0.0.0 nor another slot's
    assert options["working-directory"] == str(tmp_path / "work")
    assert options["glusterd-sockfile"] == str(tmp_path / "g.socket")
    assert options["transport.socket.listen-port"] == "24007"


def test_the_provisioner_config_is_the_shared_mount_only(tmp_path):
    assert storage.provisioner_config(tmp_path / "mnt") == {"sharedFileSystemPath": str(tmp_path / "mnt")}


def test_objects_the_class_rbac_and_helper_pods_on_real_nodes_only():
    objs = {
        (o["kind"], o["metadata"]["name"]): o
        for o in storage.objects("localhost/tfk8s/tensorflow-task:0.1.0")
    }
    assert objs[("StorageClass", "glusterfs")] == {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": "glusterfs"},
        "provisioner": "rancher.io/local-path",
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }
    binding = objs[("ClusterRoleBinding", "tfk8s-storage")]
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:tfk8s-storage"}
    ]
    verbs = {
        r: rule["verbs"]
        for rule in objs[("ClusterRole", "tfk8s-storage")]["rules"]
        for r in rule["resources"]
    }
    assert "create" not in verbs["pods"]  # pods only in its own namespace (the Role)
    assert "secrets" not in verbs
    cm = objs[("ConfigMap", "local-path-config")]
    helper = yaml.safe_load(cm["data"]["helperPod.yaml"])
    term = helper["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "type", "operator": "NotIn", "values": ["kwok"]}]}
    ]
    assert helper["spec"]["containers"][0]["image"] == "localhost/tfk8s/tensorflow-task:0.1.0"
    assert 'mkdir -m 0777 -p "$VOL_DIR"' in cm["data"]["setup"]
    assert 'rm -rf "$VOL_DIR"' in cm["data"]["teardown"]
    ns = objs[("Namespace", "tfk8s-storage")]
    assert ns["metadata"]["labels"] == {"pod-security.kubernetes.io/enforce": "privileged"}


def test_without_glusterfs_server_up_says_what_to_run_and_leaves_nothing_running(tmp_path, monkeypatch):
    import shutil

    import pytest

    from devcluster.cluster import Cluster
    from devcluster.network import Slot

    monkeypatch.setattr(shutil, "which", lambda tool: None if "gluster" in tool else "/usr/bin/" + tool)
    cluster = Cluster(tmp_path / "cluster")
    with pytest.raises(storage.StorageError, match="^glusterd is missing: run scripts/bootstrap kube-node"):
        storage.up(cluster, Slot(7), helper_image="localhost/tfk8s/tensorflow-task:0.1.0")
    assert not any(cluster.procs.alive(n) for n in ("glusterd", "local-path-provisioner"))
    assert not storage.mounted(cluster.root / "storage" / "mnt")
