"""The isolation decision (tfk8s_magics.isolation.plan): every case, against literal platforms.

What isolates a cluster, a kernel or a server, and the one sentence saying why, is decided here
once; the supervisor, the pool, the guard and the kernel launcher only perform it (their real
behaviour is tested in test_local_isolation.py, test_kernel_sandbox.py and test_pool.py).
"""

from __future__ import annotations

import pytest

from tfk8s_magics.isolation.plan import (
    IN_GRAPH_KERNEL_NETNS,
    IN_GRAPH_NO_NETNS,
    PRIVATE,
    STREAMS_NO_NETNS,
    IsolationPlan,
    Platform,
    host_network_note,
    plan_cluster,
    plan_kernel,
    plan_pool,
    plan_server,
    wanted,
)

SHIM = "/cache/libtfk8s_loopback_bind-abc.so"
HOST = Platform(shim=SHIM)
NO_CC = Platform(shim=None)
SANDBOXED = Platform(shim=SHIM, kernel_netns=True)
NOTED = Platform(shim=SHIM, kernel_note="this kernel runs on the host's network because X")

# platform, setting, in_graph, streams → kind, shim, relay, fallback, reason
CLUSTERS = [
    (HOST, None, False, False, "netns", None, True, "loopback-shim", PRIVATE),
    (HOST, "netns", False, False, "netns", None, True, "loopback-shim", PRIVATE),
    (NO_CC, "netns", False, False, "netns", None, True, "none", PRIVATE),
    (HOST, "NetNS ", False, False, "netns", None, True, "loopback-shim", PRIVATE),
    (HOST, "typo", False, False, "netns", None, True, "loopback-shim", PRIVATE),  # never weaker by a typo
    (HOST, "loopback", False, False, "loopback-shim", SHIM, False, "none", "TFK8S_ISOLATION=loopback"),
    (NO_CC, "loopback", False, False, "none", None, False, "none", "TFK8S_ISOLATION=loopback"),
    (HOST, "off", False, False, "none", None, False, "none", "TFK8S_ISOLATION=off"),
    (HOST, "off", True, False, "none", None, False, "none", "TFK8S_ISOLATION=off"),
    (HOST, "netns", False, True, "loopback-shim", SHIM, True, "none", STREAMS_NO_NETNS),
    (HOST, "netns", True, False, "loopback-shim", SHIM, True, "none", IN_GRAPH_NO_NETNS),
    (NO_CC, "netns", True, False, "none", None, True, "none", IN_GRAPH_NO_NETNS),
    (NOTED, "netns", True, False, "loopback-shim", SHIM, True, "none",
     f"{IN_GRAPH_NO_NETNS}; this kernel runs on the host's network because X"),
    (SANDBOXED, "netns", True, False, "kernel-netns", SHIM, True, "none", IN_GRAPH_KERNEL_NETNS),
    (SANDBOXED, "netns", False, False, "netns", None, True, "loopback-shim", PRIVATE),
    (SANDBOXED, "loopback", True, False, "loopback-shim", SHIM, False, "none", "TFK8S_ISOLATION=loopback"),
]


@pytest.mark.parametrize(("platform", "setting", "in_graph", "streams", "kind", "shim", "relay", "fallback",
                          "reason"), CLUSTERS)
def test_a_clusters_plan(platform, setting, in_graph, streams, kind, shim, relay, fallback, reason):
    plan = plan_cluster(platform, setting, in_graph=in_graph, streams=streams)
    assert (plan.kind, plan.shim, plan.relay, plan.fallback, plan.reason) == (
        kind, shim, relay, fallback, reason)
    assert plan.private == (kind == "netns")
    assert plan.status() == {"mode": kind, "reason": reason, "netns": None}


def test_a_refused_namespace_falls_back_and_says_why_in_one_sentence():
    plan = plan_cluster(HOST, "netns", in_graph=False)
    assert plan.status("userns+netns", "/proc/7/ns/net") == {
        "mode": "userns+netns", "reason": PRIVATE, "netns": "/proc/7/ns/net"}
    refused = plan.refused("Operation not permitted")
    assert refused == IsolationPlan("loopback-shim", "no private network namespace here (Operation not "
                                    "permitted); loopback-shim instead", shim=SHIM)
    bare = plan_cluster(NO_CC, "netns", in_graph=False).refused("Operation not permitted")
    assert (bare.kind, bare.shim) == ("none", None) and bare.reason.endswith("; none instead")


@pytest.mark.parametrize(("setting", "kind", "relay"), [
    (None, "netns", True), ("netns", "netns", True), ("loopback", "none", False), ("off", "none", False)])
def test_a_servers_plan(setting, kind, relay):
    plan = plan_server(setting)
    assert (plan.kind, plan.relay) == (kind, relay)


@pytest.mark.parametrize(("platform", "setting", "kind", "shim"), [
    (HOST, "netns", "netns", SHIM), (HOST, "loopback", "loopback-shim", SHIM), (HOST, "off", "none", None),
    (NO_CC, "netns", "netns", None), (NO_CC, "loopback", "none", None)])
def test_a_pools_plan(platform, setting, kind, shim):
    plan = plan_pool(platform, setting)
    assert (plan.kind, plan.shim) == (kind, shim)


@pytest.mark.parametrize(("platform", "setting", "transport", "refused", "kind", "why"), [
    (HOST, None, "ipc", "", "kernel-netns", None),
    (HOST, "netns", "tcp", "", "loopback-shim", "its connection file asks for tcp transport, whose ports "
     "the Jupyter server must reach on the host (the lab starts kernels with transport ipc)"),
    (HOST, "loopback", "ipc", "", "loopback-shim", "TFK8S_ISOLATION=loopback"),
    (NO_CC, "off", "ipc", "", "none", "TFK8S_ISOLATION=off"),
    (HOST, "netns", None, "its connection file /k.json cannot be read (gone)", "loopback-shim",
     "its connection file /k.json cannot be read (gone)"),
])
def test_a_kernels_plan(platform, setting, transport, refused, kind, why):
    plan = plan_kernel(platform, setting, transport, refused=refused)
    assert plan.kind == kind and plan.shim == platform.shim  # the kernel's own chief binds loopback
    if why is None:
        assert plan.reason == PRIVATE and plan.relay
    else:
        assert plan.reason == host_network_note(why, platform.shim)
        assert plan.reason.startswith(f"this kernel runs on the host's network because {why}, ")


def test_the_setting_is_read_from_the_environment_when_not_given(monkeypatch):
    monkeypatch.setenv("TFK8S_ISOLATION", "loopback")
    assert wanted() == "loopback" and wanted("off") == "off"
    monkeypatch.delenv("TFK8S_ISOLATION")
    assert wanted() == "netns"


def test_this_platform_is_read_without_a_system_change(monkeypatch):
    monkeypatch.delenv("TFK8S_KERNEL_NETNS", raising=False)
    monkeypatch.setenv("TFK8S_KERNEL_NOTE", "  why  ")
    assert Platform.here(SHIM) == Platform(shim=SHIM, kernel_netns=False, kernel_note="why")
