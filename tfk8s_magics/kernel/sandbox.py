"""Start an IPython kernel in a private (user+)network namespace: the lab's sandboxed kernel.

Kernelspec argv: ``python -m tfk8s_magics.kernel.sandbox -f {connection_file}``.

The launcher asks the isolation layer for the kernel's plan
(:func:`tfk8s_magics.isolation.plan.plan_kernel`: the setting, the connection file's transport,
the loopback shim) and performs it: :class:`~tfk8s_magics.isolation.kernelns.KernelSandbox`
forks the kernel into a namespace of its own while this process still has one thread, then
``exec``-s ``ipykernel_launcher`` there.

The kernel's Jupyter channels must be unix sockets (``"transport": "ipc"`` in the connection
file; the lab's servers start kernels so, their sockets in Jupyter's 0700 runtime dir): TCP
ports in the kernel's namespace would be out of the Jupyter server's reach.

Fallback — a ``tcp`` connection file (plain ``jupyter lab`` elsewhere), ``TFK8S_ISOLATION``
``loopback``/``off``, or a kernel that refuses namespaces: the kernel runs on the host's network
(still with the shim: its chief is not on every interface), says once why in-graph clusters are
then reachable by other local users, and ``status.json`` of its in-graph clusters says so.
"""

from __future__ import annotations

import json
import os
import sys

from .. import options
from ..isolation.kernelns import KernelSandbox
from ..isolation.netns import KERNEL_NETNS, KERNEL_NOTE_ENV
from ..isolation.plan import IsolationPlan, Platform, host_network_note, plan_kernel
from ..isolation.shim import preload_env, shim_path

__all__ = ["connection_file", "host_network_note", "kernel_path_first", "main", "plan"]

#: What runs once the namespace is made (argv after it: this launcher's own, ``-f FILE`` ...).
KERNEL = ("-m", "ipykernel_launcher")


def _say(text: str) -> None:
    print(f"tfk8s: {text}", file=sys.stderr, flush=True)


def connection_file(argv: list[str]) -> str | None:
    """The connection file of ``-f FILE`` / ``--f=FILE`` in the kernel's argv (None if absent)."""
    for i, arg in enumerate(argv):
        if arg in ("-f", "--f") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(("--f=", "-f=")):
            return arg.split("=", 1)[1]
    return None


def plan(conn_file: str, platform: Platform) -> IsolationPlan:
    """The kernel's isolation plan: the ``isolation`` option and the connection file's transport."""
    try:
        with open(conn_file, encoding="utf-8") as f:
            transport = json.load(f).get("transport", "tcp")
    except (OSError, ValueError, AttributeError) as e:
        return plan_kernel(platform, options.get("isolation"), None,
                           refused=f"its connection file {conn_file} cannot be read ({e})")
    return plan_kernel(platform, options.get("isolation"), transport)


def kernel_path_first(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the kernel's own interpreter's folder first on ``PATH``: a notebook's ``!pip
    install x`` (a shell command) then runs this environment's pip, and the next ``import x`` in
    the kernel — and in the local backend's tasks, which run this interpreter — finds it."""
    here = os.path.dirname(sys.executable)
    rest = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != here]
    env["PATH"] = os.pathsep.join([here, *rest])
    return env


def main(argv: list[str] | None = None) -> int:
    """Run the kernel in a sandbox if its plan says so, else on the host."""
    argv = sys.argv[1:] if argv is None else argv
    conn_file = connection_file(argv)
    if conn_file is None:
        print(
            "usage: python -m tfk8s_magics.kernel.sandbox -f CONNECTION_FILE [kernel options]",
            file=sys.stderr,
        )
        return 2
    shim = shim_path()
    platform = Platform(shim=str(shim) if shim else None)
    decided = plan(conn_file, platform)
    env = kernel_path_first(dict(os.environ))
    preload_env(env, decided.shim)
    command = [sys.executable, *KERNEL, *argv]
    note = decided.reason
    if decided.kind == KERNEL_NETNS:
        outcome = KernelSandbox(conn_file, command, env).run()
        if isinstance(outcome, int):
            return outcome
        note = host_network_note(outcome, decided.shim)
    _say(note)
    env[KERNEL_NOTE_ENV] = note
    os.execve(sys.executable, command, env)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
