"""A task's log on Kubernetes as the kubelet cuts it: Keras's default progress bar, with the lab's
progress records written meanwhile, read back as a terminal shows it (real tf-keras output).

The kubelet ends a log line at ``\\n`` only. Keras's bar (``verbose=1``, the default) rewrites its
line with backspaces and ``\\r`` for a whole epoch, and the progress callback's records, written
by its own thread, land in the middle of it: the dashboard showed the raw records glued to the
bar, backspaces as boxes, and the run's last records were never read (a finished run stayed at
"step 4/8").
"""

import os
import subprocess
import sys
import textwrap

import pytest

from tfk8s_magics.backends.kubernetes.logs import LineJoiner, split_progress


class _Watch:
    def __init__(self) -> None:
        self.progress = []

    def record_progress(self, p) -> None:
        self.progress.append(p)


def _shown(lines: list[str]):
    watch, joiner, shown = _Watch(), LineJoiner(), []
    for text in lines:
        line = split_progress(watch, "worker-0", text, joiner)
        if line is not None:
            shown.append(line.text)
    return watch.progress, shown


def test_a_record_glued_to_a_bar_is_read_and_the_bar_shows_its_newest_state():
    bar = "1/4 [=>...] - ETA: 0s - loss: 1.0" + "\b" * 33 + "\r2/4 [==>..] - ETA: 0s - loss: 0.9"
    record = '@tfk8s-progress {"step":2,"total":8,"metrics":{"loss":0.9},"task":"worker-0"}'
    rest = "\b" * 33 + "\r4/4 [=====] - 0s 3ms/step - loss: 0.8"
    progress, shown = _shown(["Epoch 1/2", bar + record, rest, "Epoch 2/2"])
    assert [(p.step, p.total) for p in progress] == [(2, 8)]
    assert shown == ["Epoch 1/2", "\r2/4 [==>..] - ETA: 0s - loss: 0.9",
                     "4/4 [=====] - 0s 3ms/step - loss: 0.8", "Epoch 2/2"]
    # A line printed in two parts around a record is one line.
    progress, shown = _shown(["abc" + record, "def"])
    assert shown == ["\rabc", "abcdef"] and len(progress) == 1


@pytest.mark.slow
def test_the_readme_fit_with_kerass_default_bar_ends_at_its_last_step(tmp_path):
    code = textwrap.dedent("""
        import numpy as np, tensorflow as tf, tfk8s_magics
        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        x = np.random.rand(256, 4).astype("float32")
        data = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1))).batch(32).repeat()
        model.fit(data, epochs=2, steps_per_epoch=4, callbacks=[tfk8s_magics.progress_callback()])
    """)
    # A pod's environment: no progress file, so records go to stdout with the marker.
    env = {k: v for k, v in os.environ.items() if k != "TFK8S_PROGRESS_FILE"}
    env.update(TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", TFK8S_TASK="worker-0",
               PYTHONUNBUFFERED="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    assert b"\b" in out.stdout and b"\r" in out.stdout  # Keras drew its dynamic bar
    kubelet_lines = out.stdout.decode().split("\n")  # how the kubelet cuts the stream
    progress, shown = _shown(kubelet_lines)
    assert progress and (progress[-1].step, progress[-1].total) == (8, 8), [
        (p.step, p.total) for p in progress]
    assert not any("\b" in t or "@tfk8s-progress" in t for t in shown), shown
    finished = [t for t in shown if "\r" not in t]
    assert "Epoch 2/2" in finished
    assert any(t.startswith("4/4 [") and "loss:" in t for t in finished), finished
