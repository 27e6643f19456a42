"""The live log stream is adaptive: a quiet stream's line goes out at once, a burst is batched.

Issue 16, item 4.  No assertion here is about wall time: the feed's pacer
runs on a clock and a sleep the test controls, and the follower's
event-driven read is shown by giving it a read interval of an hour (the
old fixed pause would hang the test until its bounded wait fails).  The
chunked file reading is checked line for line against the line-by-line
reading it replaced.
"""

from __future__ import annotations

import gc
import os
import queue
import select
import threading
import time

import pytest

from tfk8s_magics.backends import LogChunk, LogLine
from tfk8s_magics.backends.local import logtail
from tfk8s_magics.backends.pacing import Pacer
from tfk8s_magics.watch import HISTORY_LINES, ClusterFeed, LogBatch

TIMEOUT = 10.0
_BURST_END = object()
_END = object()


class FakeClock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_the_pacer_takes_a_slow_stream_at_once_and_spaces_a_busy_one_out():
    clock = FakeClock()
    p = Pacer(0.02, 0.1, clock=clock)
    assert p.delay(1) == 0  # the first line of all
    p.took()
    for _ in range(5):  # 20 lines/s, slower than one per min_gap: each goes at once
        clock.advance(0.05)
        assert p.delay(1) == 0
        p.took()
    assert p.gap == 0.02 and p.immediate == 6 and p.delayed == 0
    gaps = []
    for _ in range(5):  # a flood: 500 lines are waiting a millisecond after each batch
        clock.advance(0.001)
        wait = p.delay(500)
        assert wait == pytest.approx(p.gap - 0.001)
        clock.advance(wait)
        p.took()
        gaps.append(p.gap)
    assert gaps == pytest.approx([0.04, 0.08, 0.1, 0.1, 0.1])  # doubles, up to the window
    # The flood turns into 20 lines/s: the first line after it goes at once (the gap the
    # flood left behind does not hold a slow stream back), and the gap shrinks again.
    clock.advance(0.05)
    assert p.delay(1) == 0
    p.took()
    assert p.gap == pytest.approx(0.05)
    clock.advance(1.0)  # a quiet spell longer than the window: even a big batch goes at once
    assert p.delay(10_000) == 0
    with pytest.raises(ValueError, match="min_gap <= max_gap"):
        Pacer(0.2, 0.1)


class QueueBackend:
    """Duck-typed backend (no ``follow_log_batches``): log lines are what the test puts."""

    name = "queued"

    def __init__(self) -> None:
        self.q: queue.Queue = queue.Queue()
        self.burst_in = threading.Event()

    def watch(self, name, stop):
        return iter(())

    def follow_logs(self, name, stop, tasks=None, from_start=True):
        while not stop.is_set():
            item = self.q.get(timeout=TIMEOUT)
            if item is _END:
                return
            if item is _BURST_END:
                # Asked for the next line: every line before this mark is in the feed.
                self.burst_in.set()
                continue
            yield item


def test_a_quiet_line_goes_out_alone_at_once_and_a_burst_in_one_batch():
    be = QueueBackend()
    clock = FakeClock()
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:  # the batching window: lasts until the burst is in
        sleeps.append(seconds)
        assert be.burst_in.wait(TIMEOUT)
        clock.advance(seconds)

    feed = ClusterFeed(be, "x", pacer=Pacer(0.02, 0.1, clock=clock, sleep=sleep)).start()
    got: queue.Queue = queue.Queue()
    feed.subscribe(on_logs=got.put)
    try:
        be.q.put(LogLine("worker-0", "first", 1.0))
        assert [ln.text for ln in got.get(timeout=TIMEOUT)] == ["first"]
        assert sleeps == []  # handed out without waiting for any window
        # The clock has not moved: 1500 lines now come faster than the gap.
        burst = [LogLine("worker-0", f"b{i}", 2.0) for i in range(1500)]
        for line in burst:
            be.q.put(line)
        be.q.put(_BURST_END)
        assert got.get(timeout=TIMEOUT) == burst  # one update for the whole burst, in order
        clock.advance(5.0)  # quiet again
        be.q.put(LogLine("ps-0", "after", 3.0))
        assert [ln.text for ln in got.get(timeout=TIMEOUT)] == ["after"]
        be.q.put(_END)
        assert feed.logs_done.wait(TIMEOUT)
        # History (for late views) holds the newest lines of each task, nothing else.
        assert list(feed.history["worker-0"]) == burst[-HISTORY_LINES:]
        assert [ln.text for ln in feed.history["ps-0"]] == ["after"]
        assert got.empty()
    finally:
        be.q.put(_END)
        feed.close()
    for t in feed._threads:
        t.join(TIMEOUT)
    assert not feed.running
    # One wait, for the burst; the two lines after quiet went out at once.
    assert sleeps == [pytest.approx(0.02)]
    assert (feed.pacer.immediate, feed.pacer.delayed) == (2, 1)


def test_the_follower_reads_a_line_after_a_quiet_spell_without_waiting_its_interval(tmp_path):
    """With an hour between reads under load, a line after quiet must still come at once."""
    path = tmp_path / "worker-0.log"
    path.write_bytes(b"")
    stop = threading.Event()
    got: queue.Queue = queue.Queue()

    def run() -> None:
        for chunk in logtail.follow_batches({"worker-0": path}, stop, lambda: False, interval=3600):
            got.put(chunk)

    reader = threading.Thread(target=run, daemon=True)
    reader.start()
    try:
        for text in ("one", "two", "three"):
            with open(path, "ab") as f:
                f.write(text.encode() + b"\n")
            chunk = got.get(timeout=TIMEOUT)
            assert chunk.texts == [text] and chunk.task == "worker-0"
    finally:
        stop.set()
        reader.join(TIMEOUT)
    assert not reader.is_alive()


def _inotify_masks(directory) -> list[int]:
    """The masks of this process's inotify watches on ``directory`` (from ``/proc/self/fdinfo``)."""
    ino = format(os.stat(directory).st_ino, "x")
    masks = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:inotify":
                continue
            with open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as f:
                info = f.read()
        except OSError:
            continue  # closed meanwhile
        for line in info.splitlines():
            fields = dict(kv.split(":", 1) for kv in line.split()[1:] if ":" in kv)
            if line.startswith("inotify ") and fields.get("ino") == ino:
                masks.append(int(fields["mask"], 16))
    return masks


def _inotify_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")
            if _readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"}


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


IN_MODIFY = 0x2


def test_a_busy_stream_is_read_on_a_timer_and_its_writes_make_no_inotify_event(tmp_path):
    """Issue 16: a task printing in a flood lost a quarter of its lines/s to the kernel queueing an
    inotify event for each of its write()s into the watched log dir.  While the stream is busy the
    follower's watch must not ask for writes, the kernel must queue nothing for them, and once the
    stream is quiet a line must wake the follower again — nothing lost across the switches."""
    path = tmp_path / "worker-0.log"
    path.write_bytes(b"")
    skew = [0.0]  # the pacer's clock is monotonic + skew; its sleeps only move the skew
    pacer = Pacer(0.005, 3600, clock=lambda: time.monotonic() + skew[0],
                  sleep=lambda s: skew.__setitem__(0, skew[0] + s))
    stop = threading.Event()
    before = _inotify_fds()
    gen = logtail.follow_batches({"worker-0": path}, stop, lambda: False, pacer=pacer)

    def write(prefix: str, n: int) -> list[str]:
        lines = [f"{prefix}{i}" for i in range(n)]
        with open(path, "ab") as f:
            for line in lines:  # one write() per line, as an unbuffered print does
                f.write(line.encode() + b"\n")
                f.flush()
        return lines

    written = write("a", 2000)
    got = list(next(gen).texts)
    assert got == written and all(m & IN_MODIFY for m in _inotify_masks(tmp_path))
    written += write("b", 2000)  # 2000 lines right after a read: busy
    got += next(gen).texts
    masks = _inotify_masks(tmp_path)
    assert masks and not any(m & IN_MODIFY for m in masks), "a busy stream still asks for writes"
    (watch_fd,) = _inotify_fds() - before
    written += write("c", 500)
    assert select.select([watch_fd], [], [], 0)[0] == [], "a write in a busy stream made an event"
    got += next(gen).texts

    def quiet_line() -> None:  # an hour later (on the pacer's clock): the stream is quiet
        skew[0] += 7200
        written.extend(write("d", 1))

    timer = threading.Timer(0.2, quiet_line)
    timer.start()
    try:
        got += next(gen).texts  # nothing more of the burst: write events on, then the quiet line
        assert all(m & IN_MODIFY for m in _inotify_masks(tmp_path))
    finally:
        timer.join(TIMEOUT)
        stop.set()
        gen.close()
    assert got == written
    assert _inotify_fds() == before


def _reference_lines(chunks: list[bytes]) -> list[str]:
    """The line-by-line reading the chunked one replaced (its rules, one line at a time)."""
    out, partial = [], b""
    for data in chunks:
        *complete, partial = (partial + data).split(b"\n")
        if len(partial) > logtail.MAX_LINE:
            complete.append(partial)
            partial = b""
        out += [line[:logtail.MAX_LINE].decode("utf-8", "replace").rstrip("\r") for line in complete]
    return out


@pytest.mark.parametrize("chunks", [
    [b"plain\nlines\n"],
    [b"windows\r\nline\r\n", b"half a li", b"ne\n"],
    [b"bad \xff\xfe utf8\n\xe2\x82\n\xe2\x82\xac ok\n", b"cut \xe2", b"\x82\xac across reads\n"],
    [("\u20ac" * (logtail.MAX_LINE // 2)).encode() + b"\nshort\n"],  # long in bytes, not chars
    [b"x" * (logtail.MAX_LINE + 10)] + [b"y" * 100 + b"\n"],  # an endless line is shown cut
    [b"a\n" * 20_000 + b"\xff" * (logtail.MAX_LINE + 1) + b"\n"],
])
def test_chunked_reading_yields_what_line_by_line_reading_did(tmp_path, chunks):
    path = tmp_path / "t.log"
    path.write_bytes(b"")
    cursor = logtail._FileCursor("t", path, from_start=True)
    got = []
    for data in chunks:
        with open(path, "ab") as f:
            f.write(data)
        got += cursor.read()
    assert got == _reference_lines(chunks)
    assert cursor.read() == []
    assert LogLine.many("t", ["a", "b"], 1.0) == [LogLine("t", "a", 1.0), LogLine("t", "b", 1.0)]
    assert all(type(ln) is LogLine for ln in LogLine.many("t", ["a"], 1.0))


class FakeOutput:
    """The parts of ``ipywidgets.Output`` the live view uses."""

    def __init__(self) -> None:
        self.outputs: tuple = ()
        self.appends = 0

    def append_stdout(self, text: str) -> None:
        self.outputs = (*self.outputs, {"output_type": "stream", "name": "stdout", "text": text})
        self.appends += 1

    def text(self) -> str:
        return "".join(o["text"] for o in self.outputs)


class Counted(str):
    """A line text that counts how often the view formats it."""

    formatted = 0

    def __format__(self, spec: str) -> str:
        Counted.formatted += 1
        return str.__format__(self, spec)


def test_the_live_view_formats_only_what_a_flood_leaves_visible(capsys):
    from tfk8s_magics.ui.live import LogOutput
    from tfk8s_magics.ui.logview import LogView

    view = LogView(backend=None, name="demo", max_lines=50)
    out = FakeOutput()
    view._output = LogOutput(out, 50)
    Counted.formatted = 0
    view._on_logs([LogLine("worker-0", Counted(f"a{i}")) for i in range(10)])
    assert out.text() == "".join(f"[worker-0] a{i}\n" for i in range(10)) and out.appends == 1
    view._on_logs([LogLine("worker-0", Counted(f"f{i}")) for i in range(5000)])
    shown = out.text().splitlines()
    # One re-base: a head saying where the rest is, then the newest 50 lines, no silent gap.
    assert shown[0] == "… 4960 earlier lines are in the log files (%tfcluster logs demo)"
    assert shown[1:] == [f"[worker-0] f{i}" for i in range(4950, 5000)] == list(view.lines)
    assert view.dropped == 4960 and Counted.formatted == 10 + 50  # not 5010
    view._on_logs([LogLine("worker-0", "next")])
    assert out.text().endswith("[worker-0] f4999\n[worker-0] next\n") and view.dropped == 4961
    printed = LogView(backend=None, name="demo", max_lines=50)  # no widget: every line printed
    printed._on_logs([LogLine("worker-0", f"p{i}") for i in range(200)])
    assert capsys.readouterr().out.splitlines() == [f"[worker-0] p{i}" for i in range(200)]


def test_a_batch_is_a_sequence_of_the_lines_it_was_read_as():
    chunks = [LogChunk("ps-0", ["p0", "p1"], 1.0), LogChunk("worker-0", [], 2.0),
              LogChunk("worker-0", ["w0", "w1", "w2"], 3.0)]
    lines = [ln for c in chunks for ln in c.lines()]
    batch = LogBatch(chunks)
    assert len(batch) == 5 and batch == lines and list(batch) == lines
    assert list(reversed(batch)) == lines[::-1]
    for i in range(-5, 5):
        assert batch[i] == lines[i]
    for sl in (slice(None), slice(1, 4), slice(-2, None), slice(-50, 2), slice(4, 1), slice(None, None, 2)):
        assert batch[sl] == lines[sl], sl
    with pytest.raises(IndexError):
        batch[5]
    assert LogBatch([]) == [] and not LogBatch([])


def test_a_flood_handed_out_line_by_line_leaves_the_garbage_collector_idle():
    # LogLine is a tuple subclass: tracked by the collector for life.  A flood made into
    # LogLines at once (for the batch, or for the history) promotes tens of thousands of them
    # per batch, and the kernel pays with full collections; kept as strings and looked at one
    # by one, none survives to a collection.
    texts = [f"line {i}" for i in range(70_000)]
    feed = ClusterFeed(QueueBackend(), "x")  # not started: _flush is driven by hand
    shown = []
    feed.subscribe(on_logs=lambda batch: shown.append(sum(len(ln.text) for ln in batch)))
    gc.collect()
    before = gc.get_stats()[0]["collections"]
    feed._pending = [LogChunk("worker-0", texts, 1.0)]
    assert feed._flush()
    lazy = gc.get_stats()[0]["collections"] - before
    before = gc.get_stats()[0]["collections"]
    listed = sum(len(ln.text) for ln in LogChunk("worker-0", texts, 1.0).lines())
    eager = gc.get_stats()[0]["collections"] - before
    assert shown == [listed]
    assert eager >= 50 and lazy <= 5, (eager, lazy)
    assert [ln.text for ln in feed.history["worker-0"]] == texts[-HISTORY_LINES:]
