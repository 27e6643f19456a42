"""tf-keras fit under MultiWorkerMirroredStrategy: the lab's progress records against Keras's numbers.

Writes ``values-<task>.json`` in the task's log dir: Keras's raw batch-level loss per step
(what tf-keras hands to callbacks), History's per-epoch loss, the number of replicas, and the
records the lab's callback wrote to this task's progress file."""
import json
import os

import numpy as np
import tensorflow as tf

import tfk8s_magics

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu", input_shape=(4,)),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
x = np.random.RandomState(0).rand(256, 4).astype("float32")
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
data = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True))).repeat().batch(8)


class Raw(tf.keras.callbacks.Callback):
    """Keras's batch logs as they are (step → loss)."""

    def __init__(self):
        super().__init__()
        self.step, self.raw = 0, {}

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        self.raw[self.step] = float(logs["loss"])


raw = Raw()
history = model.fit(data.with_options(options), epochs=3, steps_per_epoch=150, verbose=0,
                    callbacks=[tfk8s_magics.progress_callback(metric_names=("loss", "mae")), raw])
with open(os.environ["TFK8S_PROGRESS_FILE"], encoding="utf-8") as f:
    records = [json.loads(line) for line in f if line.strip()]
out = os.path.join(os.environ["TFK8S_LOG_DIR"], f"values-{os.environ['TFK8S_TASK']}.json")
with open(out, "w", encoding="utf-8") as f:
    json.dump({"raw": raw.raw, "history": history.history, "records": records,
               "replicas": strategy.num_replicas_in_sync}, f)
