"""Tie a process's life to another's, so nothing outlives what owns it.

Two mechanisms, used together:

* :func:`set_parent_death_signal` (Linux ``PR_SET_PDEATHSIG``): the kernel
  signals a child when its parent dies, even by SIGKILL.  Used for task
  processes, whose parent is their cluster's supervisor.
* :func:`exit_with` : a thread that waits on a pidfd of the owner and ends
  this process when the owner exits.  Used where the owner is not the
  parent thread (a notebook kernel owning a supervisor or a TensorBoard).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import threading
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGKILL, expected_parent: int | None = None) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies.

    Meant for ``preexec_fn``.  If the parent is already gone (it is no
    longer ``expected_parent``), exit at once instead.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid`` (readable once it exits), or None if it is gone already."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None


def pid_alive(pid: int | None) -> bool:
    """Whether a process with this pid exists (and is not a zombie)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def exit_with(owner_pid: int, on_exit: Callable[[], None] | None = None) -> threading.Thread | None:
    """End this process when ``owner_pid`` exits (after calling ``on_exit``)."""
    fd = open_pidfd(owner_pid)

    def wait() -> None:
        if fd is not None:
            select.select([fd], [], [])
        if on_exit is not None:
            on_exit()
        os._exit(0)

    if fd is None:
        wait()
        return None
    thread = threading.Thread(target=wait, name=f"lifeline-{owner_pid}", daemon=True)
    thread.start()
    return thread
