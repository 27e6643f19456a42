"""Kubernetes backend bench: objects per cluster, API requests, render+apply time (JobSet).

    .venv/bin/python bench/k8s_objects.py [--workers 64] [--repeat 5]

Counts are exact (from the manifests and the fake API server's request log,
tests/kubeapi); times are ratios against a baseline measured in the same
run (a naive loop creating the same objects one by one), so they do not
depend on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.kubeapi.harness import KubeHarness  # noqa: E402
from tfk8s_magics.backends.base import Phase  # noqa: E402
from tfk8s_magics.backends.kubernetes import KubernetesBackend  # noqa: E402
from tfk8s_magics.backends.kubernetes.apply import apply, preflight  # noqa: E402
from tfk8s_magics.backends.kubernetes.client import Api  # noqa: E402
from tfk8s_magics.backends.kubernetes.feed import WATCH_SECONDS  # noqa: E402
from tfk8s_magics.backends.kubernetes.jobset import cluster_manifests  # noqa: E402
from tfk8s_magics.backends.kubernetes.manifests import owner_reference, with_owner  # noqa: E402
from tfk8s_magics.backends.kubernetes.rbac import backend_role  # noqa: E402
from tfk8s_magics.backends.kubernetes.settings import K8sSettings  # noqa: E402
from tfk8s_magics.spec import ClusterSpec  # noqa: E402

NS = "bench"
SCRIPT = "print('x')\n"


def spec(name: str, workers: int, ps: int = 2) -> ClusterSpec:
    return ClusterSpec(name=name, ps=ps, workers=workers, script=SCRIPT, ps_grace_period=0)


def objects_table() -> list[str]:
    rows = ["| tasks N | ours: objects we create (between / in-graph) | + what JobSet creates "
            "(headless Service + one Job per role) | bare-pod design: N+4 | seed: 2N+2 |",
            "|---|---|---|---|---|"]
    settings = K8sSettings(namespace=NS)
    for n in (2, 4, 16, 64, 256):
        between = cluster_manifests(spec("b", n - 1, 1), settings, tensorboard=True)
        in_graph = cluster_manifests(
            ClusterSpec(name="g", mode="in-graph", ps=1, workers=n - 1), settings, True)
        jobset = next(m for m in between if m["kind"] == "JobSet")
        jobs = sum(r["replicas"] for r in jobset["spec"]["replicatedJobs"])
        rows.append(f"| {n} | {len(between)} / {len(in_graph)} | 1 + {jobs} | "
                    f"{n + 4 + 2} | {2 * n + 2} |")
    return rows


def harness() -> tuple[KubeHarness, KubernetesBackend]:
    kube = KubeHarness(history_size=100000).start()
    kube.create_namespace(NS)
    kube.set_role(backend_role(NS), NS, service_account="jupyter")
    backend = KubernetesBackend(namespace=NS, api_client=kube.api_client, user="bench")
    return kube, backend


def requests_for_64(workers: int) -> dict[str, float]:
    kube, backend = harness()
    try:
        kube.kubelet.auto(run_after=0.0)
        start = len(kube.requests)
        backend.launch(spec("big", workers), detach=True)
        launch = len(kube.requests) - start
        start = len(kube.requests)
        stop = threading.Event()
        t0 = time.monotonic()
        for status in backend.watch("big", stop):
            if status.phase == Phase.RUNNING:
                break
            if time.monotonic() - t0 > 60:
                raise TimeoutError("cluster not running within 60 s")
        to_running = len(kube.requests) - start
        # steady state: every task running, nothing changing, for 10 s
        start = len(kube.requests)
        time.sleep(10)
        idle = len(kube.requests) - start
        # a burst of changes: every worker succeeds; count until the cluster is done
        start = len(kube.requests)
        for i in range(workers):
            kube.kubelet.succeed(NS, kube.jobsets.pod_name(NS, "big", "worker", i))
        kube.jobsets.finish(NS, "big")  # JobSet: Completed; it deletes the PS Job
        t0 = time.monotonic()
        for status in backend.watch("big", stop):
            if status.terminal or time.monotonic() - t0 > 60:
                break
        finish = len(kube.requests) - start
        per_task = [r for r in kube.requests if r.name and r.name.startswith("big-")
                    and r.resource == "pods" and r.verb in ("get", "list")]
        return {"launch": launch, "to_running": to_running, "idle": idle,
                "finish": finish, "per_task_reads": len(per_task)}
    finally:
        backend.close()
        kube.stop()


def time_apply(workers: int, repeat: int) -> dict[str, float]:
    kube, backend = harness()
    try:
        api = Api(kube.api_client, NS)
        settings = K8sSettings(namespace=NS, user="bench")
        ours, naive, render, launch = [], [], [], []
        for i in range(repeat):
            t0 = time.perf_counter()
            cluster_manifests(spec(f"r{i}", workers), settings)
            render.append(time.perf_counter() - t0)
            # baseline: the same objects (root, then owned ones) created one by one
            t0 = time.perf_counter()
            manifests = cluster_manifests(spec(f"n{i}", workers), settings)
            root = api.create(manifests[0])
            for m in manifests[1:]:
                api.create(with_owner(m, owner_reference(root)))
            naive.append(time.perf_counter() - t0)
            # ours: render + quota pre-flight + apply (rollback ready)
            t0 = time.perf_counter()
            manifests = cluster_manifests(spec(f"a{i}", workers), settings)
            preflight(api, manifests)
            apply(api, manifests)
            ours.append(time.perf_counter() - t0)
            # the whole launch: also checks the name and starts the cluster's watcher
            t0 = time.perf_counter()
            backend.launch(spec(f"o{i}", workers), detach=True)
            launch.append(time.perf_counter() - t0)
            backend.close()
        return {"render_ms": statistics.median(render) * 1000,
                "naive_s": statistics.median(naive), "ours_s": statistics.median(ours),
                "launch_s": statistics.median(launch)}
    finally:
        backend.close()
        kube.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print("## Objects and DNS per cluster (TensorBoard on; N = tasks)\n")
    print("\n".join(objects_table()))
    r = requests_for_64(args.workers)
    n = args.workers + 2
    print(f"\n## API requests, {args.workers} workers + 2 ps ({n} tasks)\n")
    print(f"- launch (discovery + name check + pre-flight + create 4 objects + the watch's "
          f"first listings): {r['launch']} requests, no pod created by us")
    print(f"- watch from launch to all running: {r['to_running']} requests")
    print(f"- steady watching, 10 s with nothing changing: {r['idle']} request(s) (two "
          f"watches, JobSet and pods, renewed every {WATCH_SECONDS} s: ≈2/minute whatever N)")
    print(f"- all workers finish → JobSet completes (ends the PS) → done: {r['finish']} requests")
    print(f"- per-task GET/LIST requests (polling) during the whole run: {r['per_task_reads']}")
    t = time_apply(args.workers, args.repeat)
    print(f"\n## Render + apply, {n} tasks, median of {args.repeat}\n")
    print(f"- render (pure): {t['render_ms']:.1f} ms")
    print(f"- baseline, naive loop creating the same objects one by one: {t['naive_s']:.3f} s")
    print(f"- ours, render + quota pre-flight + apply: {t['ours_s']:.3f} s"
          f" = {t['ours_s'] / t['naive_s']:.2f}× the baseline")
    print(f"- whole launch (+ JobSet discovery + name check + the watch's first lists): "
          f"{t['launch_s']:.3f} s"
          f" = {t['launch_s'] / t['naive_s']:.2f}× the baseline")


if __name__ == "__main__":
    main()
