"""Scale on the REAL API server with kwok nodes: what the notebook side costs the control plane.

    scripts/kube up && .venv/bin/python bench/k8s_scale.py [--users 20] [--clusters 5] [--tasks 8]

For ``--users`` namespaces (each bootstrapped as the hub does, each a "notebook": one
KubernetesBackend acting as that user's ServiceAccount), ``--clusters`` clusters of ``--tasks``
tasks each are launched; kwok nodes are added so every pod fits. Printed:

- launch → every pod Running for one user's clusters through the backend, as a ratio against
  ``kubectl apply`` of the very same objects (rendered by the backend) in a twin namespace;
- API requests per minute per notebook while launching and at rest (watching its clusters), and
  the watches each notebook holds, from the API server's audit log (by user) and its
  ``apiserver_longrunning_requests`` metric;
- kube-apiserver's and etcd's CPU seconds and RSS over the run.

The goal is O(1) watches per namespace and no polling at rest; the figures say whether that holds.
Everything it makes is deleted at the end (namespaces, extra nodes).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "hub_config")]

from devcluster.build import COMPONENTS  # noqa: E402
from devcluster.cluster import Cluster, fake_node  # noqa: E402
from tests.realkube import RealKube, wait_for  # noqa: E402
from tfk8s_magics.backends.kubernetes import KubernetesBackend  # noqa: E402
from tfk8s_magics.spec import ClusterSpec  # noqa: E402


def proc_usage(c: Cluster, name: str) -> tuple[float, int]:
    rec = json.loads((c.procs.pids / f"{name}.json").read_text())
    p = psutil.Process(rec["pid"])
    t = p.cpu_times()
    return t.user + t.system, p.memory_info().rss


def running(kube: RealKube, ns: str, n: int) -> bool:
    pods = kube.core.list_namespaced_pod(ns).items
    return sum(1 for p in pods if p.status.phase == "Running") >= n


def remove_nodes(c: Cluster, nodes: list[dict]) -> None:
    """Delete the kwok nodes a bench added (without waiting for them to go)."""
    for n in nodes:
        c.kubectl("delete", "node", n["metadata"]["name"], "--wait=false", check=False)


def watches(c: Cluster) -> float:
    code, body = c.get("/metrics", timeout=10)
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith("apiserver_longrunning_requests{") and 'verb="WATCH"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def compare_launch(c: Cluster, kube: RealKube, specs: list[ClusterSpec]):
    """Launch ``specs`` → every pod Running through the backend, then ``kubectl apply`` of the very
    same rendered objects (the twin namespace's token) → every pod Running.

    Returns ``(backend, our namespace, the twin, ours s, kubectl s, our launch's audit records)``,
    or None when kubectl failed (its stderr printed). The backend keeps watching: close it.
    """
    ours_ns = kube.user_namespace("bench")
    twin_ns = kube.user_namespace("twin")
    be = KubernetesBackend(
        namespace=ours_ns.name, api_client=ours_ns.api_client, user="bench", storage_class="standard"
    )
    rendered = []
    for s in specs:
        for obj in be.render(s):
            obj = json.loads(json.dumps(obj).replace(ours_ns.name, twin_ns.name))
            obj.setdefault("metadata", {})["namespace"] = twin_ns.name
            rendered.append(obj)
    n_pods = sum(s.ps + s.workers for s in specs)
    off = c.audit_log.stat().st_size
    t0 = time.monotonic()
    for s in specs:
        be.launch(s)
    wait_for(lambda: running(kube, ours_ns.name, n_pods), 600, interval=0.5, message="our pods")
    t_ours = time.monotonic() - t0
    launch_reqs = [r for r in kube.audit(off) if r.user == ours_ns.username]
    t0 = time.monotonic()
    token = kube.token(twin_ns.name, twin_ns.service_account)
    proc = subprocess.run(
        [
            str(COMPONENTS["kubernetes"].path("kubectl")),
            "--server",
            c.server,
            "--certificate-authority",
            str(c.pki / "ca.crt"),
            "--token",
            token,
            "apply",
            "-f",
            "-",
        ],
        input=yaml.safe_dump_all(rendered),
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        print(proc.stderr, file=sys.stderr)
        be.close()
        return None
    wait_for(lambda: running(kube, twin_ns.name, n_pods), 600, interval=0.5, message="kubectl's pods")
    return be, ours_ns, twin_ns, t_ours, time.monotonic() - t0, launch_reqs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--users", type=int, default=20)
    ap.add_argument("--clusters", type=int, default=5)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--rest", type=float, default=60.0, help="seconds measured at rest (default 60)")
    a = ap.parse_args()
    c = Cluster()
    if not c.running():
        print("no devcluster runs: scripts/kube up", file=sys.stderr)
        return 2
    kube = RealKube(str(c.kubeconfig), c.audit_log)
    pods_total = a.users * a.clusters * a.tasks
    extra = [fake_node(f"kwok-bench-{i}") for i in range(pods_total // 100 + 2)]
    c.apply(extra)
    wait_for(lambda: c._nodes_ready(len(extra)), 120, message="bench nodes")
    cpu0 = {n: proc_usage(c, n)[0] for n in ("kube-apiserver", "etcd")}
    base_watches = watches(c)
    t_start = time.monotonic()
    backends, users = [], []
    try:

        def specs(u):
            return [
                ClusterSpec(name=f"c{k}", ps=1, workers=a.tasks - 1, script="print(1)\n")
                for k in range(a.clusters)
            ]

        # -- one user, ours vs kubectl apply of the same objects ---------------------------------
        n_pods = a.clusters * a.tasks
        launch = compare_launch(c, kube, specs(0))
        if launch is None:
            return 1
        be, ours_ns, twin_ns, t_ours, t_kubectl, launch_reqs = launch
        backends.append(be)
        users += [ours_ns, twin_ns]

        # -- the other users, then everyone at rest ---------------------------------------------
        for u in range(1, a.users):
            ns = kube.user_namespace(f"bench{u}")
            users.append(ns)
            b = KubernetesBackend(
                namespace=ns.name, api_client=ns.api_client, user=f"u{u}", storage_class="standard"
            )
            backends.append(b)
            for s in specs(u):
                b.launch(s)
        wait_for(
            lambda: (
                sum(
                    1
                    for p in kube.core.list_pod_for_all_namespaces(label_selector="tfk8s.io/cluster").items
                    if p.status.phase == "Running"
                )
                >= pods_total + n_pods
            ),
            1800,
            interval=2,
            message="every pod running",
        )
        t_all = time.monotonic() - t_start
        for b in backends:
            for st in b.list_clusters():
                b.status(st.name)  # every notebook watches its clusters, as a dashboard does
        time.sleep(5)
        off = c.audit_log.stat().st_size
        w_rest = watches(c) - base_watches
        time.sleep(a.rest)
        rest = kube.audit(off)
        names = {u.username for u in users[2:]} | {ours_ns.username}
        rest_reqs = [r for r in rest if r.user in names]
        cpu = {n: proc_usage(c, n)[0] - cpu0[n] for n in cpu0}
        rss = {n: proc_usage(c, n)[1] for n in cpu0}
        notebooks = len(names)
        print(
            f"users {a.users} x clusters {a.clusters} x tasks {a.tasks} = {pods_total} pods "
            f"on {len(extra) + 2} kwok nodes; load {' '.join(f'{x:.1f}' for x in psutil.getloadavg())}"
        )
        print(
            f"launch -> all {n_pods} pods Running, one user: ours {t_ours:.1f} s, kubectl apply "
            f"{t_kubectl:.1f} s, ratio {t_ours / t_kubectl:.2f}"
        )
        print(
            f"requests while launching {a.clusters} clusters: {len(launch_reqs)} "
            f"({len(launch_reqs) / a.clusters:.1f} per cluster)"
        )
        print(
            f"at rest: {len(rest_reqs) / notebooks / (a.rest / 60):.2f} requests/min per notebook "
            f"({len(rest_reqs)} in {a.rest:.0f} s from {notebooks} notebooks); "
            f"verbs {sorted({r.verb for r in rest_reqs})}"
        )
        print(
            f"watches held: {w_rest:.0f} for {notebooks} notebooks = {w_rest / notebooks:.1f} per notebook "
            f"({a.clusters} clusters each)"
        )
        print(
            f"all {pods_total + n_pods} pods running after {t_all:.0f} s; "
            + "; ".join(f"{n} {cpu[n]:.0f} CPU s, RSS {rss[n] / 2**20:.0f} MiB" for n in cpu)
        )
    finally:
        for b in backends:
            b.close()
        kube.cleanup()
        remove_nodes(c, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
