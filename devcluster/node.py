"""The test cluster's real node (tier 2): containerd, runc, a kubelet, kube-proxy and CoreDNS.

``scripts/kube up --pods`` starts the control plane (:mod:`devcluster.cluster`) and then joins this
machine to it with :func:`up`; ``scripts/kube down`` calls :func:`down` first. Everything runs as a
host process (there is no systemd here); the node's processes, logs and certificates live in
``<cluster dir>/node``; containerd's image store lives beside the cached binaries
(``<cache>/node-images``) so the lab's images are imported once, not at every start.

The network never leaves this machine. Pods live on the bridge ``tfk8s-br0`` (10.244.0.0/24,
no masquerade); the node's address (10.245.0.1) and the DNS server are on the port-less bridge
``tfk8s-node``, which also carries the service range's route; kwok's invented pod addresses are
routed ``unreachable``; a chain first in the mangle table's POSTROUTING (after every routing
decision, before any address translation, in a table kube-proxy leaves alone) drops every packet of
those ranges that would leave by an outside interface. ``down`` removes all of it and restores the two sysctls
``up`` set.

The pure builders (``containerd_config``, ``cni_config``, ``kubelet_config``,
``kube_proxy_config``, ``corefile``, ``dns_objects``, ``fence_rules``, ``routes``) take the layout
and return data; the rest performs them.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from . import build, registry
from .pki import CA
from .procs import Procs
from .versions import HERE, cache_root

#: the node's addresses: all on devices of this machine (see the module docstring)
POD_CIDR = "10.244.0.0/24"
SERVICE_CIDR = "10.96.0.0/16"  # the apiserver's --service-cluster-ip-range
KWOK_CIDR = "10.0.0.0/24"  # where kwok invents pod addresses: routed unreachable
POD_GATEWAY = "10.244.0.1"  # the bridge's address (the CNI plugin's isGateway finds it there)
NODE_IP = "10.245.0.1"
DNS_IP = "10.96.0.10"  # the kube-dns Service's ClusterIP (its endpoint is NODE_IP:53)
CLUSTER_DOMAIN = "cluster.local"
NODE_NAME = "tfk8s-node"
BRIDGE = "tfk8s-br0"
DUMMY = "tfk8s-node"
FENCE_CHAIN = "TFK8S-NODE-FENCE"
#: where the fence hangs: mangle/POSTROUTING sees every packet about to leave (forwarded or local),
#: after routing and before SNAT; kube-proxy inserts its own rules first in filter's FORWARD/OUTPUT
FENCE_TABLE, FENCE_HOOK = "mangle", "POSTROUTING"
API_CHAIN = "TFK8S-NODE-API"  # nat/PREROUTING: pods -> the kubernetes Service -> 127.0.0.1
API_SERVICE_IP = "10.96.0.1"
#: the ranges that must never leave by an interface other than the node's own
LOCAL_RANGES = (POD_CIDR, SERVICE_CIDR, KWOK_CIDR, NODE_IP + "/32")
CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins
CNI_NETWORK = "tfk8s-pods"
RUN_DIR = Path("/run/tfk8s-node")  # sockets and containerd's state: short paths, gone at reboot
PAUSE_IMAGE = "localhost/tfk8s/pause:3.10-tfk8s"
#: sysctls ``up`` sets and ``down`` restores: pods reach pods through services (DNAT on the
#: bridge) only with forwarding on and bridged traffic passing iptables
SYSCTLS = {"net/ipv4/ip_forward": "1", "net/bridge/bridge-nf-call-iptables": "1"}
#: sysctls the kubelet and kube-proxy set on their own (kernel.panic*, overcommit, route_localnet):
#: saved before they start, restored by ``down``
RESTORED = (
    "kernel/panic",
    "kernel/panic_on_oops",
    "vm/overcommit_memory",
    "net/ipv4/conf/all/route_localnet",
)
#: the lab's images the tests run, imported from podman (scripts/build_images.py tags them so)
LAB_IMAGES = (
    "localhost/tfk8s/tensorflow-task:0.1.0",
    "localhost/tfk8s/notebook:0.1.0",
    "localhost/tfk8s/hub:0.1.0",
)


NODE_PROCESSES = ("containerd", "kubelet", "kube-proxy", "coredns")


class NodeError(RuntimeError):
    """The node could not be started; the message says what failed and what to do."""


def _run(argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=check, **kw)


# -- building -----------------------------------------------------------------------------------


def pause_image_tar(binary: bytes, name: str = PAUSE_IMAGE) -> bytes:
    """A docker-archive of a one-file image holding the static ``/pause`` (pure, deterministic)."""

    def tar_bytes(members: list[tuple[str, bytes, int]]) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for path, data, mode in members:
                info = tarfile.TarInfo(path)
                info.size, info.mode, info.mtime = len(data), mode, 0
                tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    layer = tar_bytes([("pause", binary, 0o755)])
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created_by": "devcluster/pause/pause.c, gcc -static"}],
        },
        sort_keys=True,
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_name = hashlib.sha256(layer).hexdigest() + "/layer.tar"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [name], "Layers": [layer_name]}]).encode()
    return tar_bytes(
        [(config_name, config, 0o644), (layer_name, layer, 0o644), ("manifest.json", manifest, 0o644)]
    )


def build_pause(log=print) -> Path:
    """Compile ``pause.c`` statically and wrap it as an image archive (cached by the source's hash)."""
    source = HERE / "pause" / "pause.c"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    out = cache_root() / f"pause-{digest}" / "pause-image.tar"
    if out.is_file():
        return out
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise NodeError("a C compiler is missing to build the pause image: apt-get install gcc")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        binary = Path(tmp) / "pause"
        r = _run([cc, "-static", "-Os", "-Wall", "-o", str(binary), str(source)], check=False)
        if r.returncode:
            raise NodeError(f"compiling {source} failed: {r.stderr.strip()}")
        (Path(tmp) / "image.tar").write_bytes(pause_image_tar(binary.read_bytes()))
        (Path(tmp) / "image.tar").rename(out)
    log(f"devcluster: built the pause image {PAUSE_IMAGE}")
    return out


def bins() -> dict[str, Path]:
    """Build (or find) the node's components; component -> its cache directory."""
    return {name: build.ensure(name).dir for name in build.TIER2}


# -- the node's layout and configuration (pure) -------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Where the node keeps everything; built from the cluster directory and the binaries."""

    cluster: Path  # the control plane's state dir (pki/ca.crt, pki/ca.key, admin.kubeconfig)
    bins: dict[str, Path]  # component -> its cache directory
    server: str  # the apiserver's URL

    @property
    def state(self) -> Path:
        """The node's own directory in the cluster's."""
        return self.cluster / "node"

    @property
    def pki(self) -> Path:
        """The cluster's certificates (the node's are issued there too)."""
        return self.cluster / "pki"

    @property
    def ca(self) -> Path:
        """The cluster CA: the apiserver's and the kubelet's client CA."""
        return self.cluster / "pki" / "ca.crt"

    @property
    def containerd_sock(self) -> Path:
        """containerd's socket."""
        return RUN_DIR / "containerd" / "containerd.sock"

    @property
    def kubelet_root(self) -> Path:
        """The kubelet's --root-dir (pods' volumes are mounted under it)."""
        return self.state / "kubelet"

    @property
    def images(self) -> Path:
        """containerd's root: the image store, kept across clusters (imports are slow)."""
        return cache_root() / "node-images"

    def bin(self, component: str, binary: str) -> str:
        """The path of one cached binary."""
        return str(self.bins[component] / binary)


def containerd_config(lay: Layout) -> str:
    """containerd's config (version 3): CRI with runc, cgroupfs, the pinned pause image, CNI."""
    runc = lay.bin("runc", "runc")
    return f"""\
# Written by devcluster/node.py: the test node's containerd.
version = 3
root = {json.dumps(str(lay.images))}
state = {json.dumps(str(RUN_DIR / "containerd" / "state"))}

[grpc]
  address = {json.dumps(str(lay.containerd_sock))}

[ttrpc]
  address = ""

[debug]
  address = ""

[metrics]
  address = ""

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'

    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = {json.dumps(PAUSE_IMAGE)}

    # hosts.toml per registry name, read at each pull (devcluster/registry.py writes the cluster's)
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = {json.dumps(str(registry.hosts_dir(lay.cluster)))}

  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    # this VM refuses a negative oom_score_adj even to root: never ask for one below ours
    restrict_oom_score_adj = true

    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'

      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'

        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = {json.dumps(runc)}
          SystemdCgroup = false

    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [{json.dumps(CNI_BIN_DIR)}]
      conf_dir = {json.dumps(str(lay.state / "cni" / "net.d"))}
      max_conf_num = 1

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
"""


def cni_config(lay: Layout) -> dict:
    """The pod network: Debian's bridge + host-local plugins, one local range, no masquerade."""
    return {
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,  # nothing is translated towards the outside: it never gets there
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(lay.state / "cni" / "ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(lay: Layout) -> dict:
    """The kubelet's KubeletConfiguration for this VM (cgroup v1, no systemd, no swap rule)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # Kubernetes 1.35 made cgroup v1 fatal by default; this VM has only cgroup v1
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        "address": NODE_IP,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "tlsCertFile": str(lay.pki / "node-kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(lay.pki / "node-kubelet-serving.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(lay.ca)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{lay.containerd_sock}",
        # never collect images (they cannot be pulled back) and never evict for disk
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "nodefs.available": "0%",
            "nodefs.inodesFree": "0%",
            "imagefs.available": "0%",
            "imagefs.inodesFree": "0%",
        },
        "serializeImagePulls": False,
        "resolvConf": "",  # pods get only the cluster DNS, never the host's resolvers
        "clusterDNS": [DNS_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "podLogsDir": str(lay.state / "pod-logs"),
        "staticPodPath": "",
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "protectKernelDefaults": False,
        "maxPods": 110,
    }


def kube_proxy_config(lay: Layout) -> dict:
    """kube-proxy in iptables mode (this kernel has no IPVS and no NFT_QUEUE); conntrack as is."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(lay.state / "kube-proxy.kubeconfig")},
        "hostnameOverride": NODE_NAME,
        "clusterCIDR": POD_CIDR,
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # NodePorts only on the node's own address, never on the outside interface
        "nodePortAddresses": [NODE_IP + "/32"],
        # as k3s does: leave the host's conntrack sysctls alone
        "conntrack": {"maxPerCore": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def corefile(lay: Layout) -> str:
    """CoreDNS: the cluster's zones only, no ``forward`` (no query ever leaves the machine)."""
    return f"""\
.:53 {{
    bind {NODE_IP}
    errors
    ready 127.0.0.1:18181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {lay.state / "coredns.kubeconfig"}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
}}
"""


def kubeconfig(server: str, ca: Path, cert: Path, key: Path, user: str) -> dict:
    """A kubeconfig naming files (a client certificate signed by the cluster CA)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "default",
        "clusters": [{"name": "devcluster", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "default", "context": {"cluster": "devcluster", "user": user}}],
    }


#: client certificates: file stem -> (CN, O)
CLIENTS = {
    "kubelet": (f"system:node:{NODE_NAME}", "system:nodes"),
    # bound by the default ClusterRoleBinding system:node-proxier
    "kube-proxy": ("system:kube-proxy", None),
    "coredns": ("tfk8s:coredns", None),
}


def dns_objects() -> list[dict]:
    """kube-dns (a Service with no selector, its endpoint the node's DNS) and CoreDNS's RBAC."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
            "spec": {
                "clusterIP": DNS_IP,
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                ],
            },
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "kube-dns-node",
                "namespace": "kube-system",
                "labels": {
                    "kubernetes.io/service-name": "kube-dns",
                    "endpointslice.kubernetes.io/managed-by": "tfk8s-devcluster",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}}],
            "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "tfk8s:coredns"},
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
            "metadata": {"name": "tfk8s:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "tfk8s:coredns",
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "tfk8s:coredns"}],
        },
    ]


def fence_rules(outside: list[str]) -> list[list[str]]:
    """iptables rules (``-A FENCE_CHAIN ...``): drop the local ranges towards each outside interface.

    Whatever the routes say, a packet from or to a pod, a service, the node's address or a kwok
    address never leaves by ``outside`` (the machine's real interfaces).
    """
    rules = []
    for dev in outside:
        for cidr in LOCAL_RANGES:
            rules.append(["-A", FENCE_CHAIN, "-o", dev, "-s", cidr, "-j", "DROP"])
            rules.append(["-A", FENCE_CHAIN, "-o", dev, "-d", cidr, "-j", "DROP"])
    return rules


def api_dnat_rule(api_port: int) -> list[str]:
    """The nat rule that takes pods' requests for the ``kubernetes`` Service to the API server.

    The API server listens on 127.0.0.1 only and a loopback address may not be an endpoint, so
    the Service has none; the pods' packets for 10.96.0.1:443 are sent to 127.0.0.1 instead (with
    ``route_localnet`` on the pod bridge, as kube-proxy does for localhost NodePorts).
    """
    return [
        "-A",
        API_CHAIN,
        "-s",
        POD_CIDR,
        "-d",
        API_SERVICE_IP + "/32",
        "-p",
        "tcp",
        "--dport",
        "443",
        "-j",
        "DNAT",
        "--to-destination",
        f"127.0.0.1:{api_port}",
    ]


def routes() -> list[list[str]]:
    """``ip route replace`` arguments: each range on a device of this machine.

    (kwok's range is routed ``unreachable`` by the control plane itself, :mod:`devcluster.cluster`;
    the pod range is the bridge's own connected route.)
    """
    return [[SERVICE_CIDR, "dev", DUMMY, "src", NODE_IP]]  # ClusterIPs: DNAT by kube-proxy, never out


# -- performing ---------------------------------------------------------------------------------


def outside_interfaces() -> list[str]:
    """The machine's interfaces other than loopback and the node's own devices."""
    return [
        dev
        for dev in sorted(os.listdir("/sys/class/net"))
        if dev != "lo" and not dev.startswith(("tfk8s", "veth", "ifb"))
    ]


def _layout(cluster, component_dirs: dict[str, Path]) -> Layout:
    return Layout(cluster=cluster.root, bins=component_dirs, server=cluster.server)


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def write_configs(lay: Layout) -> None:
    """Certificates (signed by the cluster CA), kubeconfigs and config files of the node."""
    ca = CA(lay.pki)
    for stem, (cn, org) in CLIENTS.items():
        crt, key = ca.issue(f"node-{stem}", cn, org=org, client=True)
        _write_json(lay.state / f"{stem}.kubeconfig", kubeconfig(lay.server, lay.ca, crt, key, stem))
    ca.issue(
        "node-kubelet-serving",
        f"system:node:{NODE_NAME}",
        org="system:nodes",
        server=True,
        dns=(NODE_NAME,),
        ips=(NODE_IP,),
    )
    (lay.state / "containerd.toml").write_text(containerd_config(lay))
    _write_json(lay.state / "cni" / "net.d" / "10-tfk8s.conflist", cni_config(lay))
    _write_json(lay.state / "kubelet.yaml", kubelet_config(lay))  # JSON is YAML
    _write_json(lay.state / "kube-proxy.yaml", kube_proxy_config(lay))
    (lay.state / "Corefile").write_text(corefile(lay))
    for d in ("pod-logs", "kubelet", "cni/ipam"):
        (lay.state / d).mkdir(parents=True, exist_ok=True)
    lay.images.mkdir(parents=True, exist_ok=True)


def _sysctl(name: str, value: str | None = None) -> str:
    path = Path("/proc/sys", name)
    if value is not None:
        path.write_text(value + "\n")
    return path.read_text().strip()


def _iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = _run(["iptables", "-w", *args], check=False)
    if check and r.returncode:
        raise NodeError(f"iptables {' '.join(args)} failed: {r.stderr.strip()}")
    return r


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = _run(["ip", *args], check=False)
    if check and r.returncode:
        raise NodeError(f"ip {' '.join(args)} failed: {r.stderr.strip()}")
    return r


def network_up(lay: Layout) -> None:
    """The fence, the node device, the pod bridge, the routes, then the sysctls (idempotent)."""
    outside = outside_interfaces()
    # the fence first: nothing is forwarded before it stands
    t = ("-t", FENCE_TABLE)
    if _iptables(*t, "-n", "-L", FENCE_CHAIN, check=False).returncode:
        _iptables(*t, "-N", FENCE_CHAIN)
    _iptables(*t, "-F", FENCE_CHAIN)
    for rule in fence_rules(outside):
        _iptables(*t, *rule)
    if _iptables(*t, "-C", FENCE_HOOK, "-j", FENCE_CHAIN, check=False).returncode:
        _iptables(*t, "-I", FENCE_HOOK, "1", "-j", FENCE_CHAIN)
    if _ip("link", "show", DUMMY, check=False).returncode:
        # a bridge without ports: this kernel has no dummy driver, and it cannot load modules
        _ip("link", "add", DUMMY, "type", "bridge")
    _ip("addr", "replace", NODE_IP + "/32", "dev", DUMMY)
    _ip("link", "set", DUMMY, "up")
    # the bridge exists before the first pod (the CNI plugin adopts it)
    if _ip("link", "show", BRIDGE, check=False).returncode:
        _ip("link", "add", BRIDGE, "type", "bridge")
    # the gateway address now, so the pod range is routed to the bridge before the first pod
    _ip("addr", "replace", POD_GATEWAY + "/24", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    for r in routes():
        _ip("route", "replace", *r)
    # pods reach the API server (127.0.0.1) through the kubernetes Service's address
    n = ("-t", "nat")
    if _iptables(*n, "-n", "-L", API_CHAIN, check=False).returncode:
        _iptables(*n, "-N", API_CHAIN)
    _iptables(*n, "-F", API_CHAIN)
    _iptables(*n, *api_dnat_rule(int(lay.server.rsplit(":", 1)[1])))
    if _iptables(*n, "-C", "PREROUTING", "-j", API_CHAIN, check=False).returncode:
        _iptables(*n, "-I", "PREROUTING", "1", "-j", API_CHAIN)
    saved = lay.state / "sysctls.json"
    if not saved.exists():
        _write_json(saved, {k: _sysctl(k) for k in (*SYSCTLS, *RESTORED) if Path("/proc/sys", k).exists()})
    for k, v in SYSCTLS.items():
        _sysctl(k, v)
    _sysctl(f"net/ipv4/conf/{BRIDGE}/route_localnet", "1")  # the bridge goes with down


def network_down(state: Path, log) -> None:
    """Remove what :func:`network_up` and the CNI plugins made; restore the sysctls."""
    saved = state / "sysctls.json"
    if saved.exists():
        for k, v in json.loads(saved.read_text()).items():
            try:
                _sysctl(k, v)
            except OSError as e:
                log(f"devcluster: could not restore the sysctl {k}={v}: {e}")
        saved.unlink()
    for r in routes():
        _ip("route", "del", r[0], check=False)
    for link in os.listdir("/sys/class/net"):  # pod ends left on the bridge
        master = Path("/sys/class/net", link, "master")
        if link.startswith("veth") and master.exists() and os.path.basename(os.readlink(master)) == BRIDGE:
            _ip("link", "del", link, check=False)
    for dev in (BRIDGE, DUMMY):
        _ip("link", "del", dev, check=False)
    while _iptables("-t", "nat", "-D", "PREROUTING", "-j", API_CHAIN, check=False).returncode == 0:
        pass
    _iptables("-t", "nat", "-F", API_CHAIN, check=False)
    _iptables("-t", "nat", "-X", API_CHAIN, check=False)
    t = ("-t", FENCE_TABLE)
    while _iptables(*t, "-D", FENCE_HOOK, "-j", FENCE_CHAIN, check=False).returncode == 0:
        pass
    _iptables(*t, "-F", FENCE_CHAIN, check=False)
    _iptables(*t, "-X", FENCE_CHAIN, check=False)


def ctr(lay: Layout, *args: str, stdin=None, check: bool = True) -> subprocess.CompletedProcess:
    """``ctr`` on the node's containerd, namespace k8s.io (the one the kubelet sees)."""
    r = subprocess.run(
        [lay.bin("containerd", "ctr"), "--address", str(lay.containerd_sock), "-n", "k8s.io", *args],
        stdin=stdin,
        capture_output=True,
    )
    if check and r.returncode:
        raise NodeError(f"ctr {' '.join(args)} failed: {r.stderr.decode(errors='replace').strip()}")
    return r


def import_archive(lay: Layout, archive: Path) -> None:
    """Import a docker-archive into containerd's k8s.io namespace."""
    with open(archive, "rb") as f:
        ctr(lay, "images", "import", "-", stdin=f)


def containerd_images(lay: Layout) -> set[str]:
    """The image references containerd's k8s.io namespace holds."""
    return set(ctr(lay, "images", "list", "-q").stdout.decode().split())


def podman_image_id(image: str) -> str | None:
    """podman's id of ``image``, or None when podman does not have it."""
    if not shutil.which("podman"):
        return None
    r = _run(
        ["podman", "--runtime", "/usr/sbin/runc", "image", "inspect", "--format", "{{.Id}}", image],
        check=False,
    )
    return r.stdout.strip() if r.returncode == 0 else None


def image_targets(lay: Layout) -> dict[str, str]:
    """Every image record of containerd's k8s.io namespace -> the digest of its manifest (index)."""
    rows = ctr(lay, "images", "ls").stdout.decode().splitlines()[1:]
    return {cols[0]: cols[2] for cols in (row.split() for row in rows) if len(cols) > 2}


def stale_records(image: str, targets: dict[str, str]) -> list[str]:
    """The records to delete so that nothing keeps ``image``'s content (pure).

    The kubelet's image service (CRI) adds a record named by the image's id (``sha256:<config
    digest>``) beside every name it sees; that record alone keeps every blob and snapshot of
    the image alive. It goes with the name unless another name still points at the same content.
    """
    if image not in targets:
        return []
    target = targets[image]
    names = [r for r, t in targets.items() if t == target and r != image and not r.startswith("sha256:")]
    ids = [r for r, t in targets.items() if t == target and r.startswith("sha256:")]
    return [image, *([] if names else sorted(ids))]


def remove_image(lay: Layout, image: str) -> bool:
    """Remove ``image`` from containerd and collect its content and snapshots now; False if absent.

    Its id record (:func:`stale_records`) goes too, and ``--sync`` makes containerd run its
    garbage collector before answering, so the blobs and unpacked layers no other image
    references are gone when this returns (not at some later GC).
    """
    records = stale_records(image, image_targets(lay))
    if not records:
        return False
    ctr(lay, "images", "rm", "--sync", *records)
    return True


def _marker(lay: Layout, image: str) -> Path:
    return lay.images / "imported" / hashlib.sha256(image.encode()).hexdigest()


def _imported_id(lay: Layout, image: str) -> str | None:
    marker = _marker(lay, image)
    return marker.read_text() if marker.is_file() else None


def superseded(image: str, have: set[str] | list[str]) -> list[str]:
    """The images of ``have`` that importing ``image`` makes stale (pure).

    ``scripts/build_images.py`` tags every build ``<repo>:h-<hash of its inputs>``: a new ``h-``
    tag of a repository supersedes that repository's other ``h-`` tags (other tags stay).
    """
    repo, _, tag = image.rpartition(":")
    if not tag.startswith("h-"):
        return []
    return sorted(n for n in have if n != image and n.startswith(f"{repo}:h-"))


def import_podman_images(lay: Layout, images: tuple[str, ...], log) -> list[str]:
    """Copy podman images into containerd (``podman save --format docker-archive`` -> ``ctr import``).

    An image already in containerd with podman's id is not copied again; one podman lacks is
    skipped with a line (the tests that need it say so). When podman's id of a tag changed, the
    old image is removed (and its content collected) before the new one is imported, so the store
    holds one copy per tag, not one per build. Returns the images imported or present.
    """
    out = []
    for image in images:
        have = containerd_images(lay)
        pid = podman_image_id(image)
        if pid is None:
            log(f"devcluster: podman has no {image}; build it with scripts/build_images.py (not imported)")
            continue
        marker = _marker(lay, image)
        if image in have and marker.is_file() and marker.read_text() == pid:
            out.append(image)
            continue
        t0 = time.monotonic()
        marker.unlink(missing_ok=True)
        if image in have:
            remove_image(lay, image)
            log(f"devcluster: removed the previous {image} from containerd (podman's id changed)")
        same = [n for n in sorted(have) if n != image and _imported_id(lay, n) == pid]
        if same:  # the same podman image under another name: a new name, no copy
            ctr(lay, "images", "tag", "--force", same[0], image)
        for stale in superseded(image, have):
            remove_image(lay, stale)
            _marker(lay, stale).unlink(missing_ok=True)
            log(f"devcluster: removed {stale} from containerd (superseded by {image})")
        if same:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(pid)
            out.append(image)
            log(f"devcluster: {image} is {same[0]} in containerd (the same podman image): tagged")
            continue
        with tempfile.NamedTemporaryFile(suffix=".tar", dir=lay.images) as tmp:
            r = _run(
                [
                    "podman",
                    "--runtime",
                    "/usr/sbin/runc",
                    "save",
                    "--format",
                    "docker-archive",
                    "-o",
                    tmp.name,
                    image,
                ],
                check=False,
            )
            if r.returncode:
                raise NodeError(f"podman save {image} failed: {r.stderr.strip()}")
            import_archive(lay, Path(tmp.name))
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(pid)
        out.append(image)
        log(f"devcluster: imported {image} into containerd in {time.monotonic() - t0:.0f} s")
    return out


def import_images(cluster, images: tuple[str, ...], log=print) -> list[str]:
    """:func:`import_podman_images` on the running node of ``cluster`` (for a test's own images)."""
    if not running(cluster):
        raise NodeError(
            f"the real node of {cluster.root} is not running: start it with scripts/kube up --pods"
        )
    return import_podman_images(_layout(cluster, bins()), images, log)


def layout(cluster) -> Layout:
    """The running node's layout (where its sockets, state and binaries are)."""
    return _layout(cluster, bins())


def _wait(what: str, check, timeout: float, procs: Procs, name: str, interval: float = 0.5) -> None:
    """Poll ``check`` until truthy; fail with the process's last lines if it exits or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except (OSError, subprocess.SubprocessError, NodeError):
            pass
        if not procs.alive(name):
            raise NodeError(f"{name} exited while waiting for {what}; its last lines:\n{procs.tail(name)}")
        if time.monotonic() > deadline:
            raise NodeError(
                f"{what} did not happen within {timeout:.0f} s; {name}'s last lines:\n{procs.tail(name)}"
            )
        time.sleep(interval)


def _dns_ready() -> bool:
    with urllib.request.urlopen("http://127.0.0.1:18181/ready", timeout=2) as r:
        return r.status == 200


def _node_ready(cluster) -> bool:
    r = cluster.kubectl(
        "get",
        "node",
        NODE_NAME,
        "-o",
        "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
        check=False,
    )
    return r.returncode == 0 and r.stdout.strip() == "True"


def up(cluster, log=print) -> float:
    """Join this machine to ``cluster`` (running) as a real node; the seconds it took.

    On a failure half-way, everything started so far is removed again (:func:`down`).
    """
    if os.geteuid() != 0:
        raise NodeError("the real node needs root (containerd, mounts, iptables): run scripts/kube as root")
    for tool in ("iptables", "ip", "podman"):
        if not shutil.which(tool):
            raise NodeError(f"{tool} is missing: run scripts/bootstrap kube-node")
    if not Path(CNI_BIN_DIR, "bridge").is_file():
        raise NodeError(f"the CNI plugins are missing in {CNI_BIN_DIR}: run scripts/bootstrap kube-node")
    owner = _owner()
    if owner not in (None, str(cluster.root)) and running_in(Path(owner)):
        raise NodeError(
            f"this machine already runs the real node of the cluster in {owner}: "
            f"stop that one first (TFK8S_KUBE_DIR={owner} scripts/kube down)"
        )
    t_build = time.monotonic()
    dirs = bins()
    pause = build_pause(log)
    t0 = time.monotonic()
    if t0 - t_build > 1:
        log(f"devcluster: node binaries ready in {t0 - t_build:.0f} s")
    lay = _layout(cluster, dirs)
    procs = Procs(lay.state)
    try:
        write_configs(lay)
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        (RUN_DIR / "owner").write_text(str(cluster.root))
        network_up(lay)
        path = f"{lay.bins['containerd']}:{lay.bins['runc']}:/usr/sbin:/usr/bin:/sbin:/bin"
        env = dict(os.environ, PATH=path)
        procs.start(
            "containerd",
            [lay.bin("containerd", "containerd"), "--config", str(lay.state / "containerd.toml")],
            env=env,
        )
        _wait(
            "containerd's socket",
            lambda: ctr(lay, "version", check=False).returncode == 0,
            60,
            procs,
            "containerd",
        )
        import_archive(lay, pause)
        imported = import_podman_images(lay, LAB_IMAGES, log)
        procs.start(
            "kubelet",
            [
                lay.bin("kubelet", "kubelet"),
                "--config",
                str(lay.state / "kubelet.yaml"),
                "--kubeconfig",
                str(lay.state / "kubelet.kubeconfig"),
                "--root-dir",
                str(lay.kubelet_root),
                "--hostname-override",
                NODE_NAME,
                "--node-ip",
                NODE_IP,
                "--v",
                "1",
            ],
            env=env,
        )
        procs.start(
            "kube-proxy",
            [lay.bin("kubelet", "kube-proxy"), "--config", str(lay.state / "kube-proxy.yaml"), "--v", "1"],
            env=env,
        )
        cluster.apply(dns_objects())
        procs.start("coredns", [lay.bin("coredns", "coredns"), "-conf", str(lay.state / "Corefile")], env=env)
        _wait("CoreDNS ready", _dns_ready, 60, procs, "coredns")
        _wait(f"node {NODE_NAME} Ready", lambda: _node_ready(cluster), 240, procs, "kubelet", interval=1)
    except BaseException:
        down(cluster, log=lambda *_: None)
        raise
    took = time.monotonic() - t0
    log(
        f"devcluster: node {NODE_NAME} Ready in {took:.1f} s (containerd, kubelet, kube-proxy, CoreDNS; "
        f"images: {', '.join(imported) or 'none'})"
    )
    return took


def kube_chain_cleanup(rules: str) -> list[list[str]]:
    """``iptables -S`` output of one table -> the commands that remove every ``KUBE-*`` chain.

    The kubelet's canary chains and whatever kube-proxy's own ``--cleanup`` left: first the rules
    that jump to them from other chains, then the chains themselves (flushed, then deleted).
    """
    out, chains = [], []
    for line in rules.splitlines():
        words = shlex.split(line)  # comments with spaces are quoted
        if words[:1] == ["-N"] and words[1].startswith("KUBE-"):
            chains.append(words[1])
        elif (
            words[:1] == ["-A"]
            and not words[1].startswith("KUBE-")
            and any(w.startswith("KUBE-") for w in words[2:])
        ):
            out.append(["-D", *words[1:]])
    out += [["-F", c] for c in chains] + [["-X", c] for c in chains]
    return out


def _remove_kube_chains() -> None:
    for exe in ("iptables", "ip6tables"):
        if not shutil.which(exe):
            continue
        for table in ("filter", "nat", "mangle"):
            r = _run([exe, "-w", "-t", table, "-S"], check=False)
            for cmd in kube_chain_cleanup(r.stdout):
                _run([exe, "-w", "-t", table, *cmd], check=False)


def _mounts_under(prefixes: list[str]) -> list[str]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4].replace("\\040", " ")
        if any(target == p or target.startswith(p.rstrip("/") + "/") for p in prefixes):
            out.append(target)
    return sorted(set(out), key=len, reverse=True)  # deepest first


def _pids_of(exe_dir: Path) -> list[int]:
    """Processes running a binary from ``exe_dir`` (containerd's shims outlive containerd)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.readlink(d / "exe").startswith(str(exe_dir) + "/"):
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def _kill(pids: list[int]) -> None:
    import signal

    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.1)


def down(cluster, log=print) -> None:
    """Stop the node and remove every process, mount, netns, iptables rule and route it made.

    Only the cluster that started the node removes it (the devices, rules and sockets are the
    machine's, and another cluster directory may own them).
    """
    state = cluster.root / "node"
    if not state.is_dir() or _owner() not in (None, str(cluster.root)):
        return
    procs = Procs(state)
    for name in ("coredns", "kube-proxy", "kubelet"):
        procs.stop(name)
    containerd = build.COMPONENTS["containerd"]
    lay = Layout(cluster=cluster.root, bins={n: build.COMPONENTS[n].dir for n in build.TIER2}, server="")
    if procs.alive("containerd"):
        # every container and sandbox: kill the tasks; removing them lets containerd tear down their netns
        tasks = ctr(lay, "tasks", "list", "-q", check=False).stdout.decode().split()
        for t in tasks:
            ctr(lay, "tasks", "kill", "-s", "SIGKILL", t, check=False)
        deadline = time.monotonic() + 30
        for t in tasks:
            while time.monotonic() < deadline and ctr(lay, "tasks", "delete", t, check=False).returncode:
                time.sleep(0.3)
    procs.stop("containerd")
    _kill(_pids_of(containerd.dir))  # shims (and anything else of ours) still running
    # the pods' network namespaces (containerd names them cni-<uuid>) and what the CNI recorded
    netns = Path("/var/run/netns")
    for ns in sorted(netns.glob("cni-*")) if netns.is_dir() else []:
        _ip("netns", "del", ns.name, check=False)
    kube_proxy = build.COMPONENTS["kubelet"].path("kube-proxy")
    if kube_proxy.is_file():  # kube-proxy removes its own chains
        _run([str(kube_proxy), "--cleanup", "--proxy-mode", "iptables"], check=False, timeout=120)
    _remove_kube_chains()
    for m in _mounts_under([str(state), str(RUN_DIR), str(lay.images)]):
        if _run(["umount", m], check=False).returncode:
            _run(["umount", "-l", m], check=False)
    network_down(state, log)
    results = Path("/var/lib/cni/results")
    for f in results.glob(f"{CNI_NETWORK}-*") if results.is_dir() else []:
        f.unlink()
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    shutil.rmtree(state, ignore_errors=True)
    log("devcluster: node down")


def running(cluster) -> bool:
    """True when every process of the node runs."""
    return running_in(cluster.root)


def running_in(cluster_root: Path) -> bool:
    """True when every process of the node of the cluster in ``cluster_root`` runs."""
    procs = Procs(cluster_root / "node")
    return all(procs.alive(n) for n in NODE_PROCESSES)


def _owner() -> str | None:
    """The cluster directory whose node holds this machine's node devices, if any."""
    try:
        return (RUN_DIR / "owner").read_text().strip() or None
    except OSError:
        return None


def status(cluster) -> dict[str, bool]:
    """Each node process: running or not (empty when no node was started)."""
    procs = Procs(cluster.root / "node")
    return {n: procs.alive(n) for n in procs.names()}
