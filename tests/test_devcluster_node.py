"""The real nodes' pure builders (devcluster/network.py, nodes.py, dns.py) against literal values."""

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
def n2(tmp_path):
    from devcluster import network, nodes

    bins = {k: tmp_path / k for k in ("containerd", "runc", "coredns", "kubelet")}
    return nodes.Node(
        net=network.NodeNet(1, 2), cluster=tmp_path / "cluster", bins=bins, server="https://10.246.1.1:6443"
    )


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

    assert build.TIER2 == ("containerd", "runc", "coredns", "kubelet", "cilium")
    assert build.COMPONENTS["kubelet"].binaries == ("kubelet", "kube-proxy")
    assert build.COMPONENTS["kubelet"].version_key == "KUBERNETES"  # same module, same ldflags
    assert build.COMPONENTS["containerd"].binaries == ("containerd", "ctr", "containerd-shim-runc-v2")
    assert build.COMPONENTS["runc"].version_key == "RUNC"


def test_each_node_has_its_own_names_addresses_and_range():
    from devcluster import network

    a, b = network.Slot(1).nodes(2)
    assert (a.name, a.netns, a.ip, a.pod_cidr, a.pod_gateway, a.host_ip) == (
        "tfk8s-node-1",
        "tfk8s-s1n1",
        "10.246.1.11",
        "10.244.17.0/24",
        "10.244.17.1",
        "10.246.1.1",
    )
    assert (b.name, b.netns, b.ip, b.pod_cidr) == (
        "tfk8s-node-2",
        "tfk8s-s1n2",
        "10.246.1.12",
        "10.244.18.0/24",
    )
    assert str(b.netns_path) == "/run/netns/tfk8s-s1n2"
    s3 = network.Slot(3)
    assert (s3.bridge, s3.net, s3.host_ip, s3.fence_chain, s3.api_chain) == (
        "tfk8s-s3",
        "10.246.3.0/24",
        "10.246.3.1",
        "TFK8S-S3-FENCE",
        "TFK8S-S3-API",
    )
    with pytest.raises(network.NetworkError, match="between 1 and 15 real nodes, not 16"):
        s3.nodes(16)


def test_slots_never_clash_with_each_other_nor_with_the_one_node_layout():
    """Several clusters' real nodes run at once, one slot each; and the one-node layout (bridge
    tfk8s-br0, device tfk8s-node, pods 10.244.0.0/24, the node at 10.245.0.1, chains
    TFK8S-NODE-*, /run/tfk8s-node) may run beside them."""
    import ipaddress

    from devcluster import network, nodes

    names = {"tfk8s-br0", "tfk8s-node"}
    nets = [ipaddress.ip_network("10.244.0.0/24"), ipaddress.ip_network("10.245.0.0/16")]
    for k in network.SLOTS:
        slot = network.Slot(k)
        for thing in (slot.bridge, slot.fence_chain, slot.api_chain):
            assert thing not in names, thing
            names.add(thing)
        assert len(slot.bridge) <= 15 and not slot.fence_chain.startswith("TFK8S-NODE-")
        mine = [ipaddress.ip_network(slot.net)]
        for n in slot.nodes(network.MAX_NODES):
            assert n.netns not in names and len(n.netns) <= 15, n.netns  # also a device name
            names.add(n.netns)
            mine.append(ipaddress.ip_network(n.pod_cidr))
        for net in mine:
            assert not any(net.overlaps(other) for other in nets), net
            assert any(
                net.subnet_of(ipaddress.ip_network(r)) for r in (network.POD_RANGE, network.NODES_RANGE)
            )
        nets += mine
    assert nodes.RUN_ROOT.name != "tfk8s-node"


def test_containerd_config(n2):
    from devcluster import nodes

    cfg = tomllib.loads(nodes.containerd_config(n2))
    assert cfg["version"] == 3
    runtime = cfg["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True
    assert runtime["netns_mounts_under_state_dir"] is True  # not the machine's /var/run/netns
    assert runtime["cni"] == {"bin_dirs": ["/usr/lib/cni"], "conf_dir": str(n2.cni_dir), "max_conf_num": 1}
    assert runtime["containerd"]["runtimes"]["runc"] == {
        "runtime_type": "io.containerd.runc.v2",
        "options": {
            "BinaryName": str(n2.bins["runc"] / "runc"),
            "Root": "/run/tfk8s-rn/tfk8s-s1n2/runc",
            "SystemdCgroup": False,
        },
    }
    assert cfg["root"] == str(nodes.cache_root() / "nodes-images" / "tfk8s-s1n2")  # outlives a cluster
    assert cfg["state"] == "/run/tfk8s-rn/tfk8s-s1n2/containerd"
    assert cfg["plugins"]["io.containerd.nri.v1.nri"] == {"disable": True}  # a machine-wide socket
    images = cfg["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"] == {"sandbox": "localhost/tfk8s/pause:3.10-tfk8s"}
    # hosts.toml per registry name (devcluster/registry.py writes the cluster's), read at each pull
    assert images["registry"] == {"config_path": str(n2.cluster / "registry" / "hosts.d")}
    assert cfg["grpc"]["address"] == "/run/tfk8s-rn/tfk8s-s1n2/containerd.sock"
    assert cfg["plugins"]["io.containerd.grpc.v1.cri"]["stream_server_address"] == "127.0.0.1"


def test_cni_config(n2):
    from devcluster import nodes

    assert nodes.cni_config(n2) == {
        "cniVersion": "1.0.0",
        "name": "tfk8s-s1n2",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "tfk8s-pods",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": "10.244.18.0/24"}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(n2.state / "cni" / "ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def test_kubelet_config(n2):
    from devcluster import nodes

    cfg = nodes.kubelet_config(n2)
    expected = {
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": "/tfk8s-s1n2",
        "failSwapOn": False,
        "readOnlyPort": 0,
        "resolvConf": "",
        "clusterDNS": ["169.254.25.10"],
        "clusterDomain": "cluster.local",
        "imageGCHighThresholdPercent": 100,
        "serializeImagePulls": False,
        "address": "10.246.1.12",
        "authorization": {"mode": "Webhook"},
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(n2.cluster / "pki" / "ca.crt")},
        },
        "evictionHard": {
            "nodefs.available": "0%",
            "nodefs.inodesFree": "0%",
            "imagefs.available": "0%",
            "imagefs.inodesFree": "0%",
        },
        "containerRuntimeEndpoint": "unix:///run/tfk8s-rn/tfk8s-s1n2/containerd.sock",
        "podLogsDir": str(n2.cluster / "nodes" / "tfk8s-node-2" / "pod-logs"),
    }
    assert {k: cfg[k] for k in expected} == expected


def test_every_process_of_a_node_runs_in_its_namespace_with_its_own_dirs(n2):
    from devcluster import nodes

    kubelet = nodes.argv(n2, "kubelet")
    assert kubelet[kubelet.index("--root-dir") + 1] == str(n2.state / "kubelet")
    assert kubelet[kubelet.index("--node-ip") + 1] == "10.246.1.12"
    assert kubelet[kubelet.index("--hostname-override") + 1] == "tfk8s-node-2"
    assert set(nodes.PROCESSES) == {"containerd", "kubelet", "kube-proxy", "nodelocaldns"}
    for name in nodes.PROCESSES:
        assert nodes.argv(n2, name)[0].startswith(str(n2.bins[next(iter(n2.bins))].parent))


def test_the_node_reaches_the_api_server_by_the_host_end_checking_its_certificate_for_localhost(n2):
    from devcluster import nodes

    kc = nodes.kubeconfig(n2.server, n2.ca, n2.pki / "a.crt", n2.pki / "a.key", "kubelet")
    assert kc["clusters"][0]["cluster"] == {
        "server": "https://10.246.1.1:6443",
        "certificate-authority": str(n2.ca),
        "tls-server-name": "localhost",
    }
    assert nodes.clients(n2)["kubelet"] == ("system:node:tfk8s-node-2", "system:nodes")
    assert nodes.clients(n2)["kube-proxy"] == ("system:kube-proxy", None)


def test_kube_proxy_config(n2):
    from devcluster import nodes

    cfg = nodes.kube_proxy_config(n2, "10.244.0.0/16")
    assert cfg["mode"] == "iptables"
    assert cfg["hostnameOverride"] == "tfk8s-node-2"
    assert cfg["nodePortAddresses"] == ["10.246.1.12/32"]
    assert cfg["clusterCIDR"] == "10.244.0.0/16"
    assert cfg["conntrack"] == {"maxPerCore": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"}


def test_coredns_answers_only_the_cluster_zones_on_the_host_end_of_the_node_bridge():
    from devcluster import dns

    text = dns.corefile("10.246.1.1", "/k/coredns.kubeconfig")
    assert "forward" not in text and "proxy" not in text
    assert "bind 10.246.1.1" in text and "ready 10.246.1.1:8181" in text
    assert "kubernetes cluster.local in-addr.arpa ip6.arpa {" in text
    assert "kubeconfig /k/coredns.kubeconfig" in text


def test_the_node_local_cache_listens_on_the_link_local_address_and_asks_kube_dns():
    from devcluster import dns, network

    text = dns.local_corefile(network.NodeNet(1, 2))
    assert "bind 169.254.25.10" in text
    assert "forward . 10.96.0.10 {\n        force_tcp\n    }" in text
    assert "ready 10.246.1.12:8181" in text and "cache {" in text


def test_dns_objects_point_kube_dns_at_the_host_coredns():
    from devcluster import dns

    svc, slice_, role, binding = dns.objects("10.246.1.1")
    assert svc["spec"]["clusterIP"] == "10.96.0.10" and "selector" not in svc["spec"]
    assert slice_["metadata"]["labels"]["kubernetes.io/service-name"] == "kube-dns"
    assert slice_["endpoints"] == [{"addresses": ["10.246.1.1"], "conditions": {"ready": True}}]
    assert all(set(r["verbs"]) == {"list", "watch"} for r in role["rules"])
    assert binding["subjects"][0]["name"] == dns.COREDNS_CLIENT


def test_dns_query_builds_and_parses_a_real_answer():
    """The resolver the readiness check uses, against a literal answer (compressed name)."""
    import socket
    import struct
    import threading

    from devcluster import dns

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as srv:
        srv.bind(("127.0.0.1", 0))
        port = srv.getsockname()[1]

        def answer():
            q, addr = srv.recvfrom(512)
            head = q[:2] + struct.pack(">HHHHH", 0x8180, 1, 1, 0, 0)
            rr = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 5, 4) + socket.inet_aton("10.96.0.1")
            srv.sendto(head + q[12:] + rr, addr)

        t = threading.Thread(target=answer)
        t.start()
        try:
            assert dns.query("127.0.0.1", "kubernetes.default.svc.cluster.local", port=port) == ["10.96.0.1"]
        finally:
            t.join()


def test_fence_rules_drop_every_local_range_towards_each_outside_interface():
    from devcluster import network

    rules = network.fence_rules(network.Slot(2), ["eth0"])
    assert ["-A", "TFK8S-S2-FENCE", "-o", "eth0", "-s", "10.244.0.0/16", "-j", "DROP"] in rules
    assert ["-A", "TFK8S-S2-FENCE", "-o", "eth0", "-d", "10.0.0.0/24", "-j", "DROP"] in rules
    assert ["-A", "TFK8S-S2-FENCE", "-o", "eth0", "-s", "10.246.0.0/16", "-j", "DROP"] in rules
    assert len(rules) == 2 * len(network.LOCAL_RANGES)
    assert network.fence_rules(network.Slot(2), []) == []


def test_routes_take_pod_traffic_across_nodes_without_nat_and_nothing_elsewhere():
    from devcluster import network

    a, b, c = network.Slot(1).nodes(3)
    assert network.node_routes(b, [a, b, c]) == [
        # its own pods, with the node's address as the source of what the node sends them (the
        # kubelet's probes: Cilium knows that address as the host, not the pod bridge's)
        ["10.244.18.0/24", "dev", "tfk8s-pods", "proto", "kernel", "scope", "link", "src", "10.246.1.12"],
        ["10.244.17.0/24", "via", "10.246.1.11", "dev", "eth0"],
        ["10.244.19.0/24", "via", "10.246.1.13", "dev", "eth0"],
        ["10.96.0.0/16", "via", "10.246.1.1", "dev", "eth0", "src", "10.246.1.12"],
    ]  # and no default route: an outside address is unreachable from a node
    assert network.host_routes([a, b]) == [
        ["10.244.17.0/24", "via", "10.246.1.11", "dev", "tfk8s-s1"],
        ["10.244.18.0/24", "via", "10.246.1.12", "dev", "tfk8s-s1"],
    ]


def test_the_api_server_is_reached_through_the_host_end_and_the_kubernetes_service():
    from devcluster import network

    slot = network.Slot(1)
    assert network.host_api_rule(slot, 6443) == [
        "-A", "TFK8S-S1-API", "-i", "tfk8s-s1", "-d", "10.246.1.1/32", "-p", "tcp", "--dport", "6443",
        "-j", "DNAT", "--to-destination", "127.0.0.1:6443",
    ]  # fmt: skip
    # the registry's port the same way, in the slot's own chain, after the API server's
    assert network.host_nat_rules(network.Slot(3), 6443, (5000,)) == [
        ["-A", "TFK8S-S3-API", "-i", "tfk8s-s3", "-d", "10.246.3.1/32", "-p", "tcp", "--dport", str(port),
         "-j", "DNAT", "--to-destination", f"127.0.0.1:{port}"]
        for port in (6443, 5000)
    ]  # fmt: skip
    # the kubernetes Service's one endpoint, as the API server's reconciler would write it
    eps = network.api_endpoints(slot, 6443)
    assert (eps["kind"], eps["metadata"]["namespace"], eps["metadata"]["name"]) == (
        "EndpointSlice", "default", "kubernetes")
    assert eps["metadata"]["labels"] == {"kubernetes.io/service-name": "kubernetes"}
    assert eps["endpoints"] == [{"addresses": ["10.246.1.1"], "conditions": {"ready": True}}]
    assert eps["ports"] == [{"name": "https", "port": 6443, "protocol": "TCP"}]


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


def test_down_stops_only_processes_of_its_own_nodes(tmp_path):
    """A process in another network namespace and cgroup (another cluster's kubelet running the same
    binary) is not among those a node's ``stop`` kills; one in the node's namespace is."""
    import os
    import subprocess
    import sys

    from devcluster import network, nodes

    if os.geteuid() != 0:
        pytest.skip("needs root (a network namespace)")
    net = network.NodeNet(8, 15)
    n = nodes.Node(net=net, cluster=tmp_path, bins={}, server="")
    subprocess.run(["ip", "netns", "add", net.netns], check=True)
    inside = outside = None
    try:
        sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
        inside = subprocess.Popen(["nsenter", f"--net={net.netns_path}", "--", *sleep])
        outside = subprocess.Popen(sleep)  # the same binary, the host's namespace
        import time

        deadline = time.monotonic() + 10
        while inside.pid not in network.pids_in(net) and time.monotonic() < deadline:
            time.sleep(0.1)
        found = network.pids_in(net)
        assert inside.pid in found and outside.pid not in found and os.getpid() not in found
        assert outside.pid not in nodes.cgroup_pids(n)
        nodes.kill(found)
        assert inside.wait(10) == -9 and outside.poll() is None
    finally:
        for p in (inside, outside):
            if p and p.poll() is None:
                p.kill()
        subprocess.run(["ip", "netns", "del", net.netns])


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


def test_a_failed_start_of_the_real_nodes_is_tried_once_more_and_said(tmp_path, monkeypatch):
    """The first failure's message is logged in full (scripts/test repeats it at the end of its
    output); a second failure ends the start with it."""
    from devcluster import node
    from devcluster.cluster import Cluster, ClusterError

    outcomes = [node.NodeError("CoreDNS ready did not happen within 60 s"), None]
    calls = []

    def up(cluster, log=print):
        calls.append(cluster)
        if err := outcomes.pop(0):
            raise err
        return 1.0

    monkeypatch.setattr(node, "up", up)
    c = Cluster(tmp_path)
    lines: list[str] = []
    c._start_nodes(lines.append)
    assert calls == [c, c]
    assert len(lines) == 1 and "did not start (" in lines[0] and "CoreDNS ready did not happen" in lines[0]

    outcomes[:] = [node.NodeError("first"), node.NodeError("second")]
    with pytest.raises(ClusterError, match="did not start, twice: second"):
        c._start_nodes(lines.append)
    assert len(calls) == 4
