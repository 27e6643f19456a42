# A Keras fit on the in-graph cluster "psprogress" (this process is the coordinator), with the
# lab's progress callback: what a user runs in the notebook after `strategy = %tfcluster connect`.
import sys

# A notebook kernel is an interactive shell (it defines sys.ps1): there TensorFlow's logger prints
# its INFO lines, to stdout.
sys.ps1 = "In : "

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfk8s_magics as tk  # noqa: E402

strategy = tk.connect("psprogress")
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
x = np.random.rand(64, 4).astype("float32")
data = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1))).batch(8).repeat()
history = model.fit(data, epochs=3, steps_per_epoch=5, callbacks=[tk.progress_callback()])
print("FIT DONE", history.history["loss"][-1], flush=True)
