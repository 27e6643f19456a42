"""Run a :class:`~.base.Trainer` inside a task (or in this process): strategy, model, loop, export.

:func:`run` is what the script of ``%%tfcluster launch NAME --trainer CLS``
ends with.  It reads the task's ``TF_CONFIG`` and, for the cluster's shape
and the ``sync`` option, either

* trains under ``MultiWorkerMirroredStrategy`` (sync: every worker runs the
  loop), or
* coordinates ``ParameterServerStrategy`` training from the chief (async),
  while each worker serves a ``tf.distribute.Server`` until the chief says
  training is over (a marker file on the shared log dir), then exits 0.

Without ``TF_CONFIG`` (a plain process) it trains with the default strategy,
so the same class runs on a laptop.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from .base import Trainer, wait_until
from .loop import done_marker
from .options import ASYNC, TrainerOptions


def _tf_config() -> dict[str, Any]:
    # Deferred: the package's __init__ imports api, which imports this module.
    from .. import task_info

    return task_info() if os.environ.get("TF_CONFIG") else {}


def _serve_until_done(cfg: dict[str, Any], log_dir: str) -> None:
    """An async worker: serve the coordinator's steps until it marks training done."""
    import tensorflow as tf

    started = time.time()
    task = cfg["task"]
    server = tf.distribute.Server(
        tf.train.ClusterSpec(cfg["cluster"]), job_name=task["type"], task_index=int(task["index"]),
        protocol="grpc", start=True,
    )
    print(f"tfk8s-trainer: {task['type']}-{task['index']} serving the coordinator at {server.target}",
          flush=True)
    wait_until(done_marker(log_dir), started)
    print("tfk8s-trainer: the coordinator finished training; exiting", flush=True)


def make_strategy(options: TrainerOptions, cfg: dict[str, Any], strategy=None):
    """``(strategy, coordinator)`` for this task: MWMS for sync, PS + coordinator for async.

    ``strategy``: an existing ParameterServerStrategy (the in-graph kernel's, from ``connect``).
    """
    import tensorflow as tf

    if strategy is not None:
        return strategy, tf.distribute.coordinator.ClusterCoordinator(strategy)
    if options.sync == ASYNC:
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        strategy = tf.distribute.ParameterServerStrategy(resolver)
        return strategy, tf.distribute.coordinator.ClusterCoordinator(strategy)
    if cfg:
        return tf.distribute.MultiWorkerMirroredStrategy(), None
    return tf.distribute.get_strategy(), None


def _split(built) -> tuple[Any, Any]:
    if isinstance(built, tuple | list):
        model, optimizer = built
        return model, optimizer
    optimizer = getattr(built, "optimizer", None)
    if optimizer is None:
        raise TypeError("build_model() returned a model that is not compiled: compile it with an optimizer "
                        "and a loss, or return (model, optimizer) and override compute_loss().")
    return built, optimizer


def compiled_loss(model):
    """The compiled model's loss as a per-example function (no reduction)."""
    import tensorflow as tf

    loss = getattr(model, "loss", None)
    if loss is None:
        raise TypeError("the model has no compiled loss: compile it with loss=..., "
                        "or override compute_loss().")
    if isinstance(loss, str) or not hasattr(loss, "get_config"):
        return tf.keras.losses.get(loss)
    return type(loss).from_config({**loss.get_config(), "reduction": "none"})


def train(trainer: Trainer, cfg: dict[str, Any] | None = None, strategy=None) -> Trainer:
    """Build the model under the strategy, train, export on the chief, then ``after_train``."""
    import tensorflow as tf

    opts = trainer.options
    cfg = cfg if cfg is not None else _tf_config()
    if not opts.use_gpu:
        tf.config.set_visible_devices([], "GPU")
    if cfg:
        trainer.is_chief = bool(cfg.get("is_chief"))
    trainer.strategy, trainer.coordinator = make_strategy(opts, cfg, strategy)
    with trainer.strategy.scope():
        model, optimizer = _split(trainer.build_model())
    if type(trainer).compute_loss is Trainer.compute_loss:
        trainer._loss_fn = compiled_loss(model)
    how = ("ParameterServerStrategy (async)" if trainer.coordinator is not None
           else "MultiWorkerMirroredStrategy (sync)" if cfg else type(trainer.strategy).__name__)
    print(f"tfk8s-trainer: {type(trainer).__name__} on {how}, "
          f"{opts.steps} steps, global batch {opts.batch_size}", flush=True)
    trainer.train(model, optimizer)
    if opts.export:
        trainer.exported_to = trainer.export(model)
    trainer.after_train(model)
    return trainer


def run(trainer_cls: type[Trainer], options: dict[str, Any] | TrainerOptions | None = None,
        **settings: Any) -> Trainer | None:
    """Run ``trainer_cls`` as this task's part of the cluster (see the module docstring)."""
    if isinstance(options, str):
        options = json.loads(options)
    opts = options if isinstance(options, TrainerOptions) else TrainerOptions.from_dict(dict(options or {}))
    cfg = _tf_config()
    role = cfg.get("task", {}).get("type") if cfg else None
    trainer = trainer_cls(opts, **settings)
    if role == "evaluator":
        print("tfk8s-trainer: an evaluator has no part in training; evaluate in after_train()", flush=True)
        return None
    if opts.sync == ASYNC and role == "worker":
        _serve_until_done(cfg, trainer.log_dir)
        return None
    train(trainer, cfg)
    if opts.sync == ASYNC and trainer.is_chief:
        marker = done_marker(trainer.log_dir)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(str(time.time()), encoding="utf-8")
    return trainer
