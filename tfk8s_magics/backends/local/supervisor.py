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

Task processes get ``PR_SET_PDEATHSIG`` = SIGKILL, so even a supervisor
killed with SIGKILL takes its tasks with it; the supervisor is a child
subreaper (a task's orphaned children become its own, and it ends them with
the task), and its :mod:`.watchdog` kills every process marked with the
cluster's id when the supervisor itself ends, however it ends: no
descendant of a task outlives its cluster.

The supervisor trusts its directory only while it is the same one: it
holds the directory open and writes through that handle, and checks every
:data:`IDENTITY_CHECK` seconds that the path still names that directory
with the record's ``id``.  If the dir was removed or replaced (a new
cluster of the same name), it kills its own tasks and exits without
writing anything.  Files it creates are private (umask 077), log files are
opened without following symlinks, and a write that fails (a full disk, a
read-only dir) fails the cluster with the path and the cause.
It never imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import errno
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

from ... import lifecycle, options, taskenv
from ...isolation import netns
from ...isolation.plan import IsolationPlan, Platform, plan_cluster
from ...isolation.shim import preload_env
from ...lifeline import (
    become_subreaper,
    children_of,
    kill_marked,
    open_pidfd,
    process_state,
    set_parent_death_signal,
    start_time,
)
from ...ports import free_ports
from ...runtime.exitcodes import PORT_TAKEN_MARK, TERMINATION_FILE_ENV
from ...spec import ClusterSpec, Task
from ...stall import DEFAULT_TIMEOUT as DEFAULT_STALL_TIMEOUT
from ...tfconfig import cluster_def, tf_config
from ..base import Phase
from . import pool
from .kerastemp import remove_keras_temp_dirs
from .layout import (
    ClusterDir,
    open_private_append,
    overwrite_json,
    read_json,
    task_log_path,
    write_json_atomic,
)
from .stallwatch import StallWatch
from .status import LocalTaskStatus
from .storage import ClusterStorage
from .watchdog import CLUSTER_ID_ENV, fork_watchdog

#: Seconds a task gets between SIGTERM and SIGKILL.
STOP_TIMEOUT = 5.0
#: Seconds between checks that the cluster dir is still this cluster's.
IDENTITY_CHECK = 1.0
#: How many times a cluster's tasks are moved to new ports (the rule: :class:`.lifecycle.RestartRule`).
PORT_MOVES = lifecycle.PORT_MOVES


def _how_it_ended(st: LocalTaskStatus, asked: float | None) -> str:
    """One line for a stopped task's end: how (exit code or signal) and how long after SIGTERM."""
    how = f"killed by {st.signal}" if st.signal else f"exited with code {st.exit_code}"
    if asked is not None and st.finished is not None:
        how += f" {max(0.0, st.finished - asked):.1f} s after SIGTERM"
    return how


#: How a peer that ended a moment before the task that lost it is described (a zombie: its end is
#: not handled yet).
ZOMBIE = lifecycle.ZOMBIE


#: The errors of a write to a full disk (or a full quota).
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def say(line: str) -> None:
    """Print ``line`` to the supervisor's log, which may be on a full disk: never raises."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


class DirReplaced(Exception):
    """The cluster's directory was removed or now belongs to another cluster."""


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
    stopped_at: float | None = None  # when we sent SIGTERM
    history: list[dict] = field(default_factory=list)


class Supervisor:
    """Runs the tasks of one cluster until it ends; see the module docstring."""

    def __init__(self, cdir: ClusterDir) -> None:
        self.cdir = cdir
        self.record = read_json(cdir.record)
        self.cluster_id = str(self.record.get("id") or "")
        # Held for life: every write goes through it, so a replaced dir is never written.
        self.dir_fd = os.open(cdir.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.dir_ino = os.fstat(self.dir_fd).st_ino
        self.identity_at = time.time() + IDENTITY_CHECK
        self.watchdog_pid: int | None = None
        self.spec = ClusterSpec.from_dict(self.record["spec"])
        self.policy = lifecycle.LifecyclePolicy.of(self.spec)
        self.cluster = self.record["cluster"]
        self.sel = selectors.DefaultSelector()
        #: Signals received, not acted on yet (SIGTERM/SIGINT/SIGHUP: a stop).
        self.pending: list[int] = []
        #: A wait for a warm process ended early (a stop, the owner's exit): start nothing more.
        self.claim_interrupted = False
        self.tasks: dict[str, _Task] = {}
        for t in self.spec.tasks():
            st = LocalTaskStatus(name=t.name, host=self.record["addresses"][t.name])
            self.tasks[t.name] = _Task(t, st, self.spec.runs_script(t))
        self.phase = Phase.STARTING
        self.reason = ""
        self.finished: float | None = None
        self.stop_reason = ""
        self.grace_deadline: float | None = None
        #: The restart rule (incidents, group restarts, deferred starts, blame, port moves): it
        #: decides, this process performs (see :meth:`perform`).
        self.rule = lifecycle.RestartRule(self.policy, self.spec)
        self.dirty = True
        #: How this cluster is kept from other users (see :meth:`isolate`), for status.json.
        self.isolation: dict = {"mode": netns.NONE, "reason": "not isolated yet", "netns": None}
        #: The plan it performs (:mod:`tfk8s_magics.isolation.plan`), once :meth:`isolate` made it.
        self.plan: IsolationPlan | None = None
        #: The warm pool's namespace this cluster adopted (its id; see :meth:`isolate`), or None
        #: and why not (then its tasks start cold).
        self.pool_ns: str | None = None
        self.pool_why = "no warm pool"
        #: --data-sync before the tasks, --backup after them (issue 15).
        self.storage = ClusterStorage(self)
        #: Each task's log as the supervisor opened it (read and write; the stall check reads it
        #: through this descriptor, never by name).
        self.log_fds: dict[str, int] = {}
        self.stalls = StallWatch(
            {t: task_log_path(self.record["log_dir"], t) for t in self.tasks},
            self.log_fds,
            cdir.progress_dir,
            float(self.record.get("stall_timeout", DEFAULT_STALL_TIMEOUT)),
        )

    # -- events and status ------------------------------------------------
    def event(self, task: str, reason: str, message: str, type_: str = "Normal") -> None:
        """Append an event to ``events.jsonl`` and mark the status for rewriting."""
        line = json.dumps(
            {"time": time.time(), "task": task, "reason": reason, "message": message, "type": type_}
        )
        self.dirty = True
        try:
            with open_private_append(self.cdir.events.name, self.dir_fd) as f:
                f.write((line + "\n").encode())
        except OSError as e:  # the status still says what happened; say it here too
            say(f"tfk8s: cannot write {self.cdir.events}: {e.strerror or e}")
            if e.errno in DISK_FULL:
                self.disk_full()

    def disk_full(self) -> None:
        """The disk holding the cluster's dir is full: fail the cluster saying so (its tasks are
        stopped, so nothing fills it further); status.json is then written in place."""
        if self.phase not in Phase.TERMINAL:
            self.fail(f"the disk holding {self.cdir.root} is full (No space left on device): "
                      "free space there, then launch again")
            self.event("", "DiskFull", self.reason, "Warning")

    def check_disk(self) -> None:
        """Fail the cluster once the disk holding its dir has no free block left for its user."""
        try:
            full = os.statvfs(self.dir_fd).f_bavail == 0
        except OSError:
            return
        if full:
            self.disk_full()

    def write_status(self, done: bool = False) -> None:
        """Rewrite ``status.json`` atomically; ``done`` tells readers the supervisor has finished.
        On a full disk the cluster fails saying so, and the status is written over the old one."""
        self.check_identity()
        try:
            write_json_atomic(self.cdir.status, self._status(done), dir_fd=self.dir_fd)
        except OSError as e:
            if e.errno not in DISK_FULL:
                raise
            self.disk_full()
            try:
                overwrite_json(self.cdir.status, self._status(done), self.dir_fd)
            except OSError as again:  # no block left even for that: tried again at the next change
                say(f"tfk8s: cannot write {self.cdir.status}: {again.strerror or again}")
                return
        self.dirty = False

    def _status(self, done: bool) -> dict:
        """What ``status.json`` says now."""
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
            "stall": self.stalls.stall.to_dict() if self.stalls.stall else None,
            "isolation": self.isolation,
            "updated": time.time(),
        }

    # -- task processes -----------------------------------------------------
    def _env(self, t: _Task) -> dict[str, str]:
        """The task's environment, built by :func:`taskenv.build` (an allow-list, not a copy)."""
        rec = self.record
        reserved = {
            "TF_CONFIG": tf_config(self.cluster, t.task),
            "TFK8S_TASK": t.task.name,
            "TFK8S_CLUSTER": self.spec.name,
            CLUSTER_ID_ENV: self.cluster_id,
            "TFK8S_LOG_DIR": rec["log_dir"],
            "TFK8S_DATA_DIR": rec["data_dir"],
            "TFK8S_CHECKPOINT_DIR": str(Path(rec["log_dir"]) / "checkpoints"),
            "TFK8S_PROGRESS_FILE": str(self.cdir.progress_file(t.task.name)),
            TERMINATION_FILE_ENV: str(self._termination_file(t)),
        }
        if t.runs_script:
            reserved["TFK8S_SCRIPT"] = str(self.cdir.script)
            reserved["TFK8S_SCRIPT_DIR"] = rec.get("script_dir") or rec["workdir"]
            name = self.spec.script_name or ""
            reserved["TFK8S_SCRIPT_IS_CELL"] = "1" if not name or name.startswith("<") else "0"
            if self.spec.files:
                reserved["TFK8S_FILES_DIR"] = str(self.cdir.files)
        reserved.update(self.storage.task_env())  # streaming: TFK8S_DATA_URL + storage credentials
        env = taskenv.build(os.environ, self.spec.env, reserved, self.spec.legacy_keras)
        preload_env(env, self.plan.shim if self.plan else None)
        return env

    def _termination_file(self, t: _Task) -> Path:
        """Where the task's runtime says why it cannot run (``progress/<task>.end``)."""
        return self.cdir.progress_dir / f"{t.task.name}.end"

    def _termination_reason(self, t: _Task) -> str:
        """What this try's runtime wrote (the file is removed after reading):
        :data:`lifecycle.SCRIPT_BROKEN`, :data:`PORT_TAKEN_MARK`, or "" (exit 3 alone is the
        script's own ``sys.exit(3)``)."""
        path = self._termination_file(t)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return ""
        try:
            text = os.read(fd, 4096).decode("utf-8", "replace")
        finally:
            os.close(fd)
            path.unlink(missing_ok=True)
        for mark in (lifecycle.SCRIPT_BROKEN, PORT_TAKEN_MARK):
            if text.startswith(mark + ":"):
                return mark
        return ""

    def _open_log(self, t: _Task):
        """The task's log, opened for appending without following a symlink at any level we create
        (``tasks/`` and the file); the restart banner written.  Raises OSError naming the path."""
        log_path = task_log_path(self.record["log_dir"], t.task.name)
        try:
            dfd = os.open(log_path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            raise OSError(e.errno, e.strerror, str(log_path.parent)) from None
        try:
            log = open_private_append(log_path.name, dfd, readable=True)
        except OSError as e:
            raise OSError(e.errno, e.strerror, str(log_path)) from None
        finally:
            os.close(dfd)
        try:
            if t.status.restarts:
                log.write(f"tfk8s: --- restart {t.status.restarts} of {t.task.name} ---\n".encode())
                log.flush()
        except OSError as e:
            log.close()
            raise OSError(e.errno, e.strerror, str(log_path)) from None
        return log

    def file_failure(self, t: _Task | None, e: OSError) -> None:
        """A file the cluster needs cannot be written (full disk, read-only dir, a planted symlink):
        fail the cluster naming the path and the cause; every task row ends."""
        cause = "it is a symlink (not followed)" if e.errno == errno.ELOOP else (e.strerror or str(e))
        why = f"cannot write {e.filename}: {cause}"
        if t is not None:
            t.status.phase, t.status.reason = Phase.FAILED, why
            t.status.finished = time.time()
        self.fail(why)
        self.event(t.task.name if t else "", "Failed", why, "Warning")

    def _claim_warm(self, t: _Task, env: dict[str, str], log_fd: int, ready_fd: int,
                    wait: bool) -> pool.PooledProcess | None:
        """Hand the task to a process of the owner's warm pool; None (and an event saying why) if
        it must start cold."""
        sock = self.record.get("pool")
        if not sock:
            return None
        if self.isolation["netns"] and not self.pool_ns:
            # A pooled process never changes namespace after its import (its threads would not follow).
            proc, why = None, self.pool_why
        else:
            # A stop or the owner's exit ends a wait (the refill may still be importing); only
            # start_all waits, and it turns such an end into the stop.
            stops = [key.fd for key in self.sel.get_map().values()
                     if key.data[0] in ("signal", "owner")] if wait else []
            proc, why = pool.claim(sock, {k: v for k, v in env.items() if k != "TFK8S_READY_FD"},
                                   self.record["workdir"], log_fd, ready_fd, wait, self.pool_ns, stops)
        if why == pool.INTERRUPTED:
            self.claim_interrupted = True
        elif proc is None:
            self.event(t.task.name, "StartedCold", f"not from the warm pool: {why}")
        return proc

    def start(self, t: _Task, use_pool: bool = True, wait_warm: bool = False) -> None:
        """Start (or restart) a task's process, its output appended to the task's log.

        The process comes from the owner's warm pool when there is one and the
        task's import-time environment matches it (see :mod:`.pool`); with
        ``wait_warm``, a pooled process still importing TensorFlow is waited for.
        """
        try:
            log = self._open_log(t)
        except OSError as e:
            self.file_failure(t, e)
            return
        try:  # a mark of an earlier try says nothing about this one
            self._termination_file(t).unlink(missing_ok=True)
        except OSError:
            pass
        old = self.log_fds.pop(t.task.name, None)
        if old is not None:
            os.close(old)
        self.log_fds[t.task.name] = os.dup(log.fileno())  # not inheritable (os.dup): no task gets it
        read_fd, write_fd = os.pipe()
        env = self._env(t)
        env["TFK8S_READY_FD"] = str(write_fd)
        me = os.getpid()
        with log:
            warm = self._claim_warm(t, env, log.fileno(), write_fd, wait_warm) if use_pool else None
            if self.claim_interrupted:  # stopping: this task is not started at all
                os.close(read_fd)
                os.close(write_fd)
                return
            t.proc = warm or subprocess.Popen(
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
        # A pooled process is not our child: its end (and status) comes through the status pipe.
        t.pidfd = warm.status_fd if warm else open_pidfd(t.proc.pid)
        self.sel.register(read_fd, selectors.EVENT_READ, ("ready", t))
        if t.pidfd is not None:
            self.sel.register(t.pidfd, selectors.EVENT_READ, ("exit", t))
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
        self.rule.started(t.task.name, t.status.started)
        self.dirty = True

    def start_all(self) -> None:
        """Start every task: as many from the warm pool as it holds (waiting for ones still
        importing), the others cold and first, so they do not wait behind the pool."""
        sock = self.record.get("pool")
        # Namespaced without the pool's namespace: every task cold, each with an event saying why.
        warm = len(self.tasks) if sock and self.isolation["netns"] and not self.pool_ns else (
            pool.available(sock, self.pool_ns))
        tasks = list(self.tasks.values())
        order = [(t, {"use_pool": False}) for t in tasks[warm:]]
        order += [(t, {"wait_warm": True}) for t in tasks[:warm]]
        for t, how in order:
            if self.stop_reason:  # a task could not start (e.g. its log cannot be written), or a stop
                self.end_task(t, "stop")
                continue
            self.start(t, **how)
            if self.claim_interrupted:  # a stop or the owner's exit came while its claim waited
                self.claim_interrupted = False
                self.pump(0)  # turns it into request_stop
                if self.stop_reason:
                    self.end_task(t, "stop")  # never started
                else:
                    self.start(t, use_pool=False)  # woken by nothing that stops us: start it cold

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
        self.rule.ending(t.task.name, why)
        t.stopped_at = time.time()
        t.kill_at = t.stopped_at + STOP_TIMEOUT
        self.signal_task(t, signal.SIGTERM)
        self.signal_task(t, signal.SIGCONT)  # a stopped task handles its SIGTERM only once continued

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
        self.reap_orphans()
        return rc

    def reap_orphans(self) -> None:
        """End and reap what a task left behind and reparented to us (we are a subreaper):
        a child of ours that is no task is an orphaned descendant, which must not outlive its task."""
        keep = {t.proc.pid for t in self.tasks.values() if t.proc is not None and t.proc.returncode is None}
        keep.add(self.watchdog_pid)
        keep.add(self.storage.uploader.pid if self.storage.uploader else None)  # waits for the backup
        for pid in children_of(os.getpid()):
            if pid in keep:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass

    def _disk_note(self) -> str:
        """Why a task's end may be the disk's fault: its log dir's file system is full."""
        log_dir = self.record["log_dir"]
        try:
            full = os.statvfs(log_dir).f_bavail == 0
        except OSError:
            return ""
        return f"; its log dir {log_dir} is full (No space left on device)" if full else ""

    def on_exit(self, t: _Task) -> None:
        """Handle a task's exit: perform what the restart rule answers (restart, success, failure)."""
        rc = self._reap(t)
        st = t.status
        st.finished = time.time()
        st.pid = st.pid_start = None
        st.exit_code = rc if rc >= 0 else None
        st.signal = signal.Signals(-rc).name if rc < 0 else None
        self.dirty = True
        on_its_own = not t.stopping  # a task we ended is settled by the rule without these
        end = lifecycle.TaskEnd(exit_code=st.exit_code, signal=st.signal,
                                reason=self._termination_reason(t) if on_its_own else "")
        # A peer that is stopped, a zombie or gone is the cause of a retryable end, not its bystander.
        culprit = self.peer_at_fault(t) if on_its_own else None
        self.perform(self.rule.ended(t.task.name, end, st.finished, culprit=culprit,
                                     note=self._disk_note() if on_its_own else ""))

    def perform(self, actions: list) -> None:
        """Perform the restart rule's actions, in order (the rule is :class:`.lifecycle.RestartRule`)."""
        for action in actions:
            if isinstance(action, lifecycle.Blame):
                self.event(action.task, "Culprit", action.message, "Warning")
            elif isinstance(action, lifecycle.Succeed):
                st = self.tasks[action.task].status
                st.phase, st.reason = Phase.SUCCEEDED, action.reason
                self.event(action.task, "Completed", "exited with code 0")
            elif isinstance(action, lifecycle.Fail):
                st = self.tasks[action.task].status
                st.phase, st.reason = Phase.FAILED, action.task_reason
                self.fail(action.reason)
                self.event(action.task, "Failed", st.reason, "Warning")
            elif isinstance(action, lifecycle.EndTasks):
                for name in action.tasks:
                    self.end_task(self.tasks[name], action.why)
            elif isinstance(action, lifecycle.Restart):
                t = self.tasks[action.task]
                t.status.restarts += 1
                self.event(t.task.name, "Restarted", action.why, "Warning")
                if action.deferred:
                    t.status.phase, t.status.reason = Phase.STARTING, "waiting for its group to stop"
                    self.dirty = True
                else:
                    self.start(t)
            elif isinstance(action, lifecycle.StartDeferred):
                for name in action.tasks:
                    if self.stop_reason:
                        self.end_task(self.tasks[name], "stop")
                    else:
                        self.start(self.tasks[name])
            elif isinstance(action, lifecycle.SettleTask):
                self._settle(self.tasks[action.task], action)
            elif isinstance(action, lifecycle.MovePort):
                self._move_port(self.tasks[action.task])
            else:
                raise TypeError(f"unknown action of the restart rule: {action!r}")

    def _settle(self, t: _Task, action: lifecycle.SettleTask) -> None:
        """A task we ended (stop, recycle, the blamed cause of a failure) has ended: its row."""
        st = t.status
        if action.phase == Phase.STOPPED:
            st.phase, st.reason = Phase.STOPPED, self.stop_reason
            self.event(t.task.name, "TaskStopped", _how_it_ended(st, t.stopped_at))
        elif action.phase == Phase.SUCCEEDED:
            st.phase, st.reason = Phase.SUCCEEDED, action.reason
            self.event(t.task.name, "Recycled", st.reason)
        else:  # the cause of a failed cluster, not a bystander
            st.phase, st.reason = action.phase, action.reason

    def peer_at_fault(self, t: _Task) -> tuple[str, str] | None:
        """The task whose process is the cause of ``t``'s end, with what was wrong with it: one that
        is stopped (SIGSTOP, a debugger), a zombie (it ended; its exit is not handled yet) or gone,
        while its row says it runs.  None when every peer's process is well (``t`` is the cause)."""
        now = time.time()
        for other in self.tasks.values():
            if other is t or other.proc is None or other.proc.returncode is not None or other.stopping:
                continue
            state = process_state(other.proc.pid)
            if state in ("T", "t"):
                how = "stopped (SIGSTOP or SIGTSTP)" if state == "T" else "stopped by a debugger (traced)"
                silent = self._silent_for(other, now)
                return other.task.name, f"{other.task.name} was {how}" + (
                    f", silent for {silent:.0f} s" if silent is not None else "")
            if state in ("Z", "X"):
                return other.task.name, f"{other.task.name} {ZOMBIE}"
            if state is None:
                return other.task.name, f"{other.task.name}'s process was gone"
        return None

    def _silent_for(self, t: _Task, now: float) -> float | None:
        """Seconds since ``t`` last wrote to its log (or started), through the supervisor's descriptor."""
        times = [t.status.started] if t.status.started is not None else []
        fd = self.log_fds.get(t.task.name)
        if fd is not None:
            try:
                times.append(os.fstat(fd).st_mtime)
            except OSError:
                pass
        return max(0.0, now - max(times)) if times else None

    def _move_port(self, t: _Task) -> None:
        """``t``'s port was taken by another process before it could listen (tasks on the host's
        loopback): give it a new one, rewrite the addresses every task and the kernel read
        (``record.json``); the rule then restarts the tasks already started with them — free of
        the restart budget (at most :data:`PORT_MOVES` times: the rule counts)."""
        old = self.record["addresses"][t.task.name]
        taken = {a.rsplit(":", 1)[1] for a in self.record["addresses"].values()}
        port = next(p for p in free_ports(len(taken) + 1) if str(p) not in taken)
        self.record["addresses"][t.task.name] = t.status.host = f"127.0.0.1:{port}"
        addresses = self.record["addresses"]
        self.record["cluster"] = self.cluster = cluster_def(self.spec, lambda x: addresses[x.name])
        try:
            write_json_atomic(self.cdir.record, self.record, dir_fd=self.dir_fd)
        except OSError as e:
            self.file_failure(t, OSError(e.errno, e.strerror, str(self.cdir.record)))
            return
        self.event(t.task.name, "PortTaken", f"{old} was taken by another process before the task could "
                   f"listen on it; moved to 127.0.0.1:{port}, every task restarted with the new addresses "
                   "(not counted against the restart budget)", "Warning")
        self.perform(self.rule.port_moved(t.task.name, old))

    # -- isolation (decided by tfk8s_magics.isolation.plan) ------------------------
    def isolate(self) -> None:
        """Perform the cluster's isolation plan before any task starts (the tasks inherit it):
        enter a private network namespace (the warm pool's spare, else a new one), or stay
        where the plan says; where the kernel refuses a namespace, the plan's fallback, and
        ``status.json`` says why."""
        plan = plan_cluster(Platform.here(self.record.get("loopback_shim")), options.get("isolation"),
                            in_graph=not self.policy.success_roles, streams=bool(self.storage.streams))
        self.plan = plan
        if not plan.private:
            self.isolation = plan.status()
            return
        try:
            mode = self._adopt_pool_namespace() or netns.enter_private_network()
        except netns.IsolationError as e:
            self.plan = plan.refused(e.strerror)
            self.isolation = self.plan.status()
            print(f"tfk8s: {self.isolation['reason']}", flush=True)
            return
        self.isolation = plan.status(mode, f"/proc/{os.getpid()}/ns/net")

    def _adopt_pool_namespace(self) -> str | None:
        """Enter the warm pool's spare namespace, where its processes imported TensorFlow (their
        every thread is in it); return the mode, or None (no pool or spare: make a new one)."""
        sock = self.record.get("pool")
        if not sock or not self.tasks:
            return None
        env = self._env(next(iter(self.tasks.values())))  # the tasks' import-time env is one
        ns, fds, why = pool.adopt(sock, {k: v for k, v in env.items() if k != "TFK8S_READY_FD"})
        if ns is None:
            self.pool_why = why
            return None
        try:
            mode = netns.join_namespace(fds)
        except netns.IsolationError as e:
            pool.release(sock, ns)
            self.pool_why = f"cannot enter the pool's namespace ({e.strerror})"
            return None  # nothing changed (a refused first setns): a namespace of our own
        finally:
            for fd in fds:
                os.close(fd)
        self.pool_ns = ns
        return mode

    # -- the cluster dir's identity --------------------------------------------
    def dir_is_mine(self) -> bool:
        """Whether the cluster's path still names our directory (same inode, same record id)."""
        try:
            if os.stat(self.cdir.root).st_ino != self.dir_ino:
                return False
            record = read_json(self.cdir.record)
        except (OSError, ValueError):
            return False
        return isinstance(record, dict) and str(record.get("id") or "") == self.cluster_id

    def check_identity(self) -> None:
        """Raise :class:`DirReplaced` if the cluster dir is gone or is another cluster's now."""
        self.identity_at = time.time() + IDENTITY_CHECK
        if not self.dir_is_mine():
            raise DirReplaced(f"{self.cdir.root} was removed or replaced")

    def abandon(self, why: str) -> None:
        """Our dir is gone or another cluster's: kill our own tasks (and all they started) and write
        nothing, so a new cluster of the same name is left alone."""
        print(f"tfk8s: {why}; stopping this cluster's tasks and exiting", file=sys.stderr, flush=True)
        for t in self.tasks.values():
            if t.proc is not None and t.proc.returncode is None:
                self.signal_task(t, signal.SIGKILL)
                t.proc.wait()
        self.reap_orphans()
        if self.cluster_id:
            kill_marked(CLUSTER_ID_ENV, self.cluster_id)

    # -- cluster-level decisions -------------------------------------------
    def fail(self, reason: str) -> None:
        """Mark the cluster failed for ``reason`` and stop every task still running (once)."""
        if self.phase in Phase.TERMINAL:
            return
        self.phase, self.reason, self.finished = Phase.FAILED, reason, time.time()
        self.stop_reason = "the cluster failed"
        self.rule.stop_requested(failed=True)
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
        self.rule.stop_requested()
        self.grace_deadline = None  # a stop ends the PS grace period too: nothing is left to wait for
        self.event("", "Stopping", reason)
        if self.phase not in Phase.TERMINAL:  # "stopped" once every task has ended (update_phase)
            self.phase, self.reason = Phase.STOPPING, f"{reason}; waiting for the tasks to end"
            self.dirty = True
        for t in self.tasks.values():
            self.end_task(t, "stop")

    def update_phase(self) -> None:
        """Recompute the cluster's phase from its tasks; start the PS grace period when the workers finish."""
        if self.phase in Phase.TERMINAL:
            return
        if self.phase == Phase.STOPPING:
            if not self.alive():
                self.phase, self.reason, self.finished = Phase.STOPPED, self.stop_reason, time.time()
                self.event("", "Stopped", f"every task has ended ({self.reason})")
                self.dirty = True
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
            self.reason = ("every task is ready" if new == Phase.RUNNING
                           else f"restarting after {self.rule.incident_cause}" if self.rule.incident_cause
                           else "")
            self.dirty = True

    def tick(self) -> None:
        """Act on deadlines: recycle servers after the grace period, SIGKILL tasks that outlived SIGTERM."""
        now = time.time()
        if self.grace_deadline is not None and now >= self.grace_deadline:
            self.grace_deadline = None
            # After success what runs on is recycled; after a failure it is stopped.
            how = "recycle" if self.phase == Phase.SUCCEEDED else "stop"
            if how == "recycle" and "grace period" in self.reason:  # no longer "will stop": did
                self.reason = "the workers finished; the parameter servers were recycled"
                self.dirty = True
            for t in self.tasks.values():
                if t.status.phase not in Phase.TERMINAL:
                    self.end_task(t, how)
        for t in self.tasks.values():
            if t.kill_at is not None and now >= t.kill_at and t.proc and t.proc.returncode is None:
                self.signal_task(t, signal.SIGKILL)
                t.kill_at = None
                self.event(t.task.name, "Killed", f"still running {STOP_TIMEOUT:g} s after SIGTERM: "
                           "sent SIGKILL", "Warning")
        if now >= self.identity_at:
            self.check_identity()
            self.check_disk()
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
        deadlines.append(self.identity_at)
        return max(0.0, min(deadlines) - time.time())

    def alive(self) -> bool:
        """Whether any task process is still running."""
        return any(t.proc is not None and t.proc.returncode is None for t in self.tasks.values())

    # -- main loop ---------------------------------------------------------
    def _guard(self) -> None:
        """Before any task: become a subreaper, fork the watchdog, watch the owner."""
        become_subreaper()
        if self.cluster_id:  # forked before any task or thread exists
            self.watchdog_pid = fork_watchdog(self.cluster_id)
        owner = self.record.get("owner_pid")
        if owner and not self.record.get("detached"):
            fd = open_pidfd(owner)
            if fd is None:
                self.request_stop(f"its owner (pid {owner}) had already exited")
            else:
                self.sel.register(fd, selectors.EVENT_READ, ("owner", owner))

    def _start_all(self) -> None:
        if self.stop_reason:
            return
        self.start_all()
        self.event("", "Started", f"started {len(self.tasks)} task(s)")
        if self.pool_ns:  # the adopted namespace's processes no task took end now (status first)
            self.write_status()
            pool.release(self.record["pool"], self.pool_ns)

    def _dispatch(self, key: selectors.SelectorKey) -> None:
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
        self._guard()
        self.write_status()
        if self.storage.before_tasks():  # on the host's network: the data URL and the uploader
            self.isolate()
        self._start_all()
        while True:
            self.update_phase()
            self.storage.on_success()  # --backup: uploaded before the success is written
            self.check_stall(time.time())
            if self.dirty:
                self.write_status()
            if not self.alive() and (self.phase in Phase.TERMINAL) and self.grace_deadline is None:
                break
            self.pump(self.next_timeout())
            self.tick()
        self.storage.after_tasks()  # the backup, before what is left of the cluster is killed
        self.reap_orphans()
        if self.cluster_id:  # whatever a task started in another session dies with the cluster
            kill_marked(CLUSTER_ID_ENV, self.cluster_id, exclude=frozenset({self.watchdog_pid or 0}))
        # A fit cut short leaves Keras's scratch folders (a stray TensorBoard run): nothing writes now.
        removed = remove_keras_temp_dirs(self.record["log_dir"])
        if removed:
            self.event("", "TempRemoved", "removed what Keras leaves when a multi-worker fit does not "
                       "return: " + ", ".join(str(p) for p in removed))
        self.write_status(done=True)
        return 0


def main(argv: list[str] | None = None) -> int:
    """Supervise the cluster whose directory is ``argv[0]``."""
    argv = sys.argv[1:] if argv is None else argv
    os.umask(0o077)  # what the cluster writes (status, events, logs, checkpoints) is its owner's only
    sup = Supervisor(ClusterDir(Path(argv[0])))
    try:
        return sup.run()
    except DirReplaced as e:
        sup.abandon(str(e))
        return 1
    except BaseException:
        with contextlib.suppress(OSError):  # the log may be on a full disk
            traceback.print_exc()
        for t in sup.tasks.values():
            if t.proc is not None and t.proc.returncode is None:
                sup.signal_task(t, signal.SIGKILL)
        sup.phase, sup.reason = Phase.FAILED, "the supervisor crashed; see supervisor.log"
        for t in sup.tasks.values():
            if t.status.phase not in Phase.TERMINAL:
                t.status.phase, t.status.reason, t.status.pid = Phase.FAILED, "the supervisor crashed", None
        try:
            sup.write_status(done=True)
        except DirReplaced as e:
            sup.abandon(str(e))
        return 1


if __name__ == "__main__":
    sys.exit(main())
