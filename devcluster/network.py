"""The real nodes' network: one network namespace per node on a host bridge, routes, the fence.

Every node (:mod:`devcluster.nodes`) lives in its own network namespace ``tfk8s-n<i>``, joined to
the host bridge ``tfk8s-nodes`` (10.246.0.0/24, the host's end 10.246.0.1) by a veth pair whose
node end is ``eth0`` with the node's address 10.246.0.(10+i). Inside the namespace:

- the pod bridge ``tfk8s-pods`` holding the gateway of the node's pod range 10.244.i.0/24 (the
  CNI plugin attaches each pod's veth to it);
- ``nodelocaldns``, a port-less bridge holding the node-local DNS cache's link-local address
  169.254.25.10 (kubespray's; :mod:`devcluster.dns`);
- one route per other node's pod range via that node's address (pod traffic crosses nodes
  without NAT), and the service range via the host (packets for it are DNATed by the node's
  kube-proxy before they leave; its route only lets locally made packets reach that DNAT);
- a DNAT of the ``kubernetes`` Service (10.96.0.1:443) to the host's end, port of the API server.

On the host, the API server and the cluster's CoreDNS listen on 127.0.0.1 only; a DNAT takes
packets that arrive on the host bridge for 10.246.0.1:<API port> to 127.0.0.1 (``route_localnet``
on that bridge only). No namespace has a default route: an address outside the cluster is
unreachable from a node or a pod. The fence, first in the mangle table's POSTROUTING (after every
routing decision, before any address translation, in a table kube-proxy leaves alone), drops every
packet of the cluster's ranges that would leave by an outside interface anyway.

The pure builders (:func:`fence_rules`, :func:`host_api_rule`, :func:`node_api_rule`,
:func:`node_routes`, :func:`host_routes`) return data; :func:`host_up`, :func:`node_up` and the
``*_down`` functions perform them. Deleting a node's namespace removes everything inside it
(devices, routes, its kube-proxy's iptables rules).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

HOST_BRIDGE = "tfk8s-nodes"
NODE_NET = "10.246.0.0/24"
HOST_IP = "10.246.0.1"  # the host's end of the node bridge: the API server's DNAT, the cluster DNS
POD_RANGE = "10.244.0.0/16"  # every node's pod range is a /24 in it (10.244.<i>.0/24, i >= 1)
SERVICE_CIDR = "10.96.0.0/16"  # the API server's --service-cluster-ip-range
API_SERVICE_IP = "10.96.0.1"
KWOK_CIDR = "10.0.0.0/24"  # where kwok invents pod addresses: routed unreachable by the control plane
POD_BRIDGE = "tfk8s-pods"  # inside each node's namespace
LOCAL_DNS_DEVICE = "nodelocaldns"  # inside each node's namespace, as NodeLocal DNSCache names it
LOCAL_DNS_IP = "169.254.25.10"  # kubespray's node-local DNS address
FENCE_CHAIN = "TFK8S-NET-FENCE"
#: where the fence hangs: mangle/POSTROUTING sees every packet about to leave (forwarded or local)
FENCE_TABLE, FENCE_HOOK = "mangle", "POSTROUTING"
API_CHAIN = "TFK8S-NET-API"  # host nat/PREROUTING: node bridge -> 127.0.0.1:<API port>
NODE_API_CHAIN = "TFK8S-API"  # inside a node: the kubernetes Service -> the host's end
#: the ranges that must never leave by an interface other than the cluster's own
LOCAL_RANGES = (POD_RANGE, SERVICE_CIDR, KWOK_CIDR, NODE_NET)
#: sysctls set inside each node's namespace (their own copies: nothing of the host's changes)
NODE_SYSCTLS = {"net/ipv4/ip_forward": "1", "net/bridge/bridge-nf-call-iptables": "1"}


class NetworkError(RuntimeError):
    """A device, route or rule could not be made; the message says which and why."""


@dataclass(frozen=True)
class NodeNet:
    """The addresses and names of real node number ``index`` (1, 2, ...)."""

    index: int

    @property
    def name(self) -> str:
        """The Kubernetes node name."""
        return f"tfk8s-node-{self.index}"

    @property
    def netns(self) -> str:
        """The node's network namespace (``ip netns``), also the host end of its veth."""
        return f"tfk8s-n{self.index}"

    @property
    def ip(self) -> str:
        """The node's address on the node bridge (its InternalIP)."""
        return f"10.246.0.{10 + self.index}"

    @property
    def pod_cidr(self) -> str:
        """The node's pod range."""
        return f"10.244.{self.index}.0/24"

    @property
    def pod_gateway(self) -> str:
        """The pod bridge's address (the CNI plugin's ``isGateway`` finds it there)."""
        return f"10.244.{self.index}.1"

    @property
    def netns_path(self) -> Path:
        """The namespace's file (``nsenter --net=`` takes it)."""
        return Path("/run/netns") / self.netns


def nodes(count: int) -> list[NodeNet]:
    """The first ``count`` nodes."""
    return [NodeNet(i) for i in range(1, count + 1)]


# -- pure builders ------------------------------------------------------------------------------


def fence_rules(outside: list[str]) -> list[list[str]]:
    """iptables rules (``-A FENCE_CHAIN ...``): drop the local ranges towards each outside interface."""
    rules = []
    for dev in outside:
        for cidr in LOCAL_RANGES:
            rules.append(["-A", FENCE_CHAIN, "-o", dev, "-s", cidr, "-j", "DROP"])
            rules.append(["-A", FENCE_CHAIN, "-o", dev, "-d", cidr, "-j", "DROP"])
    return rules


def host_api_rule(api_port: int) -> list[str]:
    """Host nat rule: what arrives on the node bridge for the host's end reaches the API server."""
    return [
        "-A", API_CHAIN, "-i", HOST_BRIDGE, "-d", HOST_IP + "/32", "-p", "tcp", "--dport", str(api_port),
        "-j", "DNAT", "--to-destination", f"127.0.0.1:{api_port}",
    ]  # fmt: skip


def node_api_rule(api_port: int) -> list[str]:
    """A node's nat rule: the ``kubernetes`` Service's address (it has no endpoint: the API server
    listens on a loopback address, which may not be one) -> the host's end of the node bridge."""
    return [
        "-A", NODE_API_CHAIN, "-d", API_SERVICE_IP + "/32", "-p", "tcp", "--dport", "443",
        "-j", "DNAT", "--to-destination", f"{HOST_IP}:{api_port}",
    ]  # fmt: skip


def node_routes(node: NodeNet, others: list[NodeNet]) -> list[list[str]]:
    """``ip route replace`` arguments inside ``node``: other nodes' pods, and the services."""
    out = [[o.pod_cidr, "via", o.ip, "dev", "eth0"] for o in others if o.index != node.index]
    out.append([SERVICE_CIDR, "via", HOST_IP, "dev", "eth0", "src", node.ip])
    return out


def host_routes(all_nodes: list[NodeNet]) -> list[list[str]]:
    """``ip route replace`` arguments on the host: each node's pods via that node (answers of the
    API server and the cluster DNS to pods)."""
    return [[n.pod_cidr, "via", n.ip, "dev", HOST_BRIDGE] for n in all_nodes]


# -- performing ---------------------------------------------------------------------------------


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and r.returncode:
        raise NetworkError(f"{' '.join(argv)} failed: {r.stderr.strip()}")
    return r


def _in(node: NodeNet | None, argv: list[str]) -> list[str]:
    return argv if node is None else ["ip", "netns", "exec", node.netns, *argv]


def ip(*args: str, node: NodeNet | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """``ip`` on the host or inside ``node``'s namespace."""
    return _run(["ip", *(["-n", node.netns] if node else []), *args], check=check)


def iptables(*args: str, node: NodeNet | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """``iptables -w`` on the host or inside ``node``'s namespace."""
    return _run(_in(node, ["iptables", "-w", *args]), check=check)


def outside_interfaces() -> list[str]:
    """The machine's interfaces other than loopback and the test clusters' own devices."""
    return [
        dev
        for dev in sorted(os.listdir("/sys/class/net"))
        if dev != "lo" and not dev.startswith(("tfk8s", "veth", "ifb"))
    ]


def _chain(table: str, chain: str, hook: str, rules: list[list[str]], node: NodeNet | None = None) -> None:
    """Make ``chain`` hold exactly ``rules`` and hang it first in ``hook`` (idempotent)."""
    t = ("-t", table)
    if iptables(*t, "-n", "-L", chain, node=node, check=False).returncode:
        iptables(*t, "-N", chain, node=node)
    iptables(*t, "-F", chain, node=node)
    for rule in rules:
        iptables(*t, *rule, node=node)
    if iptables(*t, "-C", hook, "-j", chain, node=node, check=False).returncode:
        iptables(*t, "-I", hook, "1", "-j", chain, node=node)


def _unchain(table: str, chain: str, hook: str) -> None:
    t = ("-t", table)
    while iptables(*t, "-D", hook, "-j", chain, check=False).returncode == 0:
        pass
    iptables(*t, "-F", chain, check=False)
    iptables(*t, "-X", chain, check=False)


def _bridge(name: str, address: str, node: NodeNet | None = None) -> None:
    # a bridge without ports also stands in for a dummy device: this kernel has no dummy driver
    if ip("link", "show", name, node=node, check=False).returncode:
        ip("link", "add", name, "type", "bridge", node=node)
    ip("addr", "replace", address, "dev", name, node=node)
    ip("link", "set", name, "up", node=node)


def host_up(api_port: int, also: tuple[int, ...] = ()) -> None:
    """The fence (first: nothing is forwarded before it stands), the node bridge, the API DNAT.

    ``also``: ports of other servers on 127.0.0.1 the nodes reach the same way (the registry's).
    """
    _chain(FENCE_TABLE, FENCE_CHAIN, FENCE_HOOK, fence_rules(outside_interfaces()))
    _bridge(HOST_BRIDGE, HOST_IP + "/24")
    Path(f"/proc/sys/net/ipv4/conf/{HOST_BRIDGE}/route_localnet").write_text("1\n")  # goes with the bridge
    _chain("nat", API_CHAIN, "PREROUTING", [host_api_rule(port) for port in (api_port, *also)])


def node_up(node: NodeNet, all_nodes: list[NodeNet], api_port: int) -> None:
    """``node``'s namespace, its link to the node bridge, its bridges, routes, sysctls and API DNAT."""
    if not node.netns_path.exists():
        ip("netns", "add", node.netns)
    if ip("link", "show", node.netns, check=False).returncode:
        ip("link", "add", node.netns, "type", "veth", "peer", "name", "eth0", "netns", node.netns)
    ip("link", "set", node.netns, "master", HOST_BRIDGE, "up")
    ip("link", "set", "lo", "up", node=node)
    ip("addr", "replace", node.ip + "/24", "dev", "eth0", node=node)
    ip("link", "set", "eth0", "up", node=node)
    _bridge(POD_BRIDGE, node.pod_gateway + "/24", node)
    _bridge(LOCAL_DNS_DEVICE, LOCAL_DNS_IP + "/32", node)
    for r in node_routes(node, all_nodes):
        ip("route", "replace", *r, node=node)
    for k, v in NODE_SYSCTLS.items():
        _run(_in(node, ["sysctl", "-q", "-w", f"{k.replace('/', '.')}={v}"]))
    rules = [node_api_rule(api_port)]
    _chain("nat", NODE_API_CHAIN, "PREROUTING", rules, node)  # pods
    _chain("nat", NODE_API_CHAIN, "OUTPUT", rules, node)  # the node's own processes
    for r in host_routes([node]):
        ip("route", "replace", *r)


def node_down(node: NodeNet) -> None:
    """Remove ``node``'s namespace (and with it everything inside) and its host route."""
    for r in host_routes([node]):
        ip("route", "del", r[0], check=False)
    ip("link", "del", node.netns, check=False)
    if node.netns_path.exists():
        ip("netns", "del", node.netns, check=False)


def host_down() -> None:
    """Remove what :func:`host_up` made."""
    ip("link", "del", HOST_BRIDGE, check=False)
    _unchain("nat", API_CHAIN, "PREROUTING")
    _unchain(FENCE_TABLE, FENCE_CHAIN, FENCE_HOOK)


def pids_in(node: NodeNet) -> list[int]:
    """The processes whose network namespace is ``node``'s (its daemons and containerd's shims)."""
    try:
        ino = node.netns_path.stat().st_ino
    except OSError:
        return []
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.stat(d / "ns" / "net").st_ino == ino:
                    out.append(int(d.name))
            except OSError:
                pass
    return out
