"""The example notebooks run unmodified on the local backend, and show what they say they show.

Each notebook is executed top to bottom by nbclient in a real ipykernel
started from this interpreter, with a private ``TFK8S_STATE_DIR`` (the
``state_dir`` fixture, which also fails the test if any cluster process
outlives it).  Then its outputs are checked: the printed losses, devices,
``%tfcluster status`` / ``logs`` / ``events``.  Output of the live log
widget under ``%%tfcluster launch`` is not checked (it is widget state).
"""

from __future__ import annotations

import html
import json
import os
import re
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import wait_gone

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
#: Where each executed notebook is kept, with its outputs: the docs render these copies.
EXECUTED = REPO / "build" / "notebooks"
_STARTED = time.time()
ALL = ("in_graph_walkthrough.ipynb", "between_graph_walkthrough.ipynb", "dashboard_tour.ipynb",
       "trainer_and_serving.ipynb")


def read_notebook(name: str):
    import nbformat

    path = NOTEBOOKS / name
    if not path.exists():
        pytest.fail(f"{path.relative_to(REPO)} is missing: every example notebook in {ALL} must "
                    "exist and run in CI.")
    return nbformat.read(path, as_version=4)


@pytest.mark.parametrize("name", ALL)
def test_notebook_is_committed_without_outputs(name):
    nb = read_notebook(name)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    assert "widgets" not in nb.metadata, f"{name} carries saved widget state (live logs): drop it."
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, (
                f"{name} cell {i} carries outputs: clear them before committing (CI executes it)."
            )


@pytest.fixture
def python3_kernel(tmp_path, monkeypatch):
    """Make the ``python3`` kernelspec start this interpreter, with this checkout importable."""
    kernels = tmp_path / "jupyter" / "kernels" / "python3"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (tfk8s tests)",
        "language": "python",
    }), encoding="utf-8")
    monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join(
        p for p in (str(tmp_path / "jupyter"), os.environ.get("JUPYTER_PATH")) if p))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    return "python3"


@pytest.fixture
def run_notebook(state_dir, python3_kernel, tmp_path):
    """Execute a notebook in a fresh working dir; return it with outputs, as a :class:`Run`."""
    import nbformat
    from nbclient import NotebookClient

    def run(name: str, on_cell_executed=None) -> Run:
        nb = read_notebook(name)
        workdir = tmp_path / "work"
        workdir.mkdir()
        client = NotebookClient(nb, kernel_name=python3_kernel, timeout=600,
                                resources={"metadata": {"path": str(workdir)}},
                                on_cell_executed=on_cell_executed)
        try:
            client.execute()
        finally:
            # Kept for whoever debugs a failure: the notebook with all its outputs.
            nbformat.write(nb, tmp_path / name)
        result = Run(name, nb)
        # Nothing may be left running once the notebook (and its kernel) is done.
        assert not wait_gone(state_dir), f"{name} left cluster processes running"
        assert not list((state_dir / "clusters").glob("*")), f"{name} left clusters behind"
        assert "Traceback" not in result.stderr, f"{name} printed a traceback:\n{result.stderr}"
        keep_for_the_docs(nb, name)
        return result

    return run


def keep_for_the_docs(nb, name: str) -> None:
    """Write the executed notebook to build/notebooks/, where the docs build takes it from.

    Without the saved widget state (the live views), which would make the page load the widget
    manager's JavaScript from the web; the static summaries and printed outputs stay.
    """
    import copy

    import nbformat

    kept = copy.deepcopy(nb)
    kept.metadata.pop("widgets", None)
    EXECUTED.mkdir(parents=True, exist_ok=True)
    nbformat.write(kept, EXECUTED / name)


class Run:
    """An executed notebook, with helpers to read each cell's outputs."""

    def __init__(self, name: str, nb) -> None:
        self.name = name
        self.nb = nb

    def cell(self, source_start: str):
        """The one code cell whose source starts with ``source_start``."""
        found = [c for c in self.nb.cells
                 if c.cell_type == "code" and c.source.lstrip().startswith(source_start)]
        assert len(found) == 1, f"{self.name}: {len(found)} cells start with {source_start!r}"
        return found[0]

    def text(self, source_start: str) -> str:
        """The cell's stdout and the ``text/plain`` of what it displayed."""
        parts = []
        for out in self.cell(source_start).outputs:
            if out.output_type == "stream" and out.name == "stdout":
                parts.append(out.text)
            elif out.output_type in ("display_data", "execute_result"):
                parts.append(out.data.get("text/plain", ""))
        return "\n".join(parts)

    def html(self, source_start: str) -> str:
        return "\n".join(out.data.get("text/html", "") for out in self.cell(source_start).outputs
                         if out.output_type in ("display_data", "execute_result"))

    @property
    def stderr(self) -> str:
        return "\n".join(out.text for c in self.nb.cells if c.cell_type == "code"
                         for out in c.outputs
                         if out.output_type == "stream" and out.name == "stderr")


def task_line(text: str, task: str) -> str:
    """The row of ``task`` in a ``%tfcluster status`` table."""
    rows = [line for line in text.splitlines() if line.startswith(f"{task} ")]
    assert len(rows) == 1, text
    return rows[0]


@pytest.mark.slow
def test_in_graph_walkthrough(run_notebook):
    nb = run_notebook("in_graph_walkthrough.ipynb")

    assert "ig: every server is ready" in nb.text("%tfcluster launch ig")
    # The kernel is the chief of a cluster whose servers it sees.
    devices = nb.text("strategy = %tfcluster connect ig")
    assert "ParameterServerStrategy" in devices
    for job in ("chief/replica:0/task:0", "ps/replica:0/task:0", "ps/replica:0/task:1",
                "worker/replica:0/task:0", "worker/replica:0/task:1"):
        assert f"/job:{job}/device:CPU:0" in devices, devices

    # tf-keras variables live on the parameter servers, round-robin over both.
    made = nb.text("with strategy.scope():")
    assert "keras: tf_keras" in made, made
    placed = dict(re.findall(r"^(dense/\S+)\s+(\S+)$", made, re.M))
    assert set(placed) == {"dense/kernel:0", "dense/bias:0"}, made
    assert all(d.startswith("/job:ps/") for d in placed.values()), made
    assert {re.search(r"task:(\d)", d)[1] for d in placed.values()} == {"0", "1"}, made

    # The scheduled steps really trained the model: the loss fell and the weights are right.
    trained = nb.text("@tf.function\ndef train_step")
    losses = [float(v) for v in re.findall(r"round \d+/6: 20 steps, mean loss ([\d.]+)", trained)]
    assert len(losses) == 6, trained
    assert losses[-1] < losses[0] / 20 and losses[-1] < 0.1, losses
    learned = nb.text("kernel, bias = ")
    found = re.search(r"learned w: \[([^\]]*)\]", learned)
    assert found, learned
    w = [float(v) for v in found[1].split()]
    assert w == pytest.approx([2.0, -1.0, 0.5, 3.0], abs=0.15), learned
    # At least once: every scheduled step ran (a retried one may run twice).
    assert int(re.search(r"optimizer steps: (\d+) on /job:ps/", learned)[1]) >= 120, learned

    status = nb.text("%tfcluster status ig")
    assert "cluster ig (local, in-graph): running" in status, status
    for task in ("ps-0", "ps-1", "worker-0", "worker-1"):
        assert " running " in task_line(status, task), status
    assert "tfk8s-phase-running" in nb.html("%tfcluster status ig")
    ps_log = nb.text("%tfcluster logs ig ps-0 --tail 5")
    assert "ps-0 serving at grpc://127.0.0.1:" in ps_log, ps_log
    assert len(ps_log.strip().splitlines()) <= 5, ps_log
    assert nb.text("%tfcluster delete ig").strip() == "ig: deleted"
    # The launch cell keeps a record of the servers as they were when deleted.
    record = nb.html("%tfcluster launch ig")
    assert 'class="tfk8s-summary" data-phase="deleted"' in record, record
    assert "ps-0 serving at grpc://127.0.0.1:" in record, record
    assert nb.text("%tfcluster list").strip() == "no clusters"


@pytest.mark.slow
def test_between_graph_walkthrough(run_notebook):
    nb = run_notebook("between_graph_walkthrough.ipynb")

    # Part A: MultiWorkerMirroredStrategy + tf-keras fit on two workers.
    done = nb.text("%tfcluster wait mwms")
    # The saved launch cell says how the cluster ended (then deleted), not "starting".
    record = nb.html("%%tfcluster launch mwms")
    assert "it had ended <b>succeeded</b>" in record and ": final loss " in record, record
    assert "cluster mwms (local, between): succeeded" in done, done
    for task in ("worker-0", "worker-1"):
        assert "succeeded" in task_line(done, task) and "exit code 0" in task_line(done, task), done
    assert "progress: step 60/60 (100.0%)" in done, done
    chief = nb.text("%tfcluster logs mwms worker-0 --tail 10")
    assert len(chief.strip().splitlines()) <= 10, chief
    assert re.search(r"worker-0: checkpoint \S+/checkpoints/ckpt-1$", chief, re.M), chief
    loss0 = re.search(r"worker-0: final loss ([\d.]+)", chief)
    # The prose: worker-1's final loss, picked out of its log, is the chief's.
    picked = nb.text("import tfk8s_magics as tk").strip()
    loss1 = re.fullmatch(r"worker-1: final loss ([\d.]+)", picked)
    assert loss0 and loss1, (chief, picked)
    assert float(loss0[1]) < 0.1 and loss0[1] == loss1[1], (loss0[1], loss1[1])
    # Only the chief wrote to the shared log dir: its summaries and its checkpoint.
    files = nb.text("from pathlib import Path").split()
    assert "checkpoints/ckpt-1.index" in files and "checkpoints/checkpoint" in files, files
    assert any(f.startswith("tensorboard/train/events.out.tfevents.") for f in files), files
    assert not any("workertemp" in f or "/ckpt/" in f for f in files), files

    # Part B: TF1 parameter servers with replica_device_setter.
    done = nb.text("%tfcluster wait tf1")
    assert "cluster tf1 (local, between): succeeded" in done, done
    assert "parameter servers stop after a 5 s grace period" in done, done
    for task in ("worker-0", "worker-1"):
        assert "exit code 0" in task_line(done, task), done
    for task in ("ps-0", "ps-1"):  # the prose: "still serving for their 5 s grace period"
        assert " running " in task_line(done, task) and "serving" in task_line(done, task), done
    logs = nb.text("%tfcluster logs tf1 worker-0") + "\n" + nb.text("reports = ")
    placed = dict(re.findall(r"^worker-0: (\S+) on (\S+)$", logs, re.M))
    assert set(placed) == {"global_step", "w", "b"}, logs
    assert all(d.startswith("/job:ps/task:") for d in placed.values()), placed
    assert {d.split("/task:")[1][0] for d in placed.values()} == {"0", "1"}, placed
    # The prose: the line shown for worker-1 is the last global step it reported, the total.
    assert re.fullmatch(r"worker-1: global step 100/100, .*", nb.text("reports = ").strip())
    for i in (0, 1):  # both trained the shared variables up to the total global step
        final = re.search(rf"^worker-{i}: global step 100/100, loss [\d.]+, w \[([^\]]*)\]$",
                          logs, re.M)
        assert final, logs
        w = [float(v) for v in final[1].split(",")]
        assert w == pytest.approx([2.0, -1.0, 0.5, 3.0], abs=0.1), final[0]

    # The parameter servers were recycled after the grace period.
    status = nb.text("%tfcluster status tf1")
    assert "progress: step 100/100 (100.0%)" in status, status
    for task in ("ps-0", "ps-1"):
        row = task_line(status, task)
        assert "succeeded" in row and "recycled after the workers finished" in row, status
    events = nb.text("%tfcluster events tf1")
    assert "WorkersFinished" in events, events
    for task in ("ps-0", "ps-1"):
        recycled = rf"{task}\s+Recycled\s+recycled after the workers finished"
        assert re.search(recycled, events), events

    # (Two stream outputs when a display update came between the prints: compare the lines.)
    deleted = [line for line in nb.text("%tfcluster delete mwms").splitlines() if line]
    assert deleted == ["mwms: deleted", "tf1: deleted"], deleted
    assert nb.text("%tfcluster list").strip() == "no clusters"


def test_every_example_notebook_is_run_here():
    assert {p.name for p in NOTEBOOKS.glob("*.ipynb")} == set(ALL)


@pytest.mark.slow
def test_dashboard_tour(run_notebook):
    curve: list = []

    def read_tensorboard(cell, **_):
        # While the tour's TensorBoard runs (the cluster is deleted later): ask it for the curve.
        if not cell.source.startswith("%tfcluster tensorboard tour"):
            return
        text = "".join(o.get("text", "") for o in cell.outputs)
        url = re.search(r"TensorBoard \((?:started|reused)\) on (http://127\.0\.0\.1:\d+/)", text)
        assert url, cell.outputs
        query = "data/plugin/scalars/scalars?run=train&tag=loss"
        with urllib.request.urlopen(url[1] + query, timeout=30) as r:
            curve.extend(json.load(r))

    nb = run_notebook("dashboard_tour.ipynb", on_cell_executed=read_tensorboard)
    # Regression: the tour invited the user to press TensorBoard but wrote no summaries
    # ("No dashboards are active").  Now TensorBoard has the loss curve, every step of it.
    assert [step for _, step, _ in curve] == list(range(1, 101)), curve
    losses = [value for *_, value in curve]
    assert losses[-1] < losses[0] / 10, losses
    # The training ran to the end and reported its progress; then it was removed.
    final = nb.text("%tfcluster wait tour")
    assert "cluster tour (local, between): succeeded" in final, final
    assert "step 100/100 (100.0%)" in final and "loss" in final, final
    assert "tour: deleted" in nb.text("%tfcluster delete tour")


SHORT_RUN = """%%tfcluster launch short --workers 1 --ps 0
for i in range(3):
    print(f"line {i} <b>not bold</b>", flush=True)
print("the script's last line", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["wait-then-delete", "ends-while-another-cell-runs"])
def test_a_saved_notebook_records_how_its_cluster_ended(ending, state_dir, python3_kernel, tmp_path):
    """Regression: a notebook executed by nbclient (or saved after the browser closed) showed
    the launch cell frozen at "starting".  Now the launch cell's output gains a static summary
    when the cluster ends — ``%tfcluster wait`` returning, or the cluster ending while another
    cell runs (the watcher's update) — that survives saving and nbconvert.

    Issue 27 item 7: the summary is the live dashboard output's HTML/text alternative (one
    output), not a second block under it: where the widget state is not saved (JupyterLab's
    default) nbconvert shows the summary in the dashboard's place."""
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    then = {
        "wait-then-delete": ["%tfcluster wait short --timeout 300", "%tfcluster delete short"],
        "ends-while-another-cell-runs": [
            "import time\nimport tfk8s_magics as tk\n"
            "deadline = time.monotonic() + 300\n"
            "while not tk.get('short').status().terminal and time.monotonic() < deadline:\n"
            "    time.sleep(0.2)\n"
            "time.sleep(3)  # the summary is drawn by the watcher's thread meanwhile"],
    }[ending]
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(src) for src in ["%load_ext tfk8s_magics", SHORT_RUN, *then]],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    (workdir := tmp_path / "work").mkdir()
    NotebookClient(nb, kernel_name=python3_kernel, timeout=600,
                   resources={"metadata": {"path": str(workdir)}}).execute()
    path = tmp_path / "saved.ipynb"
    nbformat.write(nb, path)
    saved = nbformat.read(path, as_version=4)
    outputs = saved.cells[1].outputs
    displays = [o for o in outputs if o.output_type == "display_data"]
    summaries = [o for o in displays if "tfk8s-summary" in o.data.get("text/html", "")]
    assert len(summaries) == 1, outputs
    # The summary is the dashboard's own output: its widget view for a live front end.
    assert "application/vnd.jupyter.widget-view+json" in summaries[0].data, summaries[0].data.keys()
    assert len(displays) == 1, [o.data.keys() for o in displays]  # no second block, no placeholder
    html = summaries[0].data["text/html"]
    if ending == "wait-then-delete":  # deleted afterwards; the record says how it had ended
        assert 'data-phase="deleted"' in html and "it had ended <b>succeeded</b>" in html, html
        plain = "final state of short (then deleted)"
    else:
        assert 'data-phase="succeeded"' in html, html
        plain = "final state of short\ncluster short (local, between): succeeded"
    assert "tfk8s-phase-succeeded" in html and "starting" not in html, html
    assert "line 2 &lt;b&gt;not bold&lt;/b&gt;" in html and "the script&#x27;s last line" in html, html
    assert plain in "".join(
        o.data.get("text/plain", "") for o in outputs if o.output_type == "display_data")
    # Saved with widget state (nbclient's default, which nbconvert then embeds): the dashboard's
    # widgets hold the final state too, not the one of the last draw before the notebook ended.
    state = saved.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    headers = [m["state"]["value"] for m in state.values()
               if "tfk8s-header" in str(m["state"].get("value", ""))]
    final = "deleted" if ending == "wait-then-delete" else "succeeded"
    assert len(headers) == 1 and f'data-phase="{final}"' in headers[0], headers
    # Saved as JupyterLab saves it by default (no widget state): nbconvert shows the summary.
    saved.metadata.pop("widgets", None)
    exported, _ = HTMLExporter().from_notebook_node(saved)
    assert "final state of short" in exported, exported[-3000:]
    assert re.search(r"the script(&#x27;|')s last line", exported), exported[-3000:]
    assert "application/vnd.jupyter.widget-view+json" not in exported


@pytest.mark.slow
def test_trainer_and_serving(run_notebook):
    nb = run_notebook("trainer_and_serving.ipynb")
    assert "killed worker-1" in nb.text("import os") and "killed worker-0" in nb.text("import os")
    done = nb.text("%tfcluster wait demo")
    assert "cluster demo (local, between): succeeded" in done, done
    assert "progress: step 300/300 (100.0%)" in done, done
    events = nb.text("%tfcluster events demo")
    assert re.search(r"worker-1\s+Restarted", events) and re.search(r"worker-0\s+Restarted", events), events
    resumed = [int(n) for n in re.findall(r"resumed from step (\d+)", nb.text("for line in cluster.logs()"))]
    assert len(resumed) == 2 and all(50 <= n < 300 for n in resumed), resumed
    assert "exported demo version 1" in nb.text("for line in cluster.logs()")
    layout = nb.text("models = Path").split()
    assert "demo/1/saved_model.pb" in layout and "demo/1/variables" in layout, layout
    served = nb.text("%tfcluster serve demo")
    assert "serving model 'demo' version 1" in served, served
    queried = nb.text("import numpy as np")
    assert "'state': 'AVAILABLE'" in queried, queried
    assert "served predictions == model.predict (float32 rounding): True" in queried, queried
    assert "served predictions == the SavedModel's signature, bit for bit: True" in queried, queried
    w = [float(v) for v in re.search(r"learned w: \[([^\]]*)\]", queried)[1].split()]
    assert w == pytest.approx([2.0, -1.0, 0.5, 3.0], abs=0.2), queried
    assert "serving stopped and removed" in nb.text("%tfcluster serve --stop demo")
    assert nb.text("%tfcluster delete demo").strip() == "demo: deleted"


def first_printed_line(path: Path) -> str:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "stream" and out.name == "stdout" and out.text.strip():
                return out.text.strip().splitlines()[0].strip()
    pytest.fail(f"{path.name}: the executed copy has no printed output")


@pytest.mark.slow
def test_the_docs_show_the_notebooks_with_the_outputs_of_this_run(tmp_path):
    """The notebooks the docs render are the ones executed above, in this run, with their outputs."""
    from test_docs import build_docs

    for name in ALL:
        copy = EXECUTED / name
        assert copy.exists() and copy.stat().st_mtime >= _STARTED, (
            f"{copy.relative_to(REPO)} was not written by this run: run all of tests/test_notebooks.py.")
    result = build_docs(tmp_path / "html", env={"TFK8S_DOCS_REQUIRE_OUTPUTS": "1"})
    assert result.returncode == 0, result.stderr[-6000:]
    for name in ALL:
        page = (tmp_path / "html" / "users" / "notebooks" / name.replace(".ipynb", ".html")).read_text()
        line = first_printed_line(EXECUTED / name)
        assert html.escape(line, quote=False) in page or html.escape(line) in page, (name, line)
