"""Bounded reads (issue 14): ``--tail`` bounds bytes and lines; scripts are regular files under a limit."""

import os
import threading

import pytest

import tfk8s_magics as tk
from tfk8s_magics.api import MAX_READ_BYTES
from tfk8s_magics.backends.local import logtail

REAL_OPEN = logtail._open


class CountingOpen:
    """Wraps logtail's one way of opening a log (``_open``) to count the bytes tail_lines reads."""

    def __init__(self):
        self.read = 0
        self.opened = 0

    def __call__(self, path):
        f = REAL_OPEN(path)
        self.opened += 1
        outer = self
        real_read = f.read

        def read(n=-1):
            data = real_read(n)
            outer.read += len(data)
            return data

        f.read = read
        return f


def test_tail_of_one_huge_line_reads_a_bounded_number_of_bytes(tmp_path, monkeypatch):
    log = tmp_path / "w.log"
    log.write_bytes(b"y" * (40 * 1024 * 1024))  # one 40 MB line, no newline
    counter = CountingOpen()
    monkeypatch.setattr(logtail, "_open", counter)
    lines = logtail.tail_lines(log, 5)
    assert counter.opened == 1 and 0 < counter.read <= logtail.MAX_TAIL_BYTES
    skipped = 40 * 1024 * 1024 - logtail.MAX_TAIL_BYTES
    assert lines[0].startswith(f"tfk8s: ... {skipped} earlier bytes not shown")
    assert len(lines) == 2 and lines[1].endswith(f"[... line cut: {logtail.MAX_TAIL_BYTES} bytes]")
    assert len(lines[1]) < logtail.MAX_LINE + 100, "a line is cut, never printed whole"


def test_tail_counts_lines_from_the_end_and_keeps_short_files_whole(tmp_path):
    log = tmp_path / "w.log"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(100_000)))
    assert logtail.tail_lines(log, 3) == ["line 99997", "line 99998", "line 99999"]
    assert logtail.tail_lines(log, 0) == []
    log.write_bytes(b"a\r\nb\nlast without newline")
    assert logtail.tail_lines(log, 10) == ["a", "b", "last without newline"]
    assert logtail.tail_lines(log, None) == ["a", "b", "last without newline"]
    assert logtail.tail_lines(tmp_path / "missing.log", 5) == []


@pytest.mark.parametrize("kind", ["device", "fifo", "big", "directory"])
def test_a_script_must_be_a_regular_file_under_the_limit(tmp_path, kind):
    if kind == "device":
        path = "/dev/zero"
    elif kind == "fifo":
        path = str(tmp_path / "pipe")
        os.mkfifo(path)
    elif kind == "directory":
        path = str(tmp_path)
    else:
        path = str(tmp_path / "big.py")
        with open(path, "w") as f:
            f.write("#" * (MAX_READ_BYTES + 1))
    result = {}

    def attempt():
        try:
            tk.make_spec("bounded", script_path=path)
        except tk.SpecError as e:
            result["error"] = str(e)

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(timeout=20)  # a FIFO must not block, /dev/zero must not be read to the end
    assert not t.is_alive(), f"reading {kind} did not return"
    expected = {
        "device": "is not a regular file (a device, FIFO or socket)",
        "fifo": "is not a regular file (a device, FIFO or socket)",
        "directory": "is a directory",
        "big": f"is larger than {MAX_READ_BYTES} bytes",
    }[kind]
    assert result["error"].startswith(f"--script {path!r} {expected}"), result
