"""The local supervisor's stall detector (the rule itself is :mod:`tfk8s_magics.stall`).

It costs one timer per cluster: the supervisor sleeps until the moment the
cluster would become stalled, then looks at the tasks' log and progress
files' modification times.  If something happened meanwhile it sleeps
again until the new moment; if nothing did, the cluster is stalled, and
only then does it watch the log and progress folders (inotify) so the
first new line clears the stall at once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ...stall import Stall, TaskActivity, detect, next_check
from . import logtail
from .inotify import DirWatcher


class StallWatch:
    """Stall state of one local cluster, driven by its supervisor's loop."""

    def __init__(self, log_files: dict[str, Path], log_fds: Mapping[str, int], progress_dir: Path,
                 timeout: float) -> None:
        #: Where the logs are (their dirs are watched after a stall); they are never opened by name:
        #: a FIFO or symlink put there meanwhile would be waited on or followed.
        self.log_files = log_files
        #: The supervisor's own descriptor of each task's log (task → fd), read with fstat/pread.
        self.log_fds = log_fds
        self.progress_dir = progress_dir
        self.timeout = timeout
        self.deadline: float | None = None
        self.stall: Stall | None = None
        self.watcher: DirWatcher | None = None

    def activity(self) -> tuple[list[TaskActivity], list[float]]:
        """Each task's last log line and its time, and the progress files' times."""
        tasks = []
        for task, fd in list(self.log_fds.items()):
            try:
                tasks.append(TaskActivity(task, os.fstat(fd).st_mtime, logtail.last_line(fd)))
            except OSError:
                continue
        progress = []
        for p in self.progress_dir.glob("*.jsonl"):
            try:
                progress.append(p.lstat().st_mtime)  # lstat: nothing there is followed or opened
            except FileNotFoundError:
                pass
        return tasks, progress

    def arm(self, now: float) -> None:
        """The cluster is running: wake up when it would be stalled (if not armed already)."""
        if self.deadline is None and self.stall is None and self.timeout > 0:
            self.deadline = now + self.timeout

    def disarm(self) -> bool:
        """The cluster is not (all) running: forget any stall; return whether one was cleared."""
        self.deadline = None
        return self._clear()

    def check(self, now: float, other_times: list[float | None]) -> Stall | None:
        """At the deadline: the new stall, or None (then the deadline moves on)."""
        if self.deadline is None or now < self.deadline:
            return None
        tasks, progress = self.activity()
        found = detect(True, tasks, [*progress, *other_times], now, self.timeout)
        if found is None:
            self.deadline = next_check(tasks, [*progress, *other_times], self.timeout)
            if self.deadline is not None and self.deadline <= now:
                self.deadline = now + self.timeout
            return None
        self.stall, self.deadline = found, None
        dirs = sorted({p.parent for p in self.log_files.values()} | {self.progress_dir})
        self.watcher = DirWatcher([d for d in dirs if d.is_dir()])
        return found

    def fd(self) -> int | None:
        """The descriptor that becomes readable on the first sign of life after a stall."""
        return self.watcher.fd if self.watcher is not None else None

    def resume(self, now: float) -> bool:
        """Something happened: clear the stall (return whether there was one) and re-arm."""
        cleared = self._clear()
        if self.timeout > 0:
            self.deadline = now + self.timeout
        return cleared

    def _clear(self) -> bool:
        had = self.stall is not None
        self.stall = None
        if self.watcher is not None:
            fd = self.watcher.fd
            if fd is not None:
                try:
                    while os.read(fd, 65536):
                        pass
                except (BlockingIOError, OSError):
                    pass
            self.watcher.close()
            self.watcher = None
        return had
