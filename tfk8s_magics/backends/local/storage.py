"""Object storage for a local cluster: the --data-sync copy before the tasks, the --backup upload after.

The supervisor calls :meth:`ClusterStorage.before_tasks` before it leaves the
host's network for the cluster's private namespace (:mod:`.isolation`): the
data URL is copied into the cluster's data dir there, once per cluster, with
its progress as the cluster's reason (``status``, ``list``, the dashboard
header) and a ``Synced``/``SyncFailed`` event; a failed copy fails the
cluster in one sentence and leaves the data dir as it was.  For a backup
it starts an *uploader* there too (``python -m
tfk8s_magics.backends.local.storage``), a child that stays on the host's
network, waits, and when the tasks have ended (:meth:`after_tasks`) uploads
``<log dir>/checkpoints`` and ``<log dir>/models`` to ``<backup>/checkpoints``
and ``<backup>/models`` (the layout of the Kubernetes backup step) with
the same progress lines as ``python -m tfk8s_magics.storage upload``.
After success a failed upload fails the cluster (as the Kubernetes backup
step does); after a stop it is best effort (an event says what happened).
Credentials are the supervisor's environment (the launching process's),
read by fsspec; none is passed on a command line or written anywhere.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ... import storage
from ...errors import SpecError
from ...lifeline import set_parent_death_signal
from ...storage.__main__ import human
from ...storage.__main__ import main as storage_main
from ..base import Phase

#: Seconds between status rewrites while data is copied.
PROGRESS_EVERY = 0.5
#: What is backed up: ``<log dir>/<name>`` → ``<backup>/<name>``.
BACKED_UP = ("checkpoints", "models")


class ClusterStorage:
    """The storage steps of one supervised cluster (see the module docstring)."""

    def __init__(self, sup) -> None:
        self.sup = sup
        self.spec = sup.spec
        self.uploader: subprocess.Popen | None = None
        self._next = 0.0

    @property
    def streams(self) -> bool:
        """Whether the tasks read the data URL themselves (``$TFK8S_DATA_URL``): they need the network."""
        return bool(self.spec.data_url) and not self.spec.data_sync

    def task_env(self) -> dict[str, str]:
        """What a task gets for streaming: ``TFK8S_DATA_URL`` and the storage credentials of this
        environment (the allow-list of :mod:`tfk8s_magics.taskenv` keeps them out otherwise)."""
        if not self.streams:
            return {}
        env = credential_env(os.environ)
        env["TFK8S_DATA_URL"] = str(self.spec.data_url)
        return env

    # -- before the tasks -----------------------------------------------------
    def before_tasks(self) -> bool:
        """Copy the data URL (``--data-sync``) and start the uploader (``--backup``); False if the
        copy failed (the cluster is failed then)."""
        if self.spec.backup_url:
            self._start_uploader()
        if not (self.spec.data_url and self.spec.data_sync):
            return True
        url, dest = self.spec.data_url, self.sup.record["data_dir"]
        self._say(f"sync: fetching {url} into {dest}")
        started = time.monotonic()
        try:
            done = storage.sync_down(url, dest, progress=lambda d, t: self._progress("fetching", url, d, t))
        except SpecError as e:
            self.sup.fail(f"sync: {e}")
            self.sup.event("", "SyncFailed", str(e), "Warning")
            return False
        took = time.monotonic() - started
        self.sup.event("", "Synced", f"{url} → {dest}: {done['files']} file(s), {human(done['bytes'])} "
                       f"in {took:.1f} s")
        self._say("")
        return True

    def _say(self, reason: str) -> None:
        self.sup.reason = reason
        self.sup.write_status()

    def _progress(self, verb: str, url: str, done: int, total: int) -> None:
        now = time.monotonic()
        if now < self._next and done < total:
            return
        self._next = now + PROGRESS_EVERY
        pct = f" ({100 * done / total:.0f}%)" if total else ""
        self._say(f"sync: {verb} {url}: {human(done)} of {human(total)}{pct}")

    def _start_uploader(self) -> None:
        me = os.getpid()
        self.uploader = subprocess.Popen(
            [sys.executable, "-m", "tfk8s_magics.backends.local.storage"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=lambda: set_parent_death_signal(signal.SIGKILL, me),
        )

    # -- after the tasks ------------------------------------------------------
    def on_success(self) -> None:
        """The workers succeeded: back up before the success is written, so a ``wait`` returns once
        the results are safe (the Kubernetes backup step is part of the JobSet's success too).  The
        cluster shows as running with the upload's progress meanwhile; a failed upload fails it."""
        if self.uploader is None or self.sup.phase != Phase.SUCCEEDED:
            return
        reason, finished = self.sup.reason, self.sup.finished
        self.sup.phase, self.sup.finished = Phase.RUNNING, None
        ok, why = self._upload()
        if ok:
            self.sup.phase, self.sup.reason, self.sup.finished = Phase.SUCCEEDED, reason, finished
            self.sup.event("", "BackedUp", f"checkpoints and models → {self.spec.backup_url}: {why}")
        else:
            self.sup.fail(f"backup: {why}")
            self.sup.event("", "BackupFailed", why, "Warning")
        self.sup.dirty = True

    def after_tasks(self) -> None:
        """Every task has ended: after a stop, back up (best effort); otherwise let the uploader go."""
        if self.uploader is None:
            return
        if self.sup.phase != Phase.STOPPED:  # a failed cluster's checkpoints may be what broke it
            self.uploader.stdin.close()
            self.uploader.wait()
            self.uploader = None
            return
        reason = self.sup.reason
        ok, why = self._upload()
        self.sup.reason = reason
        if ok:
            self.sup.event("", "BackedUp",
                           f"after the stop: checkpoints and models → {self.spec.backup_url}: {why}")
        else:
            self.sup.event("", "BackupFailed", f"best effort after a stop: {why}", "Warning")
        self.sup.dirty = True

    def _upload(self) -> tuple[bool, str]:
        """Have the uploader copy ``checkpoints`` and ``models``; (whether it succeeded, its last line)."""
        proc, self.uploader = self.uploader, None
        log_dir = Path(self.sup.record["log_dir"])
        jobs = [[str(log_dir / name), storage.join(str(self.spec.backup_url), name)] for name in BACKED_UP]
        self._say(f"backup: uploading to {self.spec.backup_url}")
        last = ""
        try:
            proc.stdin.write(json.dumps(jobs) + "\n")
            proc.stdin.close()
            for line in proc.stdout:
                last = line.strip()
                if last.startswith("tfk8s-storage: uploaded"):
                    self._say(f"backup: {last.removeprefix('tfk8s-storage: ')} to {self.spec.backup_url}")
        except OSError as e:
            last = f"tfk8s-storage: the uploader ended early ({e.strerror or e})"
        rc = proc.wait()
        # Success is the uploader's last line as well as its code (a reaped child reports 0).
        return rc == 0 and last.startswith("tfk8s-storage: done"), last.removeprefix("tfk8s-storage: ")


def credential_env(environ) -> dict[str, str]:
    """The storage credentials and settings of ``environ`` (S3, GCS, Azure, fsspec's config)."""
    prefixes = ("AWS_", "FSSPEC_", "GOOGLE_", "AZURE_STORAGE_", "HADOOP_", "ARROW_")
    return {k: v for k, v in environ.items() if k.startswith(prefixes)}


def main() -> int:
    """The uploader: wait for one JSON line ``[[src, url], ...]`` on stdin, upload each (progress on
    stdout), exit 0, or 1 after the first failure; no line (stdin closed): exit 0, nothing done."""
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    for src, url in json.loads(line):
        if storage_main(["upload", src, url]) != 0:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
