"""Soak: N launch/delete cycles of a local cluster with a live dashboard attached; nothing may grow.

Each cycle launches a 2-worker + 1-PS cluster on a private state dir, attaches a
real ipywidgets :class:`~tfk8s_magics.ui.dashboard.Dashboard` (widgets forced on,
fed by the cluster's ``ClusterFeed`` in this process), deletes the cluster and
closes the dashboard.  Every ``--ready-every`` cycles it first waits until every
task is ready (TensorFlow imported, servers listening) and a line of output
reached the dashboard; the other cycles delete while the tasks are still
starting (the delete-during-launch path).  Before and after, it prints this
process's fds, threads and RSS, the processes of the run (marked) and of any
cluster (``TFK8S_CLUSTER_ID``), the files under the state dir, the listening TCP
sockets held by the run's processes (judged) and the host's (shown only: other
users' servers come and go), then the growth of each.

The warm-up cycle waits until ready too, so modules first imported on that path
(the dashboard's metric/plot path, the log pacer) are in the "before" numbers.
Memory is sampled every 10 cycles (a leak grows with the cycles; an import is a
step): RSS, and what is in use inside it — glibc malloc's bytes handed out
(``mallinfo2``: C libraries, Python's objects over 512 bytes) and pymalloc's
(Python's small objects) — and judged on the second half of the run: memory in
use must grow by at most ``IN_USE_LIMIT`` KiB per cycle (RSS is shown: it also
counts what the allocators keep after a free). RSS is measured at the end also
after glibc's ``malloc_trim(0)``; ``--tracemalloc`` also
prints the Python allocations that grew most, by line, and the module count.

    .venv/bin/python bench/soak.py [--cycles 100] [--ready-every 10] [--tracemalloc]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import sys
import tempfile
import time
import tracemalloc
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import leftovers, machine, sweep  # noqa: E402

SCRIPT = "import time\nprint('soak up', flush=True)\ntime.sleep(600)\n"


def listening_inodes() -> list[int]:
    """Socket inodes of the listening TCP sockets in this network namespace
    (``/proc/net/tcp{,6}``, state 0A): the whole host's, other users' servers included."""
    inodes = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                rows = [line.split() for line in f.readlines()[1:]]
        except FileNotFoundError:
            continue
        inodes += [int(row[9]) for row in rows if row[3] == "0A"]
    return inodes


def socket_inodes(pids: list[int]) -> set[int]:
    """The socket inodes the processes ``pids`` hold open (``/proc/PID/fd`` → ``socket:[N]``)."""
    out = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # gone meanwhile
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                out.add(int(link[8:-1]))
    return out


def run_listening_sockets() -> int:
    """Listening TCP sockets held by this process or any process of the run (the host's network
    namespace; the clusters' own servers live in their private ones, gone with them)."""
    held = socket_inodes([os.getpid(), *(pid for pid, _ in leftovers())])
    return sum(1 for inode in listening_inodes() if inode in held)


def cluster_processes(state_dir: Path) -> int:
    """Live processes of this soak's clusters: supervisors (their dir on the command line) and
    everything that carries a cluster id and works under the state dir."""
    needle = str(state_dir).encode()
    n = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            env, cmd = (d / "environ").read_bytes(), (d / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmd or (b"TFK8S_CLUSTER_ID=" in env and needle in env):
            n += 1
    return n


def rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
        "keepcost")]


def malloc_in_use_kib() -> int:
    """Bytes glibc's malloc has handed out and not had back (``mallinfo2``: ``uordblks`` + ``hblkhd``,
    every arena, mmapped chunks too), in KiB: what C code and Python's large objects hold; -1 if
    not glibc."""
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return -1
    fn.restype = _MallInfo2
    info = fn()
    return (info.uordblks + info.hblkhd) // 1024


def pymalloc_in_use_kib() -> int:
    """Bytes in the blocks Python's small-object allocator has handed out (``sys._debugmallocstats``,
    "bytes in allocated blocks"), in KiB; -1 where that is not printed."""
    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)  # it writes to the C stderr
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        for line in out.read().decode(errors="replace").splitlines():
            if line.startswith("# bytes in allocated blocks"):
                return int(line.split("=")[1].replace(",", "").strip()) // 1024
    return -1


def trimmed_rss_kib() -> int:
    """RSS after glibc hands back the free memory it keeps (``malloc_trim(0)``); RSS if no glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    return rss_kib()


#: Memory in use (malloc's, pymalloc's) may grow at most this many KiB per cycle over the second
#: half of the run: a leak of one small object per cycle is ~0.1-1 KiB, a leaked widget tree ~100.
IN_USE_LIMIT = 2.0


def memory() -> dict[str, int]:
    """This process's memory, after a full collection: RSS, malloc's and pymalloc's bytes in use."""
    gc.collect()
    return {"RSS KiB": rss_kib(), "malloc in use KiB": malloc_in_use_kib(),
            "pymalloc in use KiB": pymalloc_in_use_kib()}


def measure(state_dir: Path) -> dict[str, int]:
    gc.collect()
    widgets = sys.modules.get("ipywidgets")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Widget.widgets: the live registry
        registry = getattr(getattr(widgets, "Widget", None), "widgets", None)
    return {
        "live widgets": len(registry) if registry is not None else 0,
        "modules": len(sys.modules),
        "gc objects": len(gc.get_objects()),
        "run processes": len(leftovers()),
        "cluster processes": cluster_processes(state_dir),
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": len(os.listdir("/proc/self/task")),
        "files under state dir": sum(1 for _ in state_dir.rglob("*")),
        "listening sockets": run_listening_sockets(),
        "host listening sockets": len(listening_inodes()),
        **memory(),
    }


def cycle(tk, dashboard_mod, backend, i: int, wait_ready: bool) -> float:
    started = time.perf_counter()
    cluster = tk.launch(f"soak{i}", workers=2, ps=1, script=SCRIPT, backend=backend)
    board = dashboard_mod.Dashboard(cluster, widgets=True).start()
    if wait_ready:
        cluster.wait_ready(timeout=300)
        deadline = time.monotonic() + 120
        while not any("soak up" in line for q in board.lines.values() for line in q):
            if time.monotonic() > deadline:
                raise RuntimeError(f"cycle {i}: no output reached the dashboard in 120 s")
            time.sleep(0.05)
    cluster.delete()
    board.close(destroy=True)  # as a re-run cell does (live.supersede): a kept view holds its widgets
    return time.perf_counter() - started


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--cycles", type=int, default=100)
    p.add_argument("--ready-every", type=int, default=10, help="wait until ready every N cycles (0: never)")
    p.add_argument("--tracemalloc", action="store_true", help="trace Python allocations (slower)")
    args = p.parse_args()
    state_dir = Path(tempfile.mkdtemp(prefix="tfk8s-soak-"))
    os.environ["TFK8S_STATE_DIR"] = str(state_dir)
    import tfk8s_magics as tk
    from tfk8s_magics.backends.local import LocalBackend
    from tfk8s_magics.ui import dashboard as dashboard_mod

    backend = LocalBackend(state_dir)
    print(machine())
    # One warm-up cycle, ready: the first imports (ipywidgets, the feed's threads, the ready
    # path's metric/plot code) are not growth.
    cycle(tk, dashboard_mod, backend, 0, wait_ready=True)
    # The warm pool's kernel side imports TensorFlow in a background thread: a step, not growth.
    from tfk8s_magics import ingraph
    if hasattr(ingraph, "preimported"):
        ingraph.preimported(600)
    if args.tracemalloc:
        tracemalloc.start(1)
    before = measure(state_dir)
    before["RSS KiB after malloc_trim"] = trimmed_rss_kib()
    snap = tracemalloc.take_snapshot() if args.tracemalloc else None
    times, ready_times = [], []
    samples = [(0, memory())]
    try:
        for i in range(1, args.cycles + 1):
            ready = bool(args.ready_every) and i % args.ready_every == 0
            took = cycle(tk, dashboard_mod, backend, i, ready)
            (ready_times if ready else times).append(took)
            if i % 10 == 0 or i == args.cycles:
                samples.append((i, memory()))
                print(f"cycle {i}: {took:.2f} s, " + ", ".join(f"{k} {v}" for k, v in samples[-1][1].items()),
                      flush=True)
        time.sleep(1.0)  # let exiting processes be reaped before counting
        after = measure(state_dir)
        after["RSS KiB after malloc_trim"] = trimmed_rss_kib()
        if snap is not None:
            print("Python allocations that grew most (tracemalloc, by line):")
            for stat in tracemalloc.take_snapshot().compare_to(snap, "lineno")[:12]:
                print(f"  {stat}")
    finally:
        sweep()
    print(f"{args.cycles} cycles ({len(ready_times)} waited until ready); median cycle "
          f"{sorted(times)[len(times) // 2] if times else float('nan'):.2f} s, "
          f"ready cycles {sorted(ready_times)[len(ready_times) // 2] if ready_times else float('nan'):.2f} s")
    print(f"{'':24}{'before':>10}{'after':>10}{'growth':>10}")
    grew = []
    for key in before:
        delta = after[key] - before[key]
        print(f"{key:24}{before[key]:>10}{after[key]:>10}{delta:>+10}")
        # The host's count is shown, not judged: other users' servers come and go meanwhile.
        if delta > 0 and not key.startswith(("RSS", "host")) and key != "gc objects" and "in use" not in key:
            grew.append(key)
    rss_growth = (after["RSS KiB"] - before["RSS KiB"]) / max(1, before["RSS KiB"])
    print(f"RSS growth {rss_growth:+.1%}")
    # Memory: judged on the second half of the run (the first cycles fill the allocators' caches:
    # thread stacks, free lists), as KiB per cycle between the samples there.
    half = [(i, m) for i, m in samples if i >= args.cycles // 2]
    if len(half) >= 2 and half[-1][0] > half[0][0]:
        (i0, m0), (i1, m1) = half[0], half[-1]
        for key in m0:
            slope = (m1[key] - m0[key]) / (i1 - i0)
            limit = IN_USE_LIMIT if "in use" in key else None
            verdict = "" if limit is None else (
                " (flat)" if slope <= limit else f" (> {limit} KiB/cycle: GROWS)")
            print(f"{key} over cycles {i0}-{i1}: {slope:+.1f} KiB/cycle{verdict}")
            if limit is not None and slope > limit:
                grew.append(key)
    if grew:
        print(f"GREW: {', '.join(grew)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
