"""Issue 27 in a real browser (JupyterLab + Debian's Chromium): a Keras progress bar updates in
place in the dashboard while the epoch runs, and Stop tells the truth — "stopping" while a task
still runs, then "stopped" with every task stopped and the SIGKILL recorded."""

from __future__ import annotations

import json
import re

import pytest

from tests.browserlab import run_cell as _run_cell
from tests.browserlab import shot as _shot
from tests.browserlab import wait as _wait
from tests.test_browser import browser_page, lab  # noqa: F401 - fixtures

pytestmark = pytest.mark.browser

BAR_CELL = """%%tfcluster launch bar --workers 1 --ps 0
import time
import numpy as np
import tensorflow as tf

tf.get_logger().setLevel("ERROR")


class Slow(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.2)


model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
model.compile(optimizer="sgd", loss="mse")
x = np.zeros((64, 2), "float32")
ds = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).repeat().batch(4)
model.fit(ds, epochs=1, steps_per_epoch=120, verbose=1, callbacks=[Slow()])
"""

STUBBORN_CELL = """%%tfcluster launch stubborn --workers 1 --ps 0
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
for i in range(3000):
    print(f"tick {i}", flush=True)
    time.sleep(0.3)
"""


def _bar_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if "/120 [" in ln]


def _step(text: str) -> int:
    lines = _bar_lines(text)
    m = re.search(r"(\d+)/120 \[", lines[-1]) if lines else None
    return int(m.group(1)) if m else -1


def test_bar_in_place_and_a_truthful_stop_in_jupyterlab(lab, browser_page, state_dir):  # noqa: F811
    page = browser_page
    cells_src = ["%load_ext tfk8s_magics", BAR_CELL, STUBBORN_CELL]
    nb = {"cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {},
                     "outputs": [], "source": src} for i, src in enumerate(cells_src)],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                      "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    (lab.root / "firsthour.ipynb").write_text(json.dumps(nb), encoding="utf-8")
    page.goto(f"{lab.base}/lab/tree/firsthour.ipynb?token={lab.token}")
    cells = page.locator(".jp-Notebook .jp-CodeCell")
    _wait(lambda: cells.count() == len(cells_src), 60, "the notebook to load", page)
    _wait(lambda: "Idle" in page.locator("#jp-main-statusbar").inner_text(), 90, "the kernel", page)
    _run_cell(page, cells.nth(0))
    _wait(lambda: "[1]" in cells.nth(0).locator(".jp-InputPrompt").first.inner_text(), 90,
          "the kernel to run the first cell", page)
    _run_cell(page, cells.nth(1))
    _run_cell(page, cells.nth(2))

    # The bar: one line, its step moving, long before the epoch's line ends.
    dash = cells.nth(1).locator(".tfk8s-dashboard")
    dash.wait_for(timeout=60_000)
    log = dash.locator(".tfk8s-log").first
    _wait(lambda: 0 <= _step(log.inner_text()) < 60, 180, "the bar's first states", page)
    first = _step(log.inner_text())
    _wait(lambda: first < _step(log.inner_text()) < 120, 60, "the bar to move", page)
    text = log.inner_text()
    assert len(_bar_lines(text)) == 1, _bar_lines(text)  # in place: one line, not one per state
    assert "\r" not in text
    _shot(page, "bar-in-place.png", dash)
    _wait(lambda: "120/120 [" in log.inner_text(), 120, "the epoch's end", page)
    assert len(_bar_lines(log.inner_text())) == 1, _bar_lines(log.inner_text())

    # Stop: "stopping" while the task (it ignores SIGTERM) still runs, then "stopped", recorded.
    other = cells.nth(2).locator(".tfk8s-dashboard")
    other.wait_for(timeout=60_000)
    header, row = other.locator(".tfk8s-header").first, other.locator('tr[data-task="worker-0"]')
    _wait(lambda: row.get_attribute("data-phase") == "running", 150, "stubborn running", page)
    other.locator("button.tfk8s-stop").click()
    _wait(lambda: header.get_attribute("data-phase") == "stopping", 30, "the header to say stopping", page)
    assert row.get_attribute("data-phase") == "running"
    _wait(lambda: header.get_attribute("data-phase") == "stopped", 60, "the header to say stopped", page)
    assert row.get_attribute("data-phase") == "stopped"
    events = other.locator(".tfk8s-events").first  # in the events tab (hidden): its DOM text
    _wait(lambda: "Killed" in (events.text_content() or ""), 30, "the SIGKILL in the events", page)
    # The task's end is the event after the kill: the events tab reads them again at a status
    # change (at most every 2 s) and at its final draw.
    _wait(lambda: "TaskStopped" in (events.text_content() or ""), 30, "the task's end in the events", page)
    assert page.dialogs == []  # type: ignore[attr-defined]
