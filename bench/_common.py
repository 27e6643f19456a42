"""Shared helpers of the benchmarks: A/B rounds, statistics, process hygiene.

Every process a benchmark starts (ours through tfk8s_magics, the baseline's
by hand) inherits ``TFK8S_BENCH_RUN=<random id>``; :func:`leftovers` finds
any that survived by that mark in ``/proc/*/environ``, so "no process is left"
is checked, not assumed, and :func:`sweep` kills them whatever went wrong.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
MARK_VAR = "TFK8S_BENCH_RUN"
MARK = os.environ.setdefault(MARK_VAR, uuid.uuid4().hex[:12])
# Importable from a bench script run as ``python bench/X.py`` from anywhere.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# -- command line and output ------------------------------------------------------
def parse_args(doc: str, rounds: int) -> argparse.Namespace:
    """``--rounds N`` (each round runs ours then the baseline once)."""
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    p.add_argument("--rounds", type=int, default=rounds, help=f"A/B rounds (default {rounds})")
    args = p.parse_args()
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    return args


def machine() -> str:
    """One line describing where and when this ran (the machine is shared)."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{time.strftime('%Y-%m-%d %H:%M')}  {os.cpu_count()} cores  load {load}  "
            f"python {sys.version.split()[0]}")


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def pct(xs: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100), nearest-rank; nan for no data."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))
    return s[k]


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


# -- processes --------------------------------------------------------------------
def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (what any hand launcher does)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.05):
            return True
    except OSError:
        return False


def wait_ports(ports: list[int], timeout: float, procs: list[subprocess.Popen] = ()) -> None:
    """Poll every ~10 ms until every port accepts a TCP connection."""
    deadline = time.monotonic() + timeout
    left = list(ports)
    while left:
        left = [p for p in left if not accepts(p)]
        if not left:
            return
        dead = [p.args for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"a baseline process exited before its port opened: {dead[0]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"ports {left} not open after {timeout:g} s")
        time.sleep(0.01)


def killpg(procs: list[subprocess.Popen]) -> None:
    """SIGKILL each process's group (they were started with start_new_session) and reap."""
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        with contextlib.suppress(Exception):
            p.wait(timeout=10)


def pool_pids() -> set[int]:
    """The pool daemon (it carries this run's mark, and lives across rounds by design)."""
    from tfk8s_magics.backends.local import pool

    return {pid} if (pid := pool.daemon_pid()) else set()


def pool_full(size: int, timeout: float, import_timeout: float | None = None,
              with_memory: bool = False, in_graph: bool = False) -> dict:
    """Start this process's pool if needed and wait until ``size`` processes in it are idle for
    the next launch (``in_graph``: on the host's network; else of the default launch's kind: in
    the pool's spare namespace), then for the kernel's own background TensorFlow import
    (warm_kernel): neither is timed."""
    from tfk8s_magics import ingraph
    from tfk8s_magics.backends.local import pool

    kind = pool.default_kind(in_graph)
    sock = pool.ensure(kind)
    deadline = time.monotonic() + timeout
    while True:
        found = pool.info(sock, with_memory=with_memory)
        if found and sum(p["state"] == "idle" and p["kind"] == kind and not p["reserved"]
                         for p in found["processes"]) >= size:
            ingraph.preimported(timeout if import_timeout is None else import_timeout)
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"the pool did not fill within {timeout:g} s: {found}")
        time.sleep(0.1)


def leftovers(allow: set[int] = frozenset()) -> list[tuple[int, str]]:
    """(pid, command) of every live process carrying this run's mark, except us (and ``allow``)."""
    me, needle = os.getpid(), f"{MARK_VAR}={MARK}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me or int(d.name) in allow:
            continue
        try:
            if needle not in (d / "environ").read_bytes().split(b"\0"):
                continue
            stat = (d / "stat").read_text()
            if stat[stat.rindex(")") + 2] == "Z":
                continue  # a zombie holds nothing but its pid
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError):
            continue
        out.append((int(d.name), cmd.strip()[:100]))
    return out


def remove_cluster(be, name: str) -> None:
    """Delete a bench cluster however far its launch got (nothing to do if it never started)."""
    from tfk8s_magics.api import Cluster

    if (be.clusters_dir / name / "cluster.json").exists():
        Cluster(name, be).delete()


def assert_clean(what: str, wait: float = 5.0, allow: set[int] = frozenset()) -> None:
    """Fail loudly if a process of this run outlived ``what`` (after up to ``wait`` s);
    ``allow``: processes meant to live across rounds (a warm pool's daemon)."""
    deadline = time.monotonic() + wait
    while (left := leftovers(allow)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if left:
        sweep()
        raise RuntimeError(f"processes left after {what}: {left}")


def sweep() -> None:
    """Kill every process of this run that is still alive (last-resort cleanup)."""
    for pid, _ in leftovers():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def cleanup_on_exit():
    """Turn SIGTERM/SIGHUP into KeyboardInterrupt so ``finally`` blocks run; sweep at the end."""
    def interrupt(_sig, _frame):
        raise KeyboardInterrupt

    old = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        sweep()


def ab_rounds(rounds: int, ours: Callable[[int], dict], base: Callable[[int], dict],
              show: Callable[[str, int, dict], str]) -> tuple[list[dict], list[dict]]:
    """Run ours, baseline, ours, baseline, … printing each result as it comes."""
    a, b = [], []
    for i in range(rounds):
        for label, fn, acc in (("ours", ours, a), ("base", base, b)):
            r = fn(i)
            acc.append(r)
            print(f"round {i + 1}/{rounds}  {label:4s}  {show(label, i, r)}", flush=True)
    return a, b


def rounds(n: int, sides: list[tuple[str, Callable[[int], dict]]],
           show: Callable[[str, int, dict], str]) -> list[list[dict]]:
    """Like :func:`ab_rounds` for any number of sides, interleaved: one result list per side."""
    out: list[list[dict]] = [[] for _ in sides]
    for i in range(n):
        for (label, fn), acc in zip(sides, out, strict=True):
            r = fn(i)
            acc.append(r)
            print(f"round {i + 1}/{n}  {label:4s}  {show(label, i, r)}", flush=True)
    return out


def run(main: Callable[[], int]) -> None:
    """Run a bench's ``main``; an interrupt exits 130 once everything was cleaned up."""
    try:
        code = main()
    except KeyboardInterrupt:
        print("\ninterrupted: every process this run started has been stopped", file=sys.stderr)
        code = 130
    sys.exit(code)
