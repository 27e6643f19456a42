"""Run one server in a private network namespace that only its owner can reach.

``python -m tfk8s_magics.backends.local.guard PORT TAG -- PYTHON_ARGS...``

Used for a cluster's TensorBoard: it serves plain HTTP to whoever connects, and on a shared
machine ``127.0.0.1:PORT`` is every local user's.  This process binds ``127.0.0.1:PORT`` on
the host (where jupyter-server-proxy, running as the owner, dials it), leaves for a network
namespace of its own (:func:`.isolation.enter_private_network`), starts the owner-only
:mod:`.relay` on that listener, and then becomes the server (``exec``: same pid), which
listens on the same port inside.  In a sandboxed kernel (whose namespace the Jupyter server
cannot enter) the relay also gets a listener on the host's ``127.0.0.1:PORT`` from the kernel's
host-side parent (:mod:`.hostside`).  Where namespaces are refused it says why on stderr and the
server listens on the caller's loopback, as before.
"""

from __future__ import annotations

import os
import sys

from ... import options
from . import hostside, isolation, relay


def _host_group(port: int) -> list[tuple[list, list[int]]]:
    """In a sandboxed kernel: the host's ``127.0.0.1:PORT`` and tables from its parent (for the
    Jupyter server on the host); elsewhere nothing (this namespace is the host's)."""
    if not hostside.available():
        return []
    return [hostside.listen([port])]


def main(argv: list[str] | None = None) -> int:
    """Guard ``127.0.0.1:PORT``, then exec the server; see the module docstring."""
    argv = sys.argv[1:] if argv is None else argv
    port, tag, command = int(argv[0]), argv[1], argv[argv.index("--") + 1:]
    if isolation.wanted(options.get("isolation")) == "netns":
        try:
            groups = [relay.host_side([("127.0.0.1", port)]), *_host_group(port)]
        except OSError as e:
            print(f"tfk8s: cannot listen on 127.0.0.1:{port}: {e.strerror or e}", file=sys.stderr, flush=True)
            return 1
        try:
            isolation.enter_private_network()
        except isolation.IsolationError as e:
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
