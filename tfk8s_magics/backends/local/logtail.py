"""Read and follow the log files of a local cluster's tasks."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ..base import LogLine
from .inotify import DirWatcher

#: After a read that found output, wait this long before reading again, so a
#: flood is taken in batches rather than in a busy loop.  An idle follower
#: sleeps in inotify and wakes the moment a task writes.
FOLLOW_INTERVAL = 0.05
#: Longest sleep of an idle follower (it still wakes at once on output).
IDLE_WAKEUP = 1.0
#: A line longer than this is cut (the file keeps it whole).
MAX_LINE = 16_384
#: When a file grew by more than this since the last read, the live stream
#: jumps to its newest ``CATCHUP_KEEP`` bytes and says so: a flood must not
#: swamp the notebook (the file keeps every byte).
MAX_BACKLOG = 512 * 1024
CATCHUP_KEEP = 64 * 1024


def tail_lines(path: Path, n: int | None) -> list[str]:
    """The last ``n`` lines of a file (all of it when ``n`` is None), read from the end."""
    try:
        with open(path, "rb") as f:
            if n is None:
                data = f.read()
            else:
                f.seek(0, os.SEEK_END)
                end = f.tell()
                block, data = 65536, b""
                pos = end
                while pos > 0 and data.count(b"\n") <= n:
                    pos = max(0, pos - block)
                    f.seek(pos)
                    data = f.read(end - pos)
    except FileNotFoundError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    return lines if n is None else lines[-n:] if n else []


class _FileCursor:
    def __init__(self, task: str, path: Path, from_start: bool) -> None:
        self.task = task
        self.path = path
        self.offset = 0
        self.partial = b""
        if not from_start:
            try:
                self.offset = path.stat().st_size
            except FileNotFoundError:
                self.offset = 0

    def read(self, now: float) -> list[LogLine]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self.offset:  # truncated: start over
            self.offset = 0
        if size == self.offset:
            return []
        skipped = 0
        if size - self.offset > MAX_BACKLOG:
            skipped = size - CATCHUP_KEEP - self.offset
            self.offset = size - CATCHUP_KEEP
            self.partial = b""
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        self.offset += len(data)
        if skipped:
            whole = len(data)
            rest = data.partition(b"\n")[2]
            if rest:  # resume at a line start (unless it is all one long line)
                data = rest
            skipped += whole - len(data)
            note = (f"tfk8s: ... {skipped} bytes of fast output skipped here; "
                    f"the log file keeps everything ({self.path})")
            head = [LogLine(self.task, note, now)]
        else:
            head = []
        data = self.partial + data
        *complete, self.partial = data.split(b"\n")
        if len(self.partial) > MAX_LINE:
            complete.append(self.partial)
            self.partial = b""
        return head + [
            LogLine(self.task, line[:MAX_LINE].decode("utf-8", "replace").rstrip("\r"), now)
            for line in complete
        ]

    def drain(self, now: float) -> list[LogLine]:
        out = self.read(now)
        if self.partial:
            out.append(LogLine(self.task, self.partial.decode("utf-8", "replace"), now))
            self.partial = b""
        return out


def follow(
    files: dict[str, Path],
    stop: threading.Event,
    finished: Callable[[], bool],
    from_start: bool = True,
    interval: float = FOLLOW_INTERVAL,
    wake_dirs: list[Path] | None = None,
) -> Iterator[LogLine]:
    """Yield new lines of ``files`` (task → path) as they are written.

    Files that do not exist yet are waited for.  Sleeps in inotify on the
    files' directories (plus ``wake_dirs``, e.g. where the status lives)
    between reads.  Ends when ``stop`` is set, or once ``finished()`` is
    true and every file has been read to its end.
    """
    cursors = [_FileCursor(task, path, from_start) for task, path in files.items()]
    dirs = sorted({p.parent for p in files.values()} | set(wake_dirs or ()))
    with DirWatcher([d for d in dirs if d.exists()]) as watcher:
        while not stop.is_set():
            done = finished()  # checked before reading, so nothing written before it is missed
            now = time.time()
            got = False
            for c in cursors:
                lines = c.drain(now) if done else c.read(now)
                got = got or bool(lines)
                yield from lines
            if done:
                return
            if got:
                stop.wait(interval)
            else:
                watcher.wait(IDLE_WAKEUP if watcher.active else interval)
