"""The progress protocol: how a training script tells the lab how far it is.

A script calls :func:`report_progress` (or adds :func:`progress_callback` to
``model.fit``); ``%tfcluster status`` and the dashboard then show step,
total, percent and ETA.  Outside a tfk8s task it does nothing, so the same
script runs anywhere.

Where the records go is decided by the task's environment:

* ``TFK8S_PROGRESS_FILE`` set (local backend): one JSON line per record,
  appended to that file;
* otherwise, inside a tfk8s task (Kubernetes): one stdout line
  ``@tfk8s-progress {json}``, which the backend takes out of the log stream;
* in an in-graph client (the notebook kernel after ``connect``): wherever
  its backend's :class:`~tfk8s_magics.backends.base.Coordinator` says
  (:func:`redirect_progress`), with no environment variable involved.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from .. import records
from . import summaries

#: The longest progress record read (a record is a step, a total, a rate and a few metrics).
MAX_RECORD = 16 * 1024

#: Prefix of progress records carried in a task's log stream.
STDOUT_MARKER = "@tfk8s-progress "
#: At most this many records per second reach the sink; the last step is always written.
MAX_RATE_HZ = 5.0


class _Reporter:
    """Rate-limited writer of progress records for this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._first: tuple[float, int] | None = None
        self._last_write = 0.0
        self._file = None
        self._held: str | None = None  # the newest record, not yet written (rate limit)
        self._timer: threading.Timer | None = None
        #: (write, task) set by redirect_progress: an in-graph client's sink.
        self.redirect: tuple[Callable[[str], None], str] | None = None
        self.redirect_key: object = None

    def _sink_path(self) -> str | None:
        return os.environ.get("TFK8S_PROGRESS_FILE") or None

    def _task(self) -> str:
        return self.redirect[1] if self.redirect else os.environ.get("TFK8S_TASK", "")

    def report(self, step: int, total: int | None, metrics: dict[str, Any], force: bool = False) -> bool:
        """Write (or hold, rate-limited) one record; whether it was written at once.  ``force``:
        write now (a caller that paces itself, such as :func:`progress_callback`)."""
        if not (self.redirect or self._sink_path() or os.environ.get("TFK8S_TASK")):
            return False
        now = time.time()
        with self._lock:
            if self._first is None or step < self._first[1]:
                self._first = (now, step)
            t0, s0 = self._first
            rate = (step - s0) / (now - t0) if now > t0 and step > s0 else None
            record = {
                "step": int(step),
                "total": None if total is None else int(total),
                "rate": rate,
                "metrics": {k: float(v) for k, v in metrics.items()},
                "task": self._task(),
                "time": now,
            }
            line = json.dumps(record, separators=(",", ":"))
            done = total is not None and step >= total
            wait = 1.0 / MAX_RATE_HZ - (now - self._last_write)
            if done or wait <= 0 or force:
                self._write(line, now)
                return True
            # Rate-limited: keep the newest record and write it when the limit allows,
            # so a pause in training never leaves a stale step on display.
            self._held = line
            if self._timer is None:
                self._timer = threading.Timer(wait, self._flush_held)
                self._timer.daemon = True
                self._timer.start()
            return False

    def _flush_held(self) -> None:
        with self._lock:
            self._timer = None
            if self._held is not None:
                self._write(self._held, time.time())

    def _write(self, line: str, now: float) -> None:
        self._held = None
        self._last_write = now
        path = self._sink_path()
        if self.redirect:
            self.redirect[0](line)
        elif path:
            if self._file is None or self._file.name != path:
                self._file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
            self._file.write(line + "\n")
        else:
            sys.stdout.write(STDOUT_MARKER + line + "\n")
            sys.stdout.flush()

    def flush(self) -> None:
        """Write the held record now (at exit, or at the end of training)."""
        if self._timer is not None:
            self._timer.cancel()
        self._flush_held()


_reporter = _Reporter()
atexit.register(_reporter.flush)


def report_progress(step: int, total: int | None = None, **metrics: float) -> bool:
    """Report that training reached ``step`` of ``total``, with optional metrics.

    Call it as often as you like: records are rate-limited to a few per
    second, and the newest one is always written (at most 0.2 s later).  Returns whether this call was
    written at once (False: held back by the rate limit, or outside a tfk8s
    task, where it does nothing).

    >>> report_progress(120, total=1000, loss=0.31)  # doctest: +SKIP
    """
    if step < 0:
        raise ValueError(f"step must be ≥ 0, got {step}")
    return _reporter.report(int(step), total, metrics)


def redirect_progress(write: Callable[[str], None] | None, task: str = "chief-0", key: object = None) -> None:
    """Send this process's progress records to ``write`` (one JSON line each), as ``task``.

    ``connect`` calls it with its backend's sink, so an in-graph client's
    :func:`report_progress` shows in the cluster's status; None restores
    the default (the task environment's sink, or nothing).  ``key`` names
    the cluster, for :func:`end_redirect`.
    """
    with _reporter._lock:
        _reporter.redirect = None if write is None else (write, task)
        _reporter.redirect_key = key
        _reporter._first = None


def end_redirect(key: object) -> None:
    """Stop sending records to the cluster ``key`` (it is being deleted); others stay."""
    with _reporter._lock:
        if _reporter.redirect is not None and _reporter.redirect_key == key:
            _reporter.redirect, _reporter.redirect_key = None, None


def append_to(path: str) -> Callable[[str], None]:
    """A sink that appends each record line to the file ``path`` (opened once, line-buffered)."""
    f = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as the sink

    def write(line: str) -> None:
        f.write(line + "\n")

    return write


def parse_record(line: str) -> dict[str, Any] | None:
    """Parse one progress record (a JSON line, with or without the stdout marker)."""
    if line.startswith(STDOUT_MARKER):
        line = line[len(STDOUT_MARKER) :]
    try:
        record = records.loads(line, MAX_RECORD)
    except ValueError:  # not JSON, too long, nested too deep
        return None
    return record if isinstance(record, dict) and "step" in record else None


def replica_sum_divisor(model) -> int:
    """How many times tf-keras counted each value in a *batch*-level log of ``model``'s ``fit``.

    tf-keras reduces a training step's outputs with ``distribute_reduction_method`` ``"auto"``,
    which is ``"sum"`` off TPUs: the metrics' results (already the same on every replica) are
    added up over the local replicas and, under ``MultiWorkerMirroredStrategy``, over every
    worker.  So a batch log reads ``num_replicas_in_sync`` times the value Keras reports for the
    epoch (``History``, TensorBoard).  Keras 3 reduces with ``"mean"`` (nothing to undo).
    """
    keras2 = sys.modules.get("tf_keras")
    strategy = getattr(model, "distribute_strategy", None)
    if keras2 is None or strategy is None or not isinstance(model, keras2.Model):
        return 1
    if getattr(model, "distribute_reduction_method", "auto") not in ("auto", "sum"):
        return 1
    if "TPU" in type(strategy).__name__:  # "auto" is "first" on TPUs
        return 1
    return max(1, int(getattr(strategy, "num_replicas_in_sync", 1) or 1))


class _ProgressLogic:
    """What :func:`progress_callback`'s callback does, apart from Keras's base class (which
    needs TensorFlow imported): mixed in before it, so these hooks are the ones Keras calls."""

    def _setup(self, total: int | None, metric_names: tuple[str, ...]) -> None:
        self._supports_tf_logs = True  # Keras hands over its tensors as they are
        self._metric_names = metric_names
        self._step = 0
        self._epoch_start = 0  # the step count before this epoch
        self._steps: int | None = None  # batches per epoch, when Keras knows it
        self._total = total
        self._latest: tuple[int, Any] | None = None  # (step, batch logs): the main thread's
        self._written = -1
        self._divisor = 1
        self._metrics: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._write_lock = threading.Lock()
        self._scalars = None  # a summaries.ScalarWriter in the lead task (opened at train begin)

    def metrics_of(self, logs, divisor: int = 1) -> dict[str, float]:
        """The chosen metrics of a Keras log as floats, divided by ``divisor``.

        Under ``ParameterServerStrategy`` a batch's logs are one ``RemoteValue`` (a step
        scheduled on a worker, not read yet): it gives no metrics, and is not waited for; the
        epoch's logs, which Keras has read, give them.
        """
        metrics: dict[str, float] = {}
        if not isinstance(logs, Mapping):
            return metrics
        for k in self._metric_names:
            if logs and k in logs:
                try:
                    metrics[k] = float(logs[k]) / divisor
                except (TypeError, ValueError):
                    pass
        return metrics

    def _write(self, step: int, logs, divisor: int) -> None:
        with self._write_lock:
            if step < self._written:  # the reader thread lost a race with an epoch's end
                return
            metrics = self.metrics_of(logs, divisor)
            self._metrics = metrics or self._metrics
            self._written = step
            _reporter.report(step, self._total, self._metrics, force=True)
            if metrics and self._scalars is not None:
                self._write_scalars(step, metrics)

    def _write_scalars(self, step: int, metrics: dict[str, float], flush: bool = False) -> None:
        """The values just reported, as TensorBoard scalars (the dashboard's curve, in TensorBoard)."""
        try:
            self._scalars.write(step, metrics)
            if flush:
                self._scalars.flush()
        except Exception as e:  # noqa: BLE001 - training goes on without them
            print(f"tfk8s: TensorBoard scalars stopped: {e}", file=sys.stderr)
            self._scalars = None

    def _flush_loop(self) -> None:
        while not self._stop.wait(1.0 / MAX_RATE_HZ):
            latest = self._latest
            if latest is not None and latest[0] > self._written:
                self._write(latest[0], latest[1], self._divisor)

    def on_train_begin(self, logs=None):
        params = getattr(self, "params", None) or {}
        epochs, steps = params.get("epochs"), params.get("steps")
        self._steps = int(steps) if steps else None
        if self._total is None and epochs and steps:
            self._total = int(epochs) * int(steps)
        self._divisor = replica_sum_divisor(getattr(self, "model", None))
        if self._scalars is None:
            self._scalars = summaries.open_writer()
        self._stop.clear()
        self._thread = threading.Thread(target=self._flush_loop, name="tfk8s-progress", daemon=True)
        self._thread.start()

    def on_epoch_begin(self, epoch, logs=None):
        # A resumed fit (BackupAndRestore, initial_epoch) starts at a later epoch: count from it.
        self._epoch_start = epoch * self._steps if self._steps else self._step

    def on_train_batch_end(self, batch, logs=None):
        # ``batch`` is the epoch's index of the last batch run (a resumed epoch starts past 0).
        self._step = self._epoch_start + int(batch) + 1 if self._steps else self._step + 1
        self._latest = (self._step, logs)  # one assignment: read by the flush thread

    def on_epoch_end(self, epoch, logs=None):
        # Epoch logs are the metrics' results (already reduced): what History records.
        self._write(self._step, logs, 1)
        with self._write_lock:
            if self._scalars is not None:
                self._write_scalars(self._step, {}, flush=True)

    def on_train_end(self, logs=None):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        latest = self._latest
        if latest is not None and latest[0] > self._written:  # no epoch end wrote it
            self._write(latest[0], latest[1], self._divisor)
        if self._total is None:  # the end: this step was the last
            _reporter.report(self._step, self._step, self._metrics, force=True)
        _reporter.flush()
        with self._write_lock:
            if self._scalars is not None:
                self._write_scalars(self._step, {}, flush=True)


def progress_callback(total: int | None = None, metric_names: tuple[str, ...] = ("loss",)):
    """A Keras callback that reports training progress to the lab.

    Works with tf-keras (``TF_USE_LEGACY_KERAS=1``, the lab's default) and
    with Keras 3.  ``total`` defaults to ``epochs * steps_per_epoch`` when
    Keras knows them.  The values are Keras's own: those of ``History`` and
    TensorBoard under every strategy (tf-keras's batch logs, summed over the
    replicas, are divided back: ``replica_sum_divisor``).

    In a task with a log dir, the lead task also writes what it reports as TensorBoard scalars
    (the run ``progress``, ``tfk8s_magics.runtime.summaries``), so TensorBoard shows the same curve as the
    dashboard with no summary code.  A fit resumed at a later epoch (``BackupAndRestore``)
    counts its steps from that epoch.

    Cheap by design (``bench/progress_callback.py`` measures it): a batch only
    records the step and Keras's log object (no tensor is read, so Keras does
    not convert its logs for us either); a thread reads the newest one at most
    5 times a second, and the end of each epoch is written
    with the epoch's logs.
    """
    import tensorflow as tf

    base = tf.keras.callbacks.Callback

    class ProgressCallback(_ProgressLogic, base):  # type: ignore[misc, valid-type]
        """Reports the global batch count and chosen metrics via :func:`report_progress`."""

        def __init__(self) -> None:
            base.__init__(self)
            self._setup(total, metric_names)

    return ProgressCallback()
