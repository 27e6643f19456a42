"""Run a command, passing its output through and appending a copy to a file.

Pod entrypoint: ``python -m tfk8s_magics.backends.kubernetes.logcopy FILE -- CMD...``.
The copy on the ``/log`` volume outlives the pod (``kubectl logs`` does not).
No shell is involved: the command is a fixed argv built by
:func:`~.manifests.task_command`.  A ``{task}`` in FILE is replaced by this
task's name (``worker-1``), which a pod made from a per-role template
learns from its environment
(:func:`~tfk8s_magics.runtime.task.task_from_env`).  The child's exit status is passed on
unchanged, and a death by signal N becomes exit 128 + N (also as a
container's PID 1), so the backend's restart decision sees the runtime's
own exit code.

When ``TFK8S_DONE_FILE`` is set (a cluster with a backup step, see
:mod:`.storage_pods`), an exit 0 leaves that file (``{task}`` filled in the
same way): the backup step waits for one per task that decides success.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from ...runtime.task import task_from_env


def _open_copy(path: str):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return open(path, "ab", buffering=0)  # noqa: SIM115 - lives as long as the child
    except OSError as e:
        print(f"tfk8s: cannot keep a copy of this log at {path}: {e}", file=sys.stderr, flush=True)
        return None


def run(path: str, argv: list[str]) -> int:
    """Run ``argv``; copy its merged stdout/stderr to our stdout and to ``path``."""
    copy = _open_copy(path)
    if copy is not None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        copy.write(f"--- tfk8s: {os.environ.get('HOSTNAME', '')} started {stamp}\n".encode())
    # The handlers come first: as a container's PID 1 a signal without a handler is dropped, so
    # one that arrives while the task starts is kept and sent to it once it exists.
    early: list[int] = []
    child: subprocess.Popen | None = None

    def forward(signum, _frame):  # kubelet's SIGTERM must reach the task
        if child is None:
            early.append(signum)
        else:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    for signum in early:
        child.send_signal(signum)
    out = sys.stdout.buffer
    stream = child.stdout
    for line in iter(stream.readline if stream else bytes, b""):
        out.write(line)
        out.flush()
        if copy is not None:
            try:
                copy.write(line)
            except OSError:
                copy = None  # a full volume must not kill the task
    rc = child.wait()
    if rc < 0:
        # Killed by signal N: exit 128 + N, as a shell and the container runtimes report
        # it.  Re-raising the signal on ourselves does not work: as a container's PID 1
        # the kernel drops signals we have no handler for (measured: SIGTERM gave 241).
        return 128 - rc
    return rc


def mark_done(template: str, task_name: str) -> None:
    """Leave the empty file ``template`` (``{task}`` → ``task_name``): this task exited 0."""
    path = template.replace("{task}", task_name)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb"):
            pass
    except OSError as e:  # the backup step then waits, and says what it waits for
        print(f"tfk8s: cannot mark this task done at {path}: {e}", file=sys.stderr, flush=True)


def main(args: list[str] | None = None) -> int:
    """Parse ``FILE -- CMD...`` and run."""
    args = list(sys.argv[1:] if args is None else args)
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m tfk8s_magics.backends.kubernetes.logcopy FILE -- CMD...",
              file=sys.stderr)
        return 2
    path = args[0]
    task = task_from_env(os.environ)
    name = task.name if task else os.environ.get("HOSTNAME", "task")
    rc = run(path.replace("{task}", name), args[2:])
    if rc == 0 and os.environ.get("TFK8S_DONE_FILE"):
        mark_done(os.environ["TFK8S_DONE_FILE"], name)
    return rc


if __name__ == "__main__":
    sys.exit(main())
