"""The progress protocol inside a task, and the Keras callback on real TensorFlow."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tfk8s_magics.runtime import progress


def test_reports_are_rate_limited_but_the_newest_is_always_written(tmp_path, monkeypatch):
    path = tmp_path / "p.jsonl"
    monkeypatch.setenv("TFK8S_PROGRESS_FILE", str(path))
    monkeypatch.setenv("TFK8S_TASK", "worker-0")
    r = progress._Reporter()
    written = [r.report(step, 1000, {"loss": 1.0 / step}) for step in range(1, 201)]
    assert written[0] is True and sum(written) < 5  # a burst is not written line by line
    time.sleep(1.0 / progress.MAX_RATE_HZ + 0.2)
    records = [json.loads(x) for x in path.read_text().splitlines()]
    assert records[-1]["step"] == 200  # the held record was flushed after the pause
    assert records[-1]["metrics"]["loss"] == 1.0 / 200
    assert records[-1]["task"] == "worker-0" and records[-1]["total"] == 1000


def test_final_step_is_written_at_once(tmp_path, monkeypatch):
    path = tmp_path / "p.jsonl"
    monkeypatch.setenv("TFK8S_PROGRESS_FILE", str(path))
    r = progress._Reporter()
    r.report(1, 2, {})
    assert r.report(2, 2, {}) is True
    assert json.loads(path.read_text().splitlines()[-1])["step"] == 2


def test_outside_a_task_it_does_nothing(monkeypatch, capsys):
    monkeypatch.delenv("TFK8S_PROGRESS_FILE", raising=False)
    monkeypatch.delenv("TFK8S_TASK", raising=False)
    assert progress._Reporter().report(5, 10, {}) is False
    assert capsys.readouterr().out == ""


def test_in_a_pod_records_go_to_stdout_with_a_marker(monkeypatch, capsys):
    monkeypatch.delenv("TFK8S_PROGRESS_FILE", raising=False)
    monkeypatch.setenv("TFK8S_TASK", "worker-1")
    assert progress._Reporter().report(3, 10, {"acc": 0.5}) is True
    line = capsys.readouterr().out.strip()
    assert line.startswith(progress.STDOUT_MARKER)
    assert progress.parse_record(line)["metrics"] == {"acc": 0.5}


def test_an_in_graph_client_redirects_its_records_until_its_cluster_is_deleted(monkeypatch):
    monkeypatch.delenv("TFK8S_PROGRESS_FILE", raising=False)
    monkeypatch.delenv("TFK8S_TASK", raising=False)
    got: list[str] = []
    progress.redirect_progress(got.append, "chief-0", key=("local", "ig"))
    try:
        assert progress.report_progress(5, total=5, loss=0.5) is True
        assert progress.parse_record(got[-1])["task"] == "chief-0"
        progress.end_redirect(("local", "other"))  # another cluster's delete changes nothing
        assert progress.report_progress(5, total=5) is True and len(got) == 2
    finally:
        progress.end_redirect(("local", "ig"))
    assert progress.report_progress(5, total=5) is False  # back to: outside a task, nothing


# -- the Keras callback, on real TensorFlow ---------------------------------------------------
@pytest.mark.slow
def test_callback_reports_kerass_numbers_under_multiworker_mirrored_strategy(local, workdir):
    """Issue 27 item 2: tf-keras sums batch-level logs over the workers under MWMS; the lab's
    records are Keras's own numbers (History's per epoch, the batch log / replicas within one)."""
    import tfk8s_magics as tk
    from tfk8s_magics.backends import Phase

    script = Path(__file__).parent / "scripts" / "mwms_progress_values.py"
    cluster = tk.launch("values", workers=2, ps=0, script_path=str(script), backend=local)
    st = cluster.wait(timeout=400)
    logs = cluster.logs_by_task()
    assert st.phase == Phase.SUCCEEDED, logs
    for task in logs:
        values = json.loads((Path(st.log_dir) / f"values-{task}.json").read_text())
        replicas, raw, history = values["replicas"], values["raw"], values["history"]
        records = values["records"]
        assert replicas == 2
        # Keras's own behaviour, which the callback undoes: the last batch log is 2 × the epoch's.
        assert raw["450"] == pytest.approx(2 * history["loss"][-1], rel=1e-5)
        by_step = {r["step"]: r for r in records}
        assert by_step[150]["metrics"]["loss"] == pytest.approx(history["loss"][0], rel=1e-5)
        assert by_step[450]["metrics"]["loss"] == pytest.approx(history["loss"][-1], rel=1e-5)
        assert by_step[450]["metrics"]["mae"] == pytest.approx(history["mae"][-1], rel=1e-5)
        within = [r for r in records if r["step"] % 150]
        assert len(within) >= 2, (task, [r["step"] for r in records])  # live records mid-epoch
        for r in within:
            assert r["metrics"]["loss"] == pytest.approx(raw[str(r["step"])] / replicas, rel=1e-5), r


@pytest.mark.slow
def test_callback_is_not_what_tensorflow_calls_slow(tmp_path, monkeypatch):
    """Issue 27 item 3: TensorFlow's "Callback method on_train_batch_end is slow compared to the
    batch time" warning is not printed for our callback (a tiny model: ~1 ms batches)."""
    code = textwrap.dedent("""
        import logging, numpy as np, tensorflow as tf, tfk8s_magics
        model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
        model.compile(optimizer="sgd", loss="mse")
        x = np.zeros((64, 2), "float32")
        ds = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).repeat().batch(4)
        for _ in range(3):
            model.fit(ds, epochs=2, steps_per_epoch=200, verbose=1,
                      callbacks=[tfk8s_magics.progress_callback()])
        print("FIT DONE", flush=True)
    """)
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "TFK8S_PROGRESS_FILE": str(tmp_path / "progress.jsonl"), "TFK8S_TASK": "worker-0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert "FIT DONE" in out.stdout, out.stderr[-3000:]
    assert "is slow compared to the batch time" not in out.stderr, out.stderr[-3000:]
    records = [json.loads(x) for x in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 400 and records[-1]["total"] == 400


@pytest.mark.slow
def test_a_batch_reads_no_tensor_on_the_training_thread(tmp_path, monkeypatch):
    """Issue 27 item 3, the cause: reading a metric (a device sync) in ``on_train_batch_end``, and
    making Keras convert every batch's logs for us, put the cost on every batch.  Now a batch only
    records the logs; the values are read on the callback's own thread, a few times a second."""
    import threading as th

    monkeypatch.setenv("TFK8S_PROGRESS_FILE", str(tmp_path / "p.jsonl"))
    monkeypatch.setenv("TFK8S_TASK", "worker-0")
    read_on = []

    class Metric:
        def __init__(self, value):
            self.value = value

        def __float__(self):
            read_on.append(th.current_thread())
            return self.value

    cb = progress.progress_callback(total=1000)
    assert cb._supports_tf_logs is True  # Keras hands its tensors over unconverted
    cb.params = {"epochs": 1, "steps": 1000}
    cb.on_train_begin()
    for i in range(300):
        cb.on_train_batch_end(i, {"loss": Metric(1.0 / (i + 1))})
    assert all(t is not th.main_thread() for t in read_on), read_on
    deadline = time.monotonic() + 30
    while not read_on and time.monotonic() < deadline:  # the reader's first tick (0.2 s)
        time.sleep(0.05)
    cb.on_train_end()
    assert read_on and all(t is not th.main_thread() for t in read_on[:-1])
    records = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 300 and records[-1]["metrics"]["loss"] == pytest.approx(1 / 300)


@pytest.mark.slow
def test_callback_under_parameter_server_strategy_reports_the_run_quietly(state_dir, tmp_path):
    """A ``fit`` driven from the coordinator of an in-graph cluster hands its callbacks one
    ``RemoteValue`` per batch, not a dict: the callback's thread raised "argument of type
    'RemoteValueImpl' is not iterable" on it, and TensorFlow printed one "Reduce to
    /device:CPU:0 then broadcast" INFO line per variable.  Now the run ends at its last step,
    with the epoch's loss, and neither is printed."""
    import tfk8s_magics as tk
    from tests.conftest import REPO

    cluster = tk.launch("psprogress", mode="in-graph", ps=1, workers=1, backend="local", wait_ready=300)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               TF_USE_LEGACY_KERAS="1")
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # what a notebook kernel has: TensorFlow's INFO lines on
    proc = subprocess.run([sys.executable, str(Path(__file__).parent / "scripts" / "ps_fit_progress.py")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "FIT DONE" in proc.stdout, out[-5000:]
    assert "Exception in thread" not in out and "RemoteValue" not in out, out[-5000:]
    assert "Reduce to" not in out, out[-5000:]
    p = cluster.status().progress
    assert p is not None and (p.step, p.total) == (15, 15), p
    last_loss = float(proc.stdout.split("FIT DONE")[1].split()[0])
    assert p.metrics.get("loss") == pytest.approx(last_loss, rel=1e-5)
    cluster.delete()


@pytest.mark.parametrize(("epoch", "batches"), [(0, 4), (2, 4)])
def test_a_resumed_fit_counts_steps_from_the_epoch_it_resumes_at(tmp_path, monkeypatch, epoch, batches):
    """BackupAndRestore resumes ``fit`` at a later epoch: a run resumed after a lost worker ended
    at "200/240" (the resumed process counted from 0).  The step is the epoch's start plus the
    batch index Keras gives."""
    path = tmp_path / "p.jsonl"
    monkeypatch.setenv("TFK8S_PROGRESS_FILE", str(path))
    monkeypatch.setenv("TFK8S_TASK", "worker-0")
    monkeypatch.setattr(progress, "_reporter", progress._Reporter())
    cb = progress._ProgressLogic()
    cb._setup(None, ("loss",))
    cb.params = {"epochs": 3, "steps": batches}
    cb.on_train_begin()
    for e in range(epoch, 3):
        cb.on_epoch_begin(e)
        for b in range(batches):
            cb.on_train_batch_end(b, {"loss": 1.0})
        cb.on_epoch_end(e, {"loss": 0.5})
    cb.on_train_end()
    records = [json.loads(x) for x in path.read_text().splitlines()]
    assert (records[-1]["step"], records[-1]["total"]) == (12, 12), records
    assert [r["step"] for r in records if r["step"] % batches == 0][0] == (epoch + 1) * batches


def test_a_batch_log_that_is_not_a_mapping_gives_no_metrics_and_no_error():
    cb = progress._ProgressLogic()
    cb._setup(None, ("loss",))

    class RemoteValueImpl:  # what ParameterServerStrategy's fit hands a batch callback
        def fetch(self):
            raise AssertionError("a batch's remote value must not be waited for")

    assert cb.metrics_of(RemoteValueImpl()) == {}
    assert cb.metrics_of({"loss": 2.0}, 2) == {"loss": 1.0}
