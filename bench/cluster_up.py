"""cluster-up: ``tk.launch`` → all tasks ready, 2 PS + 2 workers, against a bare launcher.

ours      ``tk.launch(name, mode="in-graph", ps=2, workers=2,
          backend=LocalBackend(tmp), wait_ready=120)``, timed until it returns
          (supervisor started, four ``tf.distribute.Server`` tasks ready, seen by
          the caller's status watch).
baseline  a minimal hand launcher: pick 4 free ports, ``subprocess.Popen`` four
          ``python -c "...tf.distribute.Server(..., start=True).join()"`` with the
          same TF_CONFIGs, poll every ~10 ms until each port accepts a TCP connection.

Rounds alternate ours / baseline; each cluster is torn down (``delete`` /
kill by process group) and no process may survive a round.  Prints the
per-round seconds, the medians and ratio = median(ours) / median(baseline),
and where ours spends its time (from the supervisor's ``status.json``):
launch → first task started (supervisor start-up), first task started → all
ready (TensorFlow import + servers), all ready → ``launch`` returned (the
caller's status watch).  Target: ratio ≤ 1.10.

warm      (issue 16) the same ``tk.launch`` with this process's warm pool
          (``pool_size`` 4) full: four idle processes that imported TensorFlow.
          Before each warm round the pool is refilled and waited for (not
          timed); the cold launch of the same round is made with
          ``detach=True`` (a detached cluster never uses the pool).  Targets:
          median ≤ 1.0 s and ≤ 0.25 × the baseline.  At the end, the idle
          memory of a pooled process against a bare process that imported
          TensorFlow with the same environment (target RSS ≤ 1.05 ×).

    .venv/bin/python bench/cluster_up.py [--rounds N]
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time

import _common as c

TARGET = 1.10
WARM_TARGET_S, WARM_TARGET_RATIO, MEMORY_TARGET = 1.0, 0.25, 1.05
POOL_SIZE = 4
TIMEOUT = 120.0

# The hand-written equivalent of what every in-graph task runs.
SERVER = (
    "import json, os, tensorflow as tf\n"
    "c = json.loads(os.environ['TF_CONFIG'])\n"
    "s = tf.distribute.Server(tf.train.ClusterSpec(c['cluster']), job_name=c['task']['type'],\n"
    "                         task_index=c['task']['index'], protocol='grpc', start=True)\n"
    "s.join()\n"
)


def run_ours(tmp: str, i: int, warm: bool = False) -> dict:
    import tfk8s_magics as tk
    from tfk8s_magics.backends import Phase
    from tfk8s_magics.backends.local import LocalBackend

    be = LocalBackend(os.path.join(tmp, f"{'warm' if warm else 'ours'}-{i}"))
    name = f"up{i}"
    if warm:
        c.pool_full(POOL_SIZE, 10 * TIMEOUT, import_timeout=TIMEOUT, with_memory=True,
                    in_graph=True)
    wall0, t0 = time.time(), time.perf_counter()
    try:
        # detach=True: a detached cluster never takes pooled processes (the cold side).
        tk.launch(name, mode="in-graph", ps=2, workers=2, backend=be, wait_ready=TIMEOUT,
                  detach=not warm)
        dt = time.perf_counter() - t0
        wall1 = time.time()
        raw = json.loads((be.clusters_dir / name / "status.json").read_text())
        if raw["phase"] != Phase.RUNNING:
            raise RuntimeError(f"launch returned but the cluster is {raw['phase']}")
        cold = [e for e in tk.get(name, be).events() if e.reason == "StartedCold"]
        if warm and cold:
            raise RuntimeError(f"a warm round started tasks cold: {cold}")
        # Where the time went: until the supervisor started the first task; until
        # the supervisor wrote "all ready"; until launch() noticed and returned.
        first = min(t["started"] for t in raw["tasks"])
        parts = (first - wall0, raw["updated"] - first, wall1 - raw["updated"])
    finally:
        c.remove_cluster(be, name)
    c.assert_clean(f"ours round {i + 1}", allow=c.pool_pids())
    return {"s": dt, "parts": parts}


def bare_tf_memory(env: dict) -> dict:
    """RSS/PSS of a bare process that imported TensorFlow (same environment as the pool's)."""
    from tfk8s_magics.backends.local import pool

    code = ("import tensorflow as tf, time; tf.config.list_physical_devices(); "
            "print('ok', flush=True); time.sleep(600)")
    proc = subprocess.Popen([c.PYTHON, "-c", code], env={**env, c.MARK_VAR: c.MARK},
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        if proc.stdout.readline().strip() != b"ok":
            raise RuntimeError("the bare TensorFlow process did not start")
        time.sleep(1.0)  # as settled as the idle pooled processes
        return pool.memory(proc.pid)
    finally:
        c.killpg([proc])


def report_memory() -> None:
    from tfk8s_magics.backends.local import pool

    found = c.pool_full(POOL_SIZE, 10 * TIMEOUT, import_timeout=TIMEOUT, with_memory=True,
                        in_graph=True)
    idle = [p for p in found["processes"] if p["state"] == "idle"]
    bare = bare_tf_memory(pool.base_env(shim=pool.pool_shim()))
    rss = c.median([p["rss"] for p in idle])
    pss = c.median([p["pss"] for p in idle])
    mib = 2 ** 20
    print(f"\nidle memory per pooled process (median of {len(idle)}): RSS {rss / mib:.0f} MiB, "
          f"PSS {pss / mib:.0f} MiB; total PSS of the pool {sum(p['pss'] for p in idle) / mib:.0f} MiB")
    print(f"bare process after `import tensorflow`: RSS {bare['rss'] / mib:.0f} MiB, PSS "
          f"{bare['pss'] / mib:.0f} MiB;  ratio RSS {rss / bare['rss']:.3f}  (target <= "
          f"{MEMORY_TARGET:.2f}: {c.verdict(rss / bare['rss'] <= MEMORY_TARGET)})")


def run_base(i: int) -> dict:
    ports = c.free_ports(4)
    tasks = [("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1)]
    cluster = {"ps": [f"127.0.0.1:{p}" for p in ports[:2]],
               "worker": [f"127.0.0.1:{p}" for p in ports[2:]]}
    procs: list[subprocess.Popen] = []
    t0 = time.perf_counter()
    try:
        for role, index in tasks:
            env = dict(os.environ, TF_USE_LEGACY_KERAS="1",
                       TF_CONFIG=json.dumps({"cluster": cluster,
                                             "task": {"type": role, "index": index}}))
            procs.append(subprocess.Popen([c.PYTHON, "-c", SERVER], env=env,
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True))
        c.wait_ports(ports, TIMEOUT, procs)
        dt = time.perf_counter() - t0
    finally:
        c.killpg(procs)
    c.assert_clean(f"baseline round {i + 1}", allow=c.pool_pids())
    return {"s": dt}


def show(_label: str, _i: int, r: dict) -> str:
    if "parts" not in r:
        return f"{r['s']:.3f} s"
    sup, tasks, notice = r["parts"]
    return (f"{r['s']:.3f} s   (to first task start {sup:.3f}, tasks to all-ready "
            f"{tasks:.3f}, ready seen by caller {notice:.3f})")


def main() -> int:
    args = c.parse_args(__doc__, rounds=8)
    os.environ["TFK8S_POOL_SIZE"] = str(POOL_SIZE)
    from tfk8s_magics.backends.local import pool

    print(f"cluster-up  2 PS + 2 workers  {c.machine()}", flush=True)
    with c.cleanup_on_exit(), tempfile.TemporaryDirectory(prefix="bench-up-") as tmp:
        try:
            run_base(-1)  # warm the page cache for TensorFlow once, for both sides (not counted)
            c.pool_full(POOL_SIZE, 10 * TIMEOUT, import_timeout=TIMEOUT, with_memory=True,
                        in_graph=True)
            print("warm-up done (page cache, pool of 4 filled)", flush=True)
            ours, base, warm = c.rounds(args.rounds, [
                ("ours", lambda i: run_ours(tmp, i)), ("base", run_base),
                ("warm", lambda i: run_ours(tmp, i, warm=True))], show)
            report_memory()
        finally:
            pool.shutdown()
    report_warm(warm, base, ours)
    mo, mb = c.median([r["s"] for r in ours]), c.median([r["s"] for r in base])
    ratio = mo / mb
    print(f"\nmedian  ours {mo:.3f} s   baseline {mb:.3f} s   ratio {ratio:.3f}   "
          f"(target <= {TARGET:.2f}: {c.verdict(ratio <= TARGET)})")
    ratios = [a["s"] / b["s"] for a, b in zip(ours, base, strict=True)]
    print(f"per-round ratios: {' '.join(f'{r:.2f}' for r in ratios)}   "
          f"median of per-round ratios {c.median(ratios):.3f}")
    for k, what in enumerate(("launch -> first task started", "first task -> all ready written",
                              "all ready written -> launch returned")):
        print(f"ours, median {what}: {c.median([r['parts'][k] for r in ours]) * 1000:.0f} ms")
    return 0


def report_warm(warm: list[dict], base: list[dict], ours: list[dict]) -> None:
    mw, mb, mo = (c.median([r["s"] for r in rs]) for rs in (warm, base, ours))
    ok = mw <= WARM_TARGET_S and mw / mb <= WARM_TARGET_RATIO
    print(f"\nwarm (pool)  median {mw:.3f} s   baseline {mb:.3f} s   ratio {mw / mb:.3f}   "
          f"vs ours cold {mw / mo:.3f}   (target <= {WARM_TARGET_S:.1f} s and <= "
          f"{WARM_TARGET_RATIO:.2f} x baseline: {c.verdict(ok)})")
    ratios = [a["s"] / b["s"] for a, b in zip(warm, base, strict=True)]
    print(f"warm per-round ratios: {' '.join(f'{r:.2f}' for r in ratios)}")
    for k, what in enumerate(("launch -> first task started", "first task -> all ready written",
                              "all ready written -> launch returned")):
        print(f"warm, median {what}: {c.median([r['parts'][k] for r in warm]) * 1000:.0f} ms")


if __name__ == "__main__":
    c.run(main)
