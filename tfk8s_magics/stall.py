"""Stall detection: a cluster that looks healthy while nothing happens.

A cluster **stalls** when every task is running and, for ``timeout``
seconds (default 120, ``TFK8S_STALL_TIMEOUT``), no task has printed a log
line, reported progress or exited — the signature of a collective waiting
for a task that will never join, a dead-locked input pipeline, a
forgotten ``input()``.  TensorFlow itself never says so; TFJob neither.

Pure functions: a backend gathers *activity* (when each task last did
something, and its last log line) and asks :func:`detect`.  The local
supervisor writes the result into ``status.json`` (and an event); the
Kubernetes watcher computes it from its pods' log timestamps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from . import options

#: Seconds without any sign of life before a running cluster is called stalled.
DEFAULT_TIMEOUT = 120.0


def timeout_from_env() -> float:
    """Option ``stall_timeout`` (``$TFK8S_STALL_TIMEOUT``) in seconds; 0 turns detection off."""
    try:
        return max(0.0, float(options.get("stall_timeout")))
    except (TypeError, ValueError):
        return DEFAULT_TIMEOUT


@dataclass
class TaskActivity:
    """What one task did last, and when (seconds since the epoch)."""

    task: str
    time: float
    last_line: str = ""


@dataclass
class Stall:
    """A running cluster in which nothing has happened since ``since``."""

    since: float
    timeout: float
    tasks: list[TaskActivity] = field(default_factory=list)

    def seconds(self, now: float) -> float:
        """How long nothing has happened, at ``now``."""
        return max(0.0, now - self.since)

    def describe(self, now: float) -> str:
        """One line: how long, and what each task printed last."""
        last = "; ".join(
            f"{t.task}: {t.last_line.strip()[:120]!r}" if t.last_line else f"{t.task}: no output"
            for t in self.tasks
        )
        return (
            f"stalled: no log line, progress or task exit for {format_duration(self.seconds(now))}"
            + (f" — last lines: {last}" if last else "")
        )

    def to_dict(self) -> dict:
        """As plain JSON-ready values (``status.json`` stores it)."""
        return {
            "since": self.since,
            "timeout": self.timeout,
            "tasks": [{"task": t.task, "time": t.time, "last_line": t.last_line} for t in self.tasks],
        }

    @classmethod
    def from_dict(cls, d: Mapping | None) -> Stall | None:
        """Read leniently what :meth:`to_dict` wrote (None for anything unreadable)."""
        if not isinstance(d, Mapping):
            return None
        try:
            tasks = [
                TaskActivity(
                    str(t.get("task", "")), float(t.get("time") or 0.0), str(t.get("last_line") or "")
                )
                for t in d.get("tasks") or []
            ]
            return cls(since=float(d["since"]), timeout=float(d.get("timeout") or 0.0), tasks=tasks)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


def format_duration(seconds: float) -> str:
    """``2m 05s``, ``45s``, ``1h 02m``."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {(s % 3600) // 60:02d}m"


def last_activity(activity: Iterable[TaskActivity], other_times: Iterable[float | None] = ()) -> float:
    """The latest time anything happened: a task's activity, or any of ``other_times``."""
    times = [a.time for a in activity] + [t for t in other_times if t]
    return max(times, default=0.0)


def detect(
    all_running: bool,
    activity: list[TaskActivity],
    other_times: Iterable[float | None],
    now: float,
    timeout: float,
) -> Stall | None:
    """The stall of a cluster, or None.

    ``all_running``: the cluster is running and no task is still starting.
    ``activity``: per task, its last log line and when it was written.
    ``other_times``: progress reports, task starts and exits.
    """
    if not all_running or timeout <= 0:
        return None
    since = last_activity(activity, other_times)
    if not since or now - since < timeout:
        return None
    return Stall(since=since, timeout=timeout, tasks=list(activity))


def next_check(
    activity: list[TaskActivity], other_times: Iterable[float | None], timeout: float
) -> float | None:
    """When a cluster with this activity would become stalled (None: detection is off)."""
    if timeout <= 0:
        return None
    return last_activity(activity, other_times) + timeout
