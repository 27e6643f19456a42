"""progress_callback: what ``tfk8s_magics.progress_callback()`` costs each training batch.

One process, tf-keras (the lab's default), a tiny model whose batches take
about a millisecond — the case where a callback's cost shows most, and the
one where tf-keras prints "Callback method `on_train_batch_end` is slow
compared to the batch time" (its threshold: the batch-end hooks take longer
than the batch itself).  Interleaved rounds of ``fit(steps_per_epoch=STEPS)``:

none       no callback (the baseline);
ours       ``progress_callback()`` writing to a progress file, as in a task;
per-batch  the previous design, kept here as the reference: a callback that
           reads the loss (``float``) and calls ``report_progress`` every batch,
           without ``_supports_tf_logs`` (so Keras converts its logs for it).

Printed per side: the median time per batch, the overhead per batch against
``none`` measured in the same round, and the ratio ours/none.  Also the
mean time of the batch-end hook itself (Keras's own measurement, as its
slow-callback check takes it) against the batch time: the check's ratio.

    .venv/bin/python bench/progress_callback.py [--rounds 7]
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time

import _common as c

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

STEPS = 600


def main() -> int:
    args = c.parse_args(__doc__, rounds=7)
    print(c.machine())
    tmp = tempfile.mkdtemp(prefix="tfk8s-bench-progress-")
    try:
        return _measure(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _measure(args, tmp: str) -> int:
    os.environ["TFK8S_PROGRESS_FILE"] = os.path.join(tmp, "progress.jsonl")
    os.environ["TFK8S_TASK"] = "worker-0"
    import numpy as np
    import tensorflow as tf

    import tfk8s_magics
    from tfk8s_magics.runtime import progress

    class PerBatch(tf.keras.callbacks.Callback):
        """The reference: read the loss and report every batch (the previous callback)."""

        def __init__(self):
            super().__init__()
            self.step = 0

        def on_train_batch_end(self, batch, logs=None):
            self.step += 1
            progress.report_progress(self.step, None, loss=float((logs or {})["loss"]))

    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
    model.compile(optimizer="sgd", loss="mse")
    x = np.zeros((256, 2), "float32")
    data = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).repeat().batch(4)
    model.fit(data, epochs=1, steps_per_epoch=50, verbose=0)  # trace once, outside the rounds

    def fit(callbacks) -> dict:
        t0 = time.perf_counter()
        model.fit(data, epochs=1, steps_per_epoch=STEPS, verbose=0, callbacks=callbacks)
        return {"per_batch": (time.perf_counter() - t0) / STEPS}

    def hook_cost(make) -> float:
        """Mean seconds of one ``on_train_batch_end`` of the callback, with tf-keras's CallbackList
        (its log conversion included) on the logs of a real step."""
        cb = make()
        cbl = tf.keras.callbacks.CallbackList([cb], model=model)
        cbl.set_params({"epochs": 1, "steps": STEPS, "verbose": 0})
        logs = model.train_function(iter(data))
        cbl.on_train_begin()
        cbl._check_timing = False  # we time the hook here; its check needs batch-begin calls
        t0 = time.perf_counter()
        for i in range(STEPS):
            cbl.on_train_batch_end(i, logs)
        spent = (time.perf_counter() - t0) / STEPS
        cbl.on_train_end()
        return spent

    sides = [
        ("none", lambda i: fit([])),
        ("ours", lambda i: fit([tfk8s_magics.progress_callback()])),
        ("per-batch", lambda i: fit([PerBatch()])),
    ]
    out = c.rounds(args.rounds, sides, lambda label, i, r: f"{r['per_batch'] * 1e3:.3f} ms/batch")
    none, ours, ref = ([r["per_batch"] for r in side] for side in out)
    over_ours = [o - n for o, n in zip(ours, none, strict=True)]
    over_ref = [o - n for o, n in zip(ref, none, strict=True)]
    hook_ours = statistics.median(hook_cost(tfk8s_magics.progress_callback) for _ in range(3))
    hook_ref = statistics.median(hook_cost(PerBatch) for _ in range(3))
    batch = c.median(none)
    print()
    print(f"batch time, no callback (median)      {batch * 1e3:8.3f} ms")
    print(f"ours: time per batch (median)          {c.median(ours) * 1e3:8.3f} ms   "
          f"overhead {c.median(over_ours) * 1e6:+8.1f} µs/batch   ratio ours/none "
          f"{c.median(ours) / batch:.3f}")
    print(f"per-batch reference (median)           {c.median(ref) * 1e3:8.3f} ms   "
          f"overhead {c.median(over_ref) * 1e6:+8.1f} µs/batch   ratio ref/none "
          f"{c.median(ref) / batch:.3f}")
    print(f"batch-end hook, ours                   {hook_ours * 1e6:8.1f} µs   "
          f"= {hook_ours / batch:.4f} of a batch (tf-keras warns above 1.0)")
    print(f"batch-end hook, per-batch reference    {hook_ref * 1e6:8.1f} µs   "
          f"= {hook_ref / batch:.4f} of a batch")
    ok = hook_ours < batch
    print(f"target: ours below TensorFlow's slow-callback threshold: {c.verdict(ok)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    c.run(main)
