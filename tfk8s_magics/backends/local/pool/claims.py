"""The supervisor's side of the warm pool: claim a pooled process for a task, adopt the pool's
spare network namespace, release what a cluster did not claim.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
from collections.abc import Mapping, Sequence

from .protocol import (
    ANY,
    CLAIM_TIMEOUT,
    MAX_MESSAGE,
    REQUEST_TIMEOUT,
    Interrupted,
    _message,
    _request,
    info,
)


class PooledProcess:
    """A claimed pooled process, seen by the supervisor like a ``subprocess.Popen`` child.

    ``returncode`` follows Popen (negative: killed by that signal).  The
    status comes from the pool daemon (the process's parent) through
    ``status_fd``; if the daemon itself died, the task was killed with it.
    """

    def __init__(self, pid: int, status_fd: int) -> None:
        self.pid = pid
        self.status_fd = status_fd
        self.returncode: int | None = None

    def wait(self) -> int:
        """Block until the daemon reports the exit status; return it."""
        if self.returncode is not None:
            return self.returncode
        data = b""
        os.set_blocking(self.status_fd, True)
        while chunk := os.read(self.status_fd, 64):  # the supervisor closes the fd (its "pidfd")
            data += chunk
        text = data.decode().strip()
        self.returncode = int(text) if text else -signal.SIGKILL
        return self.returncode

    def poll(self) -> int | None:
        """The return code if the status was reported, else None (never blocks)."""
        return self.returncode


def available(sock_path: str | None, ns: str | None = ANY) -> int:
    """How many processes a pool can hand out now or soon (idle or importing); 0 without a pool.

    ``ns``: those in the namespace a supervisor adopted (:func:`adopt`), None: those on the
    host's network, :data:`ANY`: every one not reserved for a cluster."""
    found = info(sock_path, with_memory=False) if sock_path else None
    if not found or found.get("closing"):
        return 0
    return sum(1 for p in found["processes"] if p["state"] in ("idle", "starting") and (
        p.get("ns") == ns if ns != ANY else not p.get("reserved")))


def adopt(sock_path: str, env: Mapping[str, str]) -> tuple[str | None, list[int], str]:
    """Take the pool's spare network namespace for a cluster whose tasks get environment ``env``:
    (its id, descriptors for :func:`~tfk8s_magics.isolation.netns.join_namespace`, "") or (None,
    [], why not, e.g. :func:`mismatch`'s reason).  The processes in it are this caller's alone from now on
    (:func:`claim` with ``ns``)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        try:
            s.settimeout(REQUEST_TIMEOUT)
            s.connect(sock_path)
            s.send(json.dumps({"op": "adopt", "env": dict(env)}).encode())
            data, fds, _, _ = socket.recv_fds(s, MAX_MESSAGE, 2)
            answer = _message(data)
        except (OSError, ValueError) as e:
            return None, [], f"the pool did not answer ({e})"
    if "ns" not in answer or len(fds) != answer.get("fds"):
        for fd in fds:
            os.close(fd)
        return None, [], answer.get("cold", "the pool has no spare namespace")
    return answer["ns"], fds, ""


def release(sock_path: str, ns: str) -> None:
    """Tell the pool a cluster claimed all it will from its adopted namespace: the rest end."""
    with contextlib.suppress(OSError, ValueError):
        _request(sock_path, {"op": "release", "ns": ns, "memory": False})


#: What :func:`claim` says when its wait was interrupted (the caller is stopping: start nothing).
INTERRUPTED = "interrupted while waiting for a warm process"


def claim(sock_path: str, env: Mapping[str, str], cwd: str, log_fd: int, ready_fd: int,
          wait: bool = True, ns: str | None = None,
          interrupt: Sequence[int] = ()) -> tuple[PooledProcess | None, str]:
    """Hand a task to a pooled process: (the process, "") or (None, why it must start cold).

    With ``wait``, a pooled process still importing TensorFlow is waited
    for (it started earlier than a cold one would); without, only an idle one is taken.
    ``ns``: the namespace the caller adopted (:func:`adopt`); None: a process on the host's network.
    ``interrupt``: descriptors that end the wait when readable (a stop signal's wakeup pipe, the
    owner's pidfd): then (None, :data:`INTERRUPTED`), and the pool keeps its process.
    """
    status_r, status_w = os.pipe()
    try:
        mask = os.umask(0o077)
        os.umask(mask)  # the claimer's (the supervisor's): a cold task would inherit it
        message = {"op": "claim", "env": dict(env), "cwd": cwd, "wait": wait, "ns": ns, "umask": mask}
        answer = _request(sock_path, message, [log_fd, ready_fd, status_w], CLAIM_TIMEOUT + REQUEST_TIMEOUT,
                          interrupt)
    except Interrupted:
        os.close(status_r)
        return None, INTERRUPTED
    except (OSError, ValueError) as e:
        os.close(status_r)
        return None, f"the pool did not answer ({e})"
    finally:
        os.close(status_w)
    if "pid" not in answer:
        os.close(status_r)
        return None, answer.get("cold", "the pool refused")
    return PooledProcess(int(answer["pid"]), status_r), ""
