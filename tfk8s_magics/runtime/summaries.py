"""The progress callback's TensorBoard scalars: the values the dashboard draws, in the log dir.

:func:`~tfk8s_magics.runtime.progress.progress_callback` reports step and metrics to the lab;
in a task with a log dir (``$TFK8S_LOG_DIR``, which TensorBoard reads) the lead task (``chief-0``,
else ``worker-0``) also writes them as scalars of the run :data:`RUN`, by step: TensorBoard then
shows the README's run with no summary code of the user's.  Other workers write nothing (their
values are the lead's under a synchronous strategy).  A failing write turns the scalars off for
the run, with one line on stderr: training never fails for them.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping

#: The TensorBoard run (a folder of the log dir) the callback writes.
RUN = "progress"


def lead_task(tf_config: str | None) -> str:
    """The task whose scalars stand for the run: ``chief-0`` when the cluster has a chief."""
    try:
        cluster = (json.loads(tf_config or "{}") or {}).get("cluster") or {}
    except (ValueError, AttributeError):
        cluster = {}
    return "chief-0" if isinstance(cluster, dict) and cluster.get("chief") else "worker-0"


def summary_dir(environ: Mapping[str, str]) -> str | None:
    """Where this process writes its scalars, or None (not a task with a log dir, or not the lead)."""
    log_dir, task = environ.get("TFK8S_LOG_DIR"), environ.get("TFK8S_TASK")
    if not log_dir or not task or task != lead_task(environ.get("TF_CONFIG")):
        return None
    return os.path.join(log_dir, RUN)


class ScalarWriter:
    """Writes ``{name: value}`` at a step as TensorBoard scalars (thread-safe: callers serialise)."""

    def __init__(self, path: str) -> None:
        import tensorflow as tf

        self._tf = tf
        self.path = path
        self._writer = tf.summary.create_file_writer(path)

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        """One scalar per metric at ``step``."""
        with self._writer.as_default():
            for name, value in metrics.items():
                self._tf.summary.scalar(name, value, step=step)

    def flush(self) -> None:
        """Make what was written readable (at an epoch's end)."""
        self._writer.flush()


def open_writer(environ: Mapping[str, str] = os.environ) -> ScalarWriter | None:
    """This task's writer, or None where it writes none (or cannot)."""
    path = summary_dir(environ)
    if path is None:
        return None
    try:
        return ScalarWriter(path)
    except Exception as e:  # noqa: BLE001 - an unwritable log dir must not stop training
        print(f"tfk8s: no TensorBoard scalars for this run: {e}", file=sys.stderr)
        return None
