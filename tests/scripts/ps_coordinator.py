"""The coordinator of an in-graph cluster, as a user's own program: ``ParameterServerStrategy``
built from ``tk.resolver`` with a variable partitioner, then Keras ``fit`` with its callbacks, a
custom loop scheduled through ``ClusterCoordinator``, and evaluation inline and on the workers.

Run in a process that is no task: ``python ps_coordinator.py [CLUSTER]`` (default ``pstutorial``)
against a running ``mode="in-graph"`` cluster of 2 parameter servers.  It prints where the
embedding's two shards live, each epoch of both trainings, the final loss and two accuracies."""

import os
import random
import sys

import tensorflow as tf

import tfk8s_magics as tk

NAME = sys.argv[1] if len(sys.argv) > 1 else "pstutorial"
resolver = tk.resolver(NAME)  # first: it prepares TensorFlow (tf-keras) as the lab's client
strategy = tf.distribute.ParameterServerStrategy(
    resolver,
    # Any variable over 64 KiB is split over both parameter servers.
    variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=64 << 10, max_shards=2))
work = os.path.join(os.getcwd(), "ps-run")  # the callbacks' folders

# -- 1. Keras fit: a linear fit of noisy points, with TensorBoard, checkpoints and backups --------
points = tf.random.stateless_uniform((256, 4), seed=(1, 2))
targets = tf.reduce_sum(points * [1.0, -2.0, 0.5, 3.0], axis=1, keepdims=True)
fit_data = tf.data.Dataset.from_tensor_slices((points, targets)).shuffle(256).repeat().batch(32)
with strategy.scope():
    line = tf.keras.Sequential([tf.keras.Input(shape=(4,)), tf.keras.layers.Dense(1)])
    line.compile(tf.keras.optimizers.legacy.SGD(0.05), loss="mse", steps_per_execution=5)
line.fit(fit_data, epochs=5, steps_per_epoch=10, callbacks=[
    tf.keras.callbacks.TensorBoard(log_dir=os.path.join(work, "tensorboard")),
    tf.keras.callbacks.ModelCheckpoint(filepath=os.path.join(work, "checkpoint")),
    tf.keras.callbacks.BackupAndRestore(backup_dir=os.path.join(work, "backup")),
])

# -- 2. a custom loop: which colours make a "warm" palette, learnt through a sharded embedding ---
COLOURS = ["red", "orange", "yellow", "green", "blue", "indigo", "violet", "white"]
WARM = {"red", "orange", "yellow"}


def palettes(count: int, seed: int) -> dict:
    """``count`` palettes of three colours, labelled 1 when most of them are warm."""
    pick = random.Random(seed)
    rows = [pick.sample(COLOURS, 3) for _ in range(count)]
    return {"colours": rows, "warm": [[int(sum(c in WARM for c in r) >= 2)] for r in rows]}


with strategy.scope():
    to_ids = tf.keras.layers.StringLookup(vocabulary=COLOURS, mask_token=None)
    colour_in = tf.keras.Input(shape=(3,), dtype=tf.int64)
    embedding = tf.keras.layers.Embedding(input_dim=to_ids.vocabulary_size(), output_dim=4096)
    pooled = tf.reduce_mean(embedding(colour_in), axis=1)
    judge = tf.keras.Model(colour_in, tf.keras.layers.Dense(1, activation="sigmoid")(pooled))
    optimizer = tf.keras.optimizers.legacy.Adam(0.05)
    accuracy = tf.keras.metrics.BinaryAccuracy()

shards = embedding.weights  # 9 rows × 4096 floats = 144 KiB: two shards of the partitioner
assert len(shards) == 2, shards
for shard in shards:
    print("embedding shard", tuple(shard.shape), "on", shard.device)


def labelled(data: tf.data.Dataset) -> tf.data.Dataset:
    return data.map(lambda d: (to_ids(d["colours"]), d["warm"]))


def train_data(_context) -> tf.data.Dataset:
    return labelled(tf.data.Dataset.from_tensor_slices(palettes(300, 5))).shuffle(300).repeat().batch(16)


@tf.function
def train_step(iterator):
    def on_worker(ids, warm):
        with tf.GradientTape() as tape:
            guess = judge(ids, training=True)
            loss = tf.nn.compute_average_loss(tf.keras.losses.binary_crossentropy(warm, guess))
        grads = tape.gradient(loss, judge.trainable_variables)
        optimizer.apply_gradients([(grads[i], v) for i, v in enumerate(judge.trainable_variables)])
        accuracy.update_state(warm, guess)
        return loss

    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(on_worker, args=next(iterator)),
                           axis=None)


coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
batches = iter(coordinator.create_per_worker_dataset(
    lambda: strategy.distribute_datasets_from_function(train_data)))
for epoch in range(4):
    accuracy.reset_state()
    for _ in range(6):
        coordinator.schedule(train_step, args=(batches,))
    coordinator.join()
    print(f"Finished epoch {epoch}, accuracy is {accuracy.result().numpy():.3f}.", flush=True)
last = coordinator.schedule(train_step, args=(batches,))
print(f"Final loss is {last.fetch():.4f}", flush=True)

# -- 3. evaluation: here in the coordinator, then scheduled on the workers --------------------
held_out = labelled(tf.data.Dataset.from_tensor_slices(palettes(24, 99))).batch(8)
inline = tf.keras.metrics.BinaryAccuracy()
for ids, warm in held_out:
    inline.update_state(warm, judge(ids, training=False))
print(f"Evaluation accuracy: {inline.result().numpy():.3f}", flush=True)

with strategy.scope():
    on_workers = tf.keras.metrics.BinaryAccuracy()


@tf.function
def eval_step(iterator):
    def on_worker(ids, warm):
        on_workers.update_state(warm, judge(ids, training=False))

    strategy.run(on_worker, args=next(iterator))


eval_batches = iter(coordinator.create_per_worker_dataset(
    lambda: labelled(tf.data.Dataset.from_tensor_slices(palettes(24, 99))).repeat().batch(8)))
for _ in range(3):
    coordinator.schedule(eval_step, args=(eval_batches,))
coordinator.join()
print(f"Evaluation accuracy: {on_workers.result().numpy():.3f}", flush=True)
