"""Read and follow the log files of a local cluster's tasks."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ..base import LogChunk, LogLine, overwritten
from ..pacing import Pacer
from .inotify import DirWatcher
from .layout import open_for_reading

#: Longest pause between reads that found output, reached only while the
#: tasks keep writing (a flood is taken in batches, not in a busy loop).
#: A follower sleeps in inotify and reads the moment a task writes after a
#: quiet spell; the pause grows from ``FOLLOW_MIN_GAP`` only under load
#: (:class:`~..pacing.Pacer`).
FOLLOW_INTERVAL = 0.05
#: Shortest pause between reads that found output.
FOLLOW_MIN_GAP = 0.005
#: Longest sleep of an idle follower (it still wakes at once on output).
IDLE_WAKEUP = 1.0
#: A line longer than this is cut (the file keeps it whole).
MAX_LINE = 16_384
#: When a file grew by more than this since the last read, the live stream
#: jumps to its newest ``CATCHUP_KEEP`` bytes and says so: a flood must not
#: swamp the notebook (the file keeps every byte).
MAX_BACKLOG = 512 * 1024
CATCHUP_KEEP = 64 * 1024


#: ``--tail`` reads at most this many bytes from the end of a file, whatever the line count.
MAX_TAIL_BYTES = 1024 * 1024
#: Without ``--tail``, at most this many bytes are read (the newest; the file keeps everything).
MAX_READ_BYTES = 32 * 1024 * 1024


def refused(path: Path, e: OSError) -> str:
    """The line shown in place of a file that is not read (a symlink, a FIFO, a device...)."""
    return (f"tfk8s: {path} was not read: {e.strerror or e}. A task's log is a regular file the "
            "cluster made; remove what is there instead.")


def tail_lines(path: Path, n: int | None, max_bytes: int = MAX_TAIL_BYTES) -> list[str]:
    """The last ``n`` lines of a file (all of it, up to :data:`MAX_READ_BYTES`, when ``n`` is None),
    read from the end.

    Opened as it was written (:func:`.layout.open_for_reading`: no symlink, FIFO or device is
    opened or waited on; one line says so instead).  Linear in what it reads: blocks are read
    backwards once each and newlines counted per block.  At most ``max_bytes`` are read (an
    earlier part is announced, not shown); any line is cut at :data:`MAX_LINE` bytes.
    """
    if n is None:
        max_bytes = max(max_bytes, MAX_READ_BYTES)
    try:
        with _open(path) as f:
            data, skipped = _read_tail(f, n, max_bytes)
    except FileNotFoundError:
        return []
    except OSError as e:
        return [refused(path, e)]
    lines = [_cut(line) for line in data.split(b"\n")]
    if lines and lines[-1] == "":
        lines.pop()  # the file ends with a newline
    if n is not None:
        lines = lines[-n:] if n else []
    if skipped and lines:
        how = "--tail reads" if n is not None else "logs read"
        lines.insert(0, f"tfk8s: ... {skipped} earlier bytes not shown ({how} at most {max_bytes} "
                        f"bytes); the file keeps everything ({path})")
    return lines


def _open(path: Path):
    """The one way a log is opened here: :func:`.layout.open_for_reading`, as a binary file."""
    return os.fdopen(open_for_reading(path), "rb")


def last_line(fd: int, max_bytes: int = 65536) -> str:
    """The last line of the open file ``fd`` (read with ``pread`` from its end: the descriptor's
    offset is left alone), cut at :data:`MAX_LINE`; "" for an empty file."""
    size = os.fstat(fd).st_size
    start = max(0, size - max_bytes)
    data = os.pread(fd, size - start, start).rstrip(b"\n")
    return _cut(data.rpartition(b"\n")[2]) if data else ""


def _read_tail(f, n: int | None, max_bytes: int) -> tuple[bytes, int]:
    """The bytes holding the last ``n`` lines (every line when None) or the last ``max_bytes``,
    and how many came before."""
    end = f.seek(0, os.SEEK_END)
    if n is None:
        n = end  # more newlines than the file can hold: read back to max_bytes
    pos, chunks, newlines, block = end, [], 0, 65536
    limit = max(0, end - max_bytes)
    while pos > limit and newlines <= n:
        start = max(limit, pos - block)
        f.seek(start)
        chunk = f.read(pos - start)
        chunks.append(chunk)
        newlines += chunk.count(b"\n")
        pos = start
    data = b"".join(reversed(chunks))
    if pos == 0 or newlines > n:
        return data, 0
    # Cut by bytes, not by lines: the first line read is a fragment (unless it is all one line).
    rest = data.partition(b"\n")[2] if b"\n" in data[:-1] else data
    return rest, pos + len(data) - len(rest)


def _cut(line: bytes) -> str:
    text = overwritten(line[:MAX_LINE].decode("utf-8", "replace"))
    return text + f" [... line cut: {len(line)} bytes]" if len(line) > MAX_LINE else text


class _FileCursor:
    def __init__(self, task: str, path: Path, from_start: bool) -> None:
        self.task = task
        self.path = path
        self.offset = 0
        self.partial = b""
        self.updated = b""  # the unfinished line's state last handed out as an update
        #: Why the file at ``path`` is not read (said once, until it changes).
        self.refused = ""
        if not from_start:
            try:
                self.offset = path.lstat().st_size
            except FileNotFoundError:
                self.offset = 0

    def read(self) -> list[str]:
        """The lines written since the last read (a note in place of a skipped flood, or of a file
        that is not read: :func:`.layout.open_for_reading`)."""
        try:
            f = _open(self.path)
        except FileNotFoundError:
            return []
        except OSError as e:
            note = refused(self.path, e)
            if note == self.refused:
                return []
            self.refused = note
            return [note]
        self.refused = ""
        with f:
            size = os.fstat(f.fileno()).st_size
            if size < self.offset:  # truncated: start over
                self.offset = 0
            if size == self.offset:
                return []
            skipped = 0
            if size - self.offset > MAX_BACKLOG:
                skipped = size - CATCHUP_KEEP - self.offset
                self.offset = size - CATCHUP_KEEP
                self.partial = b""
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
            head = [note]
        else:
            head = []
        return head + self._lines(self.partial + data)

    def _lines(self, data: bytes) -> list[str]:
        """The complete lines of ``data`` (the rest is kept for the next read).

        The chunk is decoded in one call, not line by line ("\\n" never occurs
        inside a UTF-8 sequence, so the result is the same): in a flood,
        per-line Python work is what the kernel pays for.
        """
        cut = data.rfind(b"\n")
        whole, self.partial = (data[:cut], data[cut + 1:]) if cut >= 0 else (b"", data)
        texts = whole.decode("utf-8", "replace").split("\n") if cut >= 0 else []
        if len(whole) > MAX_LINE and max(map(len, texts)) > MAX_LINE // 4:
            # Some line may be longer than MAX_LINE bytes: cut each in bytes, as the rule says.
            texts = [line[:MAX_LINE].decode("utf-8", "replace") for line in whole.split(b"\n")]
        if cut >= 0:
            self.updated = b""
        if b"\r" in whole:
            texts = [overwritten(t) for t in texts]
        if b"\r" in self.partial:
            texts.extend(self._update())
        if len(self.partial) > MAX_LINE:  # one endless line: show its start now
            texts.append(self.partial[:MAX_LINE].decode("utf-8", "replace"))
            self.partial = b""
        return texts

    def _update(self) -> list[str]:
        """The unfinished line, rewritten by carriage returns (a progress bar), as an update: a text
        that starts with ``\r``, which a view shows in place of the previous one (the finished line
        replaces it).  Only what the last ``\r`` left is kept (a bar redrawn for an hour is one
        state, not an hour of them)."""
        head, _, last = self.partial.rpartition(b"\r")
        ends = not last
        if ends:  # it ends with "\r": the state before it is shown until more comes
            last = head.rpartition(b"\r")[2]
        self.partial = b"\r" + last + (b"\r" if ends else b"")
        if not last or last == self.updated:
            return []
        self.updated = last
        return ["\r" + last[:MAX_LINE].decode("utf-8", "replace")]

    def drain(self) -> list[str]:
        """Read to the end, the unfinished last line included (the task has ended)."""
        out = self.read()
        if self.partial:
            out.append(overwritten(self.partial.decode("utf-8", "replace")))
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
    """Yield new lines of ``files`` (task → path) as they are written (see :func:`follow_batches`)."""
    for chunk in follow_batches(files, stop, finished, from_start, interval, wake_dirs):
        yield from chunk.lines()


def follow_batches(
    files: dict[str, Path],
    stop: threading.Event,
    finished: Callable[[], bool],
    from_start: bool = True,
    interval: float = FOLLOW_INTERVAL,
    wake_dirs: list[Path] | None = None,
    pacer: Pacer | None = None,
) -> Iterator[LogChunk]:
    """Yield the new lines of ``files`` (task → path), a :class:`LogChunk` per task and read.

    Files that do not exist yet are waited for.  Sleeps in inotify on the
    files' directories (plus ``wake_dirs``, e.g. where the status lives)
    and reads as soon as a task writes; only while the tasks keep writing
    do reads space out, up to ``interval`` apart (:class:`~..pacing.Pacer`).
    While they do, the watch stops asking for write events and the files are
    read on that timer instead: an event per ``write()`` costs the *writer*
    (a task printing in a flood) a quarter of its lines/s (:mod:`.inotify`).
    The first read that finds the stream slower than one line per
    ``FOLLOW_MIN_GAP`` (or nothing) turns write events back on, then reads
    once more, so no line is missed and the next quiet line is read at once.
    Ends when ``stop`` is set, or once ``finished()`` is true and every
    file has been read to its end.  ``pacer`` replaces the one made from
    ``interval`` (tests give one with their own clock).
    """
    cursors = [_FileCursor(task, path, from_start) for task, path in files.items()]
    dirs = sorted({p.parent for p in files.values()} | set(wake_dirs or ()))
    pacer = pacer or Pacer(min(FOLLOW_MIN_GAP, interval), interval, sleep=stop.wait)
    last = 0
    with DirWatcher([d for d in dirs if d.exists()]) as watcher:
        while not stop.is_set():
            done = finished()  # checked before reading, so nothing written before it is missed
            now = time.time()
            got = 0
            for c in cursors:
                texts = c.drain() if done else c.read()
                if texts:
                    got += len(texts)
                    yield LogChunk(c.task, texts, now)
            if done:
                return
            if not watcher.writes:  # busy: read on a timer, the writes make no events
                if got:
                    last = got
                    if pacer.took_polled(got):
                        pacer.sleep(pacer.gap)
                        continue
                watcher.watch_writes(True)  # slow or quiet again: wake on the next write,
                continue  # after one more read (a write made before this has no event)
            if got:
                pacer.took()
                last = got  # the pace of the last read stands for what is coming
            watcher.wait(IDLE_WAKEUP if watcher.active else interval)
            delay = pacer.delay(last)
            if delay:  # the tasks write faster than min_gap: let more gather, on a timer
                watcher.watch_writes(False)
                pacer.sleep(delay)
