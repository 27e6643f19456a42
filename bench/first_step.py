"""first step: ``tk.launch`` → the first training step done, 2-worker MultiWorkerMirroredStrategy.

cold      ``tk.launch(name, workers=2, script=SCRIPT, backend=..., detach=True)``:
          a detached cluster never takes pooled processes, so both tasks
          import TensorFlow after the launch (today's start).
warm      the same launch (not detached) with this process's warm pool
          (``pool_size`` 2) full; before each warm round the pool is refilled
          and waited for (not timed).

The script builds the strategy (the two workers meet over gRPC), a small
Keras model in its scope and runs ``fit`` for 2 steps; a callback writes the
wall time at the end of step 1 to a file per worker.  The figure is that time
(the later worker) minus the time ``launch`` was called.  Rounds alternate
cold / warm; ratio = median(warm) / median(cold).  Target: ratio ≤ 0.5.

    .venv/bin/python bench/first_step.py [--rounds N]
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import _common as c

TARGET = 0.5
POOL_SIZE = 2
TIMEOUT = 300.0

SCRIPT = '''\
import os, time
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(64, activation="relu"),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
x, y = tf.random.normal((256, 32)), tf.random.normal((256, 1))
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat()


class FirstStep(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 0:
            path = os.path.join(os.environ["TFK8S_LOG_DIR"], "first-" + os.environ["TFK8S_TASK"])
            with open(path, "w") as f:
                f.write(repr(time.time()))


model.fit(ds, epochs=1, steps_per_epoch=2, verbose=0, callbacks=[FirstStep()])
'''


def run(tmp: str, i: int, warm: bool) -> dict:
    import tfk8s_magics as tk
    from tfk8s_magics.backends import Phase
    from tfk8s_magics.backends.local import LocalBackend

    be = LocalBackend(os.path.join(tmp, f"{'warm' if warm else 'cold'}-{i}"))
    name = f"fs{i}"
    if warm:
        c.pool_full(POOL_SIZE, TIMEOUT)
    t0 = time.time()
    try:
        cluster = tk.launch(name, workers=2, script=SCRIPT, backend=be, detach=not warm)
        st = cluster.wait(TIMEOUT)
        if st.phase != Phase.SUCCEEDED:
            raise RuntimeError(f"the cluster ended {st.phase}: {st.reason}\n{cluster.logs('worker-0')}")
        cold = [e.message for e in cluster.events() if e.reason == "StartedCold"]
        if warm and cold:
            raise RuntimeError(f"a warm round started tasks cold: {cold}")
        first = max(float((Path(st.log_dir) / f"first-worker-{k}").read_text()) for k in (0, 1))
    finally:
        c.remove_cluster(be, name)
    c.assert_clean(f"{'warm' if warm else 'cold'} round {i + 1}", allow=c.pool_pids())
    return {"s": first - t0}


def main() -> int:
    args = c.parse_args(__doc__, rounds=5)
    os.environ["TFK8S_POOL_SIZE"] = str(POOL_SIZE)
    from tfk8s_magics.backends.local import pool

    print(f"first step  MWMS 2 workers  {c.machine()}", flush=True)
    with c.cleanup_on_exit(), tempfile.TemporaryDirectory(prefix="bench-fs-") as tmp:
        try:
            c.pool_full(POOL_SIZE, TIMEOUT)
            print("pool of 2 filled", flush=True)
            cold, warm = c.rounds(args.rounds, [("cold", lambda i: run(tmp, i, False)),
                                                ("warm", lambda i: run(tmp, i, True))],
                                  lambda _label, _i, r: f"{r['s']:.3f} s to the first step")
        finally:
            pool.shutdown()
    mc, mw = c.median([r["s"] for r in cold]), c.median([r["s"] for r in warm])
    ratios = [w["s"] / k["s"] for w, k in zip(warm, cold, strict=True)]
    print(f"\nmedian  warm {mw:.3f} s   cold {mc:.3f} s   ratio {mw / mc:.3f}   "
          f"(target <= {TARGET:.2f}: {c.verdict(mw / mc <= TARGET)})")
    print(f"per-round ratios: {' '.join(f'{r:.2f}' for r in ratios)}   "
          f"median of per-round ratios {c.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    c.run(main)
