"""sidebar: the TF clusters sidebar with 50 live local clusters — browser frame time and server CPU.

One run, two scenarios on the same JupyterLab server and the same Chromium page (Debian's, as the
browser tests drive it), each measured for ``--seconds`` with the sidebar shown and its list
scrolled a little every frame (so every frame lays out and paints rows):

baseline  no cluster: JupyterLab with the sidebar open and empty;
live      ``--clusters`` (50) real local clusters launched detached through the public API, each
          task printing a line and reporting progress (step, total, loss) every second: 50 row
          updates a second pushed over the sidebar's WebSocket.

Browser: every ``requestAnimationFrame`` interval (p50 / p95 / max, share of frames over 50 ms)
and the long tasks (> 50 ms) the page's PerformanceObserver saw.  Server: the jupyter_server
process's CPU time (all threads: the monitor's discovery, 50 watch threads, the socket) divided
by wall time, 100 % = one core.  Ratios are live / baseline, measured in the same run.

    .venv/bin/python bench/sidebar.py [--clusters 50] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from _common import ROOT, leftovers, machine, median, pct, sweep

sys.path.insert(0, str(ROOT))

TASK = textwrap.dedent("""\
    import time
    import tfk8s_magics as tk
    for i in range(100000):
        print(f"step {i}", flush=True)
        tk.report_progress(i + 1, total=3600, loss=1.0 / (i + 1))
        time.sleep(1.0)
""")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
MEASURE = """async (ms) => {
  const list = document.querySelector('.tfk8s-list');
  const frames = [], longs = [];
  const obs = new PerformanceObserver(l => { for (const e of l.getEntries()) longs.push(e.duration); });
  obs.observe({entryTypes: ['longtask']});
  let dir = 1;
  await new Promise(done => {
    let last = performance.now();
    const end = last + ms;
    const frame = t => {
      frames.push(t - last); last = t;
      if (list.scrollHeight > list.clientHeight) {
        if (list.scrollTop + list.clientHeight >= list.scrollHeight - 1) dir = -1;
        if (list.scrollTop <= 0) dir = 1;
        list.scrollTop += 4 * dir;
      }
      if (t < end) requestAnimationFrame(frame); else done();
    };
    requestAnimationFrame(frame);
  });
  obs.disconnect();
  return {frames: frames.slice(1), longs, rows: document.querySelectorAll('.tfk8s-row').length};
}"""


def measure(page, server, seconds: float) -> dict:
    import psutil

    proc = psutil.Process(server.proc.pid)
    t0, c0 = time.monotonic(), sum(proc.cpu_times()[:2])
    got = page.evaluate(MEASURE, seconds * 1000)
    wall, cpu = time.monotonic() - t0, sum(proc.cpu_times()[:2]) - c0
    f = got["frames"]
    return {"rows": got["rows"], "frames": len(f), "p50_ms": median(f), "p95_ms": pct(f, 95),
            "max_ms": max(f), "over50": sum(x > 50 for x in f) / len(f), "long_tasks": len(got["longs"]),
            "long_ms": sum(got["longs"]), "cpu_pct": 100 * cpu / wall}


def show(name: str, m: dict) -> None:
    print(f"  {name:9s} rows {m['rows']:3d}  frames {m['frames']:5d}  p50 {m['p50_ms']:6.1f} ms  "
          f"p95 {m['p95_ms']:6.1f} ms  max {m['max_ms']:7.1f} ms  >50ms {100 * m['over50']:5.1f} %  "
          f"long tasks {m['long_tasks']:3d} ({m['long_ms']:.0f} ms)  server CPU {m['cpu_pct']:5.1f} %")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--clusters", type=int, default=50, help="live clusters (default 50)")
    p.add_argument("--seconds", type=float, default=20.0, help="seconds per scenario (default 20)")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tfk8s-bench-sidebar-"))
    state, root = tmp / "state", tmp / "root"
    state.mkdir()
    root.mkdir()
    (root / "task.py").write_text(TASK)
    os.environ.update(TFK8S_STATE_DIR=str(state), TFK8S_BACKEND="local", TFK8S_POOL_SIZE="0")
    from playwright.sync_api import sync_playwright

    import tfk8s_magics as tk
    from tests.browserlab import Lab

    print(f"sidebar bench: {machine()}")
    server = Lab(tmp, state, root)
    server.start()
    results = {}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(120_000)
            page.goto(f"{server.base}/lab?token={server.token}")
            page.locator('.jp-SideBar [data-id="tfk8s-sidebar"]').click()
            page.wait_for_function("document.querySelector('.tfk8s-status')?.textContent.includes('backend')")
            time.sleep(3)
            results["baseline"] = measure(page, server, args.seconds)
            t0 = time.monotonic()
            for i in range(args.clusters):
                tk.launch(f"live-{i:02d}", workers=1, script_path=str(root / "task.py"), detach=True)
            launched = time.monotonic() - t0
            page.wait_for_function(
                f"document.querySelectorAll('.tfk8s-row[data-phase=\"running\"]').length >= {args.clusters}",
                timeout=600_000)
            print(f"  {args.clusters} clusters launched in {launched:.0f} s, all running in the sidebar "
                  f"{time.monotonic() - t0:.0f} s after the first launch")
            time.sleep(3)
            results["live"] = measure(page, server, args.seconds)
            browser.close()
    finally:
        for st in tk.list_clusters():
            try:
                tk.get(st.name).delete()
            except Exception as e:  # noqa: BLE001 - report and go on cleaning
                print(f"  could not delete {st.name}: {e}")
        server.close()
        left = leftovers()
        sweep()
    for name, m in results.items():
        show(name, m)
    if len(results) == 2:
        b, live = results["baseline"], results["live"]
        print(f"  ratio live/baseline: frame p50 {live['p50_ms'] / b['p50_ms']:.2f}x  "
              f"p95 {live['p95_ms'] / b['p95_ms']:.2f}x  server CPU "
              f"{live['cpu_pct'] / max(b['cpu_pct'], 0.1):.1f}x "
              f"({b['cpu_pct']:.1f} % -> {live['cpu_pct']:.1f} %)")
    (ROOT / "test-artifacts").mkdir(exist_ok=True)
    (ROOT / "test-artifacts" / "bench-sidebar.json").write_text(json.dumps(results, indent=1))
    if left:
        print(f"  processes left behind (killed): {left}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
