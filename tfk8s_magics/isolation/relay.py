"""Carry the owner's traffic into a cluster's private network namespace, and nobody else's.

``python -m tfk8s_magics.isolation.relay UID TABLE_FDS/LISTENERS... TAG``, started by
:mod:`.guard` for a server in a private network namespace (a cluster's TensorBoard).  The guard
binds ``127.0.0.1:PORT`` before it leaves its namespace and hands the listening socket to this
process, which runs inside the new namespace and forwards to the same address there.  In a
sandboxed kernel (:mod:`tfk8s_magics.kernel.sandbox`) a second listener on the HOST's
``127.0.0.1:PORT`` comes from the kernel's host-side parent (:mod:`.hostside`), for the Jupyter
server there: one relay, a group of listeners per namespace.

Every accepted connection is checked first: the connecting socket must belong to ``UID`` (the
cluster's owner), read from the ``/proc/net/tcp`` and ``tcp6`` tables of the listener's own
namespace (opened there, by the guard or the sandbox's parent: the ``uid`` column is the socket
creator's).  Any other uid's connection is closed before a byte is read or forwarded, so another
user cannot make the server do anything.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import threading

from ..lifeline import set_parent_death_signal
from .netns import socket_owner


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy one direction until it ends, then half-close the other side."""
    try:
        while data := src.recv(1 << 16):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def _serve(conn: socket.socket, port: int) -> None:
    """Forward one allowed connection to ``127.0.0.1:port`` in this namespace."""
    try:
        inner = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError:
        conn.close()
        return
    inner.settimeout(None)
    for s in (conn, inner):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    back = threading.Thread(target=_pump, args=(inner, conn), daemon=True)
    back.start()
    _pump(conn, inner)
    back.join()
    conn.close()
    inner.close()


#: One side of a relay: the TCP tables of the namespace its listeners are in, and fd → port.
Group = tuple[list[int], dict[int, int]]


def run(owner: int, groups: list[Group]) -> None:
    """Accept on every listener forever; forward the owner's connections only.

    Each group's listeners are checked against that group's tables: a listener on the host
    (handed over by a sandboxed kernel's parent, :mod:`.hostside`) against the host's, one in
    the caller's namespace against that namespace's.
    """
    sel = selectors.DefaultSelector()
    for tables, listeners in groups:
        for fd, port in listeners.items():
            sock = socket.socket(fileno=fd)
            sock.setblocking(True)
            sel.register(sock, selectors.EVENT_READ, (port, tables))
    while True:
        for key, _ in sel.select():
            try:
                conn, peer = key.fileobj.accept()
            except OSError:
                continue
            port, tables = key.data
            uid = socket_owner(tables, peer[1], port)
            if uid != owner:
                # Closed unread: not one byte reaches the task.
                print(f"tfk8s relay: refused a connection to port {port} from uid {uid}", flush=True)
                conn.close()
                continue
            threading.Thread(target=_serve, args=(conn, port), daemon=True).start()


def host_side(addresses: list[tuple[str, int]]) -> tuple[list[socket.socket], list[int]]:
    """Listening sockets on ``addresses`` and the tables that tell who connects to them.

    Call it while still in the host's network namespace: both stay bound to it afterwards.
    Raises ``OSError`` (nothing left open) when an address cannot be bound.
    """
    listeners: list[socket.socket] = []
    try:
        for host, port in addresses:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listeners.append(sock)
            sock.bind((host, port))
            sock.listen(64)
        tables = [os.open(f"/proc/self/net/{t}", os.O_RDONLY | os.O_CLOEXEC) for t in ("tcp", "tcp6")]
    except OSError:
        for sock in listeners:
            sock.close()
        raise
    return listeners, tables


def spawn(owner: int, groups: list[tuple[list[socket.socket], list[int]]], tag: str) -> subprocess.Popen:
    """Start the relay (it dies with the caller) and hand it each group's listeners and tables,
    closing them here; ``tag`` (a path) only names whose relay it is in ``ps``."""
    args = [f"{','.join(map(str, tables))}/{','.join(f'{s.fileno()}:{s.getsockname()[1]}' for s in socks)}"
            for socks, tables in groups]
    fds = [fd for socks, tables in groups for fd in (*(s.fileno() for s in socks), *tables)]
    me = os.getpid()
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "tfk8s_magics.isolation.relay", str(owner), *args, tag],
            stdin=subprocess.DEVNULL, pass_fds=fds,
            preexec_fn=lambda: set_parent_death_signal(signal.SIGKILL, me),
        )
    finally:
        for socks, tables in groups:
            for sock in socks:
                sock.close()  # the relay holds them now: when it ends, the ports close
            for fd in tables:
                os.close(fd)


def main(argv: list[str] | None = None) -> int:
    """``UID TCP_FD,TCP6_FD/FD:PORT[,FD:PORT...] [more groups...] CLUSTER_DIR`` (the dir only
    names whose relay it is)."""
    argv = sys.argv[1:] if argv is None else argv
    owner = int(argv[0])
    groups: list[Group] = []
    for group in argv[1:-1]:
        tables, _, pairs = group.partition("/")
        groups.append(([int(x) for x in tables.split(",") if x],
                       {int(fd): int(port) for fd, port in (p.split(":") for p in pairs.split(",") if p)}))
    run(owner, groups)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
