"""Tie a process's life to another's, so nothing outlives what owns it.

Two mechanisms, used together:

* :func:`set_parent_death_signal` (Linux ``PR_SET_PDEATHSIG``): the kernel
  signals a child when its parent dies, even by SIGKILL.  Used for task
  processes, whose parent is their cluster's supervisor.
* :func:`exit_with` : a thread that waits on a pidfd of the owner and ends
  this process when the owner exits.  Used where the owner is not the
  parent thread (a notebook kernel owning a supervisor or a TensorBoard).

And the owner's side: :func:`reap_in_background` waits for such a child, so a
supervisor or a TensorBoard that ended is never left as a zombie under the kernel.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
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


def wait_exit(pid: int, timeout: float) -> bool:
    """Wait (on a pidfd, no polling) until ``pid`` exits; return whether it did within ``timeout``."""
    fd = open_pidfd(pid)
    if fd is None:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


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


def reap_in_background(proc: subprocess.Popen) -> threading.Thread:
    """Wait for ``proc`` (a child this process does not wait for itself: a cluster's supervisor,
    a TensorBoard) in a thread, so that it never lingers as a zombie once it has ended."""
    thread = threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True)
    thread.start()
    return thread


# -- process identity: a pid is reused, (pid, start time) is not ------------------------
_PR_SET_CHILD_SUBREAPER = 36


def start_time(pid: int | None) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22), or None.

    A pid alone may name another process after a reboot or a wrap; the pair
    (pid, start time) names one process for the life of the machine.
    """
    if not pid:
        return None
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError, TypeError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def process_state(pid: int) -> str | None:
    """The state letter of ``pid`` (``/proc/<pid>/stat`` field 3: R, S, D, T stopped, t traced,
    Z zombie...), or None when there is no such process."""
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError, TypeError):
        return None


def same_process(pid: object, start: object) -> bool:
    """Whether the process recorded as (``pid``, ``start``) still runs; a record without a start
    time (or a malformed one) is never trusted, so a stale pid cannot hit an unrelated process."""
    if not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(start, int) or pid <= 0:
        return False
    return start_time(pid) == start


def become_subreaper() -> bool:
    """Make orphaned descendants reparent to this process (``PR_SET_CHILD_SUBREAPER``), so a task's
    daemonised grandchild stays known to its supervisor; returns whether the kernel agreed."""
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def children_of(pid: int) -> list[int]:
    """The direct children of ``pid`` (from ``/proc/<pid>/task/*/children``)."""
    out: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return out
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                out += [int(x) for x in f.read().split()]
        except FileNotFoundError:
            continue
    return out


def processes_marked(marker: str, value: str, exclude: frozenset[int] = frozenset()) -> list[int]:
    """Pids of live processes whose environment has ``marker=value`` (those this uid may read).

    Every process of a local cluster carries ``TFK8S_CLUSTER_ID``; its
    descendants inherit it, whatever process group or session they moved to.
    """
    needle = f"{marker}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:  # gone, or not ours to read
            continue
        if needle in env.split(b"\0") and start_time(int(entry)) is not None:
            found.append(int(entry))
    return found


def kill_marked(
    marker: str, value: str, rounds: int = 50, exclude: frozenset[int] = frozenset()
) -> list[int]:
    """SIGKILL every process marked ``marker=value`` (but this one and ``exclude``) until none is
    left; return what still ran after ``rounds`` sweeps (empty on success).  Repeated because a dying
    parent may fork."""
    me = exclude | {os.getpid()}
    left = processes_marked(marker, value, me)
    for _ in range(rounds):
        if not left:
            return []
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in left:  # wait until they are gone (zombies count as gone)
            _wait_gone(pid, 2.0)
        left = processes_marked(marker, value, me)
    return left


def _wait_gone(pid: int, timeout: float) -> None:
    fd = open_pidfd(pid)
    if fd is None:
        return
    try:
        select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
