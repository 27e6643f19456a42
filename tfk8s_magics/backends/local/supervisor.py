"""The supervisor of one local cluster: ``python -m tfk8s_magics.backends.local.supervisor DIR``.

One supervisor process per cluster starts every task, notices readiness
and exits the instant they happen (it sleeps in ``select`` on the tasks'
ready pipes and pidfds; nothing is polled), and performs the cluster's
:class:`~tfk8s_magics.lifecycle.LifecyclePolicy`: every start and end goes to
its :class:`~tfk8s_magics.lifecycle.RestartRule`, which decides (the incident,
the group restart, the cause, the budget) and answers actions that
:meth:`Supervisor.perform` carries out.  It restarts what the policy
retries within the restart budget, recycles parameter servers a grace
period after the workers finish, stops the rest when the cluster fails
— and stops everything when asked (SIGTERM) or when the cluster's owner
(the notebook kernel) exits, unless the cluster was launched detached.
It rewrites ``status.json`` at every change.

The supervisor is this module's :class:`Supervisor` — the cluster's phase,
the main loop — and five parts, each one concern a newcomer can change alone:

* :mod:`.taskproc` — the task processes: environment, start (cold or warm),
  readiness, signals, reaping, orphans;
* :mod:`.actions` — a task's end given to the restart rule, its actions performed;
* :mod:`.clusterfiles` — the files, through the held dir handle: events,
  status (on a full disk too), record, logs, the dir's identity;
* :mod:`.placement` — the isolation plan performed and the warm pool claimed;
* :mod:`.timers` — the deadlines: grace period, SIGKILL, identity and disk
  checks, the stall check.

Task processes get ``PR_SET_PDEATHSIG`` = SIGKILL, so even a supervisor
killed with SIGKILL takes its tasks with it; the supervisor is a child
subreaper (a task's orphaned children become its own, and it ends them with
the task), and its :mod:`.watchdog` kills every process marked with the
cluster's id when the supervisor itself ends, however it ends: no
descendant of a task outlives its cluster.

The supervisor trusts its directory only while it is the same one (see
:mod:`.clusterfiles`): if the dir was removed or replaced (a new cluster of
the same name), it kills its own tasks and exits without writing anything.
Files it creates are private (umask 077), and a write that fails (a full
disk, a read-only dir) fails the cluster with the path and the cause.
It never imports TensorFlow.
"""

from __future__ import annotations

import errno
import os
import selectors
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

from ... import lifecycle
from ...lifeline import start_time
from ...spec import ClusterSpec
from ..base import Phase
from .actions import PORT_MOVES, ZOMBIE, RuleActions
from .clusterfiles import DISK_FULL, IDENTITY_CHECK, ClusterFiles, DirReplaced
from .guard import Guard
from .layout import ClusterDir, read_json
from .placement import Placement
from .storage import ClusterStorage
from .taskproc import STOP_TIMEOUT, TaskProcesses, TaskRun
from .timers import Timers

__all__ = ["IDENTITY_CHECK", "PORT_MOVES", "STOP_TIMEOUT", "ZOMBIE", "DirReplaced", "Supervisor", "main"]


class Supervisor:
    """Runs the tasks of one cluster until it ends; see the module docstring."""

    def __init__(self, cdir: ClusterDir) -> None:
        self.cdir = cdir
        self.record = read_json(cdir.record)
        self.cluster_id = str(self.record.get("id") or "")
        self.files = ClusterFiles(cdir, self.cluster_id)
        self.watchdog_pid: int | None = None
        self.spec = ClusterSpec.from_dict(self.record["spec"])
        self.policy = lifecycle.LifecyclePolicy.of(self.spec)
        self.cluster = self.record["cluster"]
        self.sel = selectors.DefaultSelector()
        #: Signals received, not acted on yet (SIGTERM/SIGINT/SIGHUP: a stop).
        self.pending: list[int] = []
        self.phase = Phase.STARTING
        self.reason = ""
        self.finished: float | None = None
        self.stop_reason = ""
        #: The restart rule (incidents, group restarts, deferred starts, blame, port moves): it
        #: decides, this process performs (see :meth:`perform`).
        self.rule = lifecycle.RestartRule(self.policy, self.spec)
        self.dirty = True
        self.procs = TaskProcesses(self)
        self.actions = RuleActions(self)
        self.placement = Placement(self)
        #: --data-sync before the tasks, --backup after them.
        self.storage = ClusterStorage(self)
        self.timers = Timers(self)
        self.guard = Guard(self)

    @property
    def tasks(self) -> dict[str, TaskRun]:
        """The cluster's tasks by name."""
        return self.procs.tasks

    # -- events and status ------------------------------------------------
    def event(self, task: str, reason: str, message: str, type_: str = "Normal") -> None:
        """Append an event to ``events.jsonl`` and mark the status for rewriting."""
        self.dirty = True
        failed = self.files.append_event(task, reason, message, type_)
        if failed is not None and failed.errno in DISK_FULL:
            self.disk_full()

    def disk_full(self) -> None:
        """The disk holding the cluster's dir is full: fail the cluster saying so (its tasks are
        stopped, so nothing fills it further); status.json is then written in place."""
        if self.phase not in Phase.TERMINAL:
            self.fail(f"the disk holding {self.cdir.root} is full (No space left on device): "
                      "free space there, then launch again")
            self.event("", "DiskFull", self.reason, "Warning")

    def write_status(self, done: bool = False) -> None:
        """Rewrite ``status.json`` atomically; ``done`` tells readers the supervisor has finished.
        On a full disk the cluster fails saying so, and the status is written over the old one."""
        if self.files.write_status(lambda: self._status(done), self.disk_full):
            self.dirty = False

    def _status(self, done: bool) -> dict:
        """What ``status.json`` says now."""
        stall = self.timers.stalls.stall
        return {
            "id": self.cluster_id,
            "phase": self.phase,
            "reason": self.reason,
            "finished": self.finished,
            "supervisor_pid": os.getpid(),
            "supervisor_start": start_time(os.getpid()),
            "watchdog_pid": self.watchdog_pid,
            "supervisor_done": done,
            "restarts_used": self.rule.restarts_used,
            "tasks": [asdict(t.status) for t in self.tasks.values()],
            "stall": stall.to_dict() if stall else None,
            "isolation": self.placement.isolation,
            "updated": time.time(),
        }

    def file_failure(self, t: TaskRun | None, e: OSError) -> None:
        """A file the cluster needs cannot be written (full disk, read-only dir, a planted symlink):
        fail the cluster naming the path and the cause; every task row ends."""
        cause = "it is a symlink (not followed)" if e.errno == errno.ELOOP else (e.strerror or str(e))
        why = f"cannot write {e.filename}: {cause}"
        if t is not None:
            t.status.phase, t.status.reason = Phase.FAILED, why
            t.status.finished = time.time()
        self.fail(why)
        self.event(t.task.name if t else "", "Failed", why, "Warning")

    # -- cluster-level decisions -------------------------------------------
    def fail(self, reason: str) -> None:
        """Mark the cluster failed for ``reason`` and stop every task still running (once)."""
        if self.phase in Phase.TERMINAL:
            return
        self.phase, self.reason, self.finished = Phase.FAILED, reason, time.time()
        self.stop_reason = "the cluster failed"
        self.rule.stop_requested(failed=True)
        if self.policy.failure_grace > 0:
            self.timers.grace_deadline = time.time() + self.policy.failure_grace
            return
        for t in self.tasks.values():
            if t.status.phase not in Phase.TERMINAL:
                self.procs.end(t, "stop")

    def request_stop(self, reason: str) -> None:
        """Stop the cluster for ``reason``: end every task (only the first request counts)."""
        if self.stop_reason and self.timers.grace_deadline is None:
            return  # already stopping (a failed cluster's grace period is cut short, though)
        self.stop_reason = self.stop_reason or reason
        self.rule.stop_requested()
        self.timers.grace_deadline = None  # a stop ends the PS grace period too: nothing is left to wait for
        self.event("", "Stopping", reason)
        if self.phase not in Phase.TERMINAL:  # "stopped" once every task has ended (update_phase)
            self.phase, self.reason = Phase.STOPPING, f"{reason}; waiting for the tasks to end"
            self.dirty = True
        for t in self.tasks.values():
            self.procs.end(t, "stop")

    def update_phase(self) -> None:
        """Recompute the cluster's phase from its tasks; start the PS grace period when the workers finish."""
        if self.phase in Phase.TERMINAL:
            return
        if self.phase == Phase.STOPPING:
            if not self.procs.alive():
                self.phase, self.reason, self.finished = Phase.STOPPED, self.stop_reason, time.time()
                self.event("", "Stopped", f"every task has ended ({self.reason})")
                self.dirty = True
            return
        states = [t.status.phase for t in self.tasks.values()]
        script_tasks = [self.tasks[t.name] for t in self.policy.success_tasks(self.spec)]
        if script_tasks and all(t.status.phase == Phase.SUCCEEDED for t in script_tasks):
            self.phase, self.finished = Phase.SUCCEEDED, time.time()
            grace = self.policy.grace_period
            self.reason = "the workers finished"
            if any(t.status.phase not in Phase.TERMINAL for t in self.tasks.values()):
                # Only servers are left: they get the grace period, then they are recycled.
                self.timers.grace_deadline = time.time() + grace
                self.reason += f"; parameter servers stop after a {grace:g} s grace period"
                self.event("", "WorkersFinished", self.reason)
            self.dirty = True
            return
        new = Phase.RUNNING if all(s in (Phase.RUNNING, Phase.SUCCEEDED) for s in states) else Phase.STARTING
        if new != self.phase:
            self.phase = new
            self.reason = ("every task is ready" if new == Phase.RUNNING
                           else f"restarting after {self.rule.incident_cause}" if self.rule.incident_cause
                           else "")
            self.dirty = True

    # -- main loop ---------------------------------------------------------
    def _start_all(self) -> None:
        if self.stop_reason:
            return
        self.procs.start_all()
        self.event("", "Started", f"started {len(self.tasks)} task(s)")
        self.placement.release_namespace()  # the adopted namespace's unclaimed processes end now

    def _dispatch(self, key: selectors.SelectorKey) -> None:
        kind, obj = key.data
        if kind == "ready":
            self.procs.on_ready(obj)
        elif kind == "exit":
            self.actions.on_exit(obj)
            self.timers.on_activity(time.time())
        elif kind == "activity":
            self.timers.on_activity(time.time())
        elif kind == "owner":
            self.sel.unregister(key.fd)
            self.request_stop(f"its owner (pid {obj}) exited; launch with --detach to keep a cluster")
        elif kind == "signal":
            os.read(key.fd, 64)
        elif kind == "call":  # a helper's own fd (the --data-sync copy's output)
            obj()

    def pump(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` for what the supervisor watches (tasks, the owner, signals,
        helpers) and act on it: a signal asks for a stop.  The main loop and the --data-sync
        copy before the tasks both wait here, so an owner's exit or a stop is seen at once."""
        for key, _ in self.sel.select(timeout):
            self._dispatch(key)
        while self.pending:
            self.pending.pop()
            self.request_stop("stopped by the user")

    def run(self) -> int:
        """Start the tasks and supervise them until the cluster ends; return the exit code."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda s, _f: self.pending.append(s))
        self.sel.register(wake_r, selectors.EVENT_READ, ("signal", None))
        self.guard.start()
        self.write_status()
        if self.storage.before_tasks():  # on the host's network: the data URL and the uploader
            self.placement.isolate()
        self._start_all()
        while True:
            self.update_phase()
            self.storage.on_success()  # --backup: uploaded before the success is written
            self.timers.check_stall(time.time())
            if self.dirty:
                self.write_status()
            if not self.procs.alive() and self.phase in Phase.TERMINAL and self.timers.grace_deadline is None:
                break
            self.pump(self.timers.next_timeout())
            self.timers.tick()
        self.guard.finish()
        return 0



def main(argv: list[str] | None = None) -> int:
    """Supervise the cluster whose directory is ``argv[0]``."""
    argv = sys.argv[1:] if argv is None else argv
    os.umask(0o077)  # what the cluster writes (status, events, logs, checkpoints) is its owner's only
    sup = Supervisor(ClusterDir(Path(argv[0])))
    try:
        return sup.run()
    except DirReplaced as e:
        sup.guard.abandon(str(e))
        return 1
    except BaseException:
        try:
            sup.guard.crashed()
        except DirReplaced as e:
            sup.guard.abandon(str(e))
        return 1


if __name__ == "__main__":
    sys.exit(main())
