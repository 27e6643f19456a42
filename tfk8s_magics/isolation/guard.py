"""Run one server in a private network namespace that only its owner can reach.

``python -m tfk8s_magics.isolation.guard PORT[,PORT...] TAG -- PYTHON_ARGS...``
(:func:`command` builds it).

Used for a cluster's TensorBoard and its model server (REST + gRPC): they serve whoever
connects, and on a shared machine ``127.0.0.1:PORT`` is every local user's.  This process
binds ``127.0.0.1:PORT`` on the host (where jupyter-server-proxy, running as the owner, dials
it), leaves for a network namespace of its own (:func:`.netns.enter_private_network`),
starts the owner-only
:mod:`.relay` on that listener, and then becomes the server (``exec``: same pid), which
listens on the same port inside.  In a sandboxed kernel (whose namespace the Jupyter server
cannot enter) the relay also gets a listener on the host's ``127.0.0.1:PORT`` from the kernel's
host-side parent (:mod:`.hostside`).  Where namespaces are refused it says why on stderr and the
server listens on the caller's loopback, as before.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from .. import options
from ..lifeline import same_process, wait_exit
from ..ports import port_open
from . import hostside, netns, relay
from .plan import plan_server


def command(ports: list[int], tag: str, python_args: list[str]) -> list[str]:
    """The command that runs ``python PYTHON_ARGS`` behind this guard on ``ports``; ``tag`` (a
    path) names whose relay it is in ``ps``.  The guard execs the server: same pid."""
    return [sys.executable, "-m", __spec__.name if __spec__ else "tfk8s_magics.isolation.guard",
            ",".join(map(str, ports)), tag, "--", *python_args]


#: Seconds the relay gets to close a stopped server's ports.
CLOSE_TIMEOUT = 5.0


def wait_closed(ports: list[int], timeout: float = CLOSE_TIMEOUT) -> bool:
    """After the guarded server has exited: wait until nothing accepts on ``127.0.0.1:PORT`` any
    more (its relay dies with it by a parent-death signal, which a loaded machine delivers late);
    return whether every port closed within ``timeout``."""
    deadline = time.monotonic() + timeout
    while any(port_open(port) for port in ports):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def stop(pid: object, start: object, ports: list[int], grace: float = CLOSE_TIMEOUT) -> bool:
    """End the guarded server recorded as (``pid``, ``start``): SIGTERM, then SIGKILL after
    ``grace`` seconds; return once its ``ports`` are closed, and whether it was running (a stale
    record is never signalled)."""
    if not same_process(pid, start):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    if not wait_exit(pid, grace) and same_process(pid, start):
        os.kill(pid, signal.SIGKILL)
        wait_exit(pid, grace)
    wait_closed(ports)
    return True


def _host_group(ports: list[int]) -> list[tuple[list, list[int]]]:
    """In a sandboxed kernel: the host's ``127.0.0.1:PORT``s and tables from its parent (for the
    Jupyter server on the host); elsewhere nothing (this namespace is the host's)."""
    if not hostside.available():
        return []
    return [hostside.listen(ports)]


def main(argv: list[str] | None = None) -> int:
    """Guard ``127.0.0.1:PORT`` for each port, then exec the server; see the module docstring."""
    argv = sys.argv[1:] if argv is None else argv
    ports, tag, command = [int(p) for p in argv[0].split(",")], argv[1], argv[argv.index("--") + 1:]
    if plan_server(options.get("isolation")).relay:
        try:
            groups = [relay.host_side([("127.0.0.1", port) for port in ports]), *_host_group(ports)]
        except OSError as e:  # HostSocketsError too
            print(f"tfk8s: cannot listen on 127.0.0.1:{','.join(map(str, ports))}: "
                  f"{getattr(e, 'strerror', None) or e}", file=sys.stderr, flush=True)
            return 1
        try:
            netns.enter_private_network()
        except netns.IsolationError as e:
            for socks, tables in groups:
                for sock in socks:
                    sock.close()
                for fd in tables:
                    os.close(fd)
            print(f"tfk8s: no private network namespace here ({e.strerror}); listening on the host's "
                  "loopback, where every local user can connect", file=sys.stderr, flush=True)
            if len(groups) > 1:
                print("tfk8s: and in a sandboxed kernel the Jupyter server cannot reach it", file=sys.stderr,
                      flush=True)
        else:
            relay.spawn(os.geteuid(), groups, tag)
    os.execv(sys.executable, [sys.executable, *command])
    return 1  # not reached: execv replaces this process


if __name__ == "__main__":
    sys.exit(main())
