"""The :class:`Trainer` base class: the user writes the model and the data; the platform does the rest.

A subclass overrides :meth:`Trainer.build_model` (a compiled Keras model, or
``(model, optimizer)``) and :meth:`Trainer.dataset`; optionally
:meth:`Trainer.compute_loss`, :meth:`Trainer.train` and
:meth:`Trainer.after_train`.  The platform (:mod:`.runtime`) chooses the
strategy from the cluster's shape and ``sync``/``async``, builds the model
under its scope, distributes the dataset, checkpoints every
``checkpoint_every`` steps to the shared checkpoint dir and resumes from the
newest checkpoint after a restart, writes TensorBoard summaries, reports
progress, and exports a SavedModel on the chief to
``<log dir>/models/<name>/<version>`` — the layout TensorFlow Serving reads.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from ..runtime.progress import report_progress
from .loop import Loop
from .options import ASYNC, TrainerOptions


class Trainer:
    """Subclass me: ``build_model`` and ``dataset`` are yours; strategy, checkpoints, progress,
    summaries and export are the platform's.

    Attributes the platform sets before :meth:`build_model` is called:
    ``options`` (:class:`TrainerOptions`), ``strategy``, ``coordinator``
    (async only), ``is_chief``, ``task`` (``"worker-1"``), ``log_dir``,
    ``checkpoint_dir``, ``cluster`` (the cluster's name).
    """

    def __init__(self, options: TrainerOptions | None = None, **settings: Any) -> None:
        self.options = options or TrainerOptions()
        self.strategy = None
        self.coordinator = None
        self.is_chief = True
        self.task = os.environ.get("TFK8S_TASK", "")
        self.cluster = os.environ.get("TFK8S_CLUSTER", "") or "model"
        self.log_dir = os.environ.get("TFK8S_LOG_DIR") or os.path.abspath("tfk8s-logs")
        self.checkpoint_dir = (os.environ.get("TFK8S_CHECKPOINT_DIR")
                               or os.path.join(self.log_dir, "checkpoints"))
        self.resumed_from = 0
        self.exported_to: str | None = None
        for key, value in settings.items():
            setattr(self, key, value)

    # -- what the user overrides -------------------------------------------------
    def build_model(self):
        """Return a compiled Keras model (or ``(model, optimizer)``); called under the strategy's scope."""
        raise NotImplementedError("override build_model() to return a compiled Keras model")

    def dataset(self, input_context):
        """Return a ``tf.data.Dataset`` of ``(features, labels)`` batches for one replica.

        Batch with ``input_context.get_per_replica_batch_size(self.options.batch_size)``
        and shard with ``input_context`` if the data is not already per-worker;
        the platform repeats it for as many steps as asked.
        """
        raise NotImplementedError("override dataset(input_context) to return a tf.data.Dataset")

    def compute_loss(self, labels, predictions):
        """Per-example loss; the default is the compiled model's loss with no reduction."""
        return self._loss_fn(labels, predictions)

    def after_train(self, model) -> None:
        """Called on every training task after training and export (evaluation, extra exports)."""

    # -- the platform's loop (override train() for full control) -----------------
    def train(self, model, optimizer) -> int:
        """Run ``options.steps`` steps from the restored step; return the last step."""
        return Loop(self, model, optimizer).run()

    # -- helpers a custom train() may use ------------------------------------------
    def report(self, step: int, **metrics: float) -> None:
        """Report progress (chief only: it speaks for the cluster)."""
        if self.is_chief:
            report_progress(step, self.options.steps, **metrics)

    @property
    def model_name(self) -> str:
        """The exported model's name: ``options.model_name``, else the cluster's."""
        return self.options.model_name or self.cluster

    @property
    def models_dir(self) -> Path:
        """``<log dir>/models/<model>``: the base path TensorFlow Serving reads."""
        return Path(self.log_dir) / "models" / self.model_name

    def next_version(self) -> int:
        """One more than the newest version already exported (1 for the first)."""
        versions = [int(p.name) for p in self.models_dir.glob("*") if p.name.isdigit()]
        return max(versions, default=0) + 1

    def export(self, model) -> str | None:
        """Save a SavedModel: the chief to ``<models dir>/<version>``, the others to a scratch dir.

        Every worker saves (MultiWorkerMirroredStrategy may need them all for
        collectives); only the chief's copy is kept.  The chief writes into a
        hidden directory and renames it, so a server polling the base path
        never loads half an export.
        """

        self.models_dir.mkdir(parents=True, exist_ok=True)
        if self.is_chief:
            version = self.next_version()
            scratch = self.models_dir / f".export-{version}-{os.getpid()}"
        else:
            version = None
            scratch = Path(self.checkpoint_dir) / f".scratch-{self.task or os.getpid()}"
        shutil.rmtree(scratch, ignore_errors=True)
        self.save_model(model, str(scratch))
        if not self.is_chief:
            shutil.rmtree(scratch, ignore_errors=True)
            return None
        final = self.models_dir / str(version)
        os.rename(scratch, final)
        print(f"tfk8s-trainer: exported {self.model_name} version {version} to {final}", flush=True)
        return str(final)

    def save_model(self, model, path: str) -> None:
        """Write ``model`` as a SavedModel with a ``serving_default`` signature.

        tf-keras: ``model.save(path, save_format="tf")`` (loadable again with
        ``tf.keras.models.load_model``); Keras 3: ``model.export(path)``;
        anything else: ``tf.saved_model.save``.
        """
        import tensorflow as tf

        if hasattr(model, "export") and not hasattr(model, "_get_save_spec"):
            model.export(path)  # Keras 3
        elif hasattr(model, "save") and hasattr(model, "_get_save_spec"):
            model.save(path, save_format="tf")  # tf-keras
        else:
            tf.saved_model.save(model, path)

    @property
    def is_async(self) -> bool:
        """Whether this run uses parameter servers."""
        return self.options.sync == ASYNC

    def _loss_fn(self, labels, predictions):
        raise NotImplementedError  # replaced by the loop with the compiled loss


def wait_until(path: Path, newer_than: float, poll: float = 0.5) -> None:
    """Sleep until ``path`` exists with a modification time after ``newer_than``."""
    while True:
        try:
            if path.stat().st_mtime >= newer_than:
                return
        except FileNotFoundError:
            pass
        time.sleep(poll)
