"""A cluster's watchdog: the one thing that outlives a SIGKILLed supervisor and cleans up after it.

``PR_SET_PDEATHSIG`` reaches a task (the supervisor's child) but not the
task's own children, and a supervisor killed by SIGKILL runs no code.  So
the supervisor forks this watchdog first (before any task exists, while it
is single-threaded): it sits in a new session, blocked on a pidfd of the
supervisor, and when the supervisor ends — however it ends — it SIGKILLs
every process that carries the cluster's ``TFK8S_CLUSTER_ID`` (tasks and
whatever they started, in any process group or session) and exits.  After
a clean end there is nothing left to kill and it exits at once.

What it cannot catch: a descendant that scrubbed its environment (``exec``
with an empty env).  The process group and the supervisor's subreaper
still catch those while the supervisor lives; see README "Local isolation".
"""

from __future__ import annotations

import os
import select
import signal
from pathlib import Path

from ...lifeline import kill_marked, open_pidfd, start_time

#: The environment variable that marks every process of one local cluster.
CLUSTER_ID_ENV = "TFK8S_CLUSTER_ID"


def fork_watchdog(cluster_id: str) -> int:
    """Fork the watchdog of this process (the supervisor); return its pid (in the parent)."""
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: never returns
        os.setsid()  # a signal to the supervisor's group or session does not reach it
        for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        fd = open_pidfd(parent)
        os.closerange(3, fd if fd is not None else 3)  # keep nothing of the supervisor's open
        if fd is not None:
            os.closerange(fd + 1, 65536)
            select.select([fd], [], [])
        kill_marked(CLUSTER_ID_ENV, cluster_id)
    finally:
        os._exit(0)


def cluster_processes(root: Path, cluster_id: str | None) -> list[int]:
    """Pids of live processes of the cluster in ``root``: marked with its id, or (when the record is
    unreadable and the id unknown) a supervisor of ``root`` or a task writing progress under it."""
    me, prefix = os.getpid(), (str(root) + "/").encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        mine = cluster_id is not None and f"{CLUSTER_ID_ENV}={cluster_id}".encode() in env
        mine = mine or any(v.startswith(b"TFK8S_PROGRESS_FILE=" + prefix) for v in env)
        mine = mine or (_SUPERVISOR_MODULE in argv and str(root).encode() in argv)
        if mine and start_time(int(entry)) is not None:
            found.append(int(entry))
    return found


def describe(pids: list[int]) -> str:
    """``pid (command)`` for each of ``pids``, for a message."""
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            cmd = "?"
        out.append(f"{pid} ({cmd[:80]})")
    return ", ".join(out)


_SUPERVISOR_MODULE = b"tfk8s_magics.backends.local.supervisor"
