"""A supervisor's task processes: start them, watch them, end them, reap them and what they left.

Each task runs ``python -m tfk8s_magics.runtime.task`` (or in a warm pool's
process, :mod:`.placement`) with the environment :func:`~tfk8s_magics.taskenv.build`
makes, its output appended to its log, a *ready pipe* it writes once ready and
a pidfd (a pooled process: the pool's status pipe) the supervisor sleeps on.
Task processes get ``PR_SET_PDEATHSIG`` = SIGKILL and a process group of their
own: a stop signals the whole group, SIGTERM then SIGKILL after
:data:`STOP_TIMEOUT`.  The supervisor is a child subreaper, so a task's
orphaned descendants become its children and are ended with the task
(:meth:`TaskProcesses.reap_orphans`).

Which task to start, restart or end is never decided here: that is the
restart rule's (:class:`~tfk8s_magics.lifecycle.RestartRule`), performed by
:class:`~.supervisor.Supervisor`.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ... import taskenv
from ...isolation.shim import preload_env
from ...lifeline import children_of, open_pidfd, set_parent_death_signal, start_time
from ...runtime.exitcodes import TERMINATION_FILE_ENV
from ...spec import Task
from ...tfconfig import tf_config
from ..base import Phase
from .status import LocalTaskStatus
from .watchdog import CLUSTER_ID_ENV

if TYPE_CHECKING:
    from .supervisor import Supervisor

#: Seconds a task gets between SIGTERM and SIGKILL.
STOP_TIMEOUT = 5.0
def how_it_ended(st: LocalTaskStatus, asked: float | None) -> str:
    """One line for a stopped task's end: how (exit code or signal) and how long after SIGTERM."""
    how = f"killed by {st.signal}" if st.signal else f"exited with code {st.exit_code}"
    if asked is not None and st.finished is not None:
        how += f" {max(0.0, st.finished - asked):.1f} s after SIGTERM"
    return how


@dataclass
class TaskRun:
    """One task of the cluster: its row in the status, and its current process (if any)."""

    task: Task
    status: LocalTaskStatus
    runs_script: bool
    proc: subprocess.Popen | None = None
    ready_fd: int | None = None
    pidfd: int | None = None
    stopping: str = ""  # why we are ending it: "stop", "recycle", "" (not by us)
    kill_at: float | None = None
    stopped_at: float | None = None  # when we sent SIGTERM
    history: list[dict] = field(default_factory=list)

    @property
    def running(self) -> bool:
        """Whether its process runs (started, not reaped)."""
        return self.proc is not None and self.proc.returncode is None


class TaskProcesses:
    """The task processes of one supervisor (see the module docstring)."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.tasks: dict[str, TaskRun] = {}
        for t in sup.spec.tasks():
            st = LocalTaskStatus(name=t.name, host=sup.record["addresses"][t.name])
            self.tasks[t.name] = TaskRun(t, st, sup.spec.runs_script(t))
        #: Each task's log as the supervisor opened it (read and write; the stall check reads it
        #: through this descriptor, never by name).
        self.log_fds: dict[str, int] = {}

    def env(self, t: TaskRun) -> dict[str, str]:
        """The task's environment, built by :func:`taskenv.build` (an allow-list, not a copy)."""
        sup = self.sup
        rec = sup.record
        reserved = {
            "TF_CONFIG": tf_config(sup.cluster, t.task),
            "TFK8S_TASK": t.task.name,
            "TFK8S_CLUSTER": sup.spec.name,
            CLUSTER_ID_ENV: sup.cluster_id,
            "TFK8S_LOG_DIR": rec["log_dir"],
            "TFK8S_DATA_DIR": rec["data_dir"],
            "TFK8S_CHECKPOINT_DIR": str(Path(rec["log_dir"]) / "checkpoints"),
            "TFK8S_PROGRESS_FILE": str(sup.cdir.progress_file(t.task.name)),
            TERMINATION_FILE_ENV: str(sup.files.termination_file(t.task.name)),
        }
        if t.runs_script:
            reserved["TFK8S_SCRIPT"] = str(sup.cdir.script)
            reserved["TFK8S_SCRIPT_DIR"] = rec.get("script_dir") or rec["workdir"]
            name = sup.spec.script_name or ""
            reserved["TFK8S_SCRIPT_IS_CELL"] = "1" if not name or name.startswith("<") else "0"
            if sup.spec.files:
                reserved["TFK8S_FILES_DIR"] = str(sup.cdir.files)
        reserved.update(sup.storage.task_env())  # streaming: TFK8S_DATA_URL + storage credentials
        env = taskenv.build(os.environ, sup.spec.env, reserved, sup.spec.legacy_keras)
        preload_env(env, sup.placement.plan.shim if sup.placement.plan else None)
        return env

    # -- starting ------------------------------------------------------------------------------
    def start(self, t: TaskRun, use_pool: bool = True, wait_warm: bool = False) -> None:
        """Start (or restart) a task's process, its output appended to the task's log.

        The process comes from the owner's warm pool when there is one and the
        task's import-time environment matches it (see :mod:`.pool`); with
        ``wait_warm``, a pooled process still importing TensorFlow is waited for.
        """
        sup = self.sup
        try:
            log = sup.files.open_log(sup.record["log_dir"], t.task.name, t.status.restarts)
        except OSError as e:
            sup.file_failure(t, e)
            return
        try:  # a mark of an earlier try says nothing about this one
            sup.files.termination_file(t.task.name).unlink(missing_ok=True)
        except OSError:
            pass
        old = self.log_fds.pop(t.task.name, None)
        if old is not None:
            os.close(old)
        self.log_fds[t.task.name] = os.dup(log.fileno())  # not inheritable (os.dup): no task gets it
        read_fd, write_fd = os.pipe()
        env = self.env(t)
        env["TFK8S_READY_FD"] = str(write_fd)
        with log:
            warm = sup.placement.claim(t, env, log.fileno(), write_fd, wait_warm) if use_pool else None
            if sup.placement.claim_interrupted:  # stopping: this task is not started at all
                os.close(read_fd)
                os.close(write_fd)
                return
            t.proc = warm or self._popen(env, log, write_fd)
        os.close(write_fd)
        self._watch(t, read_fd, warm)

    def _popen(self, env: dict[str, str], log, write_fd: int) -> subprocess.Popen:
        me = os.getpid()
        return subprocess.Popen(
            [sys.executable, "-m", "tfk8s_magics.runtime.task"],
            env=env,
            cwd=self.sup.record["workdir"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(write_fd,),
            start_new_session=True,  # its own process group: stop reaches its children
            preexec_fn=lambda: set_parent_death_signal(signal.SIGKILL, me),
        )

    def _watch(self, t: TaskRun, read_fd: int, warm) -> None:
        """Sleep on the new process's ready pipe and its end; its row says it starts."""
        t.ready_fd = read_fd
        # A pooled process is not our child: its end (and status) comes through the status pipe.
        t.pidfd = warm.status_fd if warm else open_pidfd(t.proc.pid)
        self.sup.sel.register(read_fd, selectors.EVENT_READ, ("ready", t))
        if t.pidfd is not None:
            self.sup.sel.register(t.pidfd, selectors.EVENT_READ, ("exit", t))
        t.status.phase = Phase.STARTING
        t.status.reason = "starting in a warm process" if warm else "importing TensorFlow"
        t.status.pid = t.proc.pid
        t.status.pid_start = start_time(t.proc.pid)
        t.status.started = time.time()
        t.status.finished = None
        t.status.exit_code = None
        t.status.signal = None
        t.stopping = ""
        t.kill_at = None
        self.sup.rule.started(t.task.name, t.status.started)
        self.sup.dirty = True

    def start_all(self) -> None:
        """Start every task: as many from the warm pool as it holds (waiting for ones still
        importing), the others cold and first, so they do not wait behind the pool."""
        sup = self.sup
        tasks = list(self.tasks.values())
        warm = sup.placement.warm_count(len(tasks))
        order = [(t, {"use_pool": False}) for t in tasks[warm:]]
        order += [(t, {"wait_warm": True}) for t in tasks[:warm]]
        for t, how in order:
            if sup.stop_reason:  # a task could not start (e.g. its log cannot be written), or a stop
                self.end(t, "stop")
                continue
            self.start(t, **how)
            if sup.placement.claim_interrupted:  # a stop or the owner's exit came while its claim waited
                sup.placement.claim_interrupted = False
                sup.pump(0)  # turns it into request_stop
                if sup.stop_reason:
                    self.end(t, "stop")  # never started
                else:
                    self.start(t, use_pool=False)  # woken by nothing that stops us: start it cold

    # -- while it runs ---------------------------------------------------------------------------
    def on_ready(self, t: TaskRun) -> None:
        """The task's ready pipe is readable: mark the task running if it wrote to it (not just closed it)."""
        data = os.read(t.ready_fd, 64) if t.ready_fd is not None else b""
        if t.ready_fd is not None:
            self.sup.sel.unregister(t.ready_fd)
            os.close(t.ready_fd)
            t.ready_fd = None
        if data and t.status.phase == Phase.STARTING:
            t.status.phase = Phase.RUNNING
            t.status.reason = "running the script" if t.runs_script else "serving"
            self.sup.dirty = True

    def alive(self) -> bool:
        """Whether any task process is still running."""
        return any(t.running for t in self.tasks.values())

    # -- ending ----------------------------------------------------------------------------------
    def signal(self, t: TaskRun, sig: int) -> None:
        """Send ``sig`` to the task's whole process group, if the task is still running."""
        if not t.running:
            return
        try:
            os.killpg(t.proc.pid, sig)
        except ProcessLookupError:
            pass

    def end(self, t: TaskRun, why: str) -> None:
        """Ask a live task to end (SIGTERM now, SIGKILL after STOP_TIMEOUT)."""
        if not t.running:
            if t.status.phase not in Phase.TERMINAL:
                t.status.phase = Phase.STOPPED if why == "stop" else Phase.SUCCEEDED
                t.status.reason = self.sup.stop_reason if why == "stop" else "not needed"
                self.sup.dirty = True
            return
        if t.stopping:
            return
        t.stopping = why
        self.sup.rule.ending(t.task.name, why)
        t.stopped_at = time.time()
        t.kill_at = t.stopped_at + STOP_TIMEOUT
        self.signal(t, signal.SIGTERM)
        self.signal(t, signal.SIGCONT)  # a stopped task handles its SIGTERM only once continued

    def reap(self, t: TaskRun) -> int:
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
        self.reap_orphans()
        return rc

    def _close_fds(self, t: TaskRun) -> None:
        for fd in (t.ready_fd, t.pidfd):
            if fd is not None:
                try:
                    self.sup.sel.unregister(fd)
                except (KeyError, ValueError):
                    pass
                os.close(fd)
        t.ready_fd = t.pidfd = None

    def reap_orphans(self) -> None:
        """End and reap what a task left behind and reparented to us (we are a subreaper):
        a child of ours that is no task is an orphaned descendant, which must not outlive its task."""
        sup = self.sup
        keep = {t.proc.pid for t in self.tasks.values() if t.running}
        keep.add(sup.watchdog_pid)
        keep.add(sup.storage.uploader.pid if sup.storage.uploader else None)  # waits for the backup
        for pid in children_of(os.getpid()):
            if pid in keep:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass

    def kill_all(self) -> None:
        """SIGKILL every task still running (the supervisor cannot go on)."""
        for t in self.tasks.values():
            self.signal(t, signal.SIGKILL)
