"""The test cluster's real nodes (tier 2): several nodes on this machine, each in its own network namespace.

``scripts/kube up --pods`` starts the control plane (:mod:`devcluster.cluster`) and then :func:`up`
joins :data:`NODE_COUNT` real nodes to it; ``scripts/kube down`` calls :func:`down` first. The
pieces, one module each:

- :mod:`devcluster.network`: the host bridge, one network namespace per node, routes, the fence;
- :mod:`devcluster.nodes`: how one node exists (containerd, runc, a kubelet, kube-proxy; its
  directories, cgroup root, configuration; stopping only its own processes);
- :mod:`devcluster.dns`: CoreDNS on the host and a node-local cache in every node;
- :mod:`devcluster.images`: the pause image and the lab's images, from podman into each node;
- :mod:`devcluster.registry`: the cluster's image registry, which every node reaches through the
  slot's host address and pulls from with a pod's image pull Secret.

Everything runs as host processes (there is no systemd here); a node's processes, logs and
configuration live in ``<cluster dir>/nodes/<node>``. Several cluster directories may run real
nodes at once: each takes a free slot (:class:`devcluster.network.Slot`), which names every
machine-wide device, namespace, chain and range its nodes make, and ``down`` removes only its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

from . import build, dns, enforcer, network, registry
from .images import (  # noqa: F401 - the image API the tests and scripts use
    LAB_IMAGES,
    _marker,
    build_pause,
    clone_store,
    containerd_images,
    image_targets,
    import_archive,
    import_podman_images,
    in_sync,
    pause_image_tar,
    podman_image_id,
    remove_image,
    stale_records,
    superseded,
)
from .network import (  # noqa: F401 - the fence's names, for the tests that watch it
    FENCE_HOOK,
    FENCE_TABLE,
    LOCAL_RANGES,
    POD_RANGE,
    SERVICE_CIDR,
    SLOTS,
    Slot,
    fence_rules,
    outside_interfaces,
)
from .nodes import (  # noqa: F401
    CNI_BIN_DIR,
    RUN_ROOT,
    Node,
    NodeError,
    cni_config,
    ctr,
    make_cgroup_root,
    start,
    write_configs,
)
from .pki import CA
from .procs import Procs
from .versions import cache_root  # noqa: F401

NODE_COUNT = int(os.environ.get("TFK8S_KUBE_REAL_NODES", "2"))
NODE_NAMES = tuple(f"tfk8s-node-{i}" for i in range(1, NODE_COUNT + 1))
NODE_NAME = NODE_NAMES[0]  # the first real node
#: sysctls the kubelets set on their own (machine-wide ones): saved before they start, restored by ``down``
RESTORED = ("kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory")
#: machine-wide limits several kubelets and containerds exhaust (kind's known issues): raised to at
#: least these by ``up``, restored by ``down``
RAISED = {"fs/inotify/max_user_instances": 512, "fs/inotify/max_user_watches": 524288}


def bins() -> dict[str, Path]:
    """Build (or find) the node's components; component -> its cache directory."""
    return {name: build.ensure(name).dir for name in build.TIER2}


def _base(cluster) -> Path:
    return cluster.root / "nodes"


def _api_port(cluster) -> int:
    return int(cluster.server.rsplit(":", 1)[1])


def _nodes(cluster, dirs: dict[str, Path], slot: Slot, count: int) -> list[Node]:
    server = f"https://{slot.host_ip}:{_api_port(cluster)}"
    return [Node(net, cluster.root, dirs, server) for net in slot.nodes(count)]


def _recorded(cluster) -> tuple[Slot, int] | None:
    """The slot and node count ``up`` recorded for ``cluster`` (None before it took a slot)."""
    try:
        rec = json.loads((_base(cluster) / "nodes.json").read_text())
        return Slot(rec["slot"]), rec["count"]
    except (OSError, ValueError, KeyError):
        return None


def slot_of(cluster) -> Slot:
    """The slot of ``cluster``'s running real nodes (its bridge, host address and fence chain)."""
    rec = _recorded(cluster)
    if rec is None:
        raise NodeError(
            f"the cluster in {cluster.root} has no real nodes: start them with scripts/kube up --pods"
        )
    return rec[0]


def layouts(cluster) -> list[Node]:
    """The running cluster's real nodes (where their sockets, state and binaries are)."""
    slot, count = _recorded(cluster) or (None, 0)
    return _nodes(cluster, bins(), slot, count) if slot else []


def layout(cluster) -> Node:
    """The first real node."""
    return layouts(cluster)[0]


def import_images(cluster, images: tuple[str, ...], log=print) -> list[str]:
    """:func:`import_podman_images` into every real node of ``cluster`` (for a test's own images)."""
    if not running(cluster):
        raise NodeError(
            f"the real nodes of {cluster.root} are not running: start them with scripts/kube up --pods"
        )
    return import_podman_images(layouts(cluster), images, log)


def _wait(what: str, check, timeout: float, procs: Procs, name: str, interval: float = 0.5) -> None:
    """Poll ``check`` until truthy; fail with the process's last lines if it exits or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except (OSError, subprocess.SubprocessError, NodeError, urllib.error.URLError):
            pass
        if not procs.alive(name):
            raise NodeError(f"{name} exited while waiting for {what}; its last lines:\n{procs.tail(name)}")
        if time.monotonic() > deadline:
            raise NodeError(
                f"{what} did not happen within {timeout:.0f} s; {name}'s last lines:\n{procs.tail(name)}"
            )
        time.sleep(interval)


def _node_ready(cluster, name: str) -> bool:
    r = cluster.kubectl(
        "get", "node", name, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False
    )
    return r.returncode == 0 and r.stdout.strip() == "True"


def _cache_answers(node: Node) -> bool:
    """A real query through the node's cache, from inside the node: cache -> kube-dns -> CoreDNS."""
    code = (
        "import sys; from devcluster.dns import query; "
        f"sys.exit(0 if query({network.LOCAL_DNS_IP!r}, 'kubernetes.default.svc.cluster.local') == "
        f"[{network.API_SERVICE_IP!r}] else 1)"
    )
    r = subprocess.run(
        ["nsenter", f"--net={node.net.netns_path}", "--", sys.executable, "-c", code],
        capture_output=True,
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent)),
        timeout=20,
    )
    return r.returncode == 0


def _sysctl(name: str, value: str | None = None) -> str:
    path = Path("/proc/sys", name)
    if value is not None:
        path.write_text(value + "\n")
    return path.read_text().strip()


def _owner(slot: Slot) -> str | None:
    """The cluster directory whose real nodes hold ``slot``, if any."""
    try:
        return (RUN_ROOT / f"slot-{slot.k}").read_text().strip() or None
    except OSError:
        return None


def _take_slot(cluster) -> Slot:
    """The slot ``cluster`` recorded, else the first one no running cluster holds (claimed here)."""
    rec = _recorded(cluster)
    if rec and _owner(rec[0]) == str(cluster.root):
        return rec[0]
    RUN_ROOT.mkdir(parents=True, exist_ok=True)
    for k in SLOTS:
        slot = Slot(k)
        owner = _owner(slot)
        if (
            owner
            and (owner == str(cluster.root) or not running_in(Path(owner)))
            and not network.slot_in_use(slot)
        ):
            (RUN_ROOT / f"slot-{k}").write_text(str(cluster.root))  # a dead cluster's: ours now
            return slot
        if owner is None and not network.slot_in_use(slot):
            try:
                fd = os.open(RUN_ROOT / f"slot-{k}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue  # another cluster took it just now
            with os.fdopen(fd, "w") as f:
                f.write(str(cluster.root))
            return slot
    held = ", ".join(f"{k}: {_owner(Slot(k))}" for k in SLOTS)
    raise NodeError(
        f"every slot for real nodes on this machine is held ({held}): stop one (scripts/kube down)"
    )


def _containerd(n: Node, env: dict[str, str], pause: Path) -> None:
    start(n, "containerd", {**env, **enforcer.cni_env(n)})  # it runs the enforcer's CNI plugin
    _wait(
        f"containerd of {n.name}",
        lambda: ctr(n, "version", check=False).returncode == 0,
        60,
        n.procs,
        "containerd",
    )
    import_archive(n, pause)


def up(cluster, log=print, count: int = NODE_COUNT) -> float:
    """Join ``count`` real nodes to ``cluster`` (running); the seconds it took.

    On a failure half-way, everything started so far is removed again (:func:`down`).
    """
    if os.geteuid() != 0:
        raise NodeError("the real nodes need root (containerd, mounts, iptables): run scripts/kube as root")
    if count < 1:
        raise NodeError(f"at least one real node is needed, not {count}")
    for tool in ("iptables", "ip", "podman", "nsenter"):
        if not shutil.which(tool):
            raise NodeError(f"{tool} is missing: run scripts/bootstrap kube-node")
    if not Path(CNI_BIN_DIR, "bridge").is_file():
        raise NodeError(f"the CNI plugins are missing in {CNI_BIN_DIR}: run scripts/bootstrap kube-node")
    t_build = time.monotonic()
    dirs = bins()
    pause = build_pause(log)
    t0 = time.monotonic()
    if t0 - t_build > 1:
        log(f"devcluster: node binaries ready in {t0 - t_build:.0f} s")
    base = _base(cluster)
    base.mkdir(parents=True, exist_ok=True)
    slot = _take_slot(cluster)
    (base / "nodes.json").write_text(json.dumps({"count": count, "slot": slot.k}))
    nodes = _nodes(cluster, dirs, slot, count)
    dns_procs = Procs(base)
    env = {"PATH": f"{dirs['containerd']}:{dirs['runc']}:/usr/sbin:/usr/bin:/sbin:/bin"}
    try:
        saved = base / "sysctls.json"
        if not saved.exists():
            keys = (*RESTORED, *RAISED)
            saved.write_text(json.dumps({k: _sysctl(k) for k in keys if Path("/proc/sys", k).exists()}))
        for k, v in RAISED.items():
            if int(_sysctl(k)) < v:
                _sysctl(k, str(v))
        # the registry first: its certificate and the nodes' hosts.toml name the slot's host address,
        # whose DNAT takes its port to 127.0.0.1 as the API server's
        try:
            reg = registry.up(cluster, node_ip=slot.host_ip, log=log)
        except registry.RegistryError as e:
            raise NodeError(f"the image registry did not start: {e}") from e
        network.host_up(slot, _api_port(cluster), also=(reg.port,))
        cluster.apply([network.api_endpoints(slot, _api_port(cluster))])
        ca = CA(cluster.root / "pki")
        # the cluster's CoreDNS, on the host
        crt, key = ca.issue("coredns", dns.COREDNS_CLIENT, client=True)
        kc = base / "coredns.kubeconfig"
        kc.write_text(json.dumps(nodes_kubeconfig(cluster, crt, key)))
        (base / "Corefile").write_text(dns.corefile(slot.host_ip, str(kc)))
        cluster.apply(dns.objects(slot.host_ip))
        dns_procs.start(
            "coredns", [str(dirs["coredns"] / "coredns"), "-conf", str(base / "Corefile")], env=env
        )
        all_nets = [n.net for n in nodes]
        for n in nodes:
            network.node_up(n.net, all_nets)
            write_configs(n, ca, POD_RANGE)
            # the enforcer's CNI plugin, chained after the pod network
            (n.cni_dir / "10-tfk8s.conflist").write_text(
                json.dumps(enforcer.chained(cni_config(n), n), indent=2)
            )
            make_cgroup_root(n)
        # the images go into the first node; every other node's store is a clone of its store
        first, others = nodes[0], nodes[1:]
        t_img = time.monotonic()
        _containerd(first, env, pause)
        imported = import_podman_images([first], LAB_IMAGES, log)
        stale = [n for n in others if not in_sync(first, n)]
        if stale:
            first.procs.stop("containerd")
            for n in stale:
                t1 = time.monotonic()
                clone_store(first, n)
                took = time.monotonic() - t1
                log(f"devcluster: the image store of {n.name} cloned from {first.name} in {took:.1f} s")
            _containerd(first, env, pause)
        for n in others:
            _containerd(n, env, pause)
        t_img = time.monotonic() - t_img
        for n in nodes:
            for name in ("kubelet", "kube-proxy", "nodelocaldns"):
                start(n, name, env)
        t_enf = enforcer.up(cluster, nodes, log)
        _wait("CoreDNS ready", lambda: dns.ready(slot.host_ip), 60, dns_procs, "coredns")
        for n in nodes:
            _wait(
                f"the DNS cache of {n.name} ready",
                lambda n=n: dns.ready(n.net.ip),
                60,
                n.procs,
                "nodelocaldns",
            )
            _wait(
                f"node {n.name} Ready", lambda n=n: _node_ready(cluster, n.name), 240, n.procs, "kubelet", 1
            )
            _wait(
                f"a name resolved through the DNS cache of {n.name}",
                lambda n=n: _cache_answers(n),
                60,
                n.procs,
                "nodelocaldns",
                1,
            )
    except BaseException:
        down(cluster, log=lambda *_: None)
        raise
    took = time.monotonic() - t0
    log(
        f"devcluster: {count} real node(s) Ready in {took:.1f} s ({', '.join(n.name for n in nodes)}; "
        f"image imports {t_img:.0f} s; Cilium {t_enf:.0f} s; images: {', '.join(imported) or 'none'})"
    )
    return took


def nodes_kubeconfig(cluster, crt: Path, key: Path) -> dict:
    """CoreDNS's kubeconfig: it runs on the host, so it reaches the API server on 127.0.0.1."""
    from .nodes import kubeconfig

    return kubeconfig(cluster.server, cluster.root / "pki" / "ca.crt", crt, key, "coredns")


def down(cluster, log=print) -> None:
    """Stop every real node and remove every process, mount, namespace, cgroup, rule and route they made
    (and the slot's SSO host, :func:`devcluster.network.sso_down`).

    Only the cluster that started the nodes removes them (the devices, rules and namespaces are the
    machine's, and another cluster directory may own them); only processes of this cluster's nodes
    are stopped (see :func:`devcluster.nodes.stop`).
    """
    from .nodes import stop

    base = _base(cluster)
    rec = _recorded(cluster)
    if not base.is_dir() or rec is None or _owner(rec[0]) != str(cluster.root):
        shutil.rmtree(base, ignore_errors=True)  # nothing of the machine's is ours
        return
    slot, count = rec
    dirs = {n: build.COMPONENTS[n].dir for n in build.TIER2}
    nodes = _nodes(cluster, dirs, slot, count)
    enforcer.down(nodes)
    for n in nodes:
        stop(n)
    Procs(base).stop("coredns")
    network.sso_down(slot)  # the SSO host (its Dex, a process of the cluster's, was stopped before)
    for n in nodes:
        network.node_down(n.net)
        shutil.rmtree(n.run, ignore_errors=True)
    network.host_down(slot)
    saved = base / "sysctls.json"
    if saved.exists():
        for k, v in json.loads(saved.read_text()).items():
            try:
                _sysctl(k, v)
            except OSError as e:
                log(f"devcluster: could not restore the sysctl {k}={v}: {e}")
    (RUN_ROOT / f"slot-{slot.k}").unlink(missing_ok=True)
    shutil.rmtree(base, ignore_errors=True)
    log("devcluster: real nodes down")


def running(cluster) -> bool:
    """True when every process of every real node (and the cluster's CoreDNS) runs."""
    return running_in(cluster.root)


def running_in(cluster_root: Path) -> bool:
    """True when every process of the real nodes of the cluster in ``cluster_root`` runs."""
    from .nodes import PROCESSES

    base = cluster_root / "nodes"
    dirs = sorted(base.glob("tfk8s-node-*"))
    return (
        bool(dirs)
        and Procs(base).alive("coredns")
        and all(Procs(d).alive(p) for d in dirs for p in PROCESSES)
    )


def status(cluster) -> dict[str, dict[str, bool]]:
    """Each real node's processes (and the cluster's CoreDNS): running or not."""
    base = _base(cluster)
    out = {"dns": {"coredns": Procs(base).alive("coredns")}} if base.is_dir() else {}
    for d in sorted(base.glob("tfk8s-node-*")):
        procs = Procs(d)
        out[d.name] = {n: procs.alive(n) for n in procs.names()}
    return out


def node_procs(cluster, name: str) -> Procs:
    """The processes of real node ``name`` (a fault test stops its kubelet with it)."""
    return Procs(_base(cluster) / name)
