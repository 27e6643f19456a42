"""One user with many clusters on the REAL API server: ``%tfcluster list`` and the sidebar's pass.

    scripts/kube up && .venv/bin/python bench/k8s_many_clusters.py [--clusters 50] [--tasks 4]

Two user namespaces, bootstrapped as the hub does it, each with the user's own ServiceAccount
token (a notebook's identity): one holds one running cluster (the baseline: the latency the lab
has with one), the other ``--clusters``; the clusters run on kwok nodes. A fresh backend is
measured in one namespace then in the other, ``--rounds`` times, so the load of a shared machine
weighs on both alike:

- ``list`` cold: a new backend's first ``list_clusters()`` (what ``%tfcluster list`` costs in a
  fresh kernel: the cluster records are listed and the namespace's two watches start, listing
  the JobSets and task pods once);
- ``list`` warm: ``list_clusters()`` again on that backend (the records are listed; the JobSets
  and task pods come from the watches);
- the sidebar's discovery pass (:meth:`ClusterMonitor.discover`: the listing, a row per cluster,
  a watch per running cluster), the first pass and the passes after it (while the watches the
  first pass started run in the same process, as in the Jupyter server).

Beside the wall-clock figures, the CPU time of the calling thread in a warm listing and a pass
(which the other processes of a loaded machine do not inflate). The last line:
``N clusters: list cold X ms (R x), warm Y ms (R x); sidebar pass Z ms (R x), first ...; CPU: ...``,
ratios against the one-cluster baseline. Everything it makes is deleted at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "hub_config")]

from k8s_scale import remove_nodes, running  # noqa: E402

from devcluster.cluster import Cluster, fake_node  # noqa: E402
from tests.realkube import RealKube, wait_for  # noqa: E402
from tfk8s_magics.backends.kubernetes import KubernetesBackend  # noqa: E402
from tfk8s_magics.sidebar.monitor import ClusterMonitor  # noqa: E402
from tfk8s_magics.spec import ClusterSpec  # noqa: E402


def timed(fn, cpu: list[float] | None = None) -> float:
    """Milliseconds ``fn()`` took (and, into ``cpu``, the CPU milliseconds of this thread in
    it: what a loaded machine's other processes do not inflate)."""
    c0, t0 = time.thread_time(), time.perf_counter()
    fn()
    if cpu is not None:
        cpu.append((time.thread_time() - c0) * 1000)
    return (time.perf_counter() - t0) * 1000


def measure(ns, n: int) -> dict[str, list[float]]:
    """The four figures (ms) of one fresh backend with ``n`` clusters in the namespace."""
    be = KubernetesBackend(namespace=ns.name, api_client=ns.api_client, user="many",
                           storage_class="standard")
    try:
        listed = []
        cold = timed(lambda: listed.extend(be.list_clusters()))
        assert len(listed) == n, f"listed {len(listed)} clusters, made {n}"
        warm_cpu, pass_cpu = [], []
        warm = [timed(be.list_clusters, warm_cpu) for _ in range(10)]
        monitor = ClusterMonitor(backend=be)
        try:
            first = timed(monitor.discover)
            assert len(monitor.snapshot()) == n, f"the sidebar shows {len(monitor.snapshot())} of {n}"
            passes = [timed(monitor.discover, pass_cpu) for _ in range(5)]
        finally:
            monitor.close()
    finally:
        be.close()
    return {"list cold": [cold], "list warm": warm, "sidebar first pass": [first],
            "sidebar pass": passes, "list warm, CPU": warm_cpu, "sidebar pass, CPU": pass_cpu}


def compare(one, many, n: int, rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    """The medians (ms) of the four figures in the one-cluster namespace and the ``n``-cluster
    one, measured in turns (a fresh backend in each, ``rounds`` times), so that the load of a
    shared machine weighs on both alike."""
    base: dict[str, list[float]] = {}
    big: dict[str, list[float]] = {}
    for _ in range(rounds):
        for into, ns, k in ((base, one, 1), (big, many, n)):
            for key, values in measure(ns, k).items():
                into.setdefault(key, []).extend(values)
    med = statistics.median
    return {k: med(v) for k, v in base.items()}, {k: med(v) for k, v in big.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--clusters", type=int, default=50)
    ap.add_argument("--tasks", type=int, default=4, help="tasks per cluster (1 PS + workers)")
    ap.add_argument("--rounds", type=int, default=5, help="fresh backends measured at each size")
    a = ap.parse_args()
    if a.clusters < 2 or a.tasks < 2:
        ap.error("--clusters and --tasks must be at least 2")
    c = Cluster()
    if not c.running():
        print("no devcluster runs: scripts/kube up", file=sys.stderr)
        return 2
    kube = RealKube(str(c.kubeconfig), c.audit_log)
    extra = [fake_node(f"kwok-many-{i}") for i in range(a.clusters * a.tasks // 100 + 1)]
    c.apply(extra)
    try:
        wait_for(lambda: c._nodes_ready(len(extra)), 120, message="bench nodes")
        one, many = kube.user_namespace("one"), kube.user_namespace("many")
        launchers = [KubernetesBackend(namespace=ns.name, api_client=ns.api_client, user="many",
                                       storage_class="standard") for ns in (one, many)]
        try:
            def spec(k: int) -> ClusterSpec:
                return ClusterSpec(name=f"c{k}", ps=1, workers=a.tasks - 1, script="print(1)\n")

            launchers[0].launch(spec(0), detach=True)
            for k in range(a.clusters):
                launchers[1].launch(spec(k), detach=True)
            wait_for(lambda: running(kube, one.name, a.tasks)
                     and running(kube, many.name, a.clusters * a.tasks), 900, interval=1,
                     message="every pod running")
        finally:
            for launcher in launchers:  # their watches stop; the detached clusters run on
                launcher.close()
        base, many = compare(one, many, a.clusters, a.rounds)
        print(f"one user, {a.tasks} tasks a cluster, medians of {a.rounds} fresh backends (ms):")
        for key in base:
            print(f"  {key:20s} 1 cluster {base[key]:8.1f}   {a.clusters} clusters {many[key]:8.1f}   "
                  f"{many[key] / base[key]:.2f} x")
        r = {k: many[k] / base[k] for k in base}
        print(f"{a.clusters} clusters: list cold {many['list cold']:.0f} ms ({r['list cold']:.2f} x), "
              f"warm {many['list warm']:.1f} ms ({r['list warm']:.2f} x); sidebar pass "
              f"{many['sidebar pass']:.1f} ms ({r['sidebar pass']:.2f} x), first "
              f"{many['sidebar first pass']:.0f} ms ({r['sidebar first pass']:.2f} x); CPU: warm "
              f"{r['list warm, CPU']:.2f} x, pass {r['sidebar pass, CPU']:.2f} x")
    finally:
        kube.cleanup()
        remove_nodes(c, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
