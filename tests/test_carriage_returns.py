"""Carriage-return progress bars update in place in every view (issue 27, item 4).

Keras's progress bar (``verbose=1``) redraws one line with ``\\r`` and ends it
with ``\\n`` only at the end of an epoch; a follower that waits for the newline
held every update back, so the views looked frozen for a whole epoch.
"""

import os
import subprocess
import sys
import threading
import time

import pytest

import tfk8s_magics as tk
from tests.conftest import REPO
from tfk8s_magics.backends import Phase
from tfk8s_magics.backends.local import logtail
from tfk8s_magics.ui.live import LogOutput
from tfk8s_magics.ui.stream import Overwrites


def _write(path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def test_the_follower_hands_out_a_bars_updates_before_its_line_ends(tmp_path):
    path = tmp_path / "w.log"
    path.write_bytes(b"")
    cursor = logtail._FileCursor("worker-0", path, from_start=True)
    _write(path, b"Epoch 1/2\n\r 1/10 [>.........]")
    assert cursor.read() == ["Epoch 1/2", "\r 1/10 [>.........]"]
    _write(path, b"\r 2/10 [=>........]\r 3/10 [==>.......]")
    assert cursor.read() == ["\r 3/10 [==>.......]"]  # only the newest state
    _write(path, b"\r 3/10 [==>.......]")
    assert cursor.read() == []  # unchanged: nothing to redraw
    assert len(cursor.partial) < 40  # an hour of redraws keeps one state, not all of them
    _write(path, b"\r10/10 [==========] - loss: 0.1\n")
    assert cursor.read() == ["10/10 [==========] - loss: 0.1"]  # the finished line, as shown
    _write(path, b"half\rrewritten\r")
    assert cursor.read() == ["\rrewritten"]
    _write(path, b"x\n")  # after the trailing \r, "x" overwrites the line's start
    assert cursor.read() == ["x"]
    assert logtail.tail_lines(path, None)[-3:] == ["Epoch 1/2", "10/10 [==========] - loss: 0.1", "x"]


def test_views_render_updates_in_place_and_one_task_at_a_time():
    stream = Overwrites()
    text = stream.render(["[worker-0] Epoch 1/2", "[worker-0] \r 1/10", "[worker-1] \r 1/10",
                          "[worker-0] \r 2/10"])
    assert text == "[worker-0] Epoch 1/2\n\r[worker-0]  1/10\r[worker-0]  2/10"
    text = stream.render(["[worker-1] a log line", "[worker-0] \r 3/10", "[worker-0] 10/10 done"])
    assert text == "\n[worker-1] a log line\n\r[worker-0]  3/10\r[worker-0] 10/10 done\n"


class _Output:
    def __init__(self) -> None:
        self.outputs: tuple = ()

    def append_stdout(self, text: str) -> None:
        self.outputs = (*self.outputs, {"output_type": "stream", "name": "stdout", "text": text})


def test_a_log_widget_counts_and_rebases_on_finished_lines_only():
    out = _Output()
    view = LogOutput(out, max_lines=3)
    history = []
    for i in range(100):  # a bar redrawn 100 times is not 100 lines
        view.append([f"\r{i}/100"], tail=lambda: history, head=lambda: "")
    assert view.shown == 0 and len(out.outputs) == 100
    assert out.outputs[-1]["text"] == "\r99/100"
    history = ["a", "b", "c", "d", "e", "f", "g"]
    view.append(history, tail=lambda: history, head=lambda: "… earlier\n")
    assert out.outputs == ({"output_type": "stream", "name": "stdout",
                            "text": "… earlier\n" + "".join(f"{x}\n" for x in history)},)


KERAS_BAR = """
import time
import numpy as np
import tensorflow as tf

tf.get_logger().setLevel("ERROR")  # Slow is slow on purpose: no warning line inside the bar


class Slow(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.15)

model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
model.compile(optimizer="sgd", loss="mse")
x = np.zeros((64, 2), "float32")
ds = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).repeat().batch(4)
model.fit(ds, epochs=1, steps_per_epoch=60, verbose=1, callbacks=[Slow()])
print("FIT DONE", flush=True)
"""


@pytest.mark.slow
def test_a_keras_progress_bar_reaches_follow_and_the_cli_during_the_epoch(local, workdir, state_dir):
    """Real TensorFlow: Keras's bar (verbose=1) reaches ``follow`` while the epoch runs — an update
    of step k is read before the epoch's line ends — and ``tfk8s logs -f`` draws it in place."""
    cluster = tk.launch("bar", workers=1, ps=0, script=KERAS_BAR, backend=local)
    cli = subprocess.Popen([sys.executable, "-m", "tfk8s_magics.cli", "logs", "bar", "--follow"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=workdir,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    updates, finished_at, first_update_at = [], None, None
    stop = threading.Event()
    timer = threading.Timer(300, stop.set)
    timer.start()
    try:
        for line in cluster.follow(stop):
            if "\r" in line.text:
                updates.append(line.text)
                first_update_at = first_update_at or time.monotonic()
            elif "60/60" in line.text:
                finished_at = time.monotonic()
            if "FIT DONE" in line.text:
                break
    finally:
        timer.cancel()
        stop.set()
    assert cluster.wait(timeout=120).phase == Phase.SUCCEEDED
    assert finished_at is not None, updates[-3:]
    steps = {int(u.split("/")[0].strip("\r ")) for u in updates if "/60" in u}
    assert len(steps) >= 5 and min(steps) < 30, sorted(steps)  # many states, early in the epoch
    assert first_update_at < finished_at - 2  # the bar moved seconds before the line ended
    out, err = cli.communicate(timeout=120)
    text = out.decode()
    assert "\r[worker-0] " in text and "/60 [" in text, (text[-2000:], err[-2000:])
    # In place: every update starts with \r and no update line ends with a newline of its own.
    assert "[worker-0] 60/60" in text.replace("\r", "\n")
    bar_lines = [ln for ln in text.split("\n") if "/60 [" in ln]
    assert len(bar_lines) == 1, bar_lines
