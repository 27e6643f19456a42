"""Issue 27 in a real browser (JupyterLab + Debian's Chromium), the lab as a new user gets it.

* the lab's JupyterLab settings: no news pop-up, a new notebook starts the lab's kernel with no
  kernel-selection dialog, and the example notebooks (the copies a new user gets) open
  unmodified;
* the walk of issue 27's "Done when", through ``scripts/lab``: log in, run an example (every
  example runs in test_notebooks.py), a user's own MWMS notebook, Stop, re-run, a typo, a
  syntax error, a notebook variable, TensorBoard after stop — each point asserted in the page.
"""

from __future__ import annotations

import json
import sys
import time

import pytest

from tests.browserlab import REPO, Lab, RealLab, chromium, log_in, run_cell, shot, wait

sys.path.insert(0, str(REPO / "hub_config"))
from tfk8s_hub.local import prepare_user  # noqa: E402

pytestmark = pytest.mark.browser

EXAMPLES = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
#: The example the walk runs in the browser: the one that uses most of the lab (a trainer, its
#: checkpoints and a model server).
WALKED_EXAMPLES = ["trainer_and_serving.ipynb"]


@pytest.fixture
def home(tmp_path):
    """A new user's home as the lab makes it (the example notebooks copied in ``examples/``)."""
    return prepare_user(tmp_path / "lab", "demo")["home"]


@pytest.fixture
def lab(tmp_path, state_dir, home):
    server = Lab(tmp_path, state_dir, home)
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def page(tmp_path):
    with chromium(tmp_path / "chromium-profile") as pg:
        yield pg


def _dirty_tabs(page) -> list[str]:
    return [t.inner_text() for t in page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.jp-mod-dirty").all()]


def _kernel_idle(page, name: str) -> bool:
    bar = page.locator("#jp-main-statusbar").inner_text()
    return "Idle" in bar and name in bar


def test_the_labs_jupyterlab_settings(lab, page, home):
    """No news pop-up; a new notebook gets the lab's kernel without a dialog; the examples open
    unmodified (the kernel they start rewrites none of their metadata)."""
    spec = json.loads((REPO / "hub_config" / "jupyter" / "kernels" / "python3" / "kernel.json").read_text())
    kernel_name = spec["display_name"]
    # Each example, opened as a new user opens it: nothing changed, nothing to save (checked
    # before the next one: a page with unsaved changes would hold the navigation).
    for name in EXAMPLES:
        before = (home / "examples" / name).read_bytes()
        page.goto(f"{lab.base}/lab/tree/examples/{name}?token={lab.token}")
        wait(lambda: _kernel_idle(page, kernel_name), 120, f"{name}'s kernel", page)
        time.sleep(2)  # kernel info and metadata updates arrive just after "Idle"
        assert page.locator(".jp-Dialog").count() == 0, (name, page.locator(".jp-Dialog").inner_text())
        assert _dirty_tabs(page) == [], (name, _dirty_tabs(page))
        assert (home / "examples" / name).read_bytes() == before

    # No news pop-up (nor an update check) since the lab opened (JupyterLab asks at once).
    assert not [t for t in page.locator(".Toastify__toast").all_inner_texts()
                if "news" in t.lower() or "update" in t.lower()]

    # A new notebook (File > New > Notebook): the lab's kernel starts, no dialog asks which.
    page.locator(".lm-MenuBar-itemLabel", has_text="File").click()
    page.locator(".lm-Menu-itemLabel", has_text="New").first.hover()
    page.locator('.lm-Menu-item[data-command="notebook:create-new"]').click()
    wait(lambda: "Untitled" in page.locator(".lm-DockPanel-tabBar .lm-mod-current").inner_text(), 60,
         "the new notebook", page)
    wait(lambda: _kernel_idle(page, kernel_name), 120, "the new notebook's kernel", page)
    assert page.locator(".jp-Dialog").count() == 0, page.locator(".jp-Dialog").inner_text()

    # No news pop-up (nor an update check) was shown at any point.
    toasts = page.locator(".Toastify__toast").all_inner_texts()
    assert not [t for t in toasts if "news" in t.lower() or "update" in t.lower()], toasts
    shot(page, "lab-settings.png")
    assert page.dialogs == []  # type: ignore[attr-defined]


MWMS = """%%tfcluster launch mine --workers 2 --ps 0
import os
import numpy as np
import tensorflow as tf
import tfk8s_magics

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu", input_shape=(4,)),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
x = np.random.RandomState(0).rand(512, 4).astype("float32")
ds = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True))).repeat().batch(8)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
tb = tf.keras.callbacks.TensorBoard(os.path.join(os.environ["TFK8S_LOG_DIR"], "tb"))
model.fit(ds.with_options(options), epochs=100, steps_per_epoch=200, verbose=2,
          callbacks=[tfk8s_magics.progress_callback(), tb])
"""
MINE = [MWMS,
        "%tfcluster launch mine --wokers 2",
        '%%tfcluster launch syn --workers 1 --ps 0\nprint("unclosed"\n',
        "threshold = 0.5",
        "%%tfcluster launch nv --workers 1 --ps 0\nprint(threshold)\n"]


def _prompts(page) -> list[str]:
    # Text content, not inner text: JupyterLab skips rendering cells out of view
    # (content-visibility), and their inner text is empty.
    return page.locator(".jp-Notebook .jp-CodeCell .jp-InputPrompt").all_text_contents()


def _all_ran(page) -> bool:
    prompts = [p.strip() for p in _prompts(page)]
    return bool(prompts) and all(p.startswith("[") and p[1:-2].isdigit() for p in prompts)


def _menu(page, menu: str, command: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=menu).click()
    page.locator(f'.lm-Menu-item[data-command="{command}"]').click()


def _open(page, url: str) -> None:
    """Open a notebook alone (``?reset``: the workspace does not bring back the last one, whose
    tab would hide this one)."""
    page.goto(f"{url}?reset")
    page.locator(".jp-Notebook .jp-CodeCell").first.wait_for(timeout=90_000)
    wait(lambda: "Idle" in page.locator("#jp-main-statusbar").inner_text(), 180, "the kernel", page)


def _outputs(cell) -> str:
    return "\n".join(cell.locator(".jp-OutputArea-output").all_text_contents())


@pytest.mark.slow
def test_the_first_hour_walk(tmp_path):
    """Issue 27 "Done when": the path a new user takes, in the real lab, asserting each point."""
    lab = RealLab(tmp_path / "lab")
    try:
        lab.start()
        with chromium(tmp_path / "chromium-profile") as page:
            user = log_in(page, lab, "walker")
            home = lab.home("walker")

            # An example as shipped (the user's copy, on the lab's kernel): every cell runs, none
            # raises. One is enough here: tests/test_notebooks.py runs every example on the same
            # kernel and checks each one's outputs; this proves the copies the lab gives run in it.
            for name in WALKED_EXAMPLES:
                _open(page, f"{user}/lab/tree/examples/{name}")
                _menu(page, "Run", "runmenu:run-all")
                wait(lambda: _all_ran(page), 900, f"every cell of {name} to run", page)
                outputs = "\n".join(page.locator(".jp-OutputArea-output").all_text_contents())
                assert "Traceback" not in outputs and "UsageError" not in outputs, (name, outputs[-3000:])
                page.keyboard.press("Control+s")  # saved: nothing holds the next page
                wait(lambda: not page.locator(".lm-TabBar-tab.jp-mod-dirty").count(), 30,
                     f"{name} to be saved", page)
                lab.shut_down_kernels("walker")

            # The user's own notebook: MWMS, then the mistakes a new user makes.
            nb = {"cells": [{"cell_type": "code", "execution_count": None, "id": f"m{i}", "metadata": {},
                             "outputs": [], "source": src} for i, src in enumerate(MINE)],
                  "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
            (home / "mine.ipynb").write_text(json.dumps(nb), encoding="utf-8")
            _open(page, f"{user}/lab/tree/mine.ipynb")
            cells = page.locator(".jp-Notebook .jp-CodeCell")
            run_cell(page, cells.nth(0))
            dash = cells.nth(0).locator(".tfk8s-dashboard")
            dash.wait_for(timeout=120_000)
            header = dash.locator(".tfk8s-header").first
            wait(lambda: header.get_attribute("data-phase") == "running"
                 and "Epoch 2/100" in (dash.locator(".tfk8s-log").first.text_content() or ""), 300,
                 "the MWMS fit to train", page)

            # A typo: one sentence with the flag it meant; nothing launched.
            run_cell(page, cells.nth(1))
            wait(lambda: "did you mean --workers?" in _outputs(cells.nth(1)), 60, "the typo's hint", page)
            # A syntax error: refused at launch, with the cell's line.
            run_cell(page, cells.nth(2))
            wait(lambda: "does not compile" in _outputs(cells.nth(2)), 60, "the syntax error", page)
            assert "line 2" in _outputs(cells.nth(2)), _outputs(cells.nth(2))
            # A notebook variable used in the body: the task's log says why it is not there.
            run_cell(page, cells.nth(3))
            run_cell(page, cells.nth(4))
            nv = cells.nth(4).locator(".tfk8s-dashboard")
            nv.wait_for(timeout=120_000)
            wait(lambda: nv.locator(".tfk8s-header").first.get_attribute("data-phase") == "failed", 300,
                 "the notebook-variable run to fail", page)
            wait(lambda: "The cell body runs as a script in each task's own process" in
                 (nv.locator(".tfk8s-log").first.text_content() or ""), 60, "the NameError hint", page)

            # Stop: "stopped", every task stopped; the live view only (no record block under it).
            dash.locator("button.tfk8s-stop").click()
            wait(lambda: header.get_attribute("data-phase") == "stopped", 120, "the MWMS to stop", page)
            rows = dash.locator("tr[data-task]")
            assert {rows.nth(i).get_attribute("data-phase") for i in range(rows.count())} == {"stopped"}
            assert cells.nth(0).locator(".tfk8s-summary").count() == 0
            assert "final state" not in _outputs(cells.nth(0))
            assert not (home.parent / "tfk8s").exists() or not list(
                (home.parent / "tfk8s").rglob("workertemp_*")), "Keras's scratch folders outlived the stop"

            # TensorBoard after stop: the chief's runs only (no workertemp_1/train).
            dash.locator("button.tfk8s-tb").click()
            frame = dash.locator(".tfk8s-tensorboard iframe")
            wait(lambda: frame.count() == 1, 120, "the TensorBoard tab", page)
            src = frame.get_attribute("src")
            assert src.startswith("/user/walker/proxy/"), src  # behind the hub's login
            runs = wait(lambda: (r := page.request.get(f"{lab.base}{src}data/runs")).ok and r.json() or None,
                        120, "TensorBoard's runs", page)
            # the chief's run and the progress callback's scalars (run "progress"), no scratch run
            assert sorted(runs) == ["progress", "tb/train"], runs

            # Re-run the launch cell: the ended cluster is replaced, the new run trains.
            run_cell(page, cells.nth(0))
            dash = cells.nth(0).locator(".tfk8s-dashboard")
            header = dash.locator(".tfk8s-header").first
            wait(lambda: header.get_attribute("data-phase") == "running", 300, "the re-run to run", page)
            assert "already exists" not in _outputs(cells.nth(0))
            dash.locator("button.tfk8s-stop").click()
            wait(lambda: header.get_attribute("data-phase") == "stopped", 120, "the re-run to stop", page)

            # The old TensorBoard's link once its server stopped (the cluster deleted): a page
            # that says so and how to start it again, not a bare 500.
            lab.shut_down_kernels("walker")  # the kernel's clusters and TensorBoards end with it
            stopped = wait(lambda: (r := page.request.get(f"{lab.base}{src}")).status == 502 and r, 60,
                           "the stopped TensorBoard's page", page)
            assert "This server has stopped" in stopped.text() and "%tfcluster tensorboard" in stopped.text()
            shot(page, "walk-end.png")
            assert page.dialogs == []  # type: ignore[attr-defined]
    finally:
        lab.stop()
