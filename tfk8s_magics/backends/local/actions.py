"""What a supervisor does when a task ends: ask the restart rule, and perform its answer.

Every end of a task goes to the cluster's :class:`~tfk8s_magics.lifecycle.RestartRule`
with what the supervisor alone can see — the exit code or signal, what the
task's runtime wrote in its termination file, a peer whose process is at fault
(stopped, a zombie, gone), a full log disk — and the rule answers actions
(:class:`~tfk8s_magics.lifecycle.Blame`, ``Succeed``, ``Fail``, ``EndTasks``,
``Restart``, ``StartDeferred``, ``SettleTask``, ``MovePort``), which
:meth:`RuleActions.perform` carries out in order on the task processes
(:mod:`.taskproc`) and the cluster's phase (:mod:`.supervisor`).  Nothing is
decided here: a new kind of action is a new branch of :meth:`RuleActions.perform`.
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

from ... import lifecycle
from ...lifeline import process_state
from ...ports import free_ports
from ...tfconfig import cluster_def
from ..base import Phase
from .taskproc import TaskRun, how_it_ended

if TYPE_CHECKING:
    from .supervisor import Supervisor

#: How a peer that ended a moment before the task that lost it is described (a zombie: its end is
#: not handled yet).
ZOMBIE = lifecycle.ZOMBIE
#: How many times a cluster's tasks are moved to new ports (the rule: :class:`.lifecycle.RestartRule`).
PORT_MOVES = lifecycle.PORT_MOVES


class RuleActions:
    """A task's end, given to the restart rule; the rule's actions, performed."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup

    def _disk_note(self) -> str:
        """Why a task's end may be the disk's fault: its log dir's file system is full."""
        log_dir = self.sup.record["log_dir"]
        try:
            full = os.statvfs(log_dir).f_bavail == 0
        except OSError:
            return ""
        return f"; its log dir {log_dir} is full (No space left on device)" if full else ""

    def on_exit(self, t: TaskRun) -> None:
        """Handle a task's exit: perform what the restart rule answers (restart, success, failure)."""
        sup = self.sup
        rc = sup.procs.reap(t)
        st = t.status
        st.finished = time.time()
        st.pid = st.pid_start = None
        st.exit_code = rc if rc >= 0 else None
        st.signal = signal.Signals(-rc).name if rc < 0 else None
        sup.dirty = True
        on_its_own = not t.stopping  # a task we ended is settled by the rule without these
        end = lifecycle.TaskEnd(exit_code=st.exit_code, signal=st.signal,
                                reason=sup.files.termination_reason(t.task.name) if on_its_own else "")
        # A peer that is stopped, a zombie or gone is the cause of a retryable end, not its bystander.
        culprit = self.peer_at_fault(t) if on_its_own else None
        self.perform(sup.rule.ended(t.task.name, end, st.finished, culprit=culprit,
                                    note=self._disk_note() if on_its_own else ""))

    def perform(self, actions: list) -> None:
        """Perform the restart rule's actions, in order (the rule is :class:`.lifecycle.RestartRule`)."""
        sup, tasks, procs = self.sup, self.sup.tasks, self.sup.procs
        for action in actions:
            if isinstance(action, lifecycle.Blame):
                sup.event(action.task, "Culprit", action.message, "Warning")
            elif isinstance(action, lifecycle.Succeed):
                st = tasks[action.task].status
                st.phase, st.reason = Phase.SUCCEEDED, action.reason
                sup.event(action.task, "Completed", "exited with code 0")
            elif isinstance(action, lifecycle.Fail):
                st = tasks[action.task].status
                st.phase, st.reason = Phase.FAILED, action.task_reason
                sup.fail(action.reason)
                sup.event(action.task, "Failed", st.reason, "Warning")
            elif isinstance(action, lifecycle.EndTasks):
                for name in action.tasks:
                    procs.end(tasks[name], action.why)
            elif isinstance(action, lifecycle.Restart):
                self._restart(tasks[action.task], action)
            elif isinstance(action, lifecycle.StartDeferred):
                for name in action.tasks:
                    if sup.stop_reason:
                        procs.end(tasks[name], "stop")
                    else:
                        procs.start(tasks[name])
            elif isinstance(action, lifecycle.SettleTask):
                self._settle(tasks[action.task], action)
            elif isinstance(action, lifecycle.MovePort):
                self._move_port(tasks[action.task])
            else:
                raise TypeError(f"unknown action of the restart rule: {action!r}")

    def _restart(self, t: TaskRun, action: lifecycle.Restart) -> None:
        t.status.restarts += 1
        self.sup.event(t.task.name, "Restarted", action.why, "Warning")
        if action.deferred:
            t.status.phase, t.status.reason = Phase.STARTING, "waiting for its group to stop"
            self.sup.dirty = True
        else:
            self.sup.procs.start(t)

    def _settle(self, t: TaskRun, action: lifecycle.SettleTask) -> None:
        """A task we ended (stop, recycle, the blamed cause of a failure) has ended: its row."""
        st = t.status
        if action.phase == Phase.STOPPED:
            st.phase, st.reason = Phase.STOPPED, self.sup.stop_reason
            self.sup.event(t.task.name, "TaskStopped", how_it_ended(st, t.stopped_at))
        elif action.phase == Phase.SUCCEEDED:
            st.phase, st.reason = Phase.SUCCEEDED, action.reason
            self.sup.event(t.task.name, "Recycled", st.reason)
        else:  # the cause of a failed cluster, not a bystander
            st.phase, st.reason = action.phase, action.reason

    def _move_port(self, t: TaskRun) -> None:
        """``t``'s port was taken by another process before it could listen (tasks on the host's
        loopback): give it a new one, rewrite the addresses every task and the kernel read
        (``record.json``); the rule then restarts the tasks already started with them — free of
        the restart budget (at most :data:`PORT_MOVES` times: the rule counts)."""
        sup = self.sup
        addresses = sup.record["addresses"]
        old = addresses[t.task.name]
        taken = {a.rsplit(":", 1)[1] for a in addresses.values()}
        port = next(p for p in free_ports(len(taken) + 1) if str(p) not in taken)
        addresses[t.task.name] = t.status.host = f"127.0.0.1:{port}"
        sup.record["cluster"] = sup.cluster = cluster_def(sup.spec, lambda x: addresses[x.name])
        try:
            sup.files.write_record(sup.record)
        except OSError as e:
            sup.file_failure(t, e)
            return
        sup.event(t.task.name, "PortTaken", f"{old} was taken by another process before the task could "
                  f"listen on it; moved to 127.0.0.1:{port}, every task restarted with the new addresses "
                  "(not counted against the restart budget)", "Warning")
        self.perform(sup.rule.port_moved(t.task.name, old))

    def peer_at_fault(self, t: TaskRun) -> tuple[str, str] | None:
        """The task whose process is the cause of ``t``'s end, with what was wrong with it: one that
        is stopped (SIGSTOP, a debugger), a zombie (it ended; its exit is not handled yet) or gone,
        while its row says it runs.  None when every peer's process is well (``t`` is the cause)."""
        now = time.time()
        for other in self.sup.procs.tasks.values():
            if other is t or not other.running or other.stopping:
                continue
            state = process_state(other.proc.pid)
            if state in ("T", "t"):
                how = "stopped (SIGSTOP or SIGTSTP)" if state == "T" else "stopped by a debugger (traced)"
                silent = self.silent_for(other, now)
                return other.task.name, f"{other.task.name} was {how}" + (
                    f", silent for {silent:.0f} s" if silent is not None else "")
            if state in ("Z", "X"):
                return other.task.name, f"{other.task.name} {ZOMBIE}"
            if state is None:
                return other.task.name, f"{other.task.name}'s process was gone"
        return None

    def silent_for(self, t: TaskRun, now: float) -> float | None:
        """Seconds since ``t`` last wrote to its log (or started), through the supervisor's descriptor."""
        times = [t.status.started] if t.status.started is not None else []
        fd = self.sup.procs.log_fds.get(t.task.name)
        if fd is not None:
            try:
                times.append(os.fstat(fd).st_mtime)
            except OSError:
                pass
        return max(0.0, now - max(times)) if times else None
