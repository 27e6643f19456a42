"""Multi-worker Keras ``fit`` whose data and model come from a helper module beside this file
(``digits``): every worker runs this script with its own TF_CONFIG, which the lab writes."""

import json
import os

import digits  # found in this script's folder, as a user's own module is
import tensorflow as tf

workers = len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"])
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = digits.band_classifier()
history = model.fit(digits.training_batches(32 * workers), epochs=3, steps_per_epoch=40, verbose=2)
print("final accuracy", round(float(history.history["accuracy"][-1]), 3))
