"""The slot's SSO host (devcluster/network.py) and Dex on it (devcluster/identity.py): the pure
builders' names, addresses and routes, the record Dex's start leaves, and Dex started for real in
a throwaway SSO host on a throwaway bridge (slot 8), reached from this host at its issuer URL, then
everything removed again. The hub's pod reaching it under Cilium is the real nodes' business
(``scripts/kube up --pods``)."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from devcluster import identity, network

CALLBACK = "https://lab.tfk8s.test/hub/oauth_callback"


def test_the_sso_host_has_its_own_names_and_an_address_no_node_takes():
    s3 = network.Slot(3)
    assert (s3.sso_ip, s3.sso_netns, str(s3.sso_netns_path)) == (
        "10.246.3.5",
        "tfk8s-s3sso",
        "/run/netns/tfk8s-s3sso",
    )
    for k in network.SLOTS:
        slot = network.Slot(k)
        nodes = slot.nodes(network.MAX_NODES)
        assert ipaddress.ip_address(slot.sso_ip) in ipaddress.ip_network(slot.net)
        # not the host's end (reserved:kube-apiserver to Cilium), no node's, not tenancy's test host
        taken = {slot.host_ip, f"10.246.{k}.250", *(n.ip for n in nodes)}
        assert slot.sso_ip not in taken
        names = {slot.bridge, *(n.netns for n in nodes)}
        assert slot.sso_netns not in names and len(slot.sso_netns) <= 15  # also a device name
        # its veth's host end is one of the clusters' own devices, never an "outside" one to the fence
        assert slot.sso_netns.startswith("tfk8s")


def test_the_sso_host_routes_each_nodes_pods_back_via_that_node_and_nothing_else():
    assert network.sso_routes(network.Slot(2).nodes(2)) == [
        ["10.244.33.0/24", "via", "10.246.2.11", "dev", "eth0"],
        ["10.244.34.0/24", "via", "10.246.2.12", "dev", "eth0"],
    ]
    assert network.sso_routes([]) == []  # no default route: the bridge's /24 is connected


def test_load_reads_the_record_leniently(tmp_path):
    from devcluster.cluster import Cluster

    cluster = Cluster(tmp_path / "c")
    assert identity.load(cluster) is None
    root = cluster.root / "identity"
    root.mkdir(parents=True)
    (root / "identity.json").write_text("{not json")
    assert identity.load(cluster) is None
    (root / "identity.json").write_text(json.dumps({"issuer": "https://10.246.8.5:5556/dex"}))
    assert identity.load(cluster) is None  # no secret, no passwords: not an Identity
    rec = {
        "issuer": "https://10.246.8.5:5556/dex",
        "client_id": "tfk8s-hub",
        "client_secret": "s3cret",
        "passwords": {"alice": "pw"},
        "written_by": "a newer devcluster",  # unknown keys are ignored
    }
    (root / "identity.json").write_text(json.dumps(rec))
    assert identity.load(cluster) == identity.Identity(
        root=root,
        issuer="https://10.246.8.5:5556/dex",
        ca=cluster.pki / "ca.crt",
        client_secret="s3cret",
        passwords={"alice": "pw"},
    )


# -- Dex in a throwaway SSO host ----------------------------------------------------------------


def _links() -> set[str]:
    return set(os.listdir("/sys/class/net"))


def _netns() -> set[str]:
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in r.stdout.splitlines() if line.strip()}


def test_dex_in_the_sso_host_answers_this_host_at_the_issuer_url_and_goes_with_it(tmp_path):
    """The issuer URL answers from this host over the bridge (what a browser here uses), Dex listens
    in the SSO host only; then Dex, the namespace, its veth and the bridge are all gone."""
    from devcluster import build, node
    from devcluster.cluster import Cluster

    if os.geteuid() != 0:
        pytest.skip("needs root (a network namespace, a bridge)")
    if not build.COMPONENTS["dex"].is_built() and shutil.which("go") is None:
        pytest.skip("Dex is not built and Go is missing: scripts/kube build dex")
    slot = network.Slot(8)
    if network.slot_in_use(slot) or node._owner(slot) or slot.sso_netns in _netns():
        pytest.skip(f"slot 8 is in use here ({slot.bridge} or {slot.sso_netns} exists, or a cluster has it)")
    cluster = Cluster(tmp_path / "c")
    quiet = {"log": lambda *_: None}
    # the slot's node bridge alone: no nodes, no rules (network.host_up's fence and DNAT are not needed)
    network.ip("link", "add", slot.bridge, "type", "bridge")
    try:
        network.ip("addr", "add", slot.host_ip + "/24", "dev", slot.bridge)
        network.ip("link", "set", slot.bridge, "up")
        network.sso_up(slot, [])
        network.sso_up(slot, [])  # idempotent: _node_up runs it at every up --pods
        ident = identity.up(cluster, [CALLBACK], host=slot.sso_ip, netns=slot.sso_netns, **quiet)
        assert ident.issuer == "https://10.246.8.5:5556/dex"
        doc = identity.discovery(ident.issuer, ident.ca)  # from this host, over the bridge
        assert doc["issuer"] == ident.issuer and doc["token_endpoint"] == ident.endpoint("token")
        assert identity.load(cluster) == ident
        # Dex itself, in the SSO host's namespace, listening on its address only
        pid = cluster.procs.pid(identity.PROCESS)
        assert os.stat(f"/proc/{pid}/ns/net").st_ino == slot.sso_netns_path.stat().st_ino
        inside = ["ip", "netns", "exec", slot.sso_netns, "ss", "-Hltnp"]  # psutil sees this host's only
        ss = subprocess.run(inside, capture_output=True, text=True, check=True).stdout.splitlines()
        assert {line.split()[3] for line in ss} == {"10.246.8.5:5556"}, ss
        assert all(f"pid={pid}," in line for line in ss), ss
        # up again (scripts/kube up --pods twice): the running Dex is kept
        assert identity.up(cluster, [CALLBACK], host=slot.sso_ip, netns=slot.sso_netns, **quiet) == ident
        assert cluster.procs.pid(identity.PROCESS) == pid and cluster.procs.alive(identity.PROCESS)
        identity.down(cluster)
        network.sso_down(slot)
        with pytest.raises(OSError):  # the issuer went with its host (the bridge still stands)
            identity.discovery(ident.issuer, ident.ca)
    finally:
        identity.down(cluster)
        network.sso_down(slot)
        network.ip("link", "del", slot.bridge, check=False)
    assert not cluster.procs.alive(identity.PROCESS)
    assert slot.sso_netns not in _netns() and not Path(slot.sso_netns_path).exists()
    assert not {slot.sso_netns, slot.bridge} & _links()
