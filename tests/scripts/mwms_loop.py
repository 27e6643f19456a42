"""A multi-worker custom training loop: MultiWorkerMirroredStrategy, a dataset built per input
pipeline and sharded by it, a ``tf.function`` step run on every replica with the loss scaled to
the global batch, metrics summed across workers, and a checkpoint per epoch written by the chief
(the other workers write theirs to a scratch folder they remove, as every worker must save).

Each worker prints ``Epoch: N, accuracy: A, train_loss: L`` once per epoch."""

import json
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

EPOCHS, STEPS, PER_WORKER_BATCH = 3, 30, 32
FEATURES = 12

config = json.loads(os.environ["TF_CONFIG"])
workers = len(config["cluster"]["worker"])
is_chief = config["task"]["index"] == 0
strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch = PER_WORKER_BATCH * workers


def examples() -> tf.data.Dataset:
    """Points whose label is whether their first half outweighs their second (learnable, ours)."""
    rng = np.random.default_rng(11)
    x = rng.normal(size=(3000, FEATURES)).astype(np.float32)
    y = (x[:, :FEATURES // 2].sum(axis=1) > x[:, FEATURES // 2:].sum(axis=1)).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((x, y))


def pipeline(context: tf.distribute.InputContext) -> tf.data.Dataset:
    """This input pipeline's shard, batched to the per-replica batch, endless."""
    data = examples().shard(context.num_input_pipelines, context.input_pipeline_id)
    return data.shuffle(1000, seed=context.input_pipeline_id).repeat().batch(
        context.get_per_replica_batch_size(global_batch))


batches = iter(strategy.distribute_datasets_from_function(pipeline))

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(FEATURES,)),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(2),
    ])
    optimizer = tf.keras.optimizers.SGD(0.1)
    accuracy = tf.keras.metrics.SparseCategoricalAccuracy()
    epoch = tf.Variable(0, dtype=tf.int64, trainable=False)

loss_of = tf.keras.losses.SparseCategoricalCrossentropy(
    from_logits=True, reduction=tf.keras.losses.Reduction.NONE)


@tf.function
def train_step(batch):
    def on_replica(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.nn.compute_average_loss(loss_of(y, logits), global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients([(grads[i], v) for i, v in enumerate(model.trainable_variables)])
        accuracy.update_state(y, logits)
        return loss

    per_replica = strategy.run(on_replica, args=batch)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)


# Every worker saves (saving is a collective); only the chief's copy is kept.
checkpoint_dir = os.environ.get("TFK8S_CHECKPOINT_DIR") or tempfile.mkdtemp()
save_to = checkpoint_dir if is_chief else tempfile.mkdtemp(prefix="loop-ckpt-")
checkpoint = tf.train.Checkpoint(model=model, epoch=epoch)
manager = tf.train.CheckpointManager(checkpoint, os.path.join(save_to, "loop"), max_to_keep=1)

while epoch.numpy() < EPOCHS:
    total = 0.0
    for _ in range(STEPS):
        total += float(train_step(next(batches)))
    print(f"Epoch: {epoch.numpy()}, accuracy: {accuracy.result().numpy():.3f}, "
          f"train_loss: {total / STEPS:.4f}", flush=True)
    accuracy.reset_state()
    epoch.assign_add(1)
    manager.save()

if not is_chief:
    shutil.rmtree(save_to, ignore_errors=True)
