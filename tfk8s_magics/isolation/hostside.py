"""Listening sockets on the host's loopback for a process whose network is private (a sandboxed kernel).

A kernel started by :mod:`tfk8s_magics.kernel.sandbox` lives in a network namespace of its own;
the Jupyter server (and jupyter-server-proxy in it) is on the host.  So what the server must
reach — a cluster's TensorBoard — has to listen on the HOST's ``127.0.0.1``, which nothing in
the kernel's namespace can bind.  The sandbox's host-side parent (single-threaded, still in the
host's namespace) serves a unix socket (``$TFK8S_HOST_SOCKETS``, beside the kernel's connection
file in Jupyter's 0700 runtime dir, and answering only its own uid: ``SO_PEERCRED``) that hands
out, by ``SCM_RIGHTS``:

* listening sockets bound to ``127.0.0.1:PORT`` on the host (loopback only: nothing else is
  ever bound), and
* the host's ``/proc/net/tcp`` and ``tcp6`` tables, opened by that parent, so an owner-only
  relay (:mod:`.relay`) reads who connects on the host, not in its own namespace.

:func:`serve_one` is the parent's side; :func:`listen` and :func:`free_port` are the client's.
Outside a sandbox (``$TFK8S_HOST_SOCKETS`` unset) :func:`available` is False and nothing here runs.
"""

from __future__ import annotations

import json
import os
import socket
import struct

from ..ports import free_ports

#: The variable naming the parent's unix socket (set only inside a sandboxed kernel).
ENV = "TFK8S_HOST_SOCKETS"
_MAX = 1 << 16
_MAX_PORTS = 16


class HostSocketsError(OSError):
    """The sandbox's parent refused or could not bind; the message says which address and why."""


def available() -> bool:
    """Whether this process runs in a sandboxed kernel whose parent hands out host sockets."""
    return bool(os.environ.get(ENV))


# -- the parent's side ---------------------------------------------------------------------------
def make_server(path: str) -> socket.socket:
    """The parent's listening unix socket at ``path`` (created 0600; its dir must be the owner's)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(8)
    return sock


def serve_one(server: socket.socket) -> None:
    """Accept one request on ``server`` and answer it (a bad or foreign request gets an error)."""
    try:
        conn, _ = server.accept()
    except OSError:
        return
    with conn:
        conn.settimeout(5)
        try:
            pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if uid != os.geteuid():
                _reply(conn, {"error": f"uid {uid} is not this kernel's owner"}, [])
                return
            request = json.loads(conn.recv(_MAX) or b"{}")
            _answer(conn, request)
        except (OSError, ValueError) as e:
            try:
                _reply(conn, {"error": f"bad request: {e}"}, [])
            except OSError:
                pass


def _answer(conn: socket.socket, request: dict) -> None:
    ports = request.get("listen") if isinstance(request, dict) else None
    if (
        not isinstance(ports, list)
        or not 0 < len(ports) <= _MAX_PORTS
        or not all(isinstance(p, int) and 0 <= p < 65536 for p in ports)
    ):
        _reply(conn, {"error": "ask for 1-16 ports (0-65535) on 127.0.0.1"}, [])
        return
    made: list[socket.socket] = []
    tables: list[int] = []
    try:
        for port in ports:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            made.append(sock)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError as e:
                _reply(conn, {"error": f"cannot listen on the host's 127.0.0.1:{port}: {e.strerror}"}, [])
                return
            sock.listen(64)
        tables = [os.open(f"/proc/self/net/{t}", os.O_RDONLY | os.O_CLOEXEC) for t in ("tcp", "tcp6")]
        _reply(conn, {"ports": [s.getsockname()[1] for s in made]}, [*(s.fileno() for s in made), *tables])
    finally:
        for sock in made:
            sock.close()  # the client holds them now
        for fd in tables:
            os.close(fd)


def _reply(conn: socket.socket, message: dict, fds: list[int]) -> None:
    socket.send_fds(conn, [json.dumps(message).encode()], fds)


# -- the client's side ---------------------------------------------------------------------------
def _ask(request: dict, nfds: int) -> tuple[dict, list[int]]:
    path = os.environ.get(ENV, "")
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.settimeout(10)
        try:
            s.connect(path)
            s.send(json.dumps(request).encode())
            data, fds, _, _ = socket.recv_fds(s, _MAX, nfds)
        except OSError as e:
            raise HostSocketsError(
                e.errno, f"the sandbox's host side ({path}) did not answer: {e.strerror}"
            ) from None
    answer = json.loads(data or b"{}")
    if "error" in answer or len(fds) != nfds:
        for fd in fds:
            os.close(fd)
        raise HostSocketsError(0, answer.get("error") or "the sandbox's host side sent no sockets")
    return answer, fds


def listen(ports: list[int]) -> tuple[list[socket.socket], list[int]]:
    """Listening sockets on the host's ``127.0.0.1:PORT`` for each port (0: the host picks) and
    the host's TCP tables (``tcp``, ``tcp6`` fds); raises :class:`HostSocketsError`."""
    _, fds = _ask({"listen": list(ports)}, len(ports) + 2)
    socks = [socket.socket(fileno=fd) for fd in fds[: len(ports)]]
    return socks, fds[len(ports) :]


def free_port() -> int:
    """A port free on this namespace's loopback and, in a sandboxed kernel, on the host's too
    (a server reached from both sides, e.g. TensorBoard through its relay, needs both)."""
    if not available():
        return free_ports(1)[0]
    for _ in range(20):
        socks, tables = listen([0])
        port = socks[0].getsockname()[1]
        for s in socks:
            s.close()
        for fd in tables:
            os.close(fd)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as here:
            try:
                here.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise HostSocketsError(0, "no port is free both here and on the host's loopback")
