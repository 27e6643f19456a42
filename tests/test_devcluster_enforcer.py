"""The real nodes' NetworkPolicy enforcer as configured (``devcluster/enforcer.py``): pure builders only.

What it does on a running cluster is ``tests/test_kube_netpol.py`` (markers ``k8s``, ``netpol``).
"""

from __future__ import annotations

import tomllib

import pytest


@pytest.fixture
def n2(tmp_path):
    from devcluster import network, nodes

    bins = {k: tmp_path / k for k in ("containerd", "runc", "coredns", "kubelet", "cilium")}
    return nodes.Node(
        net=network.NodeNet(1, 2), cluster=tmp_path / "cluster", bins=bins, server="https://10.246.1.1:6443"
    )


def test_cilium_is_pinned_and_built_without_the_operator():
    from devcluster import build
    from devcluster.versions import versions

    assert versions()["CILIUM"] == "v1.20.2"
    comp = build.COMPONENTS["cilium"]
    assert comp.version_key == "CILIUM"
    assert comp.binaries == ("cilium-agent", "cilium-cni")
    assert "cilium" in build.TIER2  # every scripts/kube up --pods has it


def test_cilium_cni_is_chained_last_after_the_nodes_bridge_plugin(n2):
    from devcluster import enforcer, nodes

    base = nodes.cni_config(n2)
    chain = enforcer.chained(base, n2)
    assert [p["type"] for p in chain["plugins"]] == ["bridge", "portmap", "cilium-cni"]
    assert chain["plugins"][:2] == base["plugins"]  # the pod network itself is unchanged
    assert chain["plugins"][-1]["chaining-mode"] == "generic-veth"
    assert enforcer.chained(chain, n2) == chain  # once only


def test_containerd_finds_cilium_cni_and_its_nodes_agent(n2):
    from devcluster import enforcer, nodes

    cfg = tomllib.loads(nodes.containerd_config(n2))
    assert cfg["plugins"]["io.containerd.cri.v1.runtime"]["cni"]["bin_dirs"] == [
        "/usr/lib/cni",
        str(n2.bins["cilium"]),
    ]
    assert enforcer.cni_env(n2) == {"CILIUM_SOCK": str(n2.run / "cilium" / "cilium.sock")}


def test_the_agent_keeps_kube_proxy_and_the_default_policy_mode_and_shares_nothing_with_another(n2, tmp_path):
    from devcluster import enforcer

    argv = enforcer.agent_argv(n2, tmp_path / "cilium", tmp_path / "kc")
    flags = dict(a.removeprefix("--").split("=", 1) for a in argv[1:])
    assert flags["kube-proxy-replacement"] == "false" and flags["bpf-lb-sock"] == "false"
    assert "policy-cidr-match-mode" not in flags and "enable-policy" not in flags  # Cilium's defaults
    assert flags["cni-chaining-mode"] == "generic-veth" and flags["cni-exclusive"] == "false"
    assert flags["routing-mode"] == "native" and flags["enable-ipv4-masquerade"] == "false"
    run = str(n2.run / "cilium")
    for key in ("state-dir", "bpf-root", "cgroup-root", "socket-path"):
        assert flags[key].startswith(run + "/"), key
    assert enforcer.agent_env(n2)["K8S_NODE_NAME"] == "tfk8s-node-2"
    assert enforcer.agent_env(n2)["PATH"].startswith("/usr/lib/llvm-19/bin:")


def test_each_nodes_cilium_range_is_its_own_and_clashes_with_no_cluster_range():
    import ipaddress

    from devcluster import enforcer, network

    nets = [network.NodeNet(slot, i) for slot in network.SLOTS for i in range(1, network.MAX_NODES + 1)]
    ranges = [ipaddress.ip_network(enforcer.router_cidr(n)) for n in nets]
    assert len(set(ranges)) == len(nets)
    for r in ranges:
        for other in (*network.LOCAL_RANGES, "10.244.0.0/24", "10.245.0.0/16"):
            assert not r.overlaps(ipaddress.ip_network(other)), (r, other)


def test_the_suite_starts_every_go_build_cilium_first_beside_the_image_builds(monkeypatch):
    from pathlib import Path

    from devcluster import __main__ as cli
    from devcluster import build

    script = (Path(__file__).resolve().parent.parent / "scripts" / "test").read_text()
    start = script.index("scripts/kube build --pods &")  # in the background, before the images
    assert start < script.index("scripts/build_images.py task notebook") < script.index("kube up --pods")
    asked = []
    monkeypatch.setattr(build, "ensure_all", lambda names: asked.append(names) or {})
    assert cli.main(["build", "--pods"]) == 0
    (names,) = asked
    # and the parts up --pods starts beside the nodes (the registry, the glusterfs provisioner,
    # the Ingress controller, Dex)
    assert names[0] == "cilium" and sorted(names) == sorted(
        {*build.TIER1, *build.TIER2, *build.TIER2_PARTS}
    ), names
    assert set(build.TIER2_PARTS) == {"registry", "local-path-provisioner", "traefik", "dex"}
    assert cli.main(["build"]) == 0 and asked[-1] == build.TIER1
