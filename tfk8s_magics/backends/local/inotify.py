"""Wait for changes in a few directories (Linux inotify, through ctypes).

The log follower and the status watcher sleep here instead of polling:
an idle cluster costs nothing, and a new line or status is seen at once.
Where inotify is unavailable, :class:`DirWatcher` degrades to a timed
wait, and callers fall back to checking on every wake-up.
"""

from __future__ import annotations

import ctypes
import os
import select
from pathlib import Path

_IN_MODIFY = 0x00000002
_IN_CLOSE_WRITE = 0x00000008
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_DELETE = 0x00000200
_IN_DELETE_SELF = 0x00000400
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_MASK = _IN_MODIFY | _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE | _IN_DELETE_SELF

try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.inotify_init1.argtypes = [ctypes.c_int]
    _libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
except (OSError, AttributeError):  # not Linux
    _libc = None


class DirWatcher:
    """Wakes up when anything in the given directories is created, written, renamed or removed."""

    def __init__(self, dirs: list[Path]) -> None:
        self.fd: int | None = None
        if _libc is None:
            return
        fd = _libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return
        watched = 0
        for d in dirs:
            if _libc.inotify_add_watch(fd, os.fsencode(str(d)), _MASK) >= 0:
                watched += 1
        if watched:
            self.fd = fd
        else:
            os.close(fd)

    @property
    def active(self) -> bool:
        """Whether changes wake :meth:`wait` (False: it just sleeps for the timeout)."""
        return self.fd is not None

    def wait(self, timeout: float) -> bool:
        """Sleep until a change or ``timeout`` seconds; return whether something changed."""
        if self.fd is None:
            select.select([], [], [], timeout)
            return True  # unknown: the caller must look
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        try:
            while os.read(self.fd, 65536):
                pass
        except BlockingIOError:
            pass
        return True

    def close(self) -> None:
        """Release the inotify descriptor."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> DirWatcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
