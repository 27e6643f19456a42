"""dashboard_cpu: what the watcher and the dashboard cost a real kernel, idle and under a log flood.

A real ipykernel (the venv's, started with jupyter_client as JupyterLab
would) runs each scenario for ``--seconds``; the kernel process's CPU time
(all its threads, from psutil) is divided by wall time, so 1.0 % means one
hundredth of one core.  Scenarios, in one run, against the same baseline:

baseline   the kernel with the extension loaded, no cluster, no view;
watcher    ``ClusterFeed.of(...)`` on an idle 16-task cluster, no view
           (the backend's status polling and log following alone);
dashboard  a displayed :class:`Dashboard` on the same idle cluster (watcher +
           render thread: a 1 s clock tick while the cluster runs);
flood      the dashboard while one task's log grows as fast as a Python
           ``print(..., flush=True)`` loop can write it.

The idle 16-task cluster is a local cluster's state written on disk exactly
as the local backend's supervisor writes it (record, status.json with 16
running tasks and a live supervisor pid, 16 log files, progress records);
its "supervisor" is a ``sleep`` process.  Sixteen real TensorFlow tasks
(~500 MB and seconds of CPU each to import) would measure TensorFlow on
this shared 2-core machine, not the dashboard: the kernel-side code paths
(``LocalBackend.watch``, ``follow_logs``, the watcher, the widgets) are the
real ones.

In every scenario a trivial cell (``1 + 1``) is executed 20 times through
the kernel's shell channel; its round trip p50 / max show whether the kernel
stays responsive (target < 100 ms).  The client drains iopub and counts the
widget messages (``comm_msg``) the dashboard sends and their bytes.

    .venv/bin/python bench/dashboard_cpu.py [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import _common as c  # noqa: F401 - marks our processes, puts the repo on sys.path
import psutil
from jupyter_client import KernelManager

from tfk8s_magics.api import make_spec
from tfk8s_magics.backends.local.layout import ClusterDir, task_log_path, write_json_atomic
from tfk8s_magics.tfconfig import cluster_def

NAME = "idle16"
LINE_BYTES = len(f"step {0:9d} loss {1.0:.6f} a typical chatty training line\n")

FLOOD = r"""
import itertools, sys
out = open(sys.argv[1], "a", buffering=1)
for i in itertools.count():
    print(f"step {i:9d} loss {1.0 / (i + 1):.6f} a typical chatty training line", file=out, flush=True)
"""


# What-if for the flood (run in the kernel, not shipped): a follower that waits its interval
# after every poll, and jumps to the newest 16 KiB of a file that grew by more than 64 KiB,
# so a flooding task costs the kernel at most ~1.3 MB/s of lines per file.
BOUNDED_FOLLOW = r"""
import time
from tfk8s_magics.backends.base import LogChunk
from tfk8s_magics.backends.local import logtail

def _bounded_follow(files, stop, finished, from_start=True, interval=logtail.FOLLOW_INTERVAL,
                    wake_dirs=None, max_behind=64 << 10, keep=16 << 10):
    cursors = [logtail._FileCursor(t, p, from_start) for t, p in files.items()]
    while not stop.is_set():
        done = finished()
        now = time.time()
        for c in cursors:
            jumped = False
            if not done:
                try:
                    size = c.path.stat().st_size
                except FileNotFoundError:
                    size = 0
                if size - c.offset > max_behind:
                    skipped = size - keep - c.offset
                    c.offset, c.partial, jumped = size - keep, b"", True
                    note = f"[tfk8s] {skipped} bytes not shown here (see the log file)"
                    yield LogChunk(c.task, [note], now)
            texts = c.drain() if done else c.read()
            texts = texts[1:] if jumped else texts
            if texts:
                yield LogChunk(c.task, texts, now)
        if done:
            return
        stop.wait(interval)

logtail.follow_batches = _bounded_follow  # what the live views read through
"""


def make_idle_cluster(state: Path, supervisor_pid: int) -> Path:
    """Write a running 16-task local cluster's state (2 PS + 14 workers); return worker-0's log."""
    spec = make_spec(NAME, workers=14, ps=2, script="pass\n")
    cdir = ClusterDir(state / "clusters" / NAME)
    log_dir = cdir.default_log_dir
    for d in (log_dir / "tasks", cdir.progress_dir, cdir.default_data_dir):
        d.mkdir(parents=True, exist_ok=True)
    tasks = spec.tasks()
    addresses = {t.name: f"127.0.0.1:{20000 + i}" for i, t in enumerate(tasks)}
    now = time.time()
    write_json_atomic(
        cdir.record,
        {
            "backend": "local",
            "spec": spec.to_dict(),
            "created": now - 120,
            "owner_pid": os.getpid(),
            "owner": "bench",
            "detached": True,
            "addresses": addresses,
            "cluster": cluster_def(spec, lambda t: addresses[t.name]),
            "workdir": str(state),
            "log_dir": str(log_dir),
            "data_dir": str(cdir.default_data_dir),
            "owned_dirs": [str(cdir.root)],
        },
    )
    write_json_atomic(
        cdir.status,
        {
            "phase": "running",
            "reason": "every task is ready",
            "finished": None,
            "supervisor_pid": supervisor_pid,
            "supervisor_done": False,
            "restarts_used": 0,
            "tasks": [
                {
                    "name": t.name,
                    "phase": "running",
                    "reason": "serving" if t.role == "ps" else "running the script",
                    "exit_code": None,
                    "signal": None,
                    "restarts": 0,
                    "host": addresses[t.name],
                    "pid": supervisor_pid,
                    "started": now - 100,
                    "finished": None,
                }
                for t in tasks
            ],
            "updated": now,
        },
    )
    for t in tasks:
        task_log_path(log_dir, t.name).write_text(f"tfk8s: {t.name} started\n" * 20, encoding="utf-8")
    (cdir.progress_dir / "worker-0.jsonl").write_text(
        json.dumps(
            {
                "step": 500,
                "total": 10000,
                "rate": 5.0,
                "metrics": {"loss": 0.5},
                "task": "worker-0",
                "time": now,
            }
        )
        + "\n",
        encoding="utf-8",
    )
    return task_log_path(log_dir, "worker-0")


class Kernel:
    """A real ipykernel, and a client that drains iopub and counts widget traffic."""

    def __init__(self, env: dict[str, str]) -> None:
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(env=env, cwd=env["TFK8S_STATE_DIR"])
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        self.proc = psutil.Process(self.km.provisioner.process.pid)
        self.comm_msgs = 0
        self.comm_bytes = 0
        self.outputs: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._drain = threading.Thread(target=self._drain_iopub, daemon=True)
        self._drain.start()

    def _drain_iopub(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self.kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                continue
            kind = msg["msg_type"]
            if kind in ("comm_msg", "comm_open"):
                self.comm_msgs += 1
                self.comm_bytes += len(json.dumps(msg["content"]))
            elif kind == "stream":
                self.outputs.put(msg["content"]["text"])
            elif kind == "error":
                self.outputs.put("ERROR " + msg["content"]["evalue"])

    def run(self, code: str, timeout: float = 60) -> float:
        """Execute ``code``; return the round trip in seconds (raise if it failed)."""
        t0 = time.perf_counter()
        msg_id = self.kc.execute(code)
        while True:
            reply = self.kc.get_shell_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        took = time.perf_counter() - t0
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"{code!r} failed in the kernel: {reply['content'].get('evalue')}")
        return took

    def value(self, expr: str) -> str:
        msg_id = self.kc.execute("", user_expressions={"v": expr})
        while True:
            reply = self.kc.get_shell_msg(timeout=30)
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply["content"]["user_expressions"]["v"]["data"]["text/plain"]

    def cpu(self) -> float:
        t = self.proc.cpu_times()
        return t.user + t.system

    def close(self) -> None:
        self._stop.set()
        self._drain.join(5)
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def measure(k: Kernel, seconds: float) -> dict[str, float]:
    """Kernel CPU over ``seconds`` (percent of one core), then 20 trivial cells' round trips."""
    msgs0, bytes0 = k.comm_msgs, k.comm_bytes
    cpu0, t0 = k.cpu(), time.monotonic()
    time.sleep(seconds)
    cpu1, t1 = k.cpu(), time.monotonic()
    msgs, nbytes = k.comm_msgs - msgs0, k.comm_bytes - bytes0
    trips = []
    for _ in range(20):
        trips.append(k.run("1 + 1") * 1000)
        time.sleep(0.05)
    return {
        "cpu": 100 * (cpu1 - cpu0) / (t1 - t0),
        "msgs": msgs / (t1 - t0),
        "kbytes": nbytes / 1024 / (t1 - t0),
        "p50": statistics.median(trips),
        "max": max(trips),
    }


def _thread_cpu(fn, seconds: float) -> float:
    """Percent of one core the thread consuming ``fn(stop)`` uses (its own CPU clock only)."""
    stop = threading.Event()
    used: list[float] = []

    def run() -> None:
        c0, t0 = time.thread_time(), time.monotonic()
        for _ in fn(stop):
            pass
        used.append(100 * (time.thread_time() - c0) / (time.monotonic() - t0))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    time.sleep(seconds)
    stop.set()
    t.join(10)
    return used[0] if used else float("nan")


def mark_stalled(state: Path) -> None:
    """Rewrite the idle cluster's status.json as the supervisor does once it is stalled."""
    from tfk8s_magics.backends.local.layout import read_json
    from tfk8s_magics.stall import Stall, TaskActivity

    cdir = ClusterDir(state / "clusters" / NAME)
    status = read_json(cdir.status)
    since = time.time() - 150
    status["stall"] = Stall(
        since, 120.0, [TaskActivity(t["name"], since, f"tfk8s: {t['name']} started") for t in status["tasks"]]
    ).to_dict()
    write_json_atomic(cdir.status, status)


def stall_check_cost(state: Path, rounds: int = 200) -> tuple[float, float]:
    """CPU of one supervisor stall check of the 16-task cluster (ms), and its share of a core."""
    from tfk8s_magics.backends.local.stallwatch import StallWatch

    cdir = ClusterDir(state / "clusters" / NAME)
    logs = {p.stem: p for p in (cdir.default_log_dir / "tasks").glob("*.log")}
    watch = StallWatch(logs, cdir.progress_dir, 120.0)
    t0 = time.thread_time()
    for _ in range(rounds):
        watch.deadline = 0.0  # due now: a full check (stat + last line of every log)
        watch.check(time.time(), [])
        watch.disarm()
    per_check = (time.thread_time() - t0) / rounds
    return per_check * 1000, 100 * per_check / 120.0


def polling_breakdown(state: Path, seconds: float) -> list[tuple[str, float]]:
    """Where the watcher's idle cost goes, measured in this process one piece at a time."""
    from tfk8s_magics.backends.local import LocalBackend, logtail

    be = LocalBackend(state)
    cdir = be._dir(NAME)

    def finished_only(stop):
        while not stop.is_set():
            be._finished(cdir)
            stop.wait(logtail.FOLLOW_INTERVAL)
        return iter(())

    def follow_cached(stop, interval=logtail.FOLLOW_INTERVAL):
        # What-if: read status.json again only when its mtime changed.
        seen: dict[str, object] = {}

        def finished() -> bool:
            mtime = cdir.status.stat().st_mtime_ns
            if seen.get("mtime") != mtime:
                seen["mtime"], seen["value"] = mtime, be._finished(cdir)
            return bool(seen["value"])

        return logtail.follow(be._log_files(NAME, None), stop, finished, interval=interval)

    return [
        (
            "LocalBackend.watch (status.json + progress mtimes, 10 Hz)",
            _thread_cpu(lambda stop: be.watch(NAME, stop), seconds),
        ),
        (
            "LocalBackend.follow_logs (16 log files, 20 Hz)",
            _thread_cpu(lambda stop: be.follow_logs(NAME, stop), seconds),
        ),
        ("  of which finished() alone (reads status.json, 20 Hz)", _thread_cpu(finished_only, seconds)),
        (
            "what-if: follow_logs calling finished() on a status.json change",
            _thread_cpu(follow_cached, seconds),
        ),
        (
            "what-if: the same, polling every 0.25 s (an idle back-off)",
            _thread_cpu(lambda stop: follow_cached(stop, 0.25), seconds),
        ),
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0, help="measuring window per scenario")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tfk8s-dash-bench-"))
    state = tmp / "state"
    sleeper = subprocess.Popen(["sleep", "3600"])
    flood = None
    env = dict(
        os.environ,
        TFK8S_STATE_DIR=str(state),
        TFK8S_BACKEND="local",
        PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    )
    rows = []
    k = None
    try:
        log0 = make_idle_cluster(state, sleeper.pid)
        k = Kernel(env)
        k.run("%load_ext tfk8s_magics\nimport tfk8s_magics as tk, time")
        k.run("from tfk8s_magics.watch import ClusterFeed\ntime.sleep(1)")
        rows.append(("baseline: idle kernel, extension loaded", measure(k, args.seconds)))

        k.run(f"c = tk.get({NAME!r}); w = ClusterFeed.of(c.backend, c.name)")
        rows.append(("watcher only, idle 16-task cluster", measure(k, args.seconds)))

        k.run("from tfk8s_magics.ui import dashboard\nd = dashboard.show(c)")
        k.run("time.sleep(2)")  # first draw, replayed log history
        rows.append(("dashboard, idle 16-task cluster", measure(k, args.seconds)))
        # The same cluster once the supervisor has called it stalled (status.json gains "stall").
        mark_stalled(state)
        k.run("time.sleep(2)")
        assert k.value("c.status().shown_phase") == "'stalled'"
        rows.append(("dashboard, idle 16-task cluster, stalled", measure(k, args.seconds)))
        stall_cost = stall_check_cost(state)
        # Before the flood grows worker-0's log: the pieces read it from the start.
        breakdown = polling_breakdown(state, min(args.seconds, 10.0))

        before = int(k.value("sum(d.line_counts.values())"))
        flood = subprocess.Popen([sys.executable, "-c", FLOOD, str(log0)])
        time.sleep(1.0)
        t0, b0 = time.monotonic(), log0.stat().st_size
        r = measure(k, args.seconds)
        r["written"] = (log0.stat().st_size - b0) / LINE_BYTES / (time.monotonic() - t0)
        r["seen"] = int(k.value("sum(d.line_counts.values())")) - before
        rows.append(("dashboard, one task logging at full speed", r))
        # The same flood with the watcher alone: what the view adds to it.
        k.run("d.close()")
        rows.append(("watcher only, same flood", measure(k, args.seconds)))
        # What-if: the same flood through a bounded follower (see BOUNDED_FOLLOW).
        k.run("w.close(); time.sleep(1)")
        k.run(BOUNDED_FOLLOW)
        k.run("ClusterFeed.forget(c.backend, c.name); d = dashboard.show(c); time.sleep(2)")
        rows.append(("what-if: dashboard, flood, bounded follower", measure(k, args.seconds)))
        flood.kill()
        flood.wait()
        k.run("d.close(); ClusterFeed.forget(c.backend, c.name)")
    finally:
        if flood is not None and flood.poll() is None:
            flood.kill()
        if k is not None:
            k.close()
        sleeper.kill()
        sleeper.wait()
        shutil.rmtree(tmp, ignore_errors=True)

    base = rows[0][1]["cpu"]
    print(f"# dashboard_cpu — {c.machine()}; window {args.seconds:g} s per scenario")
    print(
        f"{'scenario':<44}{'kernel CPU':>11}{'− baseline':>12}{'widget msgs/s':>15}{'KiB/s':>8}"
        f"{'1+1 p50':>10}{'max':>8}"
    )
    for name, r in rows:
        print(
            f"{name:<44}{r['cpu']:>10.2f}%{r['cpu'] - base:>+11.2f}%{r['msgs']:>15.1f}"
            f"{r['kbytes']:>8.1f}{r['p50']:>8.1f}ms{r['max']:>6.0f}ms"
        )
    flood = rows[4][1]
    print(
        f"flood: ~{flood['written']:,.0f} lines/s written; the watcher handed the dashboard "
        f"{flood['seen']:,} lines in the window (its tab keeps the newest 300)"
    )
    print("backend polling of the idle 16-task cluster, one piece at a time (CPU of the polling thread):")
    for name, value in breakdown:
        print(f"  {name:<66}{value:>6.2f}%")
    idle = rows[2][1]["cpu"] - base
    view = rows[2][1]["cpu"] - rows[1][1]["cpu"]
    stalled = rows[3][1]["cpu"] - rows[2][1]["cpu"]
    per_check, share = stall_cost
    print(
        f"stall detector: the stalled idle dashboard costs {stalled:+.2f}% of one core more than the "
        f"idle one; the supervisor's check of 16 tasks takes {per_check:.2f} ms of CPU and runs once "
        f"per timeout (120 s): {share:.5f}% of one core"
    )
    print(
        f"idle 16-task dashboard: {idle:+.2f}% of one core over the baseline (target < 1%: "
        f"{'OK' if idle < 1.0 else 'OVER'}), of which the view itself {view:+.2f}%; "
        f"a trivial cell under the flood: p50 {flood['p50']:.0f} ms, max {flood['max']:.0f} ms "
        f"(target < 100 ms: {'OK' if flood['max'] < 100 else 'OVER'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
