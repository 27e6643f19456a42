"""The warm pool's protocol, in one place: who sends what to whom, and where pools live.

Every message is one JSON object in one ``SOCK_SEQPACKET`` packet of at most
:data:`MAX_MESSAGE` bytes (nested at most :data:`records.MAX_DEPTH` deep:
:func:`_message`); descriptors travel with it as ``SCM_RIGHTS``.  The daemon
answers a request only from a process of its own uid (``SO_PEERCRED``; any
other gets ``{"cold": "the request came from another user"}``), then closes
the connection.

**The pool's socket** (:func:`socket_path`: ``pool-KEY.sock`` in the user's
0700 :func:`runtime_dir`; ``KEY`` = :func:`pool_key` of the task environment):

=======  ======================================  ============================================
``op``   request (and descriptors)               answer
=======  ======================================  ============================================
info     ``memory``: with PSS/RSS                the pool (:meth:`Daemon.describe`):
                                                 ``pid``, ``owners``, ``size``,
                                                 ``processes`` (``pid``, ``state``, ``kind``,
                                                 ``ns``, ``reserved``), ``closing``,
                                                 ``shrunk``, ``idle_timeout``, ``claimed``
attach   ``kind`` (host / ns)                    as info; the sender is an owner from now
                                                 on (a pidfd), and a pool that emptied
                                                 itself refills (owner side)
detach   —                                       as info; the sender is no longer an owner
                                                 (``closing``: it was the last one)
resize   ``size``                                as info
close    —                                       as info (``closing``)
claim    ``env``, ``cwd``, ``umask``, ``wait``,  ``{"pid": N}`` (the process runs the task)
         ``ns``; log file, ready pipe, status    or ``{"cold": why}``; the daemon keeps
         pipe                                    the status pipe (supervisor side)
adopt    ``env``                                 ``{"ns": id, "fds": n}`` + the namespace's
                                                 descriptors, or ``{"cold": why}``
release  ``ns``                                  as info; the adopted namespace's unclaimed
                                                 processes end
=======  ======================================  ============================================

A claim with ``wait`` may be answered up to :data:`CLAIM_TIMEOUT` later (a
process still importing); the claimer hangs up to give up (a stop), and the
daemon then drops the claim.

**The status pipe**: the daemon writes the task's wait status
(``Popen.returncode``: negative = killed by that signal) and closes it when it
reaps the process; EOF without a status means the daemon died, and the task
with it (:class:`~.claims.PooledProcess`).

**The start pipe**: the daemon (:data:`DAEMON_ENTRY` ``POOL_DIR FD``) writes
``ok PID`` into descriptor ``FD`` once its socket listens; EOF means it failed
(its ``pool.log`` says why).

**A pooled process** (:data:`WORKER_ENTRY` ``FD``, a socket pair with the
daemon): it sends ``idle`` once TensorFlow is imported; the daemon sends one
assignment, ``{"env", "cwd", "umask", "shim_off"}`` with the task's log file
and ready pipe; the process answers ``ok`` (it runs the task now) or
``cold:WHY`` (it runs nothing and exits).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import select
import socket
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .... import records

#: Largest message on the pool's sockets (an assignment carries the task's environment).
MAX_MESSAGE = 1 << 20

#: Seconds a claim waits for a pooled process that is still importing TensorFlow.
CLAIM_TIMEOUT = 60.0

#: Seconds an owner-side request waits for the daemon's answer.
REQUEST_TIMEOUT = 10.0

#: The two kinds of pooled process: in the host's network namespace, or in the pool's spare one.
HOST, NS = "host", "ns"

#: ``available(ns=ANY)``: count processes of either kind that are not reserved for a cluster.
ANY = "*"

#: How the owner starts a pool daemon, and the daemon a pooled process (``-c``, not ``-m``:
#: the package is imported first, which ``-m`` warns about in every task's output).
DAEMON_ENTRY = "import sys; from tfk8s_magics.backends.local.pool.daemon import main; sys.exit(main())"
WORKER_ENTRY = "import sys; from tfk8s_magics.backends.local.pool.worker import main; sys.exit(main())"


# -- where pools live ----------------------------------------------------------------------
def runtime_dir() -> Path:
    """This user's 0700 directory of pool sockets (``$XDG_RUNTIME_DIR`` or the temp dir)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    base = base if base and os.path.isdir(base) else tempfile.gettempdir()
    path = Path(base) / f"tfk8s-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = path.lstat()
    if not path.is_dir() or path.is_symlink() or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"{path} is not a private directory of this user (mode 0700)")
    return path


def pool_key(env: Mapping[str, str], shim: str | None) -> str:
    """Which pool of this user serves processes whose tasks get ``env``: kernels with the same
    task environment (all the kernels of one lab) share one pool; a kernel whose environment
    differs (its tasks could not run in that pool's processes) gets its own."""
    text = json.dumps({"env": dict(sorted(env.items())), "shim": shim, "python": sys.executable})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def socket_path(key: str) -> str:
    """The socket of this user's pool ``key`` (:func:`pool_key`) in :func:`runtime_dir`."""
    return str(runtime_dir() / f"pool-{key}.sock")


def _remove_runtime_dir_if_empty(path: Path) -> None:
    """Remove this user's pool directory (:func:`runtime_dir`) once nothing is in it: a stopped
    lab leaves no folder behind."""
    if path.name != f"tfk8s-{os.getuid()}":
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # never while a kernel starts a pool in it (owner._start_lock)
        with contextlib.suppress(OSError):  # not empty (another pool is there), or gone
            path.rmdir()
    finally:
        os.close(fd)


# -- messages ------------------------------------------------------------------------------
def _message(data: bytes) -> dict:
    """A pool message or record (a JSON object of at most :data:`MAX_MESSAGE` bytes, nested at most
    :data:`records.MAX_DEPTH` deep); ValueError for anything else."""
    message = records.loads(data, MAX_MESSAGE)
    if not isinstance(message, dict):
        raise ValueError("a pool message is not a JSON object")
    return message


class Interrupted(Exception):
    """One of the caller's interrupt descriptors became readable before the pool answered."""


def _request(sock_path: str, message: dict, fds: list[int] = (), timeout: float = REQUEST_TIMEOUT,
             interrupt: Sequence[int] = ()) -> dict:
    """Send one request to a pool daemon and return its answer; raise :class:`Interrupted` (the
    connection closed: the daemon drops the request) if a descriptor of ``interrupt`` becomes
    readable first (it is not read: its owner reads it)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.settimeout(timeout)
        s.connect(sock_path)
        socket.send_fds(s, [json.dumps(message).encode()], list(fds))
        if interrupt:
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("timed out")
                readable, _, _ = select.select([s, *interrupt], [], [], left)
                if s in readable:
                    break
                if readable:
                    raise Interrupted()
        data = s.recv(MAX_MESSAGE)
    if not data:
        raise ConnectionError("the pool closed the connection without answering")
    return _message(data)


def info(sock_path: str, with_memory: bool = True) -> dict | None:
    """A pool's size, its processes and (``with_memory``) their memory; None if it is not running."""
    try:
        return _request(sock_path, {"op": "info", "memory": with_memory})
    except (OSError, ValueError):
        return None
