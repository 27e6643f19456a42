"""The platform's training loop, for both strategies.

Synchronous (MultiWorkerMirroredStrategy): every worker runs the loop; each
step is one all-reduced update.  Asynchronous (ParameterServerStrategy): the
chief (or the in-graph kernel) schedules steps on the workers through a
``ClusterCoordinator`` and joins them every ``summary_every`` steps.

Either way the step count is a variable saved in the checkpoint with the
model and optimizer, so a restarted cluster resumes from the newest
checkpoint's step, not from 0.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


class Loop:
    """One training run of ``trainer`` on ``model`` with ``optimizer``."""

    def __init__(self, trainer, model, optimizer) -> None:
        import tensorflow as tf

        self.tf = tf
        self.t = trainer
        self.model = model
        self.optimizer = optimizer
        opts = trainer.options
        self.total = opts.steps
        with trainer.strategy.scope():
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfk8s_step")
        self.ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, step=self.step)
        # Non-chief workers save too (collectives need everyone) but into a scratch dir.
        self.save_dir = (trainer.checkpoint_dir if trainer.is_chief
                         else os.path.join(trainer.checkpoint_dir, f".scratch-{trainer.task or os.getpid()}"))
        self.manager = tf.train.CheckpointManager(self.ckpt, self.save_dir, max_to_keep=3)
        self.writer = (tf.summary.create_file_writer(os.path.join(trainer.log_dir, "train"))
                       if trainer.is_chief else tf.summary.create_noop_writer())

    def restore(self) -> int:
        """Restore the newest checkpoint of the chief's dir, if any; return its step."""
        latest = self.tf.train.latest_checkpoint(self.t.checkpoint_dir)
        if latest is None:
            return 0
        self.ckpt.restore(latest)
        start = int(self.step.numpy())
        print(f"tfk8s-trainer: resumed from step {start} ({latest})", flush=True)
        return start

    def _step_fn(self):
        tf, model, optimizer, t = self.tf, self.model, self.optimizer, self.t
        global_batch = t.options.batch_size

        def step_fn(features, labels):
            with tf.GradientTape() as tape:
                predictions = model(features, training=True)
                per_example = t.compute_loss(labels, predictions)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
                if model.losses:
                    loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        strategy = t.strategy

        @tf.function
        def train_step(iterator):
            features, labels = next(iterator)
            losses = strategy.run(step_fn, args=(features, labels))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

        return train_step

    def _iterator(self):
        t = self.t

        def dataset_fn(input_context):
            return t.dataset(input_context).repeat()

        if t.coordinator is None:
            return iter(t.strategy.distribute_datasets_from_function(dataset_fn))

        @self.tf.function
        def per_worker():
            return t.strategy.distribute_datasets_from_function(dataset_fn)

        return iter(t.coordinator.create_per_worker_dataset(per_worker))

    def _chunk(self, train_step, iterator, n: int) -> float:
        """Run ``n`` steps; return the last loss."""
        coordinator = self.t.coordinator
        if coordinator is None:
            for _ in range(n):
                loss = train_step(iterator)
            return float(loss)
        for _ in range(n):
            result = coordinator.schedule(train_step, args=(iterator,))
        coordinator.join()
        return float(result.fetch())

    def save(self, step: int) -> None:
        """Checkpoint at ``step`` (every worker; only the chief's copy is kept)."""
        self.step.assign(step)
        self.manager.save(checkpoint_number=step)
        if not self.t.is_chief:
            shutil.rmtree(self.save_dir, ignore_errors=True)

    def run(self) -> int:
        """Train from the restored step to ``options.steps``; return the last step."""
        t, opts = self.t, self.t.options
        start = t.resumed_from = self.restore()
        train_step, iterator = self._step_fn(), self._iterator()
        # Synchronous steps are cheap to observe one by one; async ones are joined in chunks.
        chunk = 1 if t.coordinator is None else max(
            1, min(opts.summary_every, opts.checkpoint_every or opts.steps))
        step = start
        while step < self.total:
            n = min(chunk, self.total - step)
            loss = self._chunk(train_step, iterator, n)
            before, step = step, step + n
            t.report(step, loss=loss)
            if step % opts.summary_every < n or step == self.total:
                with self.writer.as_default():
                    self.tf.summary.scalar("loss", loss, step=step)
            every = opts.checkpoint_every
            if every and step // every > before // every and step < self.total:
                self.save(step)
        self.save(step)
        self.writer.flush()
        return step


def done_marker(log_dir: str) -> Path:
    """The file the coordinator touches when async training is over (the workers then exit 0)."""
    return Path(log_dir) / "trainer" / "done"
