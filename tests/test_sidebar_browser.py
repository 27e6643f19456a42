"""The TF clusters sidebar in a real browser: JupyterLab on 127.0.0.1 driven through Debian's Chromium.

One lab, one page, the way a new user goes: a cluster launched from the ``tfk8s`` CLI appears
in the sidebar without a reload; a script chosen in the file browser is launched from the form
(a typed mistake first shows the magic's own sentence) and goes running → succeeded; its logs
open in a tab (HTML in a line stays text; opening again focuses the same tab; a failed cluster's
logs open on its failed task); TensorBoard opens in a tab through jupyter-server-proxy; the
connect cell is inserted into a notebook and run; Stop and Delete work from the sidebar.  A
second test restarts the server under the open page.  The sidebar's update latency (a task's
line printed → shown in the logs tab) is measured on the way and written to
``test-artifacts/sidebar-latency.json``; screenshots go to ``test-artifacts/`` and, with
``TFK8S_DOCS_SHOTS=1``, to ``docs/users/images/``.
"""

from __future__ import annotations

import json
import os
import statistics
import textwrap
from pathlib import Path

import pytest

from tests.browserlab import ARTIFACTS, Lab, chromium, run_cell, shot, wait

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
DOCS_IMAGES = REPO / "docs" / "users" / "images"
EVIL = "<img src=x onerror=alert(1)>"

COUNT = textwrap.dedent(f"""\
    import time
    import tfk8s_magics as tk
    for i in range(16):
        print(f"line {{i}} {EVIL}", flush=True)
        tk.report_progress(i + 1, total=16, loss=1.0 / (i + 1))
        time.sleep(0.5)
""")
# Prints the time of each print, so the page can tell how long a line took to show.
TICKER = textwrap.dedent("""\
    import time
    import tfk8s_magics as tk
    for i in range(3000):
        print(f"tick {i} {time.time():.6f}", flush=True)
        tk.report_progress(i + 1, total=3000, loss=2.0 / (i + 2))
        time.sleep(0.5)
""")
FAILS = textwrap.dedent("""\
    import json, os, sys
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    print("I am", task, flush=True)
    if task["index"] == 1:
        sys.exit("worker-1 gives up")
""")
SUMMARIES = textwrap.dedent("""\
    import os
    import tensorflow as tf
    w = tf.summary.create_file_writer(os.path.join(os.environ["TFK8S_LOG_DIR"], "train"))
    with w.as_default():
        for step in range(5):
            tf.summary.scalar("loss", 1.0 / (step + 1), step=step)
    w.flush()
    print("summaries written", flush=True)
""")
LAUNCH_IG = "import tfk8s_magics as tk\ntk.launch('ig', mode='in-graph', ps=1, workers=1)"
NOTEBOOK = {"cells": [{"cell_type": "code", "execution_count": None, "id": "first", "metadata": {},
                       "outputs": [], "source": LAUNCH_IG}],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
            "nbformat": 4, "nbformat_minor": 5}

# Arrival time of every "tick I T" line shown in a logs tab after this is installed:
# [I, T printed, T shown] (the lines already shown are history, not a measure).
OBSERVE_TICKS = """(pre) => {
  window.__ticks = [];
  const seen = new Set();
  const scan = (record) => {
    const now = Date.now() / 1000;
    for (const m of pre.textContent.matchAll(/tick (\\d+) (\\d+\\.\\d+)/g)) {
      if (!seen.has(m[1])) { seen.add(m[1]); if (record) window.__ticks.push([+m[1], +m[2], now]); }
    }
  };
  scan(false);
  new MutationObserver(() => scan(true)).observe(pre, {childList: true, characterData: true, subtree: true});
}"""


# Layout shifts (Chromium's Layout Instability API) whose moved nodes are inside the sidebar.
OBSERVE_SHIFTS = """() => {
  window.__shifts = [];
  const bar = document.getElementById('tfk8s-sidebar');
  new PerformanceObserver(list => {
    for (const e of list.getEntries()) {
      if ((e.sources || []).some(s => s.node && bar.contains(s.node))) window.__shifts.push(e.value);
    }
  }).observe({type: 'layout-shift'});
}"""


def _shot(page, name: str, element=None, docs: bool = False) -> None:
    """A screenshot for test-artifacts/ (and, with ``TFK8S_DOCS_SHOTS=1``, the docs page)."""
    shot(page, name, element, DOCS_IMAGES if docs and os.environ.get("TFK8S_DOCS_SHOTS") == "1" else None)


def _wait(cond, timeout: float, what: str, page=None):
    return wait(cond, timeout, what, page, prefix="sidebar-")


@pytest.fixture
def lab(tmp_path, state_dir):
    root = tmp_path / "root"
    root.mkdir()
    for name, text in {"count.py": COUNT, "ticker.py": TICKER, "fails.py": FAILS,
                       "summaries.py": SUMMARIES}.items():
        (root / name).write_text(text)
    (root / "connect.ipynb").write_text(json.dumps(NOTEBOOK))
    server = Lab(tmp_path, state_dir, root)
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def page(tmp_path):
    """A Chromium page (Debian's browser, a fresh profile) that records any JS dialog."""
    with chromium(tmp_path / "chromium-profile", height=900) as pg:
        yield pg


def _open_sidebar(page, lab, path: str = "lab") -> None:
    page.goto(f"{lab.base}/{path}?token={lab.token}")
    tab = page.locator('.jp-SideBar [data-id="tfk8s-sidebar"]')
    _wait(lambda: tab.count() == 1, 90, "the sidebar's tab", page)
    tab.click()
    _wait(lambda: page.locator("#tfk8s-sidebar").is_visible(), 30, "the sidebar", page)


def _row(page, name: str):
    return page.locator(f'.tfk8s-row[data-name="{name}"]')


def _phase(page, name: str) -> str:
    row = _row(page, name)
    return (row.get_attribute("data-phase") or "") if row.count() else ""


def _active_tab_label(page) -> str:
    current = ".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel"
    return page.locator(current).first.inner_text()


def _run_focus(page, cell) -> None:
    """Make ``cell`` the notebook's active cell (focus, no hit-test)."""
    cell.locator(".jp-InputArea-editor .cm-content").first.focus()
    _wait(lambda: "jp-mod-active" in (cell.get_attribute("class") or "").split(), 30,
          "the cell to be the active one", page)


def test_sidebar_end_to_end(lab, page, state_dir):
    import tfk8s_magics as tk

    _open_sidebar(page, lab)
    _wait(lambda: "backend: local" in page.locator(".tfk8s-status").inner_text(), 30, "the stream", page)

    # 1. A cluster launched from a terminal appears, no reload.
    lab.tfk8s("submit", "ticker", "--workers", "1", "--script", "ticker.py")
    _wait(lambda: _phase(page, "ticker") == "running", 120, "the CLI's cluster to show as running", page)

    # 2. Launch from the form, for a script chosen in the file browser.
    page.locator('.jp-SideBar [data-id="filebrowser"]').click()
    page.locator(".jp-DirListing-item", has_text="count.py").first.click(button="right")
    page.locator(".lm-Menu-item", has_text="Launch as a TF cluster").click()
    page.locator('.jp-SideBar [data-id="tfk8s-sidebar"]').click()
    form = page.locator(".tfk8s-form")
    _wait(lambda: form.locator('input[name="workers"]').count() == 1, 30, "the launch form", page)
    assert form.locator('input[name="script"]').input_value() == "count.py"
    assert form.locator('input[name="name"]').input_value() == "count"
    fields = [f["name"] for f in lab.request("GET", "/tfk8s/form")[1]["fields"]]
    assert form.locator("[name]").evaluate_all("els => els.map(e => e.name)") == ["name", "script", *[
        n for n in ["mode", "workers", "ps", "chief", "evaluator", "restart_budget", "backend"] if n in fields
    ], *[n for n in fields if n not in ("mode", "workers", "ps", "chief", "evaluator", "restart_budget",
                                        "backend")]]
    form.locator('input[name="name"]').fill("form1")
    form.locator('input[name="workers"]').fill("x")
    form.locator(".tfk8s-form-submit").click()
    error = form.locator(".tfk8s-form-error")
    _wait(lambda: error.inner_text().strip(), 30, "the form's error", page)
    assert error.inner_text().strip() == (
        "%tfcluster launch: argument --workers: 'x' is not a whole number "
        "(%tfcluster launch --help shows how)")
    assert not [c.name for c in tk.list_clusters() if c.name == "form1"]  # nothing launched
    form.locator('input[name="workers"]').fill("1")
    form.locator(".tfk8s-form-submit").click()
    _wait(lambda: "form1: launched" in form.locator(".tfk8s-form-done").inner_text(), 60, "the launch", page)
    phases = []
    _wait(lambda: phases.append(_phase(page, "form1")) or phases[-1] == "running", 120,
          "form1 running in the sidebar", page)
    row = _row(page, "form1")
    _wait(lambda: "step" in row.locator(".tfk8s-row-progress").inner_text(), 60, "form1's progress", page)
    # No layout shift while rows update: the browser's own layout-shift entries, over updates.
    page.evaluate(OBSERVE_SHIFTS)
    steps = {row.locator(".tfk8s-row-progress").inner_text()}
    _wait(lambda: steps.add(row.locator(".tfk8s-row-progress").inner_text()) or len(steps) >= 4, 60,
          "three more progress updates of form1", page)
    assert page.evaluate("window.__shifts") == [], "rows moved while updating"
    _shot(page, "sidebar.png", page.locator("#tfk8s-sidebar"), docs=True)

    # 3. Its logs in a tab: lines as text; a second click focuses the same tab.
    row.locator(".tfk8s-action-logs").click()
    logs = page.locator(".tfk8s-logs").last
    pre = logs.locator('.tfk8s-logs-pre[data-task="worker-0"]')
    _wait(lambda: "line 3 " in pre.inner_text(), 60, "form1's log lines", page)
    assert EVIL in pre.inner_text() and pre.locator("img").count() == 0 and not page.dialogs
    assert logs.locator('.tfk8s-logs-tab[aria-selected="true"]').inner_text() == "worker-0"
    _wait(lambda: _phase(page, "form1") == "succeeded", 120, "form1 succeeded in the sidebar", page)
    assert "line 15 " in pre.inner_text()
    _wait(lambda: "ended" in logs.locator(".tfk8s-logs-state").inner_text(), 30, "the log's end", page)
    _row(page, "ticker").locator(".tfk8s-action-logs").click()
    _wait(lambda: _active_tab_label(page) == "Logs: ticker", 30, "the ticker's logs tab", page)
    row.locator(".tfk8s-action-logs").click()
    _wait(lambda: _active_tab_label(page) == "Logs: form1", 30, "the same logs tab focused again", page)
    assert page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="Logs: form1").count() == 1

    # 4. Latency: a line printed by the ticker's task -> shown in its logs tab.
    _row(page, "ticker").locator(".tfk8s-action-logs").click()
    tick_pre = page.locator('.tfk8s-logs-pre[data-task="worker-0"]').filter(has_text="tick").first
    _wait(lambda: "tick" in tick_pre.inner_text(), 60, "the ticker's lines", page)
    tick_pre.evaluate(OBSERVE_TICKS)
    _wait(lambda: len(page.evaluate("window.__ticks")) >= 20, 120, "20 new ticks shown", page)
    lat = sorted(t[2] - t[1] for t in page.evaluate("window.__ticks"))
    ARTIFACTS.mkdir(exist_ok=True)
    report = {"samples": len(lat), "median_s": statistics.median(lat), "max_s": lat[-1], "min_s": lat[0]}
    (ARTIFACTS / "sidebar-latency.json").write_text(json.dumps(report, indent=1))
    print(f"\nsidebar log latency (print -> shown): {report}")
    _shot(page, "sidebar-logs.png", docs=True)

    # 5. A failed cluster's logs open on its failed task.
    lab.tfk8s("submit", "bad", "--workers", "2", "--restarts", "0", "--script", "fails.py")
    _wait(lambda: _phase(page, "bad") == "failed", 180, "bad to fail", page)
    assert "worker-1" in _row(page, "bad").locator(".tfk8s-row-reason").inner_text()
    _row(page, "bad").locator(".tfk8s-action-logs").click()
    bad_logs = page.locator(".tfk8s-logs").filter(has=page.locator('.tfk8s-logs-tab[data-task="worker-1"]'))
    _wait(lambda: bad_logs.count() == 1, 30, "bad's logs tab", page)
    assert bad_logs.locator('.tfk8s-logs-tab[aria-selected="true"]').inner_text() == "worker-1"
    _wait(lambda: "gives up" in bad_logs.locator('.tfk8s-logs-pre[data-task="worker-1"]').inner_text(), 30,
          "worker-1's last words", page)

    # Its events, and the ticker's progress and loss curve, in tabs of their own.
    _row(page, "bad").locator(".tfk8s-action-events").click()
    events = page.locator(".tfk8s-events").last
    _wait(lambda: "worker-1" in events.locator("tbody").inner_text(), 60, "bad's events", page)
    _row(page, "ticker").locator(".tfk8s-action-progress").click()
    curve = page.locator(".tfk8s-progress .tfk8s-curve polyline")
    _wait(lambda: len((curve.get_attribute("points") or "").split()) >= 3, 60, "three points of the curve",
          page)
    assert "loss by step" in page.locator(".tfk8s-progress-label").inner_text()

    # 6. TensorBoard in a tab, through jupyter-server-proxy.
    lab.tfk8s("submit", "tb", "--workers", "1", "--script", "summaries.py")
    _wait(lambda: _phase(page, "tb") == "succeeded", 240, "tb to write its summaries", page)
    _row(page, "tb").locator(".tfk8s-action-tensorboard").click()
    frame_el = page.locator(".tfk8s-tensorboard iframe")
    _wait(lambda: frame_el.count() == 1, 120, "the TensorBoard tab", page)
    src = frame_el.get_attribute("src") or ""
    assert "/proxy/" in src, src
    frame = page.frame_locator(".tfk8s-tensorboard iframe")

    def tensorboard_shown() -> bool:
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        try:  # a frame still loading has no body yet: keep waiting, do not fail on the first look
            return "TensorBoard" in frame.locator("body").inner_text(timeout=5000)
        except PlaywrightTimeout:
            return False

    _wait(tensorboard_shown, 120, "TensorBoard to answer in its tab", page)
    _row(page, "tb").locator(".tfk8s-action-tensorboard").click()
    assert page.locator(".tfk8s-tensorboard").count() == 1

    # 7. Insert the connect cell into the active notebook and run it.  The notebook's first cell
    # launches an in-graph cluster from this kernel (the lab's sandboxed kernels reach only the
    # in-graph servers they launched: their own network namespace).
    page.locator('.jp-SideBar [data-id="filebrowser"]').click()
    page.locator(".jp-DirListing-item", has_text="connect.ipynb").first.dblclick()
    page.locator('.jp-SideBar [data-id="tfk8s-sidebar"]').click()
    cells = page.locator(".jp-Notebook .jp-CodeCell")
    _wait(lambda: cells.count() == 1, 60, "the notebook", page)
    _wait(lambda: "Idle" in page.locator("#jp-main-statusbar").inner_text(), 120, "the kernel", page)
    run_cell(page, cells.nth(0))
    _wait(lambda: cells.count() == 2, 60, "the new cell below the launch", page)
    _run_focus(page, cells.nth(1))
    _row(page, "ticker").locator(".tfk8s-action-insert").click()
    handle = cells.filter(has_text="cluster = tk.get('ticker')")
    _wait(lambda: handle.count() == 1, 30, "the inserted cell", page)
    assert cells.nth(2).locator(".jp-InputArea-editor").inner_text().strip() == (
        "import tfk8s_magics as tk\ncluster = tk.get('ticker')\ncluster")  # below the active cell
    run_cell(page, handle)
    out = handle.locator(".jp-OutputArea")
    _wait(lambda: "ticker" in out.inner_text(), 120, "the handle's output", page)
    assert "Error" not in out.inner_text()
    # In-graph: the inserted magic makes this kernel the cluster's client.
    _wait(lambda: _phase(page, "ig") == "running", 300, "ig (launched by the notebook) running", page)
    _row(page, "ig").locator(".tfk8s-action-insert").click()
    connect = cells.filter(has_text="strategy = %tfcluster connect ig")
    _wait(lambda: connect.count() == 1, 30, "the second inserted cell", page)
    run_cell(page, connect)
    _wait(lambda: connect.locator(".jp-InputPrompt").inner_text().strip() not in ("[*]:", "[ ]:"),
          300, "the connect cell to finish", page)
    assert "Error" not in connect.locator(".jp-OutputArea").inner_text()
    last = cells.nth(cells.count() - 1)
    last.locator(".jp-InputArea-editor .cm-content").first.click()
    page.keyboard.type("print(type(strategy).__name__)")
    run_cell(page, last)
    _wait(lambda: "ParameterServerStrategy" in last.locator(".jp-OutputArea").inner_text(), 120,
          "the strategy of the connected kernel", page)
    _shot(page, "sidebar-connect.png", docs=True)

    # 8. Stop, then Delete, from the sidebar.
    _row(page, "ticker").locator(".tfk8s-action-stop").click()
    _wait(lambda: _phase(page, "ticker") == "stopped", 60, "ticker stopped", page)
    assert tk.get("ticker").status().phase == "stopped"
    _row(page, "ticker").locator(".tfk8s-action-delete").click()
    page.locator(".jp-Dialog .jp-mod-accept").click()
    _wait(lambda: _row(page, "ticker").count() == 0, 60, "ticker gone from the sidebar", page)
    assert "ticker" not in [c.name for c in tk.list_clusters()]
    assert not page.dialogs


@pytest.fixture
def dark_lab(tmp_path, state_dir):
    root = tmp_path / "root"
    root.mkdir()
    for name, text in {"count.py": COUNT, "ticker.py": TICKER}.items():
        (root / name).write_text(text)
    server = Lab(tmp_path, state_dir, root,
                 settings={"@jupyterlab/apputils-extension/themes": {"theme": "JupyterLab Dark"}})
    server.start()
    try:
        yield server
    finally:
        server.close()


def _luminance(css: str) -> float:
    r, g, b = (int(x) for x in css[css.index("(") + 1:css.index(")")].split(",")[:3])
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255


def test_sidebar_after_a_server_restart(dark_lab, page, state_dir):
    """The page stays open while the server restarts; meanwhile one cluster is deleted and
    another launched from the CLI: the sidebar reconnects and shows exactly what is there.
    (In the dark theme: the sidebar takes the theme's colours.)"""
    import tfk8s_magics as tk

    lab = dark_lab
    _open_sidebar(page, lab)
    _wait(lambda: page.evaluate("document.body.dataset.jpThemeLight") == "false", 60, "the dark theme", page)
    bar = page.locator("#tfk8s-sidebar")
    assert _luminance(bar.evaluate("e => getComputedStyle(e).backgroundColor")) < 0.3
    assert _luminance(bar.locator(".tfk8s-title").evaluate("e => getComputedStyle(e).color")) > 0.6
    lab.tfk8s("submit", "keep", "--workers", "1", "--script", "ticker.py")
    lab.tfk8s("submit", "gone", "--workers", "1", "--script", "count.py")
    _wait(lambda: _phase(page, "keep") == "running" and _row(page, "gone").count() == 1, 120,
          "both clusters in the sidebar", page)
    _shot(page, "sidebar-dark.png", bar, docs=True)
    lab.stop()
    _wait(lambda: "Reconnecting" in page.locator(".tfk8s-status").inner_text(), 60,
          "the sidebar to notice", page)
    tk.get("gone").delete()
    lab.tfk8s("submit", "new", "--workers", "1", "--script", "count.py")
    lab.start()
    _wait(lambda: "backend: local" in page.locator(".tfk8s-status").inner_text(), 90, "the reconnect", page)
    _wait(lambda: _row(page, "new").count() == 1, 60, "the cluster launched meanwhile", page)
    assert _row(page, "gone").count() == 0
    _wait(lambda: _phase(page, "keep") == "running", 30, "keep still running", page)
    _wait(lambda: _phase(page, "new") == "succeeded", 180, "new pushed to succeeded after the restart", page)
    # JupyterLab's own "Server Connection Error" dialog from the outage: dismissed as a user would.
    dialog = page.locator(".jp-Dialog")
    if dialog.count():
        dialog.locator(".jp-Dialog-button").last.click()
        _wait(lambda: page.locator(".jp-Dialog").count() == 0, 30, "the dialog to close", page)
    _row(page, "keep").locator(".tfk8s-action-stop").click()
    _wait(lambda: _phase(page, "keep") == "stopped", 60, "keep stopped", page)
    # A browser restart (a fresh page): the same rows from the server's snapshot.
    _open_sidebar(page, lab)
    _wait(lambda: _phase(page, "keep") == "stopped" and _phase(page, "new") == "succeeded", 60,
          "the rows after a reload", page)
    assert _row(page, "gone").count() == 0
