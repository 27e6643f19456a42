"""The test cluster's real node (tier 2): containerd, runc, a kubelet, kube-proxy and CoreDNS.

    python3 devcluster/node.py build            build (or find) every binary, cached by version
    python3 devcluster/node.py up               join this machine to the running control plane
    python3 devcluster/node.py down             remove every process, mount, netns, rule and route
    python3 devcluster/node.py import IMAGE...  copy podman images into containerd's k8s.io namespace

Everything runs as a host process (no systemd here). The node joins the control plane that
``scripts/kube up`` started: its state directory ``$TFK8S_CACHE/devcluster/cluster`` holds the
cluster CA (``pki/ca.crt``, ``pki/ca.key``) and ``admin.kubeconfig``.

The network never leaves this machine. Pods live on the bridge ``tfk8s-br0`` (10.244.0.0/24,
no masquerade); the node's address and the DNS server are on the dummy device ``tfk8s-node``,
which also carries the service range's route; kwok's invented pod addresses are routed
``unreachable``; a chain in FORWARD and OUTPUT drops every packet of those ranges that would go
out by an interface other than ours. ``down`` removes all of it, and restores the two sysctls
``up`` set.

The pure builders (``containerd_config``, ``cni_config``, ``kubelet_config``,
``kube_proxy_config``, ``corefile``, ``fence_rules`` ...) take the layout and return data; the
rest performs them.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

#: the node's addresses: all on devices of this machine (see the module docstring)
POD_CIDR = "10.244.0.0/24"
SERVICE_CIDR = "10.96.0.0/16"  # the apiserver's --service-cluster-ip-range
KWOK_CIDR = "10.0.0.0/24"  # where kwok invents pod addresses: routed unreachable
NODE_IP = "10.245.0.1"
DNS_IP = "10.96.0.10"  # the kube-dns Service's ClusterIP (its endpoint is NODE_IP:53)
CLUSTER_DOMAIN = "cluster.local"
NODE_NAME = "tfk8s-node"
BRIDGE = "tfk8s-br0"
DUMMY = "tfk8s-node"
FENCE_CHAIN = "TFK8S-NODE-FENCE"
#: the ranges that must never leave by an interface other than the node's own
LOCAL_RANGES = (POD_CIDR, SERVICE_CIDR, KWOK_CIDR, NODE_IP + "/32")
CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins
RUN_DIR = Path("/run/tfk8s-node")  # sockets and containerd's state: short paths, gone at reboot
PAUSE_IMAGE = "localhost/tfk8s/pause:3.10-tfk8s"
#: sysctls ``up`` sets and ``down`` restores: pods reach pods through services (DNAT on the
#: bridge) only with forwarding and bridged traffic going through iptables
SYSCTLS = {"net/ipv4/ip_forward": "1", "net/bridge/bridge-nf-call-iptables": "1"}


def cache_root() -> Path:
    """``$TFK8S_CACHE/devcluster`` (default ``~/.cache/tfk8s/devcluster``)."""
    return Path(os.environ.get("TFK8S_CACHE") or Path.home() / ".cache" / "tfk8s") / "devcluster"


def versions(path: Path = HERE / "versions.env") -> dict[str, str]:
    """The pinned versions (``NAME=value`` lines of ``versions.env``)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


# -- building -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Build:
    """One cached build: ``go`` arguments producing ``binaries`` in ``cache/<name>-<version>/bin``."""

    name: str
    version: str
    binaries: tuple[str, ...]
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None

    def bin_dir(self, root: Path) -> Path:
        """Where the binaries of this version live."""
        return root / f"{self.name}-{self.version}" / "bin"


def kubernetes_ldflags(version: str) -> str:
    """The version linked into Kubernetes binaries (without it /version says v0.0.0-master)."""
    major, minor = version.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {pkg}.gitVersion={version}", f"-X {pkg}.gitMajor={major}",
                  f"-X {pkg}.gitMinor={minor}", f"-X {pkg}.gitTreeState=clean",
                  f"-X {pkg}.buildDate=2026-01-01T00:00:00Z"]
    return " ".join(flags)


def builds(v: dict[str, str]) -> dict[str, Build]:
    """Every binary the node needs, by component (pure: the build plan)."""
    containerd = v["CONTAINERD"]
    mod = "github.com/containerd/containerd/v2/cmd"
    return {
        "containerd": Build(
            "containerd", containerd, ("containerd", "ctr", "containerd-shim-runc-v2"),
            ("install", "-trimpath", "-tags", "no_btrfs", "-ldflags",
             f"-s -w -X github.com/containerd/containerd/v2/version.Version={containerd}",
             *(f"{mod}/{b}@{containerd}" for b in ("containerd", "ctr", "containerd-shim-runc-v2"))),
            {"CGO_ENABLED": "0"}),
        # cgo + libseccomp: without seccomp, pods under Pod Security "restricted" cannot start
        "runc": Build(
            "runc", v["RUNC"], ("runc",),
            ("install", "-trimpath", "-tags", "seccomp", "-ldflags",
             f"-s -w -X main.version={v['RUNC'].lstrip('v')}",
             f"github.com/opencontainers/runc@{v['RUNC']}"),
            {"CGO_ENABLED": "1"}),
        "coredns": Build(
            "coredns", v["COREDNS"], ("coredns",),
            ("install", "-trimpath", "-ldflags", "-s -w", f"github.com/coredns/coredns@{v['COREDNS']}"),
            {"CGO_ENABLED": "0"}),
        # the same tools module and version flags as the control plane (devcluster/go/kubernetes)
        "kubelet": Build(
            "kubelet", v["KUBERNETES"], ("kubelet", "kube-proxy"),
            ("build", "-trimpath", "-ldflags", kubernetes_ldflags(v["KUBERNETES"]), "-o", "{out}/",
             "k8s.io/kubernetes/cmd/kubelet", "k8s.io/kubernetes/cmd/kube-proxy"),
            {"CGO_ENABLED": "0"}, cwd=str(HERE / "go" / "kubernetes")),
    }


def _kubernetes_build_running() -> bool:
    """Whether a ``go build`` of the Kubernetes tools module runs (the machine has 2 cores)."""
    r = subprocess.run(["pgrep", "-af", "go build"], capture_output=True, text=True)
    return "k8s.io/kubernetes/cmd" in r.stdout


def build(component: Build, root: Path | None = None, log=print) -> Path:
    """Build ``component`` unless its binaries are cached; the directory holding them."""
    root = root or cache_root()
    bin_dir = component.bin_dir(root)
    if all((bin_dir / b).is_file() for b in component.binaries):
        return bin_dir
    if component.name == "kubelet":
        deadline = time.monotonic() + 3600
        while _kubernetes_build_running():  # one build of that module at a time on 2 cores
            if time.monotonic() > deadline:
                raise SystemExit("node: another go build of the Kubernetes module ran for an hour")
            log("node: waiting for the other go build of the Kubernetes module to finish")
            time.sleep(20)
    go = shutil.which("go")
    if not go:
        raise SystemExit("node: go is missing; install Go 1.26 (the module proxy must be reachable)")
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{component.name}-", dir=root))
    try:
        out = tmp / "bin"
        out.mkdir()
        argv = [a.replace("{out}", str(out)) for a in component.argv]
        env = {**os.environ, **component.env, "GOBIN": str(out), "GOFLAGS": "-buildvcs=false"}
        t0 = time.monotonic()
        log(f"node: building {component.name} {component.version} (go {' '.join(argv[:1])})")
        r = subprocess.run([go, *argv], env=env, cwd=component.cwd)
        if r.returncode != 0:
            raise SystemExit(f"node: building {component.name} {component.version} failed "
                             f"(go exited {r.returncode}); the output above says why")
        missing = [b for b in component.binaries if not (out / b).is_file()]
        if missing:
            raise SystemExit(f"node: the build of {component.name} made no {', '.join(missing)}")
        log(f"node: built {component.name} {component.version} in {time.monotonic() - t0:.0f} s")
        bin_dir.parent.mkdir(parents=True, exist_ok=True)
        if bin_dir.exists():
            shutil.rmtree(bin_dir)
        out.rename(bin_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return bin_dir


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
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "devcluster/pause/pause.c, gcc -static"}],
    }, sort_keys=True).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_name = hashlib.sha256(layer).hexdigest() + "/layer.tar"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [name],
                            "Layers": [layer_name]}]).encode()
    return tar_bytes([(config_name, config, 0o644), (layer_name, layer, 0o644),
                      ("manifest.json", manifest, 0o644)])


def build_pause(root: Path | None = None, log=print) -> Path:
    """Compile ``pause.c`` statically and wrap it as an image archive; the archive's path."""
    root = root or cache_root()
    source = HERE / "pause" / "pause.c"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    out = root / f"pause-{digest}" / "pause-image.tar"
    if out.is_file():
        return out
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise SystemExit("node: a C compiler is missing to build the pause image; apt-get install gcc")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        binary = Path(tmp) / "pause"
        subprocess.run([cc, "-static", "-Os", "-Wall", "-o", str(binary), str(source)], check=True)
        (Path(tmp) / "image.tar").write_bytes(pause_image_tar(binary.read_bytes()))
        (Path(tmp) / "image.tar").rename(out)
    log(f"node: built the pause image {PAUSE_IMAGE}")
    return out


def build_all(log=print) -> dict[str, Path]:
    """Every node binary (cached by version) and the pause image; component -> directory."""
    v = versions()
    dirs = {}
    for name, component in builds(v).items():
        t0 = time.monotonic()
        dirs[name] = build(component, log=log)
        log(f"node: {name} {component.version} ready ({time.monotonic() - t0:.1f} s)")
    dirs["pause"] = build_pause(log=log)
    return dirs


# -- the node's layout and configuration (pure) -------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Where the node keeps everything; built from the cluster directory and the binaries."""

    cluster: Path  # the control plane's state dir (pki/ca.crt, pki/ca.key, admin.kubeconfig)
    bins: dict[str, Path]
    server: str  # the apiserver's URL, from admin.kubeconfig

    @property
    def state(self) -> Path:
        return self.cluster / "node"

    @property
    def pki(self) -> Path:
        return self.state / "pki"

    @property
    def ca(self) -> Path:
        return self.cluster / "pki" / "ca.crt"

    @property
    def containerd_sock(self) -> Path:
        return RUN_DIR / "containerd" / "containerd.sock"

    @property
    def kubelet_root(self) -> Path:
        return self.state / "kubelet"

    def bin(self, component: str, binary: str) -> str:
        return str(self.bins[component] / binary)


def containerd_config(lay: Layout) -> str:
    """containerd's config (version 3): CRI with runc, cgroupfs, the pinned pause image, CNI."""
    runc = lay.bin("runc", "runc")
    return f"""\
# Written by devcluster/node.py: the test node's containerd.
version = 3
root = {json.dumps(str(lay.state / "containerd"))}
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
        "name": "tfk8s-pods",
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
        "tlsCertFile": str(lay.pki / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(lay.pki / "kubelet-serving.key"),
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
        "evictionHard": {"nodefs.available": "0%", "nodefs.inodesFree": "0%",
                         "imagefs.available": "0%", "imagefs.inodesFree": "0%"},
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
        # NodePorts only on the node's own dummy address, never on the outside interface
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
        "apiVersion": "v1", "kind": "Config", "current-context": "default",
        "clusters": [{"name": "devcluster",
                      "cluster": {"server": server, "certificate-authority": str(ca)}}],
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
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "kube-dns", "namespace": "kube-system",
                      "labels": {"k8s-app": "kube-dns"}},
         "spec": {"clusterIP": DNS_IP, "ports": [
             {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
             {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "kube-dns-node", "namespace": "kube-system",
                      "labels": {"kubernetes.io/service-name": "kube-dns",
                                 "endpointslice.kubernetes.io/managed-by": "tfk8s-devcluster"}},
         "addressType": "IPv4",
         "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}}],
         "ports": [{"name": "dns", "port": 53, "protocol": "UDP"},
                   {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "tfk8s:coredns"},
         "rules": [{"apiGroups": [""], "resources": ["services", "pods", "namespaces"],
                    "verbs": ["list", "watch"]},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                    "verbs": ["list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "tfk8s:coredns"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "tfk8s:coredns"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                       "name": "tfk8s:coredns"}]},
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


def routes() -> list[list[str]]:
    """``ip route replace`` arguments: each range on a device of this machine."""
    return [
        ["unreachable", KWOK_CIDR],  # kwok's pods have no address anywhere
        [SERVICE_CIDR, "dev", DUMMY, "src", NODE_IP],  # ClusterIPs: DNAT by kube-proxy, never out
    ]


# -- performing ---------------------------------------------------------------------------------


def _run(argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=check, **kw)


def outside_interfaces() -> list[str]:
    """The machine's interfaces other than loopback and the node's own devices."""
    out = []
    for dev in sorted(os.listdir("/sys/class/net")):
        if dev == "lo" or dev.startswith(("tfk8s", "veth", "cni", "ifb")):
            continue
        out.append(dev)
    return out


def _server_of(admin_kubeconfig: Path) -> str:
    text = admin_kubeconfig.read_text()
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("server:"):
            return line.split(":", 1)[1].strip().strip('"')
        if line.startswith('"server"'):
            return line.split(":", 1)[1].strip().strip('",')
    raise SystemExit(f"node: no server: line in {admin_kubeconfig}")


def layout(bins: dict[str, Path] | None = None) -> Layout:
    """The node's layout for the running control plane."""
    cluster = cache_root() / "cluster"
    admin = cluster / "admin.kubeconfig"
    for need in (cluster / "pki" / "ca.crt", cluster / "pki" / "ca.key", admin):
        if not need.is_file():
            raise SystemExit(f"node: {need} is missing: start the control plane first (scripts/kube up)")
    return Layout(cluster=cluster, bins=bins or build_all(log=lambda *_: None),
                  server=_server_of(admin))


def _openssl(*args: str) -> None:
    r = _run(["openssl", *args], check=False)
    if r.returncode != 0:
        raise SystemExit(f"node: openssl {args[0]} failed: {r.stderr.strip()}")


def _issue(lay: Layout, stem: str, cn: str, org: str | None, ip: str | None = None,
           server: bool = False) -> None:
    """A key and a certificate signed by the cluster CA (client, or serving with an IP SAN)."""
    key, crt = lay.pki / f"{stem}.key", lay.pki / f"{stem}.crt"
    if key.is_file() and crt.is_file():
        return
    subject = f"/CN={cn}" + (f"/O={org}" if org else "")
    ext = lay.pki / f"{stem}.ext"
    usage = "serverAuth" if server else "clientAuth"
    ext.write_text(f"basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                   f"extendedKeyUsage={usage}\n" + (f"subjectAltName=IP:{ip},DNS:{NODE_NAME}\n" if ip else ""))
    csr = lay.pki / f"{stem}.csr"
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-subj", subject,
             "-out", str(csr))
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(lay.ca), "-CAkey", str(lay.cluster / "pki" / "ca.key"),
             "-CAcreateserial", "-CAserial", str(lay.pki / "ca.srl"), "-days", "365",
             "-extfile", str(ext), "-out", str(crt))
    csr.unlink()
    ext.unlink()
    key.chmod(0o600)


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def write_configs(lay: Layout) -> None:
    """Certificates, kubeconfigs and config files under the node's state directory."""
    lay.pki.mkdir(parents=True, exist_ok=True)
    for stem, (cn, org) in CLIENTS.items():
        _issue(lay, stem, cn, org)
        _write_json(lay.state / f"{stem}.kubeconfig",
                    kubeconfig(lay.server, lay.ca, lay.pki / f"{stem}.crt", lay.pki / f"{stem}.key", stem))
    _issue(lay, "kubelet-serving", f"system:node:{NODE_NAME}", "system:nodes", ip=NODE_IP, server=True)
    (lay.state / "containerd").mkdir(parents=True, exist_ok=True)
    (lay.state / "containerd.toml").write_text(containerd_config(lay))
    _write_json(lay.state / "cni" / "net.d" / "10-tfk8s.conflist", cni_config(lay))
    _write_json(lay.state / "kubelet.yaml", kubelet_config(lay))  # JSON is YAML
    _write_json(lay.state / "kube-proxy.yaml", kube_proxy_config(lay))
    (lay.state / "Corefile").write_text(corefile(lay))
    for d in ("logs", "pids", "pod-logs", "kubelet", "cni/ipam"):
        (lay.state / d).mkdir(parents=True, exist_ok=True)


def _read_sysctl(name: str) -> str:
    return Path("/proc/sys", name).read_text().strip()


def _write_sysctl(name: str, value: str) -> None:
    Path("/proc/sys", name).write_text(value + "\n")


def network_up(lay: Layout) -> None:
    """The dummy device, the bridge, routes, sysctls and the fence (idempotent)."""
    saved = lay.state / "sysctls.json"
    if not saved.exists():
        _write_json(saved, {k: _read_sysctl(k) for k in SYSCTLS})
    if _run(["ip", "link", "show", DUMMY], check=False).returncode != 0:
        _run(["ip", "link", "add", DUMMY, "type", "dummy"])
    _run(["ip", "addr", "replace", NODE_IP + "/32", "dev", DUMMY])
    _run(["ip", "link", "set", DUMMY, "up"])
    # the bridge exists before the first pod, so its sysctls and the fence apply from the start
    if _run(["ip", "link", "show", BRIDGE], check=False).returncode != 0:
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    _run(["ip", "link", "set", BRIDGE, "up"])
    for r in routes():
        _run(["ip", "route", "replace", *r])
    # the fence goes in before forwarding is switched on
    if _run(["iptables", "-w", "-n", "-L", FENCE_CHAIN], check=False).returncode != 0:
        _run(["iptables", "-w", "-N", FENCE_CHAIN])
    _run(["iptables", "-w", "-F", FENCE_CHAIN])
    for rule in fence_rules(outside_interfaces()):
        _run(["iptables", "-w", *rule])
    for hook in ("FORWARD", "OUTPUT"):
        if _run(["iptables", "-w", "-C", hook, "-j", FENCE_CHAIN], check=False).returncode != 0:
            _run(["iptables", "-w", "-I", hook, "1", "-j", FENCE_CHAIN])
    for k, v in SYSCTLS.items():
        _write_sysctl(k, v)


def network_down(lay: Layout | None, log=print) -> None:
    """Remove what :func:`network_up` and the CNI plugins made; restore the sysctls."""
    state = lay.state if lay else cache_root() / "cluster" / "node"
    saved = state / "sysctls.json"
    if saved.exists():
        for k, v in json.loads(saved.read_text()).items():
            try:
                _write_sysctl(k, v)
            except OSError as e:
                log(f"node: could not restore {k}={v}: {e}")
        saved.unlink()
    for hook in ("FORWARD", "OUTPUT"):
        while _run(["iptables", "-w", "-D", hook, "-j", FENCE_CHAIN], check=False).returncode == 0:
            pass
    _run(["iptables", "-w", "-F", FENCE_CHAIN], check=False)
    _run(["iptables", "-w", "-X", FENCE_CHAIN], check=False)
    for r in routes():
        _run(["ip", "route", "del", *(r[:2] if r[0] == "unreachable" else r[:1])], check=False)
    for dev in (BRIDGE, DUMMY):
        _run(["ip", "link", "del", dev], check=False)
    # the CNI bridge plugin's own masquerade/forward chains (ipMasq false makes none; be sure)
    r = _run(["iptables", "-w", "-t", "nat", "-S"], check=False)
    for line in r.stdout.splitlines():
        if "tfk8s-pods" in line and line.startswith("-A "):
            _run(["iptables", "-w", "-t", "nat", "-D", *line.split()[1:]], check=False)


class Procs:
    """The node's host processes: started with a pid file and a log, stopped by pid."""

    def __init__(self, state: Path):
        self.pids = state / "pids"
        self.logs = state / "logs"

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
        self.pids.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{name}.log", "ab") as log:
            p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, env={**os.environ, **(env or {})})
        (self.pids / f"{name}.pid").write_text(f"{p.pid} {argv[0]}\n")
        return p.pid

    def alive(self, name: str) -> bool:
        pid = self._pid(name)
        return pid is not None and _is(pid, self._exe(name))

    def _pid(self, name: str) -> int | None:
        try:
            return int((self.pids / f"{name}.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _exe(self, name: str) -> str:
        try:
            return (self.pids / f"{name}.pid").read_text().split()[1]
        except (OSError, IndexError):
            return ""

    def stop(self, name: str, grace: float = 10.0) -> None:
        pid, exe = self._pid(name), self._exe(name)
        if pid is not None and _is(pid, exe):
            _kill_wait(pid, grace)
        (self.pids / f"{name}.pid").unlink(missing_ok=True)

    def tail(self, name: str, lines: int = 20) -> str:
        try:
            return "\n".join((self.logs / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _is(pid: int, exe: str) -> bool:
    """Whether ``pid`` still runs ``exe`` (a reused pid is not ours)."""
    try:
        return os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)") == exe
    except OSError:
        return False


def _kill_wait(pid: int, grace: float) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or _zombie(pid):
            return
        time.sleep(0.2)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and not _zombie(pid) and time.monotonic() < deadline:
        time.sleep(0.1)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return True


def _wait(what: str, check, timeout: float, procs: Procs | None = None, name: str = "",
          interval: float = 0.5):
    """Poll ``check`` until it returns a truthy value; fail with the process's log tail."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if procs and name and not procs.alive(name):
            raise SystemExit(f"node: {name} exited while waiting for {what}; its log ends:\n"
                             f"{procs.tail(name)}")
        if time.monotonic() > deadline:
            tail = f"; {name}'s log ends:\n{procs.tail(name)}" if procs and name else ""
            raise SystemExit(f"node: {what} did not happen within {timeout:.0f} s{tail}")
        time.sleep(interval)


def kubectl(lay: Layout, *args: str, stdin: str | None = None, check: bool = True):
    """kubectl (the control plane's own build) with the admin kubeconfig."""
    exe = shutil.which("kubectl", path=str(cache_root() / "bin-k8s")) or _kubectl_from_cache()
    return subprocess.run([exe, "--kubeconfig", str(lay.cluster / "admin.kubeconfig"), *args],
                          input=stdin, capture_output=True, text=True, check=check, timeout=120)


def _kubectl_from_cache() -> str:
    found = sorted(cache_root().glob("**/bin*/kubectl"))
    if not found:
        raise SystemExit("node: no kubectl in the devcluster cache: run scripts/kube up first")
    return str(found[-1])


def ctr(lay: Layout, *args: str, stdin=None, check: bool = True) -> subprocess.CompletedProcess:
    """``ctr`` on the node's containerd, namespace k8s.io (the one the kubelet sees)."""
    return subprocess.run([lay.bin("containerd", "ctr"), "--address", str(lay.containerd_sock),
                           "-n", "k8s.io", *args], stdin=stdin, capture_output=True, check=check)


def import_archive(lay: Layout, archive: Path) -> None:
    """Import a docker-archive into containerd's k8s.io namespace."""
    with open(archive, "rb") as f:
        r = ctr(lay, "images", "import", "--no-unpack=false", "-", stdin=f, check=False)
    if r.returncode != 0:
        raise SystemExit(f"node: ctr images import {archive} failed: {r.stderr.decode().strip()}")


def import_podman_images(lay: Layout, images: list[str], log=print) -> None:
    """Copy podman images into containerd (``podman save --format docker-archive`` -> ``ctr import``)."""
    have = set(ctr(lay, "images", "list", "-q").stdout.decode().split())
    for image in images:
        if image in have:
            continue
        t0 = time.monotonic()
        with tempfile.NamedTemporaryFile(suffix=".tar", dir=lay.state) as tmp:
            r = _run(["podman", "--runtime", "/usr/sbin/runc", "save", "--format", "docker-archive",
                      "-o", tmp.name, image], check=False)
            if r.returncode != 0:
                raise SystemExit(f"node: podman save {image} failed: {r.stderr.strip()}")
            import_archive(lay, Path(tmp.name))
        log(f"node: imported {image} into containerd in {time.monotonic() - t0:.0f} s")


def _node_ready(lay: Layout) -> bool:
    r = kubectl(lay, "get", "node", NODE_NAME, "-o",
                "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False)
    return r.returncode == 0 and r.stdout.strip() == "True"


def _dns_ready() -> bool:
    try:
        with urllib.request.urlopen("http://127.0.0.1:18181/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def up(log=print) -> float:
    """Join this machine to the running control plane as a real node; seconds it took."""
    if os.geteuid() != 0:
        raise SystemExit("node: the real node needs root (containerd, mounts, iptables)")
    t0 = time.monotonic()
    bins = build_all(log=log)
    lay = layout(bins)
    write_configs(lay)
    network_up(lay)
    procs = Procs(lay.state)
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    path = f"{lay.bins['containerd']}:{lay.bins['runc']}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    if not procs.alive("containerd"):
        procs.start("containerd", [lay.bin("containerd", "containerd"), "--config",
                                   str(lay.state / "containerd.toml")], {"PATH": path})
    _wait("containerd's socket", lambda: ctr(lay, "version", check=False).returncode == 0, 60,
          procs, "containerd")
    import_archive(lay, bins["pause"])
    if not procs.alive("kubelet"):
        procs.start("kubelet", [
            lay.bin("kubelet", "kubelet"), "--config", str(lay.state / "kubelet.yaml"),
            "--kubeconfig", str(lay.state / "kubelet.kubeconfig"), "--root-dir", str(lay.kubelet_root),
            "--hostname-override", NODE_NAME, "--node-ip", NODE_IP, "--v", "1"], {"PATH": path})
    if not procs.alive("kube-proxy"):
        procs.start("kube-proxy", [lay.bin("kubelet", "kube-proxy"), "--config",
                                   str(lay.state / "kube-proxy.yaml"), "--v", "1"], {"PATH": path})
    kubectl(lay, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                                       "items": dns_objects()}))
    if not procs.alive("coredns"):
        procs.start("coredns", [lay.bin("coredns", "coredns"), "-conf", str(lay.state / "Corefile")])
    _wait("CoreDNS ready", _dns_ready, 60, procs, "coredns")
    _wait(f"node {NODE_NAME} Ready", lambda: _node_ready(lay), 180, procs, "kubelet", interval=1)
    took = time.monotonic() - t0
    log(f"node: {NODE_NAME} Ready in {took:.1f} s (containerd, kubelet, kube-proxy, CoreDNS)")
    return took


def _mounts_under(prefixes: list[str]) -> list[str]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4].replace("\\040", " ")
        if any(target == p or target.startswith(p.rstrip("/") + "/") for p in prefixes):
            out.append(target)
    return sorted(out, key=len, reverse=True)  # deepest first


def _shim_pids(lay_bins: Path | None) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            exe = os.readlink(d / "exe")
        except OSError:
            continue
        if exe.endswith("/containerd-shim-runc-v2") and (lay_bins is None or exe.startswith(str(lay_bins))):
            out.append(int(d.name))
    return out


def down(log=print) -> None:
    """Stop the node and remove every process, mount, netns, iptables rule and route it made."""
    state = cache_root() / "cluster" / "node"
    procs = Procs(state)
    containerd_bin = None
    try:
        containerd_bin = builds(versions())["containerd"].bin_dir(cache_root())
    except (KeyError, OSError):
        pass
    lay = None
    if (cache_root() / "cluster" / "admin.kubeconfig").is_file() and containerd_bin and containerd_bin.exists():
        try:
            lay = layout({k: b.bin_dir(cache_root()) for k, b in builds(versions()).items()})
        except SystemExit:
            lay = None
    for name in ("coredns", "kube-proxy", "kubelet"):
        procs.stop(name)
    if lay and procs.alive("containerd"):
        # every pod's containers and sandboxes: kill the tasks, then containerd tears down the netns
        tasks = ctr(lay, "tasks", "list", "-q", check=False).stdout.decode().split()
        for t in tasks:
            ctr(lay, "tasks", "kill", "-s", "SIGKILL", t, check=False)
        deadline = time.monotonic() + 30
        for t in tasks:
            while time.monotonic() < deadline and ctr(lay, "tasks", "delete", t, check=False).returncode != 0:
                time.sleep(0.5)
        for c in ctr(lay, "containers", "list", "-q", check=False).stdout.decode().split():
            ctr(lay, "containers", "delete", c, check=False)
    procs.stop("containerd")
    for pid in _shim_pids(containerd_bin):
        _kill_wait(pid, 5)
    # network namespaces the CNI made for pods (containerd names them cni-<uuid>)
    for ns in Path("/var/run/netns").glob("cni-*") if Path("/var/run/netns").exists() else []:
        _run(["ip", "netns", "del", ns.name], check=False)
    if lay:
        # kube-proxy's chains, by kube-proxy itself
        _run([lay.bin("kubelet", "kube-proxy"), "--cleanup", "--config", str(state / "kube-proxy.yaml")],
             check=False, timeout=60)
    for m in _mounts_under([str(state), str(RUN_DIR)]):
        r = _run(["umount", m], check=False)
        if r.returncode != 0:
            _run(["umount", "-l", m], check=False)
    network_down(lay, log=log)
    for link in os.listdir("/sys/class/net"):
        if link.startswith("veth") and (Path("/sys/class/net") / link / "master").exists():
            if os.path.basename(os.readlink(Path("/sys/class/net") / link / "master")) == BRIDGE:
                _run(["ip", "link", "del", link], check=False)
    for results in Path("/var/lib/cni/results").glob("tfk8s-pods-*") if Path("/var/lib/cni/results").exists() else []:
        results.unlink()
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    # the runtime state goes; the certificates and the image store stay (a second up is fast)
    for d in ("kubelet", "cni/ipam", "pod-logs", "pids"):
        shutil.rmtree(state / d, ignore_errors=True)
    log("node: down")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build")
    sub.add_parser("up")
    sub.add_parser("down")
    imp = sub.add_parser("import")
    imp.add_argument("images", nargs="+")
    a = p.parse_args(argv)
    if a.cmd == "build":
        build_all()
    elif a.cmd == "up":
        up()
    elif a.cmd == "down":
        down()
    elif a.cmd == "import":
        import_podman_images(layout(), a.images)
    return 0


if __name__ == "__main__":
    sys.exit(main())
