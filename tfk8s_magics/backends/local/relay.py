"""Carry the owner's traffic into a cluster's private network namespace, and nobody else's.

``python -m tfk8s_magics.backends.local.relay UID TABLE_FDS LISTENERS``, started by the
supervisor of an in-graph cluster.  The in-graph kernel (the coordinator) lives in the host's
network namespace and dials the tasks at the addresses of TF_CONFIG, ``127.0.0.1:PORT``; the
tasks listen on the same addresses inside the cluster's namespace.  The supervisor binds each
``127.0.0.1:PORT`` in the host namespace before it leaves it and hands those listening sockets
to this process, which runs inside the cluster's namespace: so one address names the same task
on both sides, whichever namespace a TensorFlow thread happens to dial from.

Every accepted connection is checked first: the connecting socket must belong to ``UID`` (the
cluster's owner), read from the host's ``/proc/net/tcp`` and ``tcp6`` (opened by the supervisor
in the host namespace: the ``uid`` column is the socket creator's).  Any other uid's connection
is closed before a byte is read or forwarded, so another user cannot make a task do anything.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import threading

from ...lifeline import set_parent_death_signal
from .isolation import socket_owner


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


def run(owner: int, tables: list[int], listeners: dict[int, int]) -> None:
    """Accept on every listener (fd → port) forever; forward the owner's connections only."""
    sel = selectors.DefaultSelector()
    for fd, port in listeners.items():
        sock = socket.socket(fileno=fd)
        sock.setblocking(True)
        sel.register(sock, selectors.EVENT_READ, port)
    while True:
        for key, _ in sel.select():
            try:
                conn, peer = key.fileobj.accept()
            except OSError:
                continue
            uid = socket_owner(tables, peer[1], key.data)
            if uid != owner:
                # Closed unread: not one byte reaches the task.
                print(f"tfk8s relay: refused a connection to port {key.data} from uid {uid}", flush=True)
                conn.close()
                continue
            threading.Thread(target=_serve, args=(conn, key.data), daemon=True).start()


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


def spawn(owner: int, listeners: list[socket.socket], tables: list[int], tag: str) -> subprocess.Popen:
    """Start the relay (it dies with the caller) and hand it ``listeners`` and ``tables``,
    closing them here; ``tag`` (a path) only names whose relay it is in ``ps``."""
    pairs = ",".join(f"{s.fileno()}:{s.getsockname()[1]}" for s in listeners)
    me = os.getpid()
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "tfk8s_magics.backends.local.relay", str(owner),
             ",".join(map(str, tables)), pairs, tag],
            stdin=subprocess.DEVNULL, pass_fds=(*(s.fileno() for s in listeners), *tables),
            preexec_fn=lambda: set_parent_death_signal(signal.SIGKILL, me),
        )
    finally:
        for sock in listeners:
            sock.close()  # the relay holds them now: when it ends, the ports close
        for fd in tables:
            os.close(fd)


def main(argv: list[str] | None = None) -> int:
    """``UID TCP_FD,TCP6_FD FD:PORT[,FD:PORT...] CLUSTER_DIR`` (the dir only names whose relay it is)."""
    argv = sys.argv[1:] if argv is None else argv
    owner = int(argv[0])
    tables = [int(x) for x in argv[1].split(",") if x]
    listeners = {int(fd): int(port) for fd, port in (pair.split(":") for pair in argv[2].split(",") if pair)}
    run(owner, tables, listeners)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
