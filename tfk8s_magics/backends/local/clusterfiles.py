"""The files a supervisor writes, through the one handle it trusts: its cluster's directory.

The supervisor holds the cluster dir open (:class:`ClusterFiles`) and writes
``status.json``, ``events.jsonl`` and ``cluster.json`` through that handle, so a
dir that was removed or replaced (a new cluster of the same name) is never
written: :meth:`ClusterFiles.check_identity` raises :class:`DirReplaced` once
the path no longer names that dir with the record's ``id``.  Task logs are
opened without following a symlink at any level the lab creates; a task's
runtime leaves why it could not run in its termination file.

A full disk is an answer here, not a crash: an event that cannot be written
is said on the supervisor's own output (which may be full too: :func:`say`
never raises), and a status that no new file can hold is written over the old
one (:func:`~.layout.overwrite_json`).  Deciding what a full disk does to the
cluster is the supervisor's (:meth:`~.supervisor.Supervisor.disk_full`).
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ... import lifecycle
from ...runtime.exitcodes import PORT_TAKEN_MARK
from .layout import (
    ClusterDir,
    open_private_append,
    overwrite_json,
    read_json,
    task_log_path,
    write_json_atomic,
)

#: Seconds between checks that the cluster dir is still this cluster's.
IDENTITY_CHECK = 1.0
#: The errors of a write to a full disk (or a full quota).
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class DirReplaced(Exception):
    """The cluster's directory was removed or now belongs to another cluster."""


def say(line: str) -> None:
    """Print ``line`` to the supervisor's log, which may be on a full disk: never raises."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


class ClusterFiles:
    """The cluster dir as the supervisor holds it: events, status, record, logs, identity."""

    def __init__(self, cdir: ClusterDir, cluster_id: str) -> None:
        self.cdir = cdir
        self.cluster_id = cluster_id
        # Held for life: every write goes through it, so a replaced dir is never written.
        self.dir_fd = os.open(cdir.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.dir_ino = os.fstat(self.dir_fd).st_ino
        #: When the dir's identity is checked next (a status write checks it too).
        self.identity_at = time.time() + IDENTITY_CHECK

    # -- events and status ------------------------------------------------------------------
    def append_event(self, task: str, reason: str, message: str, type_: str) -> OSError | None:
        """Append an event to ``events.jsonl``; the error if it could not be written (said too)."""
        line = json.dumps(
            {"time": time.time(), "task": task, "reason": reason, "message": message, "type": type_}
        )
        try:
            with open_private_append(self.cdir.events.name, self.dir_fd) as f:
                f.write((line + "\n").encode())
        except OSError as e:  # the status still says what happened; say it here too
            say(f"tfk8s: cannot write {self.cdir.events}: {e.strerror or e}")
            return e
        return None

    def write_status(self, status: Callable[[], dict], on_full: Callable[[], None]) -> bool:
        """Rewrite ``status.json`` with ``status()`` atomically; whether it was written.  On a full
        disk ``on_full()`` runs first (it may change what the status says), then the status is
        written over the old one; if even that fails, False (the caller tries again later)."""
        self.check_identity()
        try:
            write_json_atomic(self.cdir.status, status(), dir_fd=self.dir_fd)
        except OSError as e:
            if e.errno not in DISK_FULL:
                raise
            on_full()
            try:
                overwrite_json(self.cdir.status, status(), self.dir_fd)
            except OSError as again:  # no block left even for that
                say(f"tfk8s: cannot write {self.cdir.status}: {again.strerror or again}")
                return False
        return True

    def write_record(self, record: dict) -> None:
        """Rewrite ``cluster.json`` (new addresses); raises OSError naming the path."""
        try:
            write_json_atomic(self.cdir.record, record, dir_fd=self.dir_fd)
        except OSError as e:
            raise OSError(e.errno, e.strerror, str(self.cdir.record)) from None

    def disk_is_full(self) -> bool:
        """Whether the disk holding the cluster dir has no free block left for its user."""
        try:
            return os.statvfs(self.dir_fd).f_bavail == 0
        except OSError:
            return False

    # -- the dir's identity -----------------------------------------------------------------
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

    # -- a task's files -----------------------------------------------------------------------
    def open_log(self, log_dir: str, task: str, restarts: int):
        """The task's log, opened for appending without following a symlink at any level we create
        (``tasks/`` and the file); the restart banner written.  Raises OSError naming the path."""
        log_path = task_log_path(log_dir, task)
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
            if restarts:
                log.write(f"tfk8s: --- restart {restarts} of {task} ---\n".encode())
                log.flush()
        except OSError as e:
            log.close()
            raise OSError(e.errno, e.strerror, str(log_path)) from None
        return log

    def termination_file(self, task: str) -> Path:
        """Where the task's runtime says why it cannot run (``progress/<task>.end``)."""
        return self.cdir.progress_dir / f"{task}.end"

    def termination_reason(self, task: str) -> str:
        """What this try's runtime wrote (the file is removed after reading):
        :data:`lifecycle.SCRIPT_BROKEN`, :data:`PORT_TAKEN_MARK`, or "" (exit 3 alone is the
        script's own ``sys.exit(3)``)."""
        path = self.termination_file(task)
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
