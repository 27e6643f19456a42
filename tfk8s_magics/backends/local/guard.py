"""Run one server in a private network namespace that only its owner can reach.

``python -m tfk8s_magics.backends.local.guard PORT TAG -- PYTHON_ARGS...``

Used for a cluster's TensorBoard: it serves plain HTTP to whoever connects, and on a shared
machine ``127.0.0.1:PORT`` is every local user's.  This process binds ``127.0.0.1:PORT`` on
the host (where jupyter-server-proxy, running as the owner, dials it), leaves for a network
namespace of its own (:func:`.isolation.enter_private_network`), starts the owner-only
:mod:`.relay` on that listener, and then becomes the server (``exec``: same pid), which
listens on the same port inside.  Where namespaces are refused it says why on stderr and the
server listens on the host's loopback, as before.
"""

from __future__ import annotations

import os
import sys

from ... import options
from . import isolation, relay


def main(argv: list[str] | None = None) -> int:
    """Guard ``127.0.0.1:PORT``, then exec the server; see the module docstring."""
    argv = sys.argv[1:] if argv is None else argv
    port, tag, command = int(argv[0]), argv[1], argv[argv.index("--") + 1:]
    if isolation.wanted(options.get("isolation")) == "netns":
        try:
            listeners, tables = relay.host_side([("127.0.0.1", port)])
        except OSError as e:
            print(f"tfk8s: cannot listen on 127.0.0.1:{port}: {e}", file=sys.stderr, flush=True)
            return 1
        try:
            isolation.enter_private_network()
        except isolation.IsolationError as e:
            for sock in listeners:
                sock.close()
            for fd in tables:
                os.close(fd)
            print(f"tfk8s: no private network namespace here ({e.strerror}); listening on the host's "
                  "loopback, where every local user can connect", file=sys.stderr, flush=True)
        else:
            relay.spawn(os.geteuid(), listeners, tables, tag)
    os.execv(sys.executable, [sys.executable, *command])
    return 1  # not reached: execv replaces this process


if __name__ == "__main__":
    sys.exit(main())
