"""The real test node's pure builders (devcluster/node.py) against literal values; no cluster."""

from __future__ import annotations

import io
import json
import tarfile
import tomllib

import pytest


@pytest.fixture(scope="module")
def node():
    from devcluster import node

    return node


@pytest.fixture
def lay(node, tmp_path):
    bins = {k: tmp_path / k for k in ("containerd", "runc", "coredns", "kubelet")}
    return node.Layout(cluster=tmp_path / "cluster", bins=bins, server="https://127.0.0.1:6443")


def test_versions_pin_a_kubelet_that_still_runs_on_cgroup_v1():
    from devcluster.versions import versions

    v = versions()
    major, minor = (int(x) for x in v["KUBERNETES"].lstrip("v").split(".")[:2])
    assert (major, minor) <= (1, 37)
    assert v["CONTAINERD"].startswith("v2.3.")
    for key in ("RUNC", "COREDNS"):
        assert v[key].startswith("v")


def test_the_node_components_are_in_the_build_registry():
    from devcluster import build

    assert build.TIER2 == ("containerd", "runc", "coredns", "kubelet")
    assert build.COMPONENTS["kubelet"].binaries == ("kubelet", "kube-proxy")
    assert build.COMPONENTS["kubelet"].version_key == "KUBERNETES"  # same module, same ldflags
    assert build.COMPONENTS["containerd"].binaries == ("containerd", "ctr", "containerd-shim-runc-v2")
    assert build.COMPONENTS["runc"].version_key == "RUNC"


def test_containerd_config(node, lay):
    cfg = tomllib.loads(node.containerd_config(lay))
    assert cfg["version"] == 3
    runtime = cfg["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True
    assert runtime["cni"] == {
        "bin_dirs": ["/usr/lib/cni"],
        "conf_dir": str(lay.state / "cni" / "net.d"),
        "max_conf_num": 1,
    }
    assert runtime["containerd"]["runtimes"]["runc"] == {
        "runtime_type": "io.containerd.runc.v2",
        "options": {"BinaryName": str(lay.bins["runc"] / "runc"), "SystemdCgroup": False},
    }
    assert cfg["root"] == str(node.cache_root() / "node-images")  # the image store outlives a cluster
    images = cfg["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"] == {"sandbox": "localhost/tfk8s/pause:3.10-tfk8s"}
    # the cluster's registry (devcluster/registry.py) is named and trusted through hosts.toml files
    assert images["registry"] == {"config_path": str(lay.cluster / "registry" / "hosts.d")}
    assert cfg["grpc"]["address"] == "/run/tfk8s-node/containerd/containerd.sock"
    assert cfg["plugins"]["io.containerd.grpc.v1.cri"]["stream_server_address"] == "127.0.0.1"


def test_cni_config(node, lay):
    assert node.cni_config(lay) == {
        "cniVersion": "1.0.0",
        "name": "tfk8s-pods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "tfk8s-br0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": "10.244.0.0/24"}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(lay.state / "cni" / "ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def test_kubelet_config(node, lay):
    cfg = node.kubelet_config(lay)
    expected = {
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        "readOnlyPort": 0,
        "resolvConf": "",
        "clusterDNS": ["10.96.0.10"],
        "clusterDomain": "cluster.local",
        "imageGCHighThresholdPercent": 100,
        "serializeImagePulls": False,
        "address": "10.245.0.1",
        "authorization": {"mode": "Webhook"},
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(lay.cluster / "pki" / "ca.crt")},
        },
        "evictionHard": {
            "nodefs.available": "0%",
            "nodefs.inodesFree": "0%",
            "imagefs.available": "0%",
            "imagefs.inodesFree": "0%",
        },
        "containerRuntimeEndpoint": "unix:///run/tfk8s-node/containerd/containerd.sock",
    }
    assert {k: cfg[k] for k in expected} == expected


def test_the_dns_service_ip_is_in_the_service_range_and_the_node_ip_is_not_outside(node):
    import ipaddress

    assert ipaddress.ip_address(node.DNS_IP) in ipaddress.ip_network(node.SERVICE_CIDR)
    for cidr in (node.POD_CIDR, node.SERVICE_CIDR, node.KWOK_CIDR):
        assert ipaddress.ip_network(cidr).is_private


def test_kube_proxy_config(node, lay):
    cfg = node.kube_proxy_config(lay)
    assert cfg["mode"] == "iptables"
    assert cfg["nodePortAddresses"] == ["10.245.0.1/32"]
    assert cfg["clusterCIDR"] == "10.244.0.0/24"
    assert cfg["conntrack"] == {"maxPerCore": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"}


def test_corefile_answers_only_the_cluster_zones(node, lay):
    text = node.corefile(lay)
    assert "forward" not in text and "proxy" not in text
    assert "bind 10.245.0.1" in text
    assert "kubernetes cluster.local in-addr.arpa ip6.arpa {" in text


def test_dns_objects_point_kube_dns_at_the_node(node):
    svc, slice_, role, binding = node.dns_objects()
    assert svc["spec"]["clusterIP"] == "10.96.0.10" and "selector" not in svc["spec"]
    assert slice_["metadata"]["labels"]["kubernetes.io/service-name"] == "kube-dns"
    assert slice_["endpoints"] == [{"addresses": ["10.245.0.1"], "conditions": {"ready": True}}]
    assert all(set(r["verbs"]) == {"list", "watch"} for r in role["rules"])
    assert binding["subjects"][0]["name"] == node.CLIENTS["coredns"][0]


def test_fence_rules_drop_every_local_range_towards_each_outside_interface(node):
    rules = node.fence_rules(["eth0"])
    assert ["-A", "TFK8S-NODE-FENCE", "-o", "eth0", "-s", "10.244.0.0/24", "-j", "DROP"] in rules
    assert ["-A", "TFK8S-NODE-FENCE", "-o", "eth0", "-d", "10.0.0.0/24", "-j", "DROP"] in rules
    assert len(rules) == 2 * len(node.LOCAL_RANGES)
    assert node.fence_rules([]) == []
    assert node.routes() == [["10.96.0.0/16", "dev", "tfk8s-node", "src", "10.245.0.1"]]


def test_pause_image_archive(node):
    data = node.pause_image_tar(b"\x7fELF-not-really")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        (manifest,) = json.load(tar.extractfile("manifest.json"))
        assert manifest["RepoTags"] == ["localhost/tfk8s/pause:3.10-tfk8s"]
        config = json.load(tar.extractfile(manifest["Config"]))
        assert config["config"]["Entrypoint"] == ["/pause"]
        with tarfile.open(fileobj=tar.extractfile(manifest["Layers"][0])) as layer:
            assert layer.getnames() == ["pause"]
            assert layer.getmember("pause").mode == 0o755
    assert node.pause_image_tar(b"x") == node.pause_image_tar(b"x")  # deterministic


def test_client_certificates_name_the_node_as_the_node_authorizer_expects(node):
    assert node.CLIENTS["kubelet"] == ("system:node:tfk8s-node", "system:nodes")
    assert node.CLIENTS["kube-proxy"] == ("system:kube-proxy", None)


def test_kube_chain_cleanup_removes_jumps_then_chains_and_leaves_others(node):
    rules = """-P INPUT ACCEPT
-N KUBE-FIREWALL
-N KUBE-KUBELET-CANARY
-N TFK8S-NODE-FENCE
-A INPUT -m comment --comment "kubernetes firewall" -j KUBE-FIREWALL
-A OUTPUT -j TFK8S-NODE-FENCE
-A KUBE-FIREWALL -j DROP
"""
    assert node.kube_chain_cleanup(rules) == [
        ["-D", "INPUT", "-m", "comment", "--comment", "kubernetes firewall", "-j", "KUBE-FIREWALL"],
        ["-F", "KUBE-FIREWALL"],
        ["-F", "KUBE-KUBELET-CANARY"],
        ["-X", "KUBE-FIREWALL"],
        ["-X", "KUBE-KUBELET-CANARY"],
    ]


def test_pods_reach_the_api_server_through_the_kubernetes_service_address(node):
    assert node.api_dnat_rule(6443) == [
        "-A",
        "TFK8S-NODE-API",
        "-s",
        "10.244.0.0/24",
        "-d",
        "10.96.0.1/32",
        "-p",
        "tcp",
        "--dport",
        "443",
        "-j",
        "DNAT",
        "--to-destination",
        "127.0.0.1:6443",
    ]


def test_the_pool_volumes_are_directories_a_non_root_pod_can_write(tmp_path):
    """A hostPath volume ignores fsGroup: the pool's directories must be writable by any uid
    (the hub runs as 1000:1000, notebooks as 1000:100), and exist before a pod mounts them."""
    import os
    import stat

    from devcluster.cluster import VOLUME_MODE, Cluster, fresh_volume_dir

    old = os.umask(0o022)
    try:
        pvs = Cluster(root=tmp_path)._volumes(3)
    finally:
        os.umask(old)
    for pv in pvs:
        path = pv["spec"]["hostPath"]["path"]
        assert pv["spec"]["hostPath"]["type"] == "Directory"
        assert stat.S_IMODE(os.stat(path).st_mode) == VOLUME_MODE == 0o1777
    # what the kubelet's DirectoryOrCreate used to leave (root, 0755) is made writable again
    made = tmp_path / "volumes" / "pv-100"
    made.mkdir(mode=0o755)
    assert stat.S_IMODE(fresh_volume_dir(made).stat().st_mode) == 0o1777
