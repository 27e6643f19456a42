"""Stall detection on Kubernetes (the rule itself is :mod:`tfk8s_magics.stall`).

The notebook-side watcher asks, at most once per ``period`` while every
task runs, for the last log line of each running pod with its kubelet
timestamp (``tailLines=1&timestamps=true``: one small request per task),
and compares the newest sign of life — a line, a progress report, a pod
start or exit — with the timeout.
"""

from __future__ import annotations

import time

from kubernetes.client.rest import ApiException

from ...stall import Stall, TaskActivity, detect
from ..base import ClusterStatus, Phase
from . import state


def parse_stamped(text: str) -> tuple[float | None, str]:
    """``2024-05-01T10:00:00.123456789Z line`` → (epoch seconds, line)."""
    stamp, _, line = text.partition(" ")
    value = state.parse_time(_trim_nanos(stamp))
    return value, line


def _trim_nanos(stamp: str) -> str:
    # Python parses at most microseconds: drop the extra digits of RFC 3339 nanoseconds.
    head, dot, frac = stamp.partition(".")
    if not dot:
        return stamp
    digits = "".join(c for c in frac if c.isdigit())
    zone = frac[len(digits):]
    return f"{head}.{digits[:6]}{zone}"


class StallCheck:
    """Rate-limited stall detection for one cluster's watcher."""

    def __init__(self, timeout: float, period: float | None = None) -> None:
        self.timeout = timeout
        self.period = period if period is not None else max(5.0, timeout / 4)
        self.checked = float("-inf")
        self.stall: Stall | None = None

    def update(
        self, api, pods: dict[str, dict], snap: ClusterStatus, now: float | None = None
    ) -> Stall | None:
        """The stall of ``snap`` (re-read from the API at most once per period)."""
        now = time.time() if now is None else now
        all_running = snap.phase == Phase.RUNNING and all(
            t.phase in (Phase.RUNNING, Phase.SUCCEEDED) for t in snap.tasks
        )
        if not all_running or self.timeout <= 0:
            self.stall = None
            return None
        if now - self.checked < self.period:
            return self.stall
        others = [t for task in snap.tasks for t in (task.started, task.finished)]
        others.append(snap.progress.time if snap.progress else None)
        known = [t for t in others if t]
        if known and now - max(known) < self.timeout:
            # a start, exit or progress report newer than the timeout: no stall is
            # possible whatever the logs say, so none is read (a launch reads none)
            self.stall = None
            return None
        self.checked = now
        latest = state.latest_pods(list(pods.values()))
        activity = []
        for task in snap.tasks:
            pod = latest.get(task.name)
            if pod is None or task.phase != Phase.RUNNING:
                continue
            try:
                text = api.pod_log(pod["metadata"]["name"], tail=1, timestamps=True)
            except ApiException:
                continue  # best effort: status must not fail for it
            lines = text.splitlines()
            stamp, line = parse_stamped(lines[-1]) if lines else (None, "")
            if stamp is not None:
                activity.append(TaskActivity(task.name, stamp, line))
        self.stall = detect(True, activity, others, now, self.timeout)
        return self.stall
