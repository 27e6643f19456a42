"""``tfk8s``: the same subcommands as ``%tfcluster``, for a terminal (as Arena users expect).

``tfk8s submit NAME --script train.py --workers 2 --ps 1`` (``submit`` is
``launch``), ``tfk8s list``, ``tfk8s get NAME`` (``status``), ``tfk8s logs
NAME [TASK] [-f]``, ``tfk8s delete NAME``.  A cluster launched from a
terminal is detached (it outlives the command) unless ``--follow`` is
given, which streams its logs until it ends.
"""

from __future__ import annotations

import shlex
import sys
import threading

from IPython.core.error import UsageError

from . import api
from .errors import TFClusterError

_ALIASES = {"submit": "launch", "get": "status", "rm": "delete", "ls": "list"}


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; return the exit code (0 ok, 1 failed, 2 usage)."""
    from .magics import TFClusterMagics

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv:
        argv[0] = _ALIASES.get(argv[0], argv[0])
    follow = False
    if argv and argv[0] == "launch":
        follow = "--follow" in argv
        argv = [a for a in argv if a != "--follow"]
        if not follow and "--detach" not in argv:
            argv.append("--detach")
        argv.append("--no-follow")
    magics = TFClusterMagics(shell=None)
    try:
        if argv and argv[0] == "logs" and ("-f" in argv or "--follow" in argv):
            return _follow(magics, [a for a in argv if a not in ("-f", "--follow")])
        magics.tfcluster(shlex.join(argv))
        if follow:
            return _follow(magics, ["logs", argv[1]])
    except UsageError as e:
        print(f"tfk8s: {e}", file=sys.stderr)
        return 2
    except TFClusterError as e:
        print(f"tfk8s: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _follow(magics, argv: list[str]) -> int:
    """Print a cluster's log lines as they come, until it ends; exit 0 only if it succeeded."""
    args = magics._parse(shlex.join(argv))
    cluster = api.get(args.name, args.backend)
    stop = threading.Event()
    for line in cluster.follow(stop, tasks=[args.task] if args.task else None):
        print(f"[{line.task}] {line.text}", flush=True)
    st = cluster.status()
    print(f"{st.name}: {st.phase}" + (f" — {st.reason}" if st.reason else ""))
    return 0 if st.phase == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
