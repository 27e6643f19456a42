"""A supervisor's clock: every deadline it sleeps until, and what it does when one comes.

The supervisor sleeps in ``select`` with the nearest deadline as its timeout
(:meth:`Timers.next_timeout`); nothing is polled.  The deadlines:

* the **grace period** — after the workers succeeded, the parameter servers
  and evaluators are recycled when it ends; after a failure with a failure
  grace, what still runs is stopped;
* each ending task's **SIGKILL** time, :data:`~.taskproc.STOP_TIMEOUT` after its SIGTERM;
* the **identity and disk check** every :data:`~.clusterfiles.IDENTITY_CHECK`
  seconds: the cluster dir is still this cluster's, its disk not full;
* the **stall check** (the rule: :mod:`tfk8s_magics.stall`, the files:
  :class:`~.stallwatch.StallWatch`) — armed while every task runs, the moment
  the cluster would be stalled; while stalled, any write to a log wakes it.
"""

from __future__ import annotations

import selectors
import signal
import time
from typing import TYPE_CHECKING

from ...stall import DEFAULT_TIMEOUT as DEFAULT_STALL_TIMEOUT
from ..base import Phase
from .layout import task_log_path
from .stallwatch import StallWatch
from .taskproc import STOP_TIMEOUT

if TYPE_CHECKING:
    from .supervisor import Supervisor


class Timers:
    """One supervisor's deadlines (see the module docstring)."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        #: When the grace period ends (None: no grace period runs).
        self.grace_deadline: float | None = None
        self.stalls = StallWatch(
            {t: task_log_path(sup.record["log_dir"], t) for t in sup.procs.tasks},
            sup.procs.log_fds,
            sup.cdir.progress_dir,
            float(sup.record.get("stall_timeout", DEFAULT_STALL_TIMEOUT)),
        )

    def next_timeout(self) -> float | None:
        """Seconds until the next deadline (the ``select`` timeout), or None when there is none."""
        deadlines = [t.kill_at for t in self.sup.procs.tasks.values() if t.kill_at is not None]
        if self.grace_deadline is not None:
            deadlines.append(self.grace_deadline)
        if self.stalls.deadline is not None:
            deadlines.append(self.stalls.deadline)
        deadlines.append(self.sup.files.identity_at)
        return max(0.0, min(deadlines) - time.time())

    def tick(self) -> None:
        """Act on deadlines: recycle servers after the grace period, SIGKILL tasks that outlived
        SIGTERM, check the dir and its disk, check for a stall."""
        sup = self.sup
        now = time.time()
        if self.grace_deadline is not None and now >= self.grace_deadline:
            self.grace_deadline = None
            # After success what runs on is recycled; after a failure it is stopped.
            how = "recycle" if sup.phase == Phase.SUCCEEDED else "stop"
            if how == "recycle" and "grace period" in sup.reason:  # no longer "will stop": did
                sup.reason = "the workers finished; the parameter servers were recycled"
                sup.dirty = True
            for t in sup.procs.tasks.values():
                if t.status.phase not in Phase.TERMINAL:
                    sup.procs.end(t, how)
        for t in sup.procs.tasks.values():
            if t.kill_at is not None and now >= t.kill_at and t.running:
                sup.procs.signal(t, signal.SIGKILL)
                t.kill_at = None
                sup.event(t.task.name, "Killed", f"still running {STOP_TIMEOUT:g} s after SIGTERM: "
                          "sent SIGKILL", "Warning")
        if now >= sup.files.identity_at:
            sup.files.check_identity()
            if sup.files.disk_is_full():
                sup.disk_full()
        self.check_stall(now)

    # -- stalls (the rule is in tfk8s_magics.stall) ----------------------------------------------
    def _all_running(self) -> bool:
        sup = self.sup
        return sup.phase == Phase.RUNNING and not sup.stop_reason and all(
            t.status.phase in (Phase.RUNNING, Phase.SUCCEEDED) for t in sup.procs.tasks.values()
        )

    def check_stall(self, now: float) -> None:
        """Arm, check or clear the stall detector after the cluster's state may have changed."""
        sup = self.sup
        if not self._all_running():
            self._unwatch_stall()
            if self.stalls.disarm():
                sup.dirty = True
            return
        self.stalls.arm(now)
        times = [x for t in sup.procs.tasks.values() for x in (t.status.started, t.status.finished)]
        found = self.stalls.check(now, times)
        if found is not None:
            sup.event("", "Stalled", found.describe(now), "Warning")
            fd = self.stalls.fd()
            if fd is not None:
                sup.sel.register(fd, selectors.EVENT_READ, ("activity", None))

    def on_activity(self, now: float) -> None:
        """A task wrote, reported progress, started or exited: a stall (if any) is over."""
        self._unwatch_stall()
        if self.stalls.resume(now):
            self.sup.event("", "Resumed", "a task showed activity again")

    def _unwatch_stall(self) -> None:
        fd = self.stalls.fd()
        if fd is not None:
            try:
                self.sup.sel.unregister(fd)
            except (KeyError, ValueError):
                pass
