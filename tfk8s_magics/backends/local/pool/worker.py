"""A pooled process: import what a task imports, wait for one assignment, run it as a cold task
runs, exit.  It never runs two tasks, and nothing forks after TensorFlow is imported.
"""

from __future__ import annotations

import os
import socket
import sys

from .... import taskenv
from ....isolation import shim as loopback_shim
from ....runtime import task
from ..watchdog import CLUSTER_ID_ENV
from .envmark import write_cluster_id
from .priority import _autogroup_nice, autogroup_nice
from .protocol import MAX_MESSAGE, _message


def worker(fd: int) -> int:
    """Import what a task imports, wait for one assignment, run it as a cold task runs, exit."""
    sock = socket.socket(fileno=fd)
    before = dict(os.environ)
    taskenv.import_tensorflow()  # exactly the cold task's import (quiet filter, device probe)
    # What the import itself did to the environment (TensorFlow sets TF2_BEHAVIOR and others):
    # a cold task's import does the same to its environment, so it is replayed on the task's.
    added = {k: v for k, v in os.environ.items() if before.get(k) != v}
    removed = [k for k in before if k not in os.environ]
    sock.send(b"idle")
    data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 2)
    if not data or len(fds) != 2:
        return 0  # the pool closed: nothing was assigned
    try:
        assignment = _message(data)
    except ValueError:
        return 0  # not an assignment: nothing was assigned
    log_fd, ready_fd = fds
    # A refill imported at low priority (its session's autogroup): a task runs at the cold one's.
    if autogroup_nice() not in (None, 0) and not _autogroup_nice(0):
        sock.send(b"cold:cannot set the warm process's CPU priority back to normal")
        return 0
    if assignment.get("shim_off"):
        # A cold task of this cluster has no shim: binds must pass through untouched.
        try:
            loopback_shim.switch_off(assignment["shim_off"])
        except (OSError, ValueError) as e:
            sock.send(f"cold:cannot switch the loopback shim off ({e})".encode())
            return 0
    try:  # marked as its cluster's before any of the task's code runs (and forks)
        write_cluster_id(assignment["env"].get(CLUSTER_ID_ENV, ""))
    except OSError as e:
        sock.send(f"cold:cannot mark the warm process as the cluster's ({e})".encode())
        return 0
    sock.send(b"ok")
    sock.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    os.environ.clear()
    os.environ.update(assignment["env"])
    os.environ.update(added)
    for key in removed:
        os.environ.pop(key, None)
    os.environ["TFK8S_READY_FD"] = str(ready_fd)
    if assignment.get("umask") is not None:
        os.umask(int(assignment["umask"]))
    os.chdir(assignment["cwd"])
    sys.path[0] = os.getcwd()  # what `python -m` puts first: the task's working folder
    sys.argv = [task.__file__]
    return task.main()


def main(argv: list[str] | None = None) -> int:
    """``FD``: run a pooled process on socket ``FD`` (:data:`~.protocol.WORKER_ENTRY`)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: pool worker FD", file=sys.stderr)
        return 2
    import atexit

    rc = worker(int(argv[0]))
    # As the cold task's entry point: exit handlers, then no thread joins (gRPC can hang them).
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
