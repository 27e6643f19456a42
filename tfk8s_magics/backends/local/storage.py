"""Object storage for a local cluster: the --data-sync copy before the tasks, the --backup upload after.

The supervisor calls :meth:`ClusterStorage.before_tasks` before it leaves the
host's network for the cluster's private namespace (:mod:`.isolation`): the
data URL is copied into the cluster's data dir there, once per cluster, with
its progress as the cluster's reason (``status``, ``list``, the dashboard
header) and a ``Synced``/``SyncFailed`` event; a failed copy fails the
cluster in one sentence and leaves the data dir as it was.  The copy is a
child (``python -m tfk8s_magics.storage fetch URL DIR``, its own process
group) whose output the supervisor reads in its own wait
(:meth:`~.supervisor.Supervisor.pump`): the owner's exit, ``stop`` or
``delete`` during a long copy stops the cluster at once — the child is
killed, what it wrote is removed (``SyncAborted``), the status is final.  For a backup
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
import selectors
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from ... import storage
from ...lifeline import set_parent_death_signal
from ...storage.__main__ import main as storage_main
from ..base import Phase

#: What is backed up: ``<log dir>/<name>`` → ``<backup>/<name>``.
BACKED_UP = ("checkpoints", "models")


class ClusterStorage:
    """The storage steps of one supervised cluster (see the module docstring)."""

    def __init__(self, sup) -> None:
        self.sup = sup
        self.spec = sup.spec
        self.uploader: subprocess.Popen | None = None

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
        url, dest = str(self.spec.data_url), self.sup.record["data_dir"]
        self._say(f"sync: fetching {url} into {dest}")
        code, last = SyncCopy(self, url, dest).run()
        if code is None:
            self.sup.event("", "SyncAborted", f"{url} → {dest}: {self.sup.stop_reason} during the copy; "
                           f"nothing of it was kept ({last or 'no byte yet'})", "Warning")
            return False
        if code != 0 or not last.startswith("done: "):
            why = last or f"the copy exited {code}"
            self.sup.fail(f"sync: {why}")
            self.sup.event("", "SyncFailed", why, "Warning")
            return False
        self.sup.event("", "Synced", f"{url} → {dest}: {last.removeprefix('done: ')}")
        self._say("")
        return True

    def _say(self, reason: str) -> None:
        self.sup.reason = reason
        self.sup.write_status()

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


class SyncCopy:
    """One --data-sync copy as a child process that the supervisor can stop at any moment."""

    def __init__(self, owner: ClusterStorage, url: str, dest: str) -> None:
        self.owner, self.url, self.dest = owner, url, Path(dest)
        self.buffer, self.last, self.open = b"", "", True
        self.fd = -1

    def run(self) -> tuple[int | None, str]:
        """(the child's exit code, or None when the cluster was stopped meanwhile; its last line
        without the ``tfk8s-storage:`` prefix)."""
        sup, made, me = self.owner.sup, not self.dest.exists(), os.getpid()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tfk8s_magics.storage", "fetch", self.url, str(self.dest)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: killed whole, whatever fsspec started
            preexec_fn=lambda: set_parent_death_signal(signal.SIGKILL, me),
        )
        self.fd = proc.stdout.fileno()
        os.set_blocking(self.fd, False)
        sup.sel.register(self.fd, selectors.EVENT_READ, ("call", self.readable))
        try:
            while self.open and not sup.stop_reason:
                sup.pump(None)
        finally:
            sup.sel.unregister(self.fd)
        if self.open:  # stopped meanwhile (owner gone, stop, delete): end it, keep nothing
            self._abort(proc, made)
            return None, self.last
        proc.stdout.close()
        return proc.wait(), self.last

    def readable(self) -> None:
        """Read what the child wrote: progress lines become the cluster's reason."""
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return
        if not data:
            self.open, data = False, b"\n"
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace").strip().removeprefix("tfk8s-storage: ")
            if line:
                self.last = line
            if line.startswith("fetched "):
                self.owner._say(f"sync: fetching {self.url}: {line.removeprefix('fetched ')}")

    def _abort(self, proc: subprocess.Popen, made: bool) -> None:
        """Kill the copy's whole group, then remove what it wrote (its hidden temporary dir; the
        data dir itself when the copy made it)."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        proc.stdout.close()
        if made:
            shutil.rmtree(self.dest, ignore_errors=True)
        else:
            for tmp in self.dest.glob(".tfk8s-sync-*"):
                shutil.rmtree(tmp, ignore_errors=True)


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
