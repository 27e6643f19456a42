"""A pooled process's cluster mark, written into the environment the kernel shows for it.

Every process of a local cluster carries ``TFK8S_CLUSTER_ID=<id>`` in
``/proc/PID/environ``, and the orphan sweeps (the supervisor's last one, its
watchdog, ``delete``) find a task's descendants by it, whatever session they
moved to.  That file is the environment the process was *exec'd* with:
setting ``os.environ`` in a running process changes what its later children
exec with, but not that file, and not what a child that only forks (a
double-forked daemon) shows.  A pooled process is exec'd before its cluster
exists, so the pool starts it with a fixed-width :data:`PLACEHOLDER` value
(:func:`exec_env`) and the process writes its cluster's id over it in place
(:func:`write_cluster_id`), through ``/proc/self/mem`` (its own memory, no
privilege needed), before the task's code runs: from then on it, and every
process it forks, is marked as a cold task is.
"""

from __future__ import annotations

import os

from ..watchdog import CLUSTER_ID_ENV

#: The value a pooled process is exec'd with: wider than a cluster id (32 hex digits), never one.
PLACEHOLDER = "unassigned-pooled-process-" + "-" * 38


def exec_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the placeholder mark, for exec'ing a pooled process."""
    return {**env, CLUSTER_ID_ENV: PLACEHOLDER}


def _environ_region() -> tuple[int, int]:
    """Where this process's exec-time environment lies in its memory (``/proc/self/stat``'s
    ``env_start`` and ``env_end``, fields 50 and 51)."""
    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2:].split()  # from field 3 on: the command may hold spaces
    return int(fields[47]), int(fields[48])


def write_cluster_id(cluster_id: str) -> None:
    """Replace the placeholder mark in this process's exec-time environment by ``cluster_id``
    (NUL-padded to the placeholder's width).  Raises OSError if it cannot (no placeholder, an
    id too long, ``/proc/self/mem`` not writable): the caller then runs the task cold."""
    slot = f"{CLUSTER_ID_ENV}={PLACEHOLDER}".encode()
    mark = f"{CLUSTER_ID_ENV}={cluster_id}".encode()
    if len(mark) > len(slot) or "\0" in cluster_id:
        raise OSError(f"cluster id {cluster_id!r} is wider than the pooled process's mark")
    start, end = _environ_region()
    fd = os.open("/proc/self/mem", os.O_RDWR | os.O_CLOEXEC)
    try:
        region = b"\0" + os.pread(fd, end - start, start)
        at = region.find(b"\0" + slot + b"\0")
        if at < 0:
            raise OSError("this process was not started with the pooled process's mark")
        os.pwrite(fd, mark.ljust(len(slot), b"\0"), start + at)
    finally:
        os.close(fd)
