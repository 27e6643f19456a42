"""The platform's Trainer: subclass :class:`Trainer`, override ``build_model`` and ``dataset``.

>>> class MyTrainer(Trainer):                                      # doctest: +SKIP
...     def build_model(self):
...         m = tf.keras.Sequential([tf.keras.Input((4,), name="x"), tf.keras.layers.Dense(1)])
...         m.compile(optimizer="sgd", loss="mse")
...         return m
...     def dataset(self, ctx):
...         return make_data().batch(ctx.get_per_replica_batch_size(self.options.batch_size))

``%%tfcluster launch NAME --trainer MyTrainer --workers 2 --ps 0`` (the cell
defines the class) or ``tk.launch(NAME, trainer=MyTrainer, workers=2, ps=0,
steps=200)`` run it on a cluster; ``run(MyTrainer)``
runs it in this process.  See :mod:`.runtime` for what the platform does.
"""

from __future__ import annotations

from .base import Trainer
from .options import ASYNC, SYNC, TrainerOptions
from .runtime import run

__all__ = ["ASYNC", "SYNC", "Trainer", "TrainerOptions", "run"]
