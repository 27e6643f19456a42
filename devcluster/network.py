"""The real nodes' network: one network namespace per node on a host bridge, routes, the fence.

Several clusters' real nodes may run on this machine at once: each cluster takes a free *slot*
``k`` (:class:`Slot`, 1-8), which names every machine-wide device, namespace, chain and range it
makes. Node ``i`` of slot ``k`` (:class:`NodeNet`) lives in the network namespace ``tfk8s-s<k>n<i>``,
joined to the slot's host bridge ``tfk8s-s<k>`` (10.246.k.0/24, the host's end 10.246.k.1) by a
veth pair whose node end is ``eth0`` with the node's address 10.246.k.(10+i). Inside the namespace:

- the pod bridge ``tfk8s-pods`` holding the gateway of the node's pod range 10.244.(16k+i).0/24
  (the CNI plugin attaches each pod's veth to it); its route gives what the node itself sends
  its pods (the kubelet's probes) the node's address as source, which Cilium knows as its host
  (always let in), not the gateway's, which it would take for the world;
- ``nodelocaldns``, a port-less bridge holding the node-local DNS cache's link-local address
  169.254.25.10 (kubespray's; :mod:`devcluster.dns`);
- one route per other node's pod range via that node's address (pod traffic crosses nodes
  without NAT), and the service range via the host (packets for it are DNATed by the node's
  kube-proxy before they leave; its route only lets locally made packets reach that DNAT).

On the host, the API server listens on 127.0.0.1 only; a DNAT takes packets that arrive on the
slot's bridge for its host end and the API port to 127.0.0.1 (``route_localnet`` on that bridge
only), and the same for the port of each other server of the cluster the nodes reach (the image
registry's, :mod:`devcluster.registry`). The host's end is the API server's address as the
cluster knows it: the ``kubernetes`` Service's endpoint (:func:`api_endpoints`), as an API
server's reconciler writes its advertised address on a production cluster. Services are
translated to it as to any endpoint (kube-proxy; Cilium's own per-packet load balancing, which
sees a pod's packets first and drops those for a Service without endpoints), and Cilium labels
it ``reserved:kube-apiserver``.

The slot's SSO host (:attr:`Slot.sso_netns`, :func:`sso_up`) is a namespace of its own on the
same bridge, holding :attr:`Slot.sso_ip` (10.246.k.5) on its ``eth0``: the cluster's OIDC provider
(:mod:`devcluster.identity`) listens there, so that a pod (through its node, which has the bridge's
/24 on ``eth0``: no NAT) and this host (over the bridge) reach the same issuer URL. It has an
address of its own because Cilium labels the host's end ``reserved:kube-apiserver`` and the nodes'
addresses host/remote-node, which a NetworkPolicy's ``ipBlock`` cannot select; 10.246.k.5 is
"world" to Cilium, and an ``ipBlock`` of it is how an administrator allows a private identity
provider. Its routes lead each node's pod range back via that node (:func:`sso_routes`).

No namespace has a default route: an address outside the cluster is unreachable from a node, a
pod or the SSO host. The fence, first in the mangle table's POSTROUTING (after every routing decision,
before any address translation, in a table kube-proxy leaves alone), drops every packet of the
clusters' ranges that would leave by an outside interface anyway.

The pure builders (:func:`fence_rules`, :func:`host_api_rule`, :func:`host_nat_rules`,
:func:`api_endpoints`, :func:`node_routes`, :func:`host_routes`, :func:`sso_routes`) return data;
:func:`host_up`, :func:`node_up`, :func:`sso_up` and the ``*_down`` functions perform them.
Deleting a node's namespace removes everything inside it (devices, routes, its kube-proxy's
iptables rules).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

POD_RANGE = "10.244.0.0/16"  # every node's pod range is a /24 in it
NODES_RANGE = "10.246.0.0/16"  # every slot's node bridge is a /24 in it
SERVICE_CIDR = "10.96.0.0/16"  # the API server's --service-cluster-ip-range (only seen inside nodes)
API_SERVICE_IP = "10.96.0.1"
KWOK_CIDR = "10.0.0.0/24"  # where kwok invents pod addresses: routed unreachable by the control plane
POD_BRIDGE = "tfk8s-pods"  # inside each node's namespace
LOCAL_DNS_DEVICE = "nodelocaldns"  # inside each node's namespace, as NodeLocal DNSCache names it
LOCAL_DNS_IP = "169.254.25.10"  # kubespray's node-local DNS address
#: where the fence hangs: mangle/POSTROUTING sees every packet about to leave (forwarded or local)
FENCE_TABLE, FENCE_HOOK = "mangle", "POSTROUTING"
#: the ranges that must never leave by an interface other than the cluster's own
LOCAL_RANGES = (POD_RANGE, SERVICE_CIDR, KWOK_CIDR, NODES_RANGE)
#: sysctls set inside each node's namespace (their own copies: nothing of the host's changes)
NODE_SYSCTLS = {"net/ipv4/ip_forward": "1", "net/bridge/bridge-nf-call-iptables": "1"}
SLOTS = range(1, 9)  # several clusters' real nodes may run at once, each cluster in its own slot
MAX_NODES = 15


class NetworkError(RuntimeError):
    """A device, route or rule could not be made; the message says which and why."""


@dataclass(frozen=True)
class Slot:
    """The machine-wide names and addresses of one cluster's real nodes (slot ``k`` of :data:`SLOTS`)."""

    k: int

    @property
    def bridge(self) -> str:
        """The host bridge every node of the slot is joined to."""
        return f"tfk8s-s{self.k}"

    @property
    def net(self) -> str:
        """The node bridge's range."""
        return f"10.246.{self.k}.0/24"

    @property
    def host_ip(self) -> str:
        """The host's end of the node bridge: the API server's DNAT, the cluster DNS."""
        return f"10.246.{self.k}.1"

    @property
    def sso_ip(self) -> str:
        """The SSO host's address on the node bridge, where the cluster's OIDC provider listens
        ("world" to Cilium, so a NetworkPolicy's ``ipBlock`` selects it)."""
        return f"10.246.{self.k}.5"

    @property
    def sso_netns(self) -> str:
        """The SSO host's network namespace, also the host end of its veth."""
        return f"tfk8s-s{self.k}sso"

    @property
    def sso_netns_path(self) -> Path:
        """The SSO host's namespace file (``nsenter --net=`` takes it)."""
        return Path("/run/netns") / self.sso_netns

    @property
    def fence_chain(self) -> str:
        """The host's mangle chain that drops the cluster's ranges towards outside interfaces."""
        return f"TFK8S-S{self.k}-FENCE"

    @property
    def api_chain(self) -> str:
        """The host's nat chain: node bridge -> 127.0.0.1:<API port>."""
        return f"TFK8S-S{self.k}-API"

    def nodes(self, count: int) -> list[NodeNet]:
        """The slot's first ``count`` nodes."""
        if not 1 <= count <= MAX_NODES:
            raise NetworkError(f"between 1 and {MAX_NODES} real nodes, not {count}")
        return [NodeNet(self.k, i) for i in range(1, count + 1)]


@dataclass(frozen=True)
class NodeNet:
    """The addresses and names of real node number ``index`` (1, 2, ...) of slot ``slot``."""

    slot: int
    index: int

    @property
    def name(self) -> str:
        """The Kubernetes node name (its cluster's only: the same in every slot)."""
        return f"tfk8s-node-{self.index}"

    @property
    def netns(self) -> str:
        """The node's network namespace (``ip netns``), also the host end of its veth."""
        return f"tfk8s-s{self.slot}n{self.index}"

    @property
    def ip(self) -> str:
        """The node's address on the node bridge (its InternalIP)."""
        return f"10.246.{self.slot}.{10 + self.index}"

    @property
    def host_ip(self) -> str:
        """The host's end of the node bridge."""
        return Slot(self.slot).host_ip

    @property
    def pod_cidr(self) -> str:
        """The node's pod range."""
        return f"10.244.{16 * self.slot + self.index}.0/24"

    @property
    def pod_gateway(self) -> str:
        """The pod bridge's address (the CNI plugin's ``isGateway`` finds it there)."""
        return f"10.244.{16 * self.slot + self.index}.1"

    @property
    def netns_path(self) -> Path:
        """The namespace's file (``nsenter --net=`` takes it)."""
        return Path("/run/netns") / self.netns


# -- pure builders ------------------------------------------------------------------------------


def fence_rules(slot: Slot, outside: list[str]) -> list[list[str]]:
    """iptables rules (``-A <fence chain> ...``): drop the local ranges towards each outside interface."""
    rules = []
    for dev in outside:
        for cidr in LOCAL_RANGES:
            rules.append(["-A", slot.fence_chain, "-o", dev, "-s", cidr, "-j", "DROP"])
            rules.append(["-A", slot.fence_chain, "-o", dev, "-d", cidr, "-j", "DROP"])
    return rules


def host_api_rule(slot: Slot, api_port: int) -> list[str]:
    """Host nat rule: what arrives on the node bridge for the host's end and ``api_port`` reaches
    the server listening on 127.0.0.1 there (the API server's port, the registry's)."""
    return [
        "-A", slot.api_chain, "-i", slot.bridge, "-d", slot.host_ip + "/32", "-p", "tcp",
        "--dport", str(api_port), "-j", "DNAT", "--to-destination", f"127.0.0.1:{api_port}",
    ]  # fmt: skip


def host_nat_rules(slot: Slot, api_port: int, also: tuple[int, ...] = ()) -> list[list[str]]:
    """The slot's nat chain: the API server's port, then each of ``also`` (the registry's)."""
    return [host_api_rule(slot, p) for p in (api_port, *also)]


def api_endpoints(slot: Slot, api_port: int) -> dict:
    """The ``kubernetes`` Service's EndpointSlice: the host's end of the node bridge, the API port.

    The API server runs without an endpoint reconciler (it listens on a loopback address, which
    may not be an endpoint), so this is the only endpoint the Service gets, written as the
    reconciler writes an advertised address: the same name, labels and port name."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kubernetes",
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": "kubernetes"},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [slot.host_ip], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": api_port, "protocol": "TCP"}],
    }


def node_routes(node: NodeNet, others: list[NodeNet]) -> list[list[str]]:
    """``ip route replace`` arguments inside ``node``: its pods, other nodes' pods, the services."""
    # the node's own pods: what the node itself sends them (the kubelet's probes) leaves with the
    # node's address, which the enforcer knows as its host, not with the pod bridge's
    out = [[node.pod_cidr, "dev", POD_BRIDGE, "proto", "kernel", "scope", "link", "src", node.ip]]
    out += [[o.pod_cidr, "via", o.ip, "dev", "eth0"] for o in others if o.index != node.index]
    out.append([SERVICE_CIDR, "via", node.host_ip, "dev", "eth0", "src", node.ip])
    return out


def host_routes(all_nodes: list[NodeNet]) -> list[list[str]]:
    """``ip route replace`` arguments on the host: each node's pods via that node (answers of the
    API server and the cluster DNS to pods)."""
    return [[n.pod_cidr, "via", n.ip, "dev", Slot(n.slot).bridge] for n in all_nodes]


def sso_routes(nodes: list[NodeNet]) -> list[list[str]]:
    """``ip route replace`` arguments inside the SSO host: each node's pods via that node (its
    answers to pods; the bridge's /24 is connected, and there is no default route)."""
    return [[n.pod_cidr, "via", n.ip, "dev", "eth0"] for n in nodes]


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


def host_up(slot: Slot, api_port: int, also: tuple[int, ...] = ()) -> None:
    """The fence (first: nothing is forwarded before it stands), the node bridge, the API DNAT.

    ``also``: ports of other servers on 127.0.0.1 the nodes reach the same way (the registry's).
    """
    _chain(FENCE_TABLE, slot.fence_chain, FENCE_HOOK, fence_rules(slot, outside_interfaces()))
    _bridge(slot.bridge, slot.host_ip + "/24")
    Path(f"/proc/sys/net/ipv4/conf/{slot.bridge}/route_localnet").write_text("1\n")  # goes with the bridge
    _chain("nat", slot.api_chain, "PREROUTING", host_nat_rules(slot, api_port, also))


def _join_bridge(netns: str, bridge: str, address: str) -> None:
    """Namespace ``netns`` (made if missing) joined to ``bridge`` by a veth named after it, whose
    end inside is ``eth0`` holding ``address`` (a /24 of the bridge); ``lo`` up (idempotent)."""
    if not (Path("/run/netns") / netns).exists():
        ip("netns", "add", netns)
    if ip("link", "show", netns, check=False).returncode:
        ip("link", "add", netns, "type", "veth", "peer", "name", "eth0", "netns", netns)
    ip("link", "set", netns, "master", bridge, "up")
    ip("-n", netns, "link", "set", "lo", "up")
    ip("-n", netns, "addr", "replace", address + "/24", "dev", "eth0")
    ip("-n", netns, "link", "set", "eth0", "up")


def _leave_bridge(netns: str) -> None:
    """Remove what :func:`_join_bridge` made (a namespace a process still holds outlives ``ip netns
    del``: stop what runs inside first)."""
    ip("link", "del", netns, check=False)
    if (Path("/run/netns") / netns).exists():
        ip("netns", "del", netns, check=False)


def node_up(node: NodeNet, all_nodes: list[NodeNet]) -> None:
    """``node``'s namespace, its link to the node bridge, its bridges, routes and sysctls."""
    _join_bridge(node.netns, Slot(node.slot).bridge, node.ip)
    _bridge(POD_BRIDGE, node.pod_gateway + "/24", node)
    _bridge(LOCAL_DNS_DEVICE, LOCAL_DNS_IP + "/32", node)
    for r in node_routes(node, all_nodes):
        ip("route", "replace", *r, node=node)
    for k, v in NODE_SYSCTLS.items():
        _run(_in(node, ["sysctl", "-q", "-w", f"{k.replace('/', '.')}={v}"]))
    for r in host_routes([node]):
        ip("route", "replace", *r)


def node_down(node: NodeNet) -> None:
    """Remove ``node``'s namespace (and with it everything inside) and its host route."""
    for r in host_routes([node]):
        ip("route", "del", r[0], check=False)
    _leave_bridge(node.netns)


def sso_up(slot: Slot, nodes: list[NodeNet]) -> None:
    """The SSO host's namespace, its link to the slot's node bridge with :attr:`Slot.sso_ip`, its
    routes to ``nodes``' pods (idempotent: run again, it leaves one of each)."""
    _join_bridge(slot.sso_netns, slot.bridge, slot.sso_ip)
    for r in sso_routes(nodes):
        ip("-n", slot.sso_netns, "route", "replace", *r)


def sso_down(slot: Slot) -> None:
    """Remove the SSO host's link and namespace (stop what runs inside first: a namespace a process
    still holds outlives ``ip netns del``)."""
    _leave_bridge(slot.sso_netns)


def host_down(slot: Slot) -> None:
    """Remove what :func:`host_up` made."""
    ip("link", "del", slot.bridge, check=False)
    _unchain("nat", slot.api_chain, "PREROUTING")
    _unchain(FENCE_TABLE, slot.fence_chain, FENCE_HOOK)


def slot_in_use(slot: Slot) -> bool:
    """True when the slot's host bridge exists (another cluster's nodes, or ours, use it)."""
    return Path("/sys/class/net", slot.bridge).exists()


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
