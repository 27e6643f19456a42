"""How one real node exists: its directories, configuration, processes, and how it goes away.

A node is containerd (+ runc), a kubelet, kube-proxy and a node-local DNS cache, every one of them
started inside the node's network namespace (``nsenter --net``, the mount namespace stays the
host's so the kubelet and containerd see the same mounts). Each node has its own:

- directory ``<cluster>/nodes/<name>`` (certificates' kubeconfigs, configs, logs, the kubelet's
  ``--root-dir``, pod logs, CNI state) and run directory ``/run/tfk8s-rn/<netns>`` (sockets,
  containerd's state, runc's state, the pods' network namespaces);
- containerd root (the image store) ``<cache>/nodes-images/<netns>``, kept across clusters (the
  same slot's next cluster finds its images there);
- cgroup root ``/<netns>`` in every cgroup hierarchy (two kubelets sharing ``/kubepods`` kill
  each other's pods);
- ports (each listens in its own network namespace, so the defaults never clash) and pod range.

The pod network is pluggable: :func:`cni_config` writes Debian's bridge + host-local plugins into
``cni/net.d`` of the node; a NetworkPolicy enforcer may replace that file or add a plugin to it
before the kubelet starts (``Node.cni_dir``).

Only this node's processes are ever stopped: those recorded in its directory, the processes in its
network namespace (containerd's shims outlive containerd) and those in its cgroup root (the
containers).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from . import dns, registry
from .network import LOCAL_DNS_IP, NodeNet, pids_in
from .procs import Procs
from .versions import cache_root

CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins
PAUSE_IMAGE = "localhost/tfk8s/pause:3.10-tfk8s"
RUN_ROOT = Path("/run/tfk8s-rn")  # sockets and containerd's state: short paths, gone at reboot
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROCESSES = ("containerd", "kubelet", "kube-proxy", "nodelocaldns")


class NodeError(RuntimeError):
    """A real node could not be started; the message says what failed and what to do."""


@dataclass(frozen=True)
class Node:
    """Real node ``net.index`` of the cluster in ``cluster``: where it keeps everything."""

    net: NodeNet
    cluster: Path  # the control plane's state dir (pki/, admin.kubeconfig)
    bins: dict[str, Path]  # component -> its cache directory
    server: str  # the API server's URL as the node reaches it (the host's end of the node bridge)

    @property
    def name(self) -> str:
        """The Kubernetes node name."""
        return self.net.name

    @property
    def state(self) -> Path:
        """The node's own directory in the cluster's."""
        return self.cluster / "nodes" / self.name

    @property
    def run(self) -> Path:
        """The node's run directory (sockets, containerd's and runc's state)."""
        return RUN_ROOT / self.net.netns

    @property
    def pki(self) -> Path:
        """The cluster's certificates (the node's are issued there too)."""
        return self.cluster / "pki"

    @property
    def ca(self) -> Path:
        """The cluster CA: the API server's and the kubelet's client CA."""
        return self.pki / "ca.crt"

    @property
    def containerd_sock(self) -> Path:
        """containerd's socket."""
        return self.run / "containerd.sock"

    @property
    def kubelet_root(self) -> Path:
        """The kubelet's --root-dir (pods' volumes are mounted under it)."""
        return self.state / "kubelet"

    @property
    def images(self) -> Path:
        """containerd's root: the node's image store, kept across clusters (imports are slow)."""
        return cache_root() / "nodes-images" / self.net.netns

    @property
    def cni_dir(self) -> Path:
        """The CNI configuration directory containerd reads (one file: the pod network)."""
        return self.state / "cni" / "net.d"

    @property
    def cni_bin_dirs(self) -> list[str]:
        """Where containerd looks for CNI plugins: Debian's, and the enforcer's when it is built."""
        return [CNI_BIN_DIR, *([str(self.bins["cilium"])] if "cilium" in self.bins else [])]

    @property
    def cgroup(self) -> str:
        """The kubelet's cgroupRoot (pods live below it)."""
        return f"/{self.net.netns}"

    @property
    def procs(self) -> Procs:
        """The node's processes (pid records and logs in its directory)."""
        return Procs(self.state)

    def bin(self, component: str, binary: str) -> str:
        """The path of one cached binary."""
        return str(self.bins[component] / binary)


# -- configuration (pure) -----------------------------------------------------------------------


def containerd_config(node: Node) -> str:
    """containerd's config (version 3): CRI with runc, cgroupfs, the pinned pause image, CNI."""
    q = json.dumps
    return f"""\
# Written by devcluster/nodes.py: the containerd of {node.name}.
version = 3
root = {q(str(node.images))}
state = {q(str(node.run / "containerd"))}

[grpc]
  address = {q(str(node.containerd_sock))}

[ttrpc]
  address = ""

[debug]
  address = ""

[metrics]
  address = ""

[plugins]
  [plugins.'io.containerd.nri.v1.nri']
    # its socket is a fixed machine-wide path: another containerd on this machine owns it
    disable = true

  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'

    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = {q(PAUSE_IMAGE)}

    # hosts.toml per registry name, read at each pull (devcluster/registry.py writes the cluster's)
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = {q(str(registry.hosts_dir(node.cluster)))}

  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    # this VM refuses a negative oom_score_adj even to root: never ask for one below ours
    restrict_oom_score_adj = true
    # the pods' network namespaces under the state dir, not the machine's /var/run/netns
    netns_mounts_under_state_dir = true

    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'

      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'

        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = {q(node.bin("runc", "runc"))}
          Root = {q(str(node.run / "runc"))}
          SystemdCgroup = false

    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = {q(node.cni_bin_dirs)}
      conf_dir = {q(str(node.cni_dir))}
      max_conf_num = 1

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
"""


def cni_config(node: Node) -> dict:
    """The pod network: Debian's bridge + host-local plugins on the node's range, no masquerade."""
    return {
        "cniVersion": "1.0.0",
        "name": node.net.netns,  # libcni's result cache (/var/lib/cni) is keyed by it
        "plugins": [
            {
                "type": "bridge",
                "bridge": "tfk8s-pods",
                "isGateway": True,
                "ipMasq": False,  # pod traffic crosses nodes by routes, never translated
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": node.net.pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(node.state / "cni" / "ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(node: Node) -> dict:
    """The kubelet's KubeletConfiguration for this VM (cgroup v1, no systemd, no swap rule)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # Kubernetes 1.35 made cgroup v1 fatal by default; this VM has only cgroup v1
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": node.cgroup,
        "failSwapOn": False,
        "address": node.net.ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",  # the node's own loopback (its namespace's)
        "healthzPort": 10248,
        "tlsCertFile": str(node.pki / f"{node.name}-serving.crt"),
        "tlsPrivateKeyFile": str(node.pki / f"{node.name}-serving.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(node.ca)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{node.containerd_sock}",
        # never collect images (they cannot be pulled back) and never evict for disk: every node
        # sees the whole machine's disk
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
        "clusterDNS": [LOCAL_DNS_IP],  # the node-local cache (devcluster/dns.py)
        "clusterDomain": dns.CLUSTER_DOMAIN,
        "podLogsDir": str(node.state / "pod-logs"),
        "staticPodPath": "",
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "protectKernelDefaults": False,
        "maxPods": 110,
    }


def kube_proxy_config(node: Node, cluster_cidr: str) -> dict:
    """kube-proxy in iptables mode (this kernel has no IPVS and no NFT_QUEUE); conntrack as is."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(node.state / "kube-proxy.kubeconfig")},
        "hostnameOverride": node.name,
        "clusterCIDR": cluster_cidr,
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # NodePorts only on the node's own address
        "nodePortAddresses": [node.net.ip + "/32"],
        # as k3s does: leave the host's conntrack sysctls alone
        "conntrack": {"maxPerCore": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def kubeconfig(server: str, ca: Path, cert: Path, key: Path, user: str) -> dict:
    """A kubeconfig naming files; the API server's certificate is checked for ``localhost``."""
    return api_kubeconfig(server, ca, user, {"client-certificate": str(cert), "client-key": str(key)})


def api_kubeconfig(server: str, ca: Path, user: str, credentials: dict) -> dict:
    """A kubeconfig of ``user`` with ``credentials`` (file names: a client certificate and key, or a
    ``tokenFile``); the API server's certificate is checked against ``ca`` for ``localhost``."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "default",
        "clusters": [
            {
                "name": "devcluster",
                "cluster": {
                    "server": server,
                    "certificate-authority": str(ca),
                    "tls-server-name": "localhost",
                },
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "default", "context": {"cluster": "devcluster", "user": user}}],
    }


def clients(node: Node) -> dict[str, tuple[str, str | None]]:
    """The node's client certificates: kubeconfig stem -> (CN, O)."""
    return {
        "kubelet": (f"system:node:{node.name}", "system:nodes"),  # what the Node authorizer expects
        "kube-proxy": ("system:kube-proxy", None),  # bound by system:node-proxier
    }


def argv(node: Node, name: str) -> list[str]:
    """The command line of one of the node's processes (run inside its namespace, :func:`start`)."""
    s = node.state
    return {
        "containerd": [node.bin("containerd", "containerd"), "--config", str(s / "containerd.toml")],
        "kubelet": [
            node.bin("kubelet", "kubelet"),
            "--config", str(s / "kubelet.yaml"),
            "--kubeconfig", str(s / "kubelet.kubeconfig"),
            "--root-dir", str(node.kubelet_root),
            "--hostname-override", node.name,
            "--node-ip", node.net.ip,
            "--v", "1",
        ],
        "kube-proxy": [node.bin("kubelet", "kube-proxy"), "--config", str(s / "kube-proxy.yaml"), "--v", "1"],
        "nodelocaldns": [node.bin("coredns", "coredns"), "-conf", str(s / "Corefile.local")],
    }[name]  # fmt: skip


# -- performing ---------------------------------------------------------------------------------


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def write_configs(node: Node, ca, cluster_cidr: str) -> None:
    """Certificates (signed by the cluster CA ``ca``), kubeconfigs and config files of the node."""
    for stem, (cn, org) in clients(node).items():
        crt, key = ca.issue(f"{node.name}-{stem}", cn, org=org, client=True)
        _write_json(node.state / f"{stem}.kubeconfig", kubeconfig(node.server, node.ca, crt, key, stem))
    ca.issue(
        f"{node.name}-serving",
        f"system:node:{node.name}",
        org="system:nodes",
        server=True,
        dns=(node.name,),
        ips=(node.net.ip,),
    )
    (node.state / "containerd.toml").write_text(containerd_config(node))
    _write_json(node.cni_dir / "10-tfk8s.conflist", cni_config(node))
    _write_json(node.state / "kubelet.yaml", kubelet_config(node))  # JSON is YAML
    _write_json(node.state / "kube-proxy.yaml", kube_proxy_config(node, cluster_cidr))
    (node.state / "Corefile.local").write_text(dns.local_corefile(node.net))
    for d in ("pod-logs", "kubelet", "cni/ipam"):
        (node.state / d).mkdir(parents=True, exist_ok=True)
    node.images.mkdir(parents=True, exist_ok=True)
    node.run.mkdir(parents=True, exist_ok=True)


def _hierarchies() -> list[Path]:
    return [p for p in sorted(CGROUP_ROOT.iterdir()) if p.is_dir() and not p.is_symlink()]


def make_cgroup_root(node: Node) -> None:
    """The kubelet's cgroupRoot in every hierarchy (the kubelet refuses one that does not exist)."""
    for h in _hierarchies():
        d = h / node.cgroup.lstrip("/")
        d.mkdir(exist_ok=True)
        for f in ("cpuset.cpus", "cpuset.mems"):  # a cpuset cgroup takes no task until both are set
            if (d / f).exists() and not (d / f).read_text().strip():
                (d / f).write_text((h / f).read_text())


def cgroup_pids(node: Node) -> list[int]:
    """Every process in the node's cgroup root (its containers)."""
    out: set[int] = set()
    for h in _hierarchies():
        root = h / node.cgroup.lstrip("/")
        if root.is_dir():
            for procs in root.rglob("cgroup.procs"):
                try:
                    out.update(int(p) for p in procs.read_text().split())
                except OSError:
                    pass
    return sorted(out)


def remove_cgroup_root(node: Node) -> None:
    """Remove the node's cgroups, deepest first (they are empty once its processes are gone)."""
    for h in _hierarchies():
        root = h / node.cgroup.lstrip("/")
        if root.is_dir():
            for d in sorted(
                (p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
            ):
                try:
                    d.rmdir()
                except OSError:
                    pass
            try:
                root.rmdir()
            except OSError:
                pass


def start(node: Node, name: str, env: dict[str, str]) -> int:
    """Start one of the node's processes inside its network namespace; its pid."""
    return node.procs.start(
        name, ["nsenter", f"--net={node.net.netns_path}", "--", *argv(node, name)], env=env
    )


def kill(pids: list[int]) -> None:
    """SIGKILL ``pids`` and wait (up to 10 s) until they are gone."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.1)


def ctr(node: Node, *args: str, stdin=None, check: bool = True) -> subprocess.CompletedProcess:
    """``ctr`` on the node's containerd, namespace k8s.io (the one the kubelet sees)."""
    r = subprocess.run(
        [node.bin("containerd", "ctr"), "--address", str(node.containerd_sock), "-n", "k8s.io", *args],
        stdin=stdin,
        capture_output=True,
    )
    if check and r.returncode:
        raise NodeError(
            f"ctr {' '.join(args)} on {node.name} failed: {r.stderr.decode(errors='replace').strip()}"
        )
    return r


def mounts_under(prefixes: list[str]) -> list[str]:
    """The mount points at or below ``prefixes``, deepest first."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4].replace("\\040", " ")
        if any(target == p or target.startswith(p.rstrip("/") + "/") for p in prefixes):
            out.append(target)
    return sorted(set(out), key=len, reverse=True)


def stop(node: Node) -> None:
    """Stop every process of the node and undo its mounts and cgroups (not its network)."""
    procs = node.procs
    for name in ("nodelocaldns", "kube-proxy", "kubelet"):
        procs.stop(name)
    if procs.alive("containerd"):
        # every container and sandbox: kill the tasks; removing them lets containerd tear down their netns
        tasks = ctr(node, "tasks", "list", "-q", check=False).stdout.decode().split()
        for t in tasks:
            ctr(node, "tasks", "kill", "-s", "SIGKILL", t, check=False)
        deadline = time.monotonic() + 30
        for t in tasks:
            while time.monotonic() < deadline and ctr(node, "tasks", "delete", t, check=False).returncode:
                time.sleep(0.3)
    procs.stop("containerd")
    kill(sorted(set(pids_in(node.net)) | set(cgroup_pids(node))))  # shims, containers: this node's only
    for m in mounts_under([str(node.state), str(node.run), str(node.images)]):
        if subprocess.run(["umount", m], capture_output=True).returncode:
            subprocess.run(["umount", "-l", m], capture_output=True)
    remove_cgroup_root(node)
    results = Path("/var/lib/cni/results")
    for f in results.glob(f"{node.net.netns}-*") if results.is_dir() else []:
        f.unlink()


def running(node: Node) -> bool:
    """True when every process of the node runs."""
    return all(node.procs.alive(n) for n in PROCESSES)
