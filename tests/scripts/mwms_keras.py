"""Between-graph TF2: MultiWorkerMirroredStrategy, a cross-process all-reduce, then tf-keras fit."""
import json
import os

import numpy as np
import tensorflow as tf

import tfk8s_magics

strategy = tf.distribute.MultiWorkerMirroredStrategy()
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]


@tf.function
def contribute():
    ctx = tf.distribute.get_replica_context()
    return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.constant(float(index + 1)))


total = strategy.experimental_local_results(strategy.run(contribute))[0].numpy()
print(f"ALLREDUCE {total}", flush=True)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(4,))])
    model.compile(optimizer="sgd", loss="mse")
x = np.random.RandomState(index).rand(64, 4).astype("float32")
y = x.sum(axis=1, keepdims=True)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat().with_options(options)
history = model.fit(data, epochs=2, steps_per_epoch=4, verbose=2,
                    callbacks=[tfk8s_magics.progress_callback()])
print(f"KERAS {type(model).__module__.split('.')[0]} LOSS {history.history['loss'][-1]:.4f}", flush=True)
