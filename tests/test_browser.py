"""The dashboard in a real browser: JupyterLab on 127.0.0.1 driven through Debian's Chromium.

The test starts JupyterLab (the venv's) with the lab's kernels (``hub_config/jupyter``: the
sandboxed kernel, its channels on unix sockets) on a free loopback port with a token, opens a copy of
``notebooks/dashboard_tour.ipynb`` with one extra cell appended (a cluster
that runs until stopped), runs the tour's launch cell and the extra cell
on the local backend, and asserts in the DOM that

* the dashboard renders, and its task row goes running → succeeded;
* log lines arrive while the cluster runs, and a log line that looks like
  HTML stays text (no element, no alert);
* the progress bar (ipywidgets 8 ``.widget-hprogress``) advances;
* the Stop button stops the running cluster and shows the outcome.

Screenshots go to ``test-artifacts/`` (git-ignored).  Chromium comes from
Debian (``scripts/bootstrap`` installs it); a missing browser is a
failure, not a skip, because CI always has one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.browserlab import Lab, chromium, run_cell, shot, wait

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "notebooks" / "dashboard_tour.ipynb"
EVIL = "<img src=x onerror=alert(1)>"

STOP_CELL = f"""%%tfcluster launch stopme --workers 1 --ps 0
import time
for i in range(2000):
    print(f"tick {{i}} {EVIL}", flush=True)
    time.sleep(0.3)
"""


@pytest.fixture
def lab(tmp_path, state_dir):
    """JupyterLab on 127.0.0.1 serving a temp copy of the tour notebook (plus the stop cell)."""
    root = tmp_path / "root"
    root.mkdir()
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    nb["cells"].append(
        {
            "cell_type": "code",
            "execution_count": None,
            "id": "stop-test",
            "metadata": {},
            "outputs": [],
            "source": STOP_CELL,
        }
    )
    (root / NOTEBOOK.name).write_text(json.dumps(nb), encoding="utf-8")
    server = Lab(tmp_path, state_dir, root, profile=False, args=())
    server.start(timeout=90)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def browser_page(tmp_path):
    """A Chromium page (Debian's browser, a fresh profile) that records any JS dialog."""
    with chromium(tmp_path / "chromium-profile") as page:
        yield page


_shot, _wait, _run_cell = shot, wait, run_cell


def _scroll_to(element) -> None:
    """Scroll ``element`` to the top of its scroll area by the DOM call: Playwright's
    ``scroll_into_view_if_needed`` first waits for the element to hold still, and a live
    dashboard on a loaded machine redraws too often for that wait to end."""
    element.first.evaluate("el => el.scrollIntoView({block: 'start'})")


def _progress_width(dash) -> float:
    style = dash.locator(".widget-hprogress .progress-bar").first.get_attribute("style") or ""
    for part in style.split(";"):
        key, _, value = part.partition(":")
        if key.strip() == "width" and value.strip().endswith("%"):
            return float(value.strip()[:-1])
    return 0.0


_LAST_LINE_VISIBLE = """(el) => {
  const pres = el.querySelectorAll("pre");
  if (!pres.length) return false;
  const walker = document.createTreeWalker(pres[pres.length - 1], NodeFilter.SHOW_TEXT);
  let last = null;
  while (walker.nextNode()) if (walker.currentNode.textContent.trim()) last = walker.currentNode;
  if (!last) return false;
  const text = last.textContent.trimEnd();
  const range = document.createRange();
  range.setStart(last, Math.max(0, text.length - 1));
  range.setEnd(last, text.length);
  const r = range.getBoundingClientRect(), box = el.getBoundingClientRect();
  return r.height > 0 && r.top >= box.top - 1 && r.bottom <= box.bottom + 1;
}"""


def _newest_line_visible(log) -> bool:
    """Whether the log box shows its last line (not just holds it below the fold)."""
    return bool(log.evaluate(_LAST_LINE_VISIBLE))


def _assert_sandboxed_kernel(lab) -> None:
    """The lab's kernel: channels on unix sockets, started by the sandbox in a namespace of its own."""
    import psutil

    files = list(lab.runtime.glob("kernel-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["transport"] == "ipc", files
    kernels = [p for p in psutil.Process(lab.proc.pid).children(recursive=True)
               if "ipykernel_launcher" in p.cmdline()]
    assert len(kernels) == 1 and "tfk8s_magics.kernel.sandbox" in kernels[0].parent().cmdline(), kernels
    assert os.readlink(f"/proc/{kernels[0].pid}/ns/net") != os.readlink("/proc/self/ns/net")


def test_dashboard_in_jupyterlab(lab, browser_page, state_dir):
    from tfk8s_magics.backends.local import LocalBackend

    page = browser_page
    page.goto(f"{lab.base}/lab/tree/{NOTEBOOK.name}?token={lab.token}")
    cells = page.locator(".jp-Notebook .jp-CodeCell")
    nb = json.loads((lab.root / NOTEBOOK.name).read_text(encoding="utf-8"))
    n_cells = sum(1 for c in nb["cells"] if c["cell_type"] == "code")
    _wait(
        lambda: cells.count() == n_cells and "stopme" in cells.nth(n_cells - 1).inner_text(),
        60,
        "the notebook to load",
        page,
    )
    sources = [cells.nth(i).locator(".jp-InputArea-editor").inner_text().strip() for i in range(n_cells)]

    def code_cell(first_line: str) -> int:
        found = [i for i, src in enumerate(sources) if src.startswith(first_line)]
        assert len(found) == 1, f"expected one code cell starting with {first_line!r}: {sources}"
        return found[0]

    load_i = code_cell("%load_ext tfk8s_magics")
    launch_i = code_cell("%%tfcluster launch tour")
    stop_i = code_cell("%%tfcluster launch stopme")
    view_i = code_cell("%tfcluster dashboard tour")
    list_i = code_cell("%tfcluster list")

    # Run only once the kernel is up (a cell run while it starts can be dropped).
    _wait(lambda: "Idle" in page.locator("#jp-main-statusbar").inner_text(), 90, "the kernel", page)
    _assert_sandboxed_kernel(lab)
    _run_cell(page, cells.nth(load_i))
    _wait(
        lambda: "[1]" in cells.nth(load_i).locator(".jp-InputPrompt").first.inner_text(),
        90,
        "the kernel to run the first cell",
        page,
    )
    _run_cell(page, cells.nth(launch_i))
    _run_cell(page, cells.nth(stop_i))

    dash = cells.nth(launch_i).locator(".tfk8s-dashboard")
    dash.wait_for(timeout=60_000)
    row = dash.locator('tr[data-task="worker-0"]')
    row.wait_for(timeout=30_000)
    _wait(lambda: row.get_attribute("data-phase") == "running", 150, "worker running", page)

    # Log lines arrive while the cluster runs.
    log = dash.locator(".tfk8s-log")
    _wait(lambda: "loss" in log.first.inner_text(), 60, "log lines", page)
    assert row.get_attribute("data-phase") == "running"
    first_lines = log.first.inner_text().count("\n")

    # The progress bar advances.
    w1 = _wait(lambda: _progress_width(dash), 30, "progress", page)
    _wait(lambda: _progress_width(dash) > w1 + 2, 30, "progress to advance", page)
    assert "ETA" in dash.locator(".tfk8s-progress-text").first.inner_text()
    assert dash.locator(".tfk8s-curve polyline").count() >= 1
    _wait(lambda: log.first.inner_text().count("\n") > first_lines, 20, "more log lines", page)
    assert _newest_line_visible(log.first), "the log box does not show its newest line"
    _shot(page, "dashboard-running.png", dash)

    # A second view of the same cluster keeps working after its cell is re-run.
    view_cell = cells.nth(view_i)
    _run_cell(page, view_cell)
    view_cell.locator(".tfk8s-dashboard").wait_for(timeout=30_000)
    prompt = view_cell.locator(".jp-InputPrompt").first
    _wait(lambda: "[" in prompt.inner_text() and "*" not in prompt.inner_text(), 30, "view cell", page)
    first_prompt = prompt.inner_text()
    _run_cell(page, view_cell)
    _wait(
        lambda: prompt.inner_text() not in (first_prompt,) and "*" not in prompt.inner_text(),
        30,
        "view cell re-run",
        page,
    )
    view = view_cell.locator(".tfk8s-dashboard")
    assert view.count() == 1
    v1 = _wait(lambda: _progress_width(view), 30, "re-run view progress", page)
    _wait(lambda: _progress_width(view) > v1 + 2, 30, "re-run view to advance", page)

    # The Stop button stops the other (endless) cluster.
    other = cells.nth(stop_i).locator(".tfk8s-dashboard")
    _scroll_to(other)
    orow = other.locator('tr[data-task="worker-0"]')
    orow.wait_for(timeout=60_000)
    _wait(lambda: orow.get_attribute("data-phase") == "running", 150, "stopme running", page)
    olog = other.locator(".tfk8s-log").first
    _wait(lambda: "tick" in olog.inner_text(), 30, "stopme log", page)
    # A log line that looks like HTML is shown as text: no element, no alert.
    assert EVIL in olog.inner_text()
    assert other.locator(".tfk8s-log img").count() == 0
    other.locator("button.tfk8s-stop").click()
    _wait(lambda: orow.get_attribute("data-phase") == "stopped", 60, "stopme stopped", page)
    _wait(lambda: "stopped" in other.locator(".tfk8s-outcome").inner_text(), 30, "stop outcome", page)
    assert other.locator("button.tfk8s-stop").is_disabled()
    assert LocalBackend(state_dir).status("stopme").phase == "stopped"
    _shot(page, "dashboard-stopped.png", other)

    # The cluster list shows both clusters with their phases and actions.
    list_cell = cells.nth(list_i)
    _run_cell(page, list_cell)
    table = list_cell.locator(".tfk8s-cluster-list")
    table.wait_for(timeout=30_000)
    _wait(lambda: table.locator(".tfk8s-name").count() == 2, 30, "two rows in the list", page)
    assert set(table.locator(".tfk8s-name").all_inner_texts()) == {"tour", "stopme"}
    assert table.locator('[data-phase="stopped"]').count() == 1
    assert table.locator("button.tfk8s-delete").count() == 2
    _shot(page, "cluster-list.png", table)

    # The tour's cluster runs to the end.
    _scroll_to(dash)
    _wait(lambda: row.get_attribute("data-phase") == "succeeded", 120, "worker succeeded", page)
    _wait(lambda: _progress_width(dash) >= 99.0, 30, "progress at 100%", page)
    assert "done: y = " in log.first.inner_text()
    assert _newest_line_visible(log.first), "the log box does not show its newest line"
    assert dash.locator(".widget-hprogress .progress-bar-success").count() == 1
    _shot(page, "dashboard-succeeded.png", dash)
    assert page.dialogs == []  # type: ignore[attr-defined]


DOOMED_CELL = """%%tfcluster launch doomed --workers 1 --ps 0
import sys
print("failing on purpose", flush=True)
sys.exit(1)
"""
ENDLESS_CELL = """%%tfcluster launch endless --workers 1 --ps 0
import time
print("started", flush=True)
time.sleep(600)
"""


def test_views_after_delete_in_jupyterlab(lab, browser_page, state_dir):
    """Views never contradict the truth, in a real browser: the Delete button of a failed
    cluster's dashboard turns its header to "deleted" and disables its buttons; a cluster
    deleted from another cell disappears from every view — its dashboard's task table and
    the cluster list's row and summary — and none of their buttons stays live."""
    page = browser_page
    cells_src = ["%load_ext tfk8s_magics", DOOMED_CELL, ENDLESS_CELL, "%tfcluster list",
                 "%tfcluster delete endless"]
    nb = {"cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {},
                     "outputs": [], "source": src} for i, src in enumerate(cells_src)],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                      "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    (lab.root / "views.ipynb").write_text(json.dumps(nb), encoding="utf-8")
    page.goto(f"{lab.base}/lab/tree/views.ipynb?token={lab.token}")
    cells = page.locator(".jp-Notebook .jp-CodeCell")
    _wait(lambda: cells.count() == len(cells_src), 60, "the notebook to load", page)
    _wait(lambda: "Idle" in page.locator("#jp-main-statusbar").inner_text(), 90, "the kernel", page)
    _run_cell(page, cells.nth(0))
    _wait(lambda: "[1]" in cells.nth(0).locator(".jp-InputPrompt").first.inner_text(), 90,
          "the kernel to run the first cell", page)
    _run_cell(page, cells.nth(1))
    _run_cell(page, cells.nth(2))

    doomed = cells.nth(1).locator(".tfk8s-dashboard")
    doomed.wait_for(timeout=60_000)
    header = doomed.locator(".tfk8s-header")
    _wait(lambda: header.get_attribute("data-phase") == "failed", 150, "doomed failed", page)
    endless = cells.nth(2).locator(".tfk8s-dashboard")
    erow = endless.locator('tr[data-task="worker-0"]')
    erow.wait_for(timeout=60_000)
    _wait(lambda: erow.get_attribute("data-phase") == "running", 150, "endless running", page)

    _run_cell(page, cells.nth(3))
    table = cells.nth(3).locator(".tfk8s-cluster-list")
    table.wait_for(timeout=30_000)
    _wait(lambda: table.locator(".tfk8s-name").count() == 2, 30, "two rows in the list", page)
    assert "1 running" in table.inner_text()

    # The failed cluster's own Delete button (asks once).
    doomed.locator("button.tfk8s-delete").click()
    doomed.locator("button.tfk8s-confirm").click()
    _wait(lambda: header.get_attribute("data-phase") == "deleted", 30, "doomed header deleted", page)
    for button in ("tfk8s-delete", "tfk8s-stop", "tfk8s-tb"):
        assert doomed.locator(f"button.{button}").is_disabled(), button

    # The running one, deleted from another cell.
    _run_cell(page, cells.nth(4))
    eheader = endless.locator(".tfk8s-header")
    _wait(lambda: eheader.get_attribute("data-phase") == "deleted", 60, "endless header deleted", page)
    _wait(lambda: erow.get_attribute("data-phase") == "deleted", 30, "endless row deleted", page)
    assert endless.locator("button.tfk8s-delete").is_disabled()

    # The list agrees: both rows deleted, no live Stop/Delete, and the summary says so.
    _wait(lambda: table.locator('[data-phase="deleted"]').count() == 2, 30, "list rows deleted", page)
    _wait(lambda: "0 running" in table.inner_text(), 30, "the list summary", page)
    deletes, stops = table.locator("button.tfk8s-delete"), table.locator("button.tfk8s-stop")
    assert all(deletes.nth(i).is_disabled() for i in range(deletes.count()))
    assert all(stops.nth(i).is_disabled() for i in range(stops.count()))
    assert page.dialogs == []  # type: ignore[attr-defined]
