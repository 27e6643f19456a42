"""The test cluster's DNS, laid out as production clusters lay it out.

- **CoreDNS** serves the cluster's zones. It runs once, on the host (it is the cluster's, not a
  node's), bound to the host's end of the node bridge (:data:`devcluster.network.HOST_IP`), and
  is the only endpoint of the ``kube-dns`` Service (10.96.0.10). It has no ``forward``: no query
  ever leaves the machine.
- **A node-local cache** runs in every node's namespace on kubespray's link-local address
  169.254.25.10, and every kubelet's ``clusterDNS`` names it: pods ask the cache, the cache asks
  the ``kube-dns`` Service (DNATed by the node's kube-proxy, over TCP as NodeLocal DNSCache does).
  It is CoreDNS's own binary with ``bind``, ``cache`` and ``forward``: k8s.io/dns's node-cache is
  that same CoreDNS plus code that makes the dummy device and NOTRACK rules
  (:mod:`devcluster.network` makes the device), so building it would add a Go module build and
  nothing a test could observe.

Readiness: each instance's ``ready`` endpoint (CoreDNS's on the host's bridge address, a cache's
on its node's address), then a real query through the cache (:func:`query`).
"""

from __future__ import annotations

import random
import socket
import struct
import urllib.request

from .network import HOST_IP, LOCAL_DNS_IP, NodeNet

DNS_IP = "10.96.0.10"  # the kube-dns Service's ClusterIP
CLUSTER_DOMAIN = "cluster.local"
READY_PORT = 8181
COREDNS_CLIENT = "tfk8s:coredns"  # CoreDNS's client certificate's CN (bound to its ClusterRole)


def corefile(kubeconfig: str) -> str:
    """CoreDNS: the cluster's zones only, no ``forward`` (no query ever leaves the machine)."""
    return f"""\
.:53 {{
    bind {HOST_IP}
    errors
    ready {HOST_IP}:{READY_PORT}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
}}
"""


def local_corefile(node: NodeNet) -> str:
    """A node-local cache: on 169.254.25.10 inside ``node``, in front of the ``kube-dns`` Service."""
    return f"""\
.:53 {{
    bind {LOCAL_DNS_IP}
    errors
    ready {node.ip}:{READY_PORT}
    cache {{
        success 9984 30
        denial 9984 5
    }}
    forward . {DNS_IP} {{
        force_tcp
    }}
}}
"""


def objects() -> list[dict]:
    """kube-dns (a Service with no selector, its endpoint the host's CoreDNS) and CoreDNS's RBAC."""
    ports = [
        {"name": "dns", "port": 53, "protocol": "UDP"},
        {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
    ]
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
            "spec": {"clusterIP": DNS_IP, "ports": [{**p, "targetPort": 53} for p in ports]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "kube-dns-host",
                "namespace": "kube-system",
                "labels": {
                    "kubernetes.io/service-name": "kube-dns",
                    "endpointslice.kubernetes.io/managed-by": "tfk8s-devcluster",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [HOST_IP], "conditions": {"ready": True}}],
            "ports": ports,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": COREDNS_CLIENT},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": COREDNS_CLIENT},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": COREDNS_CLIENT,
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": COREDNS_CLIENT}],
        },
    ]


def ready(address: str) -> bool:
    """True when the CoreDNS instance whose ``ready`` plugin listens on ``address`` is ready."""
    with urllib.request.urlopen(f"http://{address}:{READY_PORT}/ready", timeout=2) as r:
        return r.status == 200


def query(server: str, name: str, timeout: float = 2.0, port: int = 53) -> list[str]:
    """The A records ``server`` answers for ``name`` over UDP (a minimal resolver, no library)."""
    qid = random.randrange(1 << 16)
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split(".")) + b"\0"
    packet = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + labels + struct.pack(">HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(packet, (server, port))
        data = s.recv(4096)
    rid, _flags, qd, an = struct.unpack(">HHHH", data[:8])
    if rid != qid:
        return []
    pos = 12
    for _ in range(qd):  # skip the question
        while data[pos]:
            pos += data[pos] + 1
        pos += 5
    out = []
    for _ in range(an):
        if data[pos] & 0xC0 == 0xC0:
            pos += 2
        else:
            while data[pos]:
                pos += data[pos] + 1
            pos += 1
        rtype, _cls, _ttl, rdlen = struct.unpack(">HHIH", data[pos : pos + 10])
        pos += 10
        if rtype == 1 and rdlen == 4:
            out.append(socket.inet_ntoa(data[pos : pos + 4]))
        pos += rdlen
    return out
