"""logs: print → notebook-side latency, sustained lines/s, and kernel responsiveness.

A worker runs :data:`LOGGER`: after a short pause it prints ``RATE`` lines/s
for ``SECONDS`` s, each stamped with ``time.time()`` (latency phase), then
prints stamped lines as fast as it can for ``BURST`` s (throughput phase),
then an end line.

ours      ``tk.launch(name, workers=1, script_path=FILE, backend=LocalBackend(tmp))``;
          the notebook side is the lab's real path,
          ``ClusterFeed.of(backend, name).subscribe(on_logs=...)`` (the same
          watcher feeding the live log view and the dashboard).
baseline  ``python FILE > file`` launched by hand with the same environment
          (``PYTHONUNBUFFERED=1``, as the lab sets), and a bare ``tail -f``-style
          reader thread of that file (``read()``; sleep 10 ms at EOF; split lines;
          same callback).

The callback only stamps each batch with its receive time (parsing happens
after the round), so it costs the pipeline nothing.  Meanwhile the main
thread — the kernel — does a trivial operation every 50 ms and records how
late it ran (wake-up delay + the operation): its p95 says whether the
kernel stays responsive while logs stream.  Rounds alternate ours / baseline.

Reported: latency p50/p95/max (pooled over rounds), ours/bare ratio of
p95s, delivered lines/s in the burst (lines / (last receive − first write)),
the writer's own CPU per burst line (user and system, from its
``getrusage``: a log watch that costs the task's ``write()`` calls shows
here), the share of burst lines shown live (ours bounds a flood: past
512 KiB of backlog it jumps to the newest 64 KiB and says so; the file
keeps every line), and the kernel's p95 tick delay in each phase.  Targets: latency
p95 ≤ 200 ms; (issue 16) p95 ≤ 2 × the bare reader's, burst delivery
≥ 0.9 × the bare reader's lines/s with the kernel's tick p95 ≤ 10 ms.

    .venv/bin/python bench/logs.py [--rounds N]
"""

from __future__ import annotations

import gc
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import _common as c

# The log path alone: with the warm pool (issue 16) on, every launch is followed by two
# TensorFlow imports refilling it, which on two cores compete with the stream being
# measured (p50 rose from 0.6 to 11 ms in such rounds); the pool's own costs are measured
# by bench/cluster_up.py.  TFK8S_POOL_SIZE=2 measures the logs with it.
os.environ.setdefault("TFK8S_POOL_SIZE", "0")

TARGET_P95_MS = 200.0
TARGET_P95_RATIO = 2.0  # issue 16: ours p95 <= 2 x the bare reader's, at RATE lines/s
TARGET_DELIVERED = 0.9  # issue 16: burst delivery >= 0.9 x the bare reader's lines/s ...
TARGET_TICK_MS = 10.0  # ... with the kernel's tick p95 still <= 10 ms
RATE = 20.0  # lines/s in the latency phase
SECONDS = 8.0
BURST = 3.0  # seconds of printing as fast as possible
TICK = 0.05  # the kernel's trivial operation, every 50 ms
BARE_POLL = 0.01
TIMEOUT = 120.0

LOGGER = '''\
"""Print stamped lines: RATE/s for SECONDS s, then as fast as possible for BURST s."""
import os
import resource
import time

rate, seconds, burst = (float(os.environ[f"BENCH_{k}"]) for k in ("RATE", "SECONDS", "BURST"))
time.sleep(0.5)
period, n = 1.0 / rate, int(rate * seconds)
due = time.time()
for i in range(n):
    pause = due - time.time()
    if pause > 0:
        time.sleep(pause)
    print(f"L {i} {time.time():.6f}", flush=True)
    due += period
time.sleep(0.5)
r0 = resource.getrusage(resource.RUSAGE_SELF)
end = time.time() + burst
i = 0
while (t := time.time()) < end:
    print(f"B {i} {t:.6f}")
    i += 1
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(f"R writer-cpu-s {r1.ru_utime - r0.ru_utime:.4f} {r1.ru_stime - r0.ru_stime:.4f}")
print(f"E {i} {time.time():.6f}", flush=True)
'''
BENCH_ENV = {"BENCH_RATE": str(RATE), "BENCH_SECONDS": str(SECONDS), "BENCH_BURST": str(BURST)}


class Receiver:
    """The notebook-side callback: remembers (receive time, texts); sees the end line.

    It keeps the texts, not the LogLine objects: strings are not tracked by the
    garbage collector, so holding a million of them does not slow every full
    collection down the way a million live LogLines would (a bench artefact; the
    lab's own views keep a few hundred lines).
    """

    def __init__(self) -> None:
        self.batches: list[tuple[float, list[str]]] = []
        self.done = threading.Event()

    def __call__(self, batch: list) -> None:
        recv = time.time()
        texts = [_text(line) for line in batch]
        self.batches.append((recv, texts))
        if any(t.startswith("E ") for t in texts[-3:]):
            self.done.set()


def _text(line) -> str:
    return line if isinstance(line, str) else line.text


class GCPauses:
    """Records every garbage collection of this process: (wall start, seconds, generation)."""

    def __init__(self) -> None:
        self.pauses: list[tuple[float, float, int]] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.pauses.append((time.time(), time.perf_counter() - self._start, info["generation"]))

    def __enter__(self) -> GCPauses:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *_exc) -> None:
        gc.callbacks.remove(self)


def kernel_ticks(until: threading.Event, timeout: float) -> tuple[list[tuple[float, float, float]], float]:
    """The main thread's trivial operation every TICK s: [(wall time, delay in s, CPU s so far)], CPU s used.

    The CPU time is this whole process's (every thread) while the ticks ran:
    what following the logs cost the kernel.
    """
    ticks, table = [], {"step": 0}
    cpu0 = time.process_time()
    deadline = time.monotonic() + timeout
    due = time.perf_counter()
    while not until.is_set() and time.monotonic() < deadline:
        due += TICK
        pause = due - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        table["step"] += 1  # the "trivial operation"
        now = time.perf_counter()
        ticks.append((time.time(), now - due, time.process_time()))
        due = max(due, now - TICK)  # a late tick does not cause a catch-up burst
    return ticks, time.process_time() - cpu0


def analyse(rx: Receiver, ticks: tuple[list[tuple[float, float]], float], gcs: GCPauses) -> dict:
    ticks, cpu = ticks
    lat, first_b, last_b, n_b, end, skips = [], None, None, 0, None, 0
    writer_cpu = (float("nan"), float("nan"))
    for recv, batch in rx.batches:
        for line in batch:
            if "bytes of fast output skipped here" in line:
                skips += 1  # the live stream bounds a flood (the file keeps every line)
                continue
            if line.startswith("R writer-cpu-s "):
                writer_cpu = tuple(map(float, line.split()[2:4]))
                continue
            parts = line.split()
            if len(parts) != 3 or parts[0] not in ("L", "B", "E"):
                continue  # TensorFlow's own start-up lines
            stamp = float(parts[2])
            if parts[0] == "L":
                lat.append((recv - stamp) * 1000)
            elif parts[0] == "B":
                n_b += 1
                first_b = stamp if first_b is None else first_b
                last_b = (recv, stamp)
            else:
                end = (int(parts[1]), stamp, recv)
    if end is None or first_b is None:
        raise RuntimeError("the end line or the burst never arrived")
    written, end_stamp, end_recv = end
    if n_b != written and not skips:
        raise RuntimeError(f"{written} burst lines written, {n_b} received, and no skip announced")
    lat_window = (min(r for r, _ in rx.batches), first_b)
    burst_window = (first_b, end_recv)
    return {
        "lat": lat,
        "written_per_s": written / (end_stamp - first_b),
        "delivered_per_s": n_b / (last_b[0] - first_b),
        "lag_ms": (last_b[0] - last_b[1]) * 1000,
        "lines": n_b,
        "shown": n_b / written,
        "skips": skips,
        "cpu_us_per_line": cpu / (n_b + len(lat)) * 1e6,
        # The writer's own CPU per burst line (user, system): what watching its log costs it.
        "writer_user_us": writer_cpu[0] / written * 1e6,
        "writer_sys_us": writer_cpu[1] / written * 1e6,
        "burst_cpu_us_per_line": _window_cpu(ticks, burst_window) / n_b * 1e6,
        "tick_lat": [d * 1000 for t, d, _ in ticks if lat_window[0] <= t < lat_window[1]],
        "tick_burst": [d * 1000 for t, d, _ in ticks if burst_window[0] <= t <= burst_window[1]],
        "gc_burst": [(d * 1000, g) for t, d, g in gcs.pauses
                     if burst_window[0] <= t <= burst_window[1]],
    }


def _window_cpu(ticks: list[tuple[float, float, float]], window: tuple[float, float]) -> float:
    """CPU seconds this process used between the first and last tick inside ``window``."""
    inside = [cpu for t, _, cpu in ticks if window[0] <= t <= window[1]]
    return inside[-1] - inside[0] if len(inside) > 1 else float("nan")


def run_ours(tmp: Path, script: Path, i: int) -> dict:
    import tfk8s_magics as tk
    from tfk8s_magics.backends.local import LocalBackend
    from tfk8s_magics.watch import ClusterFeed

    be = LocalBackend(tmp / f"ours-{i}")
    name = f"logs{i}"
    cluster = None
    rx = Receiver()
    try:
        cluster = tk.launch(name, workers=1, script_path=str(script), env=BENCH_ENV,
                            backend=be)
        unsubscribe = ClusterFeed.of(be, name).subscribe(on_logs=rx)
        with GCPauses() as gcs:
            ticks = kernel_ticks(rx.done, TIMEOUT)
        unsubscribe()
        if not rx.done.is_set():
            raise RuntimeError(f"ours: no end line within {TIMEOUT:g} s:\n"
                               f"{cluster.logs('worker-0', tail=20)}")
        cluster.wait(30)
    finally:
        c.remove_cluster(be, name)
    c.assert_clean(f"ours round {i + 1}")
    return analyse(rx, ticks, gcs)


def bare_follow(path: Path, stop: threading.Event, cb) -> None:
    """The simplest ``tail -f``: read to EOF, sleep BARE_POLL, repeat."""
    while not path.exists() and not stop.is_set():
        time.sleep(BARE_POLL)
    with open(path, "rb") as f:
        rest = b""
        while not stop.is_set():
            data = f.read()
            if not data:
                time.sleep(BARE_POLL)
                continue
            *lines, rest = (rest + data).split(b"\n")
            if lines:
                cb([line.decode("utf-8", "replace") for line in lines])


def run_base(tmp: Path, script: Path, i: int) -> dict:
    path = tmp / f"base-{i}.log"
    rx, stop = Receiver(), threading.Event()
    procs: list[subprocess.Popen] = []
    reader = threading.Thread(target=bare_follow, args=(path, stop, rx), daemon=True)
    try:
        reader.start()
        with open(path, "wb") as out:
            procs.append(subprocess.Popen(
                [c.PYTHON, str(script)], env=dict(os.environ, PYTHONUNBUFFERED="1", **BENCH_ENV),
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True))
        with GCPauses() as gcs:
            ticks = kernel_ticks(rx.done, TIMEOUT)
        if not rx.done.is_set():
            raise RuntimeError(f"baseline: no end line within {TIMEOUT:g} s")
        procs[0].wait(30)
    finally:
        stop.set()
        reader.join(5)
        c.killpg(procs)
    c.assert_clean(f"baseline round {i + 1}")
    return analyse(rx, ticks, gcs)


def show(_label: str, _i: int, r: dict) -> str:
    return (f"latency p50 {c.pct(r['lat'], 50):6.1f} p95 {c.pct(r['lat'], 95):6.1f} "
            f"max {max(r['lat']):6.1f} ms | burst {r['lines']} lines ({r['shown']:.0%} shown, "
            f"{r['skips']} skips), written "
            f"{r['written_per_s']:8.0f}/s delivered {r['delivered_per_s']:8.0f}/s, "
            f"lag {r['lag_ms']:5.0f} ms, writer CPU/line user {r['writer_user_us']:.2f} sys "
            f"{r['writer_sys_us']:.2f} us, kernel CPU {r['cpu_us_per_line']:.2f} us/line "
            f"({r['burst_cpu_us_per_line']:.2f} in the burst) | "
            f"kernel tick p95 {c.pct(r['tick_lat'], 95):5.1f} ms "
            f"(latency phase) {c.pct(r['tick_burst'], 95):5.1f} ms (burst) | GC in burst: "
            f"{len(r['gc_burst'])} runs, {sum(d for d, _ in r['gc_burst']):.0f} ms, max "
            f"{max((d for d, _ in r['gc_burst']), default=0):.0f} ms")


def main() -> int:
    args = c.parse_args(__doc__, rounds=3)
    print(f"logs  {RATE:g} lines/s for {SECONDS:g} s, then {BURST:g} s flat out  {c.machine()}",
          flush=True)
    with c.cleanup_on_exit(), tempfile.TemporaryDirectory(prefix="bench-logs-") as d:
        tmp = Path(d)
        script = tmp / "logger.py"
        script.write_text(LOGGER, encoding="utf-8")
        ours, base = c.ab_rounds(args.rounds, lambda i: run_ours(tmp, script, i),
                                 lambda i: run_base(tmp, script, i), show)

    def pooled(rs: list[dict], key: str) -> list[float]:
        return [x for r in rs for x in r[key]]

    print()
    rows = []
    for label, rs in (("ours", ours), ("bare", base)):
        lat = pooled(rs, "lat")
        row = {
            "p50": c.pct(lat, 50), "p95": c.pct(lat, 95), "max": max(lat),
            "delivered": c.median([r["delivered_per_s"] for r in rs]),
            "shown": c.median([r["shown"] for r in rs]),
            "written": c.median([r["written_per_s"] for r in rs]),
            "lag": c.median([r["lag_ms"] for r in rs]),
            "cpu": c.median([r["cpu_us_per_line"] for r in rs]),
            "burst_cpu": c.median([r["burst_cpu_us_per_line"] for r in rs]),
            "w_user": c.median([r["writer_user_us"] for r in rs]),
            "w_sys": c.median([r["writer_sys_us"] for r in rs]),
            "tick_lat": c.pct(pooled(rs, "tick_lat"), 95),
            "tick_burst": c.pct(pooled(rs, "tick_burst"), 95),
        }
        rows.append(row)
        print(f"{label}: latency p50 {row['p50']:.1f} ms  p95 {row['p95']:.1f} ms  "
              f"max {row['max']:.1f} ms  ({len(lat)} lines) | burst: median written "
              f"{row['written']:.0f} lines/s, delivered {row['delivered']:.0f} lines/s "
              f"({row['shown']:.0%} of them shown live), "
              f"lag at end {row['lag']:.0f} ms, kernel CPU {row['cpu']:.2f} us/line "
              f"({row['burst_cpu']:.2f} in the burst) | "
              f"kernel tick delay p95 {row['tick_lat']:.1f} ms "
              f"(latency phase), {row['tick_burst']:.1f} ms (burst)")
    o, b = rows
    print(f"\nlatency p95 ours {o['p95']:.1f} ms (target <= {TARGET_P95_MS:g}: "
          f"{c.verdict(o['p95'] <= TARGET_P95_MS)})   ours/bare p95 {o['p95'] / b['p95']:.2f}   "
          f"ours/bare p50 {o['p50'] / b['p50']:.2f}")
    print(f"kernel CPU per line ours/bare {o['cpu'] / b['cpu']:.2f} (whole run: ours includes the "
          f"cluster's status watch and start), in the burst {o['burst_cpu'] / b['burst_cpu']:.2f}")
    ratio = o['p95'] / b['p95']
    print(f"ours/bare p95 {ratio:.2f} (target <= {TARGET_P95_RATIO:g}: "
          f"{c.verdict(ratio <= TARGET_P95_RATIO)})")
    print(f"writer CPU per burst line ours/bare: user {o['w_user'] / b['w_user']:.2f}, system "
          f"{o['w_sys'] / b['w_sys']:.2f} ({o['w_sys']:.2f} vs {b['w_sys']:.2f} us; the writer's "
          f"lines/s follow its CPU per line and its CPU share)")
    delivered = o['delivered'] / b['delivered']
    print(f"delivered lines/s ours/bare {delivered:.2f} (target >= {TARGET_DELIVERED:g}: "
          f"{c.verdict(delivered >= TARGET_DELIVERED)})   kernel tick p95 during burst ours "
          f"{o['tick_burst']:.1f} ms (target <= {TARGET_TICK_MS:g}: "
          f"{c.verdict(o['tick_burst'] <= TARGET_TICK_MS)}), bare {b['tick_burst']:.1f} ms")
    return 0


if __name__ == "__main__":
    c.run(main)
