"""The supervisor of one local cluster: ``python -m tfk8s_magics.backends.local.supervisor DIR``.

One supervisor process per cluster starts every task, notices readiness
and exits the instant they happen (it sleeps in ``select`` on the tasks'
ready pipes and pidfds; nothing is polled), and executes the cluster's
:class:`~tfk8s_magics.lifecycle.LifecyclePolicy`: restarts what the policy
retries within the restart budget, recycles parameter servers a grace
period after the workers finish, stops the rest when the cluster fails
— and stops everything when asked (SIGTERM) or when the cluster's owner
(the notebook kernel) exits, unless the cluster was launched detached.
It rewrites ``status.json`` at every change.

Task processes get ``PR_SET_PDEATHSIG`` = SIGKILL, so even a supervisor
killed with SIGKILL takes its tasks with it: no task outlives its cluster.
It never imports TensorFlow.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ... import lifecycle, taskenv
from ...lifeline import open_pidfd, set_parent_death_signal
from ...spec import ClusterSpec, Task
from ...stall import DEFAULT_TIMEOUT as DEFAULT_STALL_TIMEOUT
from ...tfconfig import tf_config
from ..base import Phase
from . import isolation
from .layout import ClusterDir, read_json, task_log_path, write_json_atomic
from .stallwatch import StallWatch
from .status import LocalTaskStatus

#: Seconds a task gets between SIGTERM and SIGKILL.
STOP_TIMEOUT = 5.0


@dataclass
class _Task:
    task: Task
    status: LocalTaskStatus
    runs_script: bool
    proc: subprocess.Popen | None = None
    ready_fd: int | None = None
    pidfd: int | None = None
    stopping: str = ""  # why we are ending it: "stop", "recycle", "" (not by us)
    kill_at: float | None = None
    history: list[dict] = field(default_factory=list)


class Supervisor:
    """Runs the tasks of one cluster until it ends; see the module docstring."""

    def __init__(self, cdir: ClusterDir) -> None:
        self.cdir = cdir
        self.record = read_json(cdir.record)
        self.spec = ClusterSpec.from_dict(self.record["spec"])
        self.policy = lifecycle.LifecyclePolicy.of(self.spec)
        self.cluster = self.record["cluster"]
        self.sel = selectors.DefaultSelector()
        self.tasks: dict[str, _Task] = {}
        for t in self.spec.tasks():
            st = LocalTaskStatus(name=t.name, host=self.record["addresses"][t.name])
            self.tasks[t.name] = _Task(t, st, self.spec.runs_script(t))
        self.phase = Phase.STARTING
        self.reason = ""
        self.finished: float | None = None
        self.restarts_used = 0
        self.stop_reason = ""
        self.grace_deadline: float | None = None
        #: The open incident: until when, "task: why" of its first retryable end, and the
        #: tasks already restarted in it (a second end of one of those is a new failure).
        self.incident: tuple[float, str, set[str]] | None = None
        self.dirty = True
        self.stalls = StallWatch(
            {t: task_log_path(self.record["log_dir"], t) for t in self.tasks},
            cdir.progress_dir,
            float(self.record.get("stall_timeout", DEFAULT_STALL_TIMEOUT)),
        )

    # -- events and status ------------------------------------------------
    def event(self, task: str, reason: str, message: str, type_: str = "Normal") -> None:
        """Append an event to ``events.jsonl`` and mark the status for rewriting."""
        line = json.dumps(
            {"time": time.time(), "task": task, "reason": reason, "message": message, "type": type_}
        )
        with open(self.cdir.events, "a", encoding="utf-8") as f:
            f.write(line + "\n")
        self.dirty = True

    def write_status(self, done: bool = False) -> None:
        """Rewrite ``status.json`` atomically; ``done`` tells readers the supervisor has finished."""
        write_json_atomic(
            self.cdir.status,
            {
                "phase": self.phase,
                "reason": self.reason,
                "finished": self.finished,
                "supervisor_pid": os.getpid(),
                "supervisor_done": done,
                "restarts_used": self.restarts_used,
                "tasks": [asdict(t.status) for t in self.tasks.values()],
                "stall": self.stalls.stall.to_dict() if self.stalls.stall else None,
                "updated": time.time(),
            },
        )
        self.dirty = False

    # -- task processes -----------------------------------------------------
    def _env(self, t: _Task) -> dict[str, str]:
        """The task's environment, built by :func:`taskenv.build` (an allow-list, not a copy)."""
        rec = self.record
        reserved = {
            "TF_CONFIG": tf_config(self.cluster, t.task),
            "TFK8S_TASK": t.task.name,
            "TFK8S_CLUSTER": self.spec.name,
            "TFK8S_LOG_DIR": rec["log_dir"],
            "TFK8S_DATA_DIR": rec["data_dir"],
            "TFK8S_CHECKPOINT_DIR": str(Path(rec["log_dir"]) / "checkpoints"),
            "TFK8S_PROGRESS_FILE": str(self.cdir.progress_file(t.task.name)),
        }
        if t.runs_script:
            reserved["TFK8S_SCRIPT"] = str(self.cdir.script)
            reserved["TFK8S_SCRIPT_DIR"] = rec.get("script_dir") or rec["workdir"]
            if self.spec.files:
                reserved["TFK8S_FILES_DIR"] = str(self.cdir.files)
        env = taskenv.build(os.environ, self.spec.env, reserved, self.spec.legacy_keras)
        isolation.preload_env(env, rec.get("loopback_shim"))
        return env

    def start(self, t: _Task) -> None:
        """Start (or restart) a task's process, its output appended to the task's log."""
        log_path = task_log_path(self.record["log_dir"], t.task.name)
        read_fd, write_fd = os.pipe()
        env = self._env(t)
        env["TFK8S_READY_FD"] = str(write_fd)
        me = os.getpid()
        with open(log_path, "ab") as log:
            if t.status.restarts:
                log.write(f"tfk8s: --- restart {t.status.restarts} of {t.task.name} ---\n".encode())
                log.flush()
            t.proc = subprocess.Popen(
                [sys.executable, "-m", "tfk8s_magics.runtime.task"],
                env=env,
                cwd=self.record["workdir"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                start_new_session=True,  # its own process group: stop reaches its children
                preexec_fn=lambda: set_parent_death_signal(signal.SIGKILL, me),
            )
        os.close(write_fd)
        t.ready_fd = read_fd
        t.pidfd = open_pidfd(t.proc.pid)
        self.sel.register(read_fd, selectors.EVENT_READ, ("ready", t))
        if t.pidfd is not None:
            self.sel.register(t.pidfd, selectors.EVENT_READ, ("exit", t))
        t.status.phase = Phase.STARTING
        t.status.reason = "importing TensorFlow"
        t.status.pid = t.proc.pid
        t.status.started = time.time()
        t.status.finished = None
        t.status.exit_code = None
        t.status.signal = None
        t.stopping = ""
        t.kill_at = None
        self.dirty = True

    def _close_fds(self, t: _Task) -> None:
        for fd in (t.ready_fd, t.pidfd):
            if fd is not None:
                try:
                    self.sel.unregister(fd)
                except (KeyError, ValueError):
                    pass
                os.close(fd)
        t.ready_fd = t.pidfd = None

    def on_ready(self, t: _Task) -> None:
        """The task's ready pipe is readable: mark the task running if it wrote to it (not just closed it)."""
        data = os.read(t.ready_fd, 64) if t.ready_fd is not None else b""
        if t.ready_fd is not None:
            self.sel.unregister(t.ready_fd)
            os.close(t.ready_fd)
            t.ready_fd = None
        if data and t.status.phase == Phase.STARTING:
            t.status.phase = Phase.RUNNING
            t.status.reason = "running the script" if t.runs_script else "serving"
            self.dirty = True

    def signal_task(self, t: _Task, sig: int) -> None:
        """Send ``sig`` to the task's whole process group, if the task is still running."""
        if t.proc is None or t.proc.returncode is not None:
            return
        try:
            os.killpg(t.proc.pid, sig)
        except ProcessLookupError:
            pass

    def end_task(self, t: _Task, why: str) -> None:
        """Ask a live task to end (SIGTERM now, SIGKILL after STOP_TIMEOUT)."""
        if t.proc is None or t.proc.returncode is not None:
            if t.status.phase not in Phase.TERMINAL:
                t.status.phase = Phase.STOPPED if why == "stop" else Phase.SUCCEEDED
                t.status.reason = self.stop_reason if why == "stop" else "not needed"
                self.dirty = True
            return
        if t.stopping:
            return
        t.stopping = why
        t.kill_at = time.time() + STOP_TIMEOUT
        self.signal_task(t, signal.SIGTERM)

    def _reap(self, t: _Task) -> int:
        """Collect a task's return code and release what watched it."""
        rc = t.proc.wait()
        # The task's children share its process group; none may outlive it.
        try:
            os.killpg(t.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if t.ready_fd is not None:
            try:
                if os.read(t.ready_fd, 64):  # it got ready before exiting quickly
                    t.status.phase = Phase.RUNNING
            except BlockingIOError:
                pass
        self._close_fds(t)
        return rc

    def on_exit(self, t: _Task) -> None:
        """Handle a task's exit: what the lifecycle policy decides (restart, success, failure)."""
        rc = self._reap(t)
        st = t.status
        st.finished = time.time()
        st.pid = None
        st.exit_code = rc if rc >= 0 else None
        st.signal = signal.Signals(-rc).name if rc < 0 else None
        self.dirty = True
        if t.stopping == "stop" or (t.stopping == "restart" and self.stop_reason):
            st.phase, st.reason = Phase.STOPPED, self.stop_reason
            return
        if t.stopping == "recycle":
            st.phase, st.reason = Phase.SUCCEEDED, lifecycle.RECYCLED
            self.event(t.task.name, "Recycled", st.reason)
            return
        if t.stopping == "restart":  # ended by us: its group restarts after another's end
            self._restart(t, f"restarted with its group ({self.incident[1]})")
            return
        end = lifecycle.TaskEnd(exit_code=st.exit_code, signal=st.signal)
        if self._in_incident(t) and self.policy.classify(end).action == lifecycle.RESTART:
            # A consequence of the incident already paid for: restart, do not count again.
            self._restart(t, f"{self.policy.classify(end).reason}; same incident as {self.incident[1]}")
            return
        decision = self.policy.decide(end, self.restarts_used)
        if decision.action == lifecycle.SUCCEED:
            st.phase, st.reason = Phase.SUCCEEDED, decision.reason
            self.event(t.task.name, "Completed", "exited with code 0")
        elif decision.action == lifecycle.RESTART and not self.stop_reason:
            self.restarts_used += 1
            self.incident = (time.time() + self.policy.incident_window, f"{t.task.name}: {decision.reason}",
                             set())
            budget = self.policy.restart_budget
            self._restart(t, f"{decision.reason}; restart {self.restarts_used} of {budget}")
            self._restart_group(t)
        else:
            st.phase, st.reason = Phase.FAILED, decision.reason
            self.fail(f"{t.task.name} failed: {decision.reason}")
            self.event(t.task.name, "Failed", st.reason, "Warning")

    def _in_incident(self, t: _Task) -> bool:
        """Whether ``t``'s end belongs to the open incident (its first end since it opened)."""
        return (self.incident is not None and time.time() < self.incident[0] and not self.stop_reason
                and t.task.name not in self.incident[2])

    def _restart(self, t: _Task, why: str) -> None:
        if self.incident is not None:
            self.incident[2].add(t.task.name)
        t.status.restarts += 1
        self.event(t.task.name, "Restarted", why, "Warning")
        self.start(t)

    def _restart_group(self, first: _Task) -> None:
        """A between-graph chief/worker ended: its synchronous peers restart with it (one incident)."""
        group = {t.name for t in self.policy.success_tasks(self.spec)}
        if first.task.name not in group:
            return
        for t in self.tasks.values():
            running = t.proc is not None and t.proc.returncode is None
            if t is not first and t.task.name in group and running and not t.stopping:
                self.end_task(t, "restart")

    # -- cluster-level decisions -------------------------------------------
    def fail(self, reason: str) -> None:
        """Mark the cluster failed for ``reason`` and stop every task still running (once)."""
        if self.phase in Phase.TERMINAL:
            return
        self.phase, self.reason, self.finished = Phase.FAILED, reason, time.time()
        self.stop_reason = "the cluster failed"
        if self.policy.failure_grace > 0:
            self.grace_deadline = time.time() + self.policy.failure_grace
            return
        for t in self.tasks.values():
            if t.status.phase not in Phase.TERMINAL:
                self.end_task(t, "stop")

    def request_stop(self, reason: str) -> None:
        """Stop the cluster for ``reason``: end every task (only the first request counts)."""
        if self.stop_reason and self.grace_deadline is None:
            return  # already stopping (a failed cluster's grace period is cut short, though)
        self.stop_reason = self.stop_reason or reason
        self.grace_deadline = None  # a stop ends the PS grace period too: nothing is left to wait for
        self.event("", "Stopping", reason)
        for t in self.tasks.values():
            self.end_task(t, "stop")
        if self.phase not in Phase.TERMINAL:
            self.phase, self.reason, self.finished = Phase.STOPPED, reason, time.time()

    def update_phase(self) -> None:
        """Recompute the cluster's phase from its tasks; start the PS grace period when the workers finish."""
        if self.phase in Phase.TERMINAL:
            return
        states = [t.status.phase for t in self.tasks.values()]
        script_tasks = [self.tasks[t.name] for t in self.policy.success_tasks(self.spec)]
        if script_tasks and all(
            t.status.phase == Phase.SUCCEEDED for t in script_tasks
        ):
            self.phase, self.finished = Phase.SUCCEEDED, time.time()
            grace = self.policy.grace_period
            self.reason = "the workers finished"
            if any(t.status.phase not in Phase.TERMINAL for t in self.tasks.values()):
                # Only servers are left: they get the grace period, then they are recycled.
                self.grace_deadline = time.time() + grace
                self.reason += f"; parameter servers stop after a {grace:g} s grace period"
                self.event("", "WorkersFinished", self.reason)
            self.dirty = True
            return
        new = Phase.RUNNING if all(s in (Phase.RUNNING, Phase.SUCCEEDED) for s in states) else Phase.STARTING
        if new != self.phase:
            self.phase = new
            self.reason = "every task is ready" if new == Phase.RUNNING else ""
            self.dirty = True

    def tick(self) -> None:
        """Act on deadlines: recycle servers after the grace period, SIGKILL tasks that outlived SIGTERM."""
        now = time.time()
        if self.grace_deadline is not None and now >= self.grace_deadline:
            self.grace_deadline = None
            # After success what runs on is recycled; after a failure it is stopped.
            how = "recycle" if self.phase == Phase.SUCCEEDED else "stop"
            for t in self.tasks.values():
                if t.status.phase not in Phase.TERMINAL:
                    self.end_task(t, how)
        for t in self.tasks.values():
            if t.kill_at is not None and now >= t.kill_at and t.proc and t.proc.returncode is None:
                self.signal_task(t, signal.SIGKILL)
                t.kill_at = None
        self.check_stall(now)

    # -- stalls (the rule is in tfk8s_magics.stall) --------------------------
    def _all_running(self) -> bool:
        return self.phase == Phase.RUNNING and not self.stop_reason and all(
            t.status.phase in (Phase.RUNNING, Phase.SUCCEEDED) for t in self.tasks.values()
        )

    def check_stall(self, now: float) -> None:
        """Arm, check or clear the stall detector after the cluster's state may have changed."""
        if not self._all_running():
            self._unwatch_stall()
            if self.stalls.disarm():
                self.dirty = True
            return
        self.stalls.arm(now)
        times = [x for t in self.tasks.values() for x in (t.status.started, t.status.finished)]
        found = self.stalls.check(now, times)
        if found is not None:
            self.event("", "Stalled", found.describe(now), "Warning")
            fd = self.stalls.fd()
            if fd is not None:
                self.sel.register(fd, selectors.EVENT_READ, ("activity", None))

    def on_activity(self, now: float) -> None:
        """A task wrote, reported progress, started or exited: a stall (if any) is over."""
        self._unwatch_stall()
        if self.stalls.resume(now):
            self.event("", "Resumed", "a task showed activity again")

    def _unwatch_stall(self) -> None:
        fd = self.stalls.fd()
        if fd is not None:
            try:
                self.sel.unregister(fd)
            except (KeyError, ValueError):
                pass

    def next_timeout(self) -> float | None:
        """Seconds until the next deadline (the ``select`` timeout), or None when there is none."""
        deadlines = [t.kill_at for t in self.tasks.values() if t.kill_at is not None]
        if self.grace_deadline is not None:
            deadlines.append(self.grace_deadline)
        if self.stalls.deadline is not None:
            deadlines.append(self.stalls.deadline)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.time())

    def alive(self) -> bool:
        """Whether any task process is still running."""
        return any(t.proc is not None and t.proc.returncode is None for t in self.tasks.values())

    # -- main loop ---------------------------------------------------------
    def run(self) -> int:
        """Start the tasks and supervise them until the cluster ends; return the exit code."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        pending: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda s, _f: pending.append(s))
        self.sel.register(wake_r, selectors.EVENT_READ, ("signal", None))
        owner = self.record.get("owner_pid")
        if owner and not self.record.get("detached"):
            fd = open_pidfd(owner)
            if fd is None:
                self.request_stop(f"its owner (pid {owner}) had already exited")
            else:
                self.sel.register(fd, selectors.EVENT_READ, ("owner", owner))
        self.write_status()
        if not self.stop_reason:
            for t in self.tasks.values():
                self.start(t)
            self.event("", "Started", f"started {len(self.tasks)} task(s)")
        while True:
            self.update_phase()
            self.check_stall(time.time())
            if self.dirty:
                self.write_status()
            if not self.alive() and (self.phase in Phase.TERMINAL) and self.grace_deadline is None:
                break
            for key, _ in self.sel.select(self.next_timeout()):
                kind, obj = key.data
                if kind == "ready":
                    self.on_ready(obj)
                elif kind == "exit":
                    self.on_exit(obj)
                    self.on_activity(time.time())
                elif kind == "activity":
                    self.on_activity(time.time())
                elif kind == "owner":
                    self.sel.unregister(key.fd)
                    self.request_stop(f"its owner (pid {obj}) exited; launch with --detach to keep a cluster")
                elif kind == "signal":
                    os.read(wake_r, 64)
            while pending:
                pending.pop()
                self.request_stop("stopped by the user")
            self.tick()
        self.write_status(done=True)
        return 0


def main(argv: list[str] | None = None) -> int:
    """Supervise the cluster whose directory is ``argv[0]``."""
    argv = sys.argv[1:] if argv is None else argv
    sup = Supervisor(ClusterDir(Path(argv[0])))
    try:
        return sup.run()
    except BaseException:
        traceback.print_exc()
        for t in sup.tasks.values():
            if t.proc is not None and t.proc.returncode is None:
                sup.signal_task(t, signal.SIGKILL)
        sup.phase, sup.reason = Phase.FAILED, "the supervisor crashed; see supervisor.log"
        sup.write_status(done=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
