"""The commands the ``sync`` and ``backup`` step pods run (:mod:`.storage_pods` builds them).

``python -m tfk8s_magics.backends.kubernetes.steps synced DIR``
    after the ``fetch`` init container: one line saying what is in ``DIR``.
``python -m tfk8s_magics.backends.kubernetes.steps backup --done-dir D --tasks T,... --source S --to URL``
    wait until every task in ``T`` left its marker in ``D`` (it exited 0 in
    this run of the JobSet), then upload each of ``S/checkpoints`` and
    ``S/models`` that exists to ``URL/checkpoints`` and ``URL/models`` with
    ``python -m tfk8s_magics.storage upload``.  Exit 0 only when every upload
    did; the storage tool's own sentence explains a failure.  On SIGTERM
    (the cluster is stopped, failed or restarting) it uploads what exists,
    best effort, then exits 143.

Credentials are the container's environment (the Secret's keys, by
``envFrom``): nothing here reads, prints or passes them on the command line.
No shell: fixed argv lists.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence

#: Seconds between looks at the markers (a shared volume: inotify does not cross nodes).
POLL = 5.0
FOLDERS = ("checkpoints", "models")


def synced(folder: str) -> int:
    """Print how many files and bytes ``folder`` holds; exit 0."""
    files = size = 0
    for root, _dirs, names in os.walk(folder):
        for name in names:
            files += 1
            try:
                size += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    print(f"tfk8s: {folder} holds {files} files, {size} bytes", flush=True)
    return 0


def missing(done_dir: str, tasks: Sequence[str]) -> list[str]:
    """The tasks that have not left their marker yet."""
    return [t for t in tasks if not os.path.exists(os.path.join(done_dir, t))]


def upload_all(source: str, url: str,
               run: Callable[..., subprocess.CompletedProcess] | None = None) -> int:
    """Upload each folder of :data:`FOLDERS` under ``source`` that exists; the first failure's code."""
    run = run or subprocess.run
    found = [f for f in FOLDERS if os.path.isdir(os.path.join(source, f))]
    if not found:
        print(f"tfk8s: nothing to upload: no {' or '.join(FOLDERS)} under {source}", flush=True)
        return 0
    for folder in found:
        target = f"{url.rstrip('/')}/{folder}"
        print(f"tfk8s: uploading {source}/{folder} to {target}", flush=True)
        rc = run([sys.executable, "-m", "tfk8s_magics.storage", "upload",
                  os.path.join(source, folder), target]).returncode
        if rc != 0:
            return rc
    print(f"tfk8s: backup done: {', '.join(found)} uploaded to {url}", flush=True)
    return 0


def backup(done_dir: str, tasks: Sequence[str], source: str, url: str,
           ended: threading.Event | None = None, poll: float = POLL) -> int:
    """Wait for every task's marker (or ``ended``), then upload; see the module docstring."""
    ended = ended or threading.Event()
    print(f"tfk8s: backup waits for {', '.join(tasks)} to finish", flush=True)
    waiting = missing(done_dir, tasks)
    while waiting and not ended.is_set():
        ended.wait(poll)
        waiting = missing(done_dir, tasks)
    if waiting:
        print(f"tfk8s: ended before {', '.join(waiting)} finished: uploading what exists "
              "(best effort)", flush=True)
        upload_all(source, url)
        return 128 + signal.SIGTERM
    return upload_all(source, url)


def main(argv: list[str] | None = None) -> int:
    """Parse and run one step command."""
    parser = argparse.ArgumentParser(prog="python -m tfk8s_magics.backends.kubernetes.steps")
    sub = parser.add_subparsers(dest="command", required=True)
    sync_p = sub.add_parser("synced")
    sync_p.add_argument("folder")
    backup_p = sub.add_parser("backup")
    backup_p.add_argument("--done-dir", required=True)
    backup_p.add_argument("--tasks", required=True)
    backup_p.add_argument("--source", required=True)
    backup_p.add_argument("--to", required=True)
    args = parser.parse_args(argv)
    if args.command == "synced":
        return synced(args.folder)
    ended = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: ended.set())
    return backup(args.done_dir, [t for t in args.tasks.split(",") if t], args.source, args.to,
                  ended)


if __name__ == "__main__":
    sys.exit(main())
