"""TensorBoard shows the README's own run: ``progress_callback()`` writes the scalars the
dashboard draws (real TensorFlow, real TensorBoard, local backend; the Kubernetes run is in
``tests/test_kube_views.py``)."""

from __future__ import annotations

import json
import urllib.request

import pytest

import tfk8s_magics as tk
from tests.conftest import wait_for
from tests.test_readme_examples import README, blocks
from tfk8s_magics.backends import Phase
from tfk8s_magics.runtime import summaries


def headline_script() -> str:
    """The cell body of the README's headline launch (its ``%%tfcluster launch`` cell)."""
    block = README.split("<!-- headline -->", 1)[1].split("<!-- /headline -->", 1)[0]
    (code,) = [b for b in blocks(block, "python") if "%%tfcluster launch" in b]
    cell = code.split("%%tfcluster launch", 1)[1]
    body = cell.split("\n", 1)[1]
    return body.split("\n\n%tfcluster", 1)[0]  # a block that holds more cells: this one only


def scalars(port: int, run: str, tag: str) -> list[list[float]]:
    """TensorBoard's own answer: ``[[wall time, step, value], ...]``."""
    url = f"http://127.0.0.1:{port}/data/plugin/scalars/scalars?run={run}&tag={tag}"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())
    except OSError:
        return []


def test_the_lead_task_writes_scalars_and_the_others_do_not():
    env = {"TFK8S_LOG_DIR": "/log", "TFK8S_TASK": "worker-0",
           "TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:1"]}})}
    assert summaries.summary_dir(env) == "/log/progress"
    assert summaries.summary_dir({**env, "TFK8S_TASK": "worker-1"}) is None
    chief = {**env, "TF_CONFIG": json.dumps({"cluster": {"chief": ["c:1"], "worker": ["a:1"]}})}
    assert summaries.summary_dir(chief) is None
    assert summaries.summary_dir({**chief, "TFK8S_TASK": "chief-0"}) == "/log/progress"
    assert summaries.summary_dir({"TFK8S_TASK": "worker-0"}) is None  # no log dir: nothing


@pytest.mark.slow
@pytest.mark.browser
def test_tensorboard_shows_the_readme_runs_loss_by_step_as_the_dashboard_does(local, workdir, tmp_path):
    cluster = tk.launch("mnist", workers=2, script=headline_script(), backend=local)
    st = cluster.wait(timeout=600)
    assert st.phase == Phase.SUCCEEDED, cluster.logs()[-3000:]
    assert st.progress is not None and st.progress.step == 8
    tb = cluster.tensorboard()
    got = wait_for(lambda: scalars(tb.port, summaries.RUN, "loss"), 60, "the loss in TensorBoard",
                   interval=0.5)
    steps = [int(s) for _, s, _ in got]
    assert steps == sorted(steps) and steps[-1] == 8, got
    # The value at the last step is the one the dashboard shows (the run's last progress record).
    assert got[-1][2] == pytest.approx(st.progress.metrics["loss"], rel=1e-5)
    # And in the browser: TensorBoard's time series lists the run and draws its loss.
    from tests.browserlab import chromium, shot

    with chromium(tmp_path / "chromium-profile") as page:
        # forceSVG: TensorBoard's canvas draws no line in a headless Chromium without a GPU
        page.goto(f"http://127.0.0.1:{tb.port}/?darkMode=false&forceSVG=true#timeseries",
                  wait_until="networkidle")
        page.get_by_text(summaries.RUN, exact=True).first.wait_for(timeout=60_000)  # the runs list
        page.locator(".card-title, .tag", has_text="loss").first.wait_for(timeout=60_000)
        shot(page, "tensorboard-readme-local.png")
    cluster.delete()
