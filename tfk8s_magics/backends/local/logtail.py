"""Read and follow the log files of a local cluster's tasks."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ..base import LogLine

#: How often the follower looks for new output.  Bounds the print-to-notebook latency.
FOLLOW_INTERVAL = 0.05
#: A line longer than this is cut (the file keeps it whole).
MAX_LINE = 16_384


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
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        self.offset += len(data)
        data = self.partial + data
        *complete, self.partial = data.split(b"\n")
        if len(self.partial) > MAX_LINE:
            complete.append(self.partial)
            self.partial = b""
        return [
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
) -> Iterator[LogLine]:
    """Yield new lines of ``files`` (task → path) as they are written.

    Files that do not exist yet are waited for.  Ends when ``stop`` is set,
    or once ``finished()`` is true and every file has been read to its end.
    """
    cursors = [_FileCursor(task, path, from_start) for task, path in files.items()]
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
        if not got:
            stop.wait(interval)
