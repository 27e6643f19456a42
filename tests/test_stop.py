"""Stop is truthful and prompt (issue 27, item 1), on real TensorFlow clusters (local backend).

TensorFlow's coordination service takes SIGTERM for its preemption notifier
once ``MultiWorkerMirroredStrategy()`` exists; the task runtime gives it back
to the script, so a stop ends a Keras ``fit`` at once and cleanly (its
``finally`` runs), and the cluster says "stopping" until every task has ended.
"""

import threading

import pytest

import tfk8s_magics as tk
from tests.conftest import wait_for
from tfk8s_magics.backends import Phase
from tfk8s_magics.runtime.stopsignal import EXIT_STOPPED

pytestmark = pytest.mark.slow

MWMS_FIT = """
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
try:
    model.fit(ds.with_options(options), epochs=1000, steps_per_epoch=1000, verbose=0,
              callbacks=[tfk8s_magics.progress_callback()])
finally:
    print("FINALLY RAN", flush=True)
print("FIT RETURNED", flush=True)
"""


def test_stop_ends_a_multiworker_fit_at_once_with_a_clean_exit(local, workdir):
    """SIGTERM is honoured by a TensorFlow process that built MWMS: the script unwinds (its
    ``finally`` runs), every task exits 143, no SIGKILL is needed, the events record each end."""
    cluster = tk.launch("mwmsstop", workers=2, ps=0, script=MWMS_FIT, backend=local)
    cluster.wait_ready(timeout=240)
    wait_for(lambda: (cluster.status().progress or None) and cluster.status().progress.step >= 20,
             timeout=240, what="20 steps of training")
    st = cluster.stop()
    assert st.phase == Phase.STOPPED, st.reason
    assert st.reason == "stopped by the user"
    logs = cluster.logs_by_task()
    for t in st.tasks:
        ended = (t.phase, t.exit_code, t.signal)
        assert ended == (Phase.STOPPED, EXIT_STOPPED, None), f"{t}\n{logs[t.name][-3000:]}"
    for task, text in logs.items():
        assert "FINALLY RAN" in text, (task, text[-2000:])
        assert "FIT RETURNED" not in text
        assert "tfk8s: stop requested (SIGTERM)" in text
    events = cluster.events()
    reasons = [(e.task, e.reason) for e in events]
    assert ("", "Stopping") in reasons and ("", "Stopped") in reasons
    assert not [e for e in events if e.reason == "Killed"], events
    ended = {e.task: e.message for e in events if e.reason == "TaskStopped"}
    assert set(ended) == {"worker-0", "worker-1"}
    assert all(m.startswith(f"exited with code {EXIT_STOPPED} ") and m.endswith("after SIGTERM")
               for m in ended.values()), ended
    # The order tells the truth: "Stopped" comes after every task's end.
    assert reasons.index(("", "Stopped")) > max(reasons.index((t, "TaskStopped")) for t in ended)


IGNORES_SIGTERM = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ignoring SIGTERM", flush=True)
time.sleep(600)
"""


MANGLES_THE_STOP = """
import time
print("waiting", flush=True)
try:
    while True:
        time.sleep(0.05)
except SystemExit:
    # what TensorFlow's bindings do when SIGTERM lands while they build an error of their own
    raise RuntimeError("pybind11::error_already_set: MISMATCH of original and normalized active "
                       "exception types: ORIGINAL UnavailableError REPLACED BY TaskStopped: 143")
"""


def test_an_error_the_stop_causes_on_its_way_out_still_ends_the_task_stopped(local, workdir):
    """A stop that reaches the script while TensorFlow builds an error comes out as another
    exception (seen under MWMS: a RuntimeError from pybind11): the task was stopped, not failed."""
    cluster = tk.launch("mangled", workers=1, ps=0, script=MANGLES_THE_STOP, backend=local)
    cluster.wait_ready(timeout=120)
    wait_for(lambda: "waiting" in cluster.logs("worker-0"), timeout=60, what="the script")
    st = cluster.stop()
    assert st.phase == Phase.STOPPED and st.reason == "stopped by the user"
    task = st.task("worker-0")
    assert (task.phase, task.exit_code, task.signal) == (Phase.STOPPED, EXIT_STOPPED, None), task
    assert "MISMATCH" in cluster.logs("worker-0")  # the traceback is kept in the log


def test_a_task_that_ignores_sigterm_is_stopping_until_killed_and_the_kill_is_recorded(local, workdir):
    """While a task outlives SIGTERM the cluster is "stopping" (not "stopped") and the task still
    runs; after the grace it is SIGKILLed, and the events say so."""
    cluster = tk.launch("stubborn", workers=1, ps=0, script=IGNORES_SIGTERM, backend=local)
    cluster.wait_ready(timeout=120)
    wait_for(lambda: "ignoring SIGTERM" in cluster.logs("worker-0"), timeout=60, what="the handler")
    result = {}
    stopper = threading.Thread(target=lambda: result.setdefault("st", cluster.stop()))
    stopper.start()
    seen = wait_for(lambda: (s := cluster.status()).phase == Phase.STOPPING and s, timeout=30,
                    what="the cluster to say stopping")
    assert seen.task("worker-0").phase == Phase.RUNNING
    assert "waiting for the tasks to end" in seen.reason
    stopper.join(timeout=120)
    assert not stopper.is_alive()
    st = result["st"]
    assert st.phase == Phase.STOPPED and st.reason == "stopped by the user"
    assert st.task("worker-0").signal == "SIGKILL"
    events = {e.reason: e for e in cluster.events() if e.task == "worker-0"}
    assert events["Killed"].type == "Warning"
    assert "5 s after SIGTERM: sent SIGKILL" in events["Killed"].message
    assert events["TaskStopped"].message.startswith("killed by SIGKILL")
    assert events["TaskStopped"].time >= events["Killed"].time


def test_after_the_grace_period_the_reason_says_the_servers_were_recycled(local, workdir):
    """Issue 27 item 7: "parameter servers stop after a 1 s grace period" stayed the reason after
    they had been recycled."""
    cluster = tk.launch("recycled", workers=1, ps=1, ps_grace_period=1, script="print('done')\n",
                        backend=local)
    st = cluster.wait(timeout=240)
    assert st.phase == Phase.SUCCEEDED
    final = wait_for(lambda: (s := cluster.status()).task("ps-0").phase in Phase.TERMINAL and s,
                     timeout=60, what="the parameter server's end")
    assert final.reason == "the workers finished; the parameter servers were recycled", final.reason
    assert "grace period" not in final.reason


def test_a_name_not_found_after_a_delete_does_not_say_none_yet(local, workdir):
    from tfk8s_magics.errors import ClusterNotFound

    tk.launch("brief", workers=1, ps=0, script="print('x')\n", backend=local).wait(timeout=240)
    tk.get("brief", local).delete()
    with pytest.raises(ClusterNotFound) as err:
        tk.get("brief", local)
    assert "none yet" not in str(err.value)


def test_a_stopped_multiworker_fit_leaves_no_workertemp_run_in_tensorboard(local, workdir):
    """Issue 27 item 7: after Stop, TensorBoard showed a run ``workertemp_1/train`` — the scratch
    folder Keras gives a non-chief worker and removes only when ``fit`` returns."""
    import json
    import urllib.request
    from pathlib import Path

    script = MWMS_FIT.replace(
        "callbacks=[tfk8s_magics.progress_callback()]",
        "callbacks=[tfk8s_magics.progress_callback(), "
        "tf.keras.callbacks.TensorBoard(os.path.join(os.environ['TFK8S_LOG_DIR'], 'tb'))]")
    cluster = tk.launch("mwmstemp", workers=2, ps=0, script=script, backend=local)
    log_dir = Path(cluster.status().log_dir)
    wait_for(lambda: (cluster.status().progress or None) and cluster.status().progress.step >= 20,
             timeout=240, what="20 steps of training")
    assert (log_dir / "tb" / "workertemp_1" / "train").is_dir()  # what Keras writes meanwhile
    st = cluster.stop()
    assert st.phase == Phase.STOPPED, st.reason
    wait_for(lambda: not (log_dir / "tb" / "workertemp_1").exists(), 30, "the scratch folder to go")
    assert (log_dir / "tb" / "train").is_dir()  # the chief's summaries stay
    removed = [e for e in cluster.events() if e.reason == "TempRemoved"]
    assert len(removed) == 1 and "workertemp_1" in removed[0].message, removed
    info = cluster.tensorboard()
    runs = wait_for(lambda: json.loads(urllib.request.urlopen(
        f"http://127.0.0.1:{info.port}/data/runs", timeout=10).read()) or None, 60, "TensorBoard's runs")
    assert sorted(runs) == ["progress", "tb/train"], runs  # the callback's scalars and the chief's run
