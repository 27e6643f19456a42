"""Start, find and stop the test cluster's processes (each one recorded by pid and start time)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # field 22 (starttime), counted after the ")" that ends the command name
    return stat.rsplit(")", 1)[1].split()[19]


class Procs:
    """The processes of one cluster directory: ``<dir>/procs/<name>.json`` + ``<dir>/logs/<name>.log``."""

    def __init__(self, root: Path):
        self.root = root
        self.pids = root / "procs"
        self.logs = root / "logs"

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
        """Start ``argv`` in its own session, its output in ``logs/<name>.log``; return its pid.

        ``env`` holds the variables added to this process's environment (recorded for restarts).
        """
        self.pids.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{name}.log", "ab") as log:
            p = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **(env or {})},
                close_fds=True,
            )
        self._write(
            name, {"pid": p.pid, "start": _start_time(p.pid), "argv": argv, "env": env, "stopped": False}
        )
        return p.pid

    def _write(self, name: str, rec: dict) -> None:
        tmp = self.pids / f".{name}.json.tmp"
        tmp.write_text(json.dumps(rec))
        tmp.replace(self.pids / f"{name}.json")

    def alive(self, name: str) -> bool:
        """True while the recorded process of ``name`` runs (same pid and start time)."""
        rec = self._record(name)
        if not rec:
            return False
        st = _start_time(rec["pid"])
        if st is None or st != rec.get("start"):
            return False
        # a zombie (exited, not reaped by us) counts as dead
        try:
            return Path(f"/proc/{rec['pid']}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    def pid(self, name: str) -> int | None:
        """The recorded pid of ``name`` (running or not), or None."""
        rec = self._record(name)
        return rec["pid"] if rec else None

    def _record(self, name: str) -> dict | None:
        try:
            return json.loads((self.pids / f"{name}.json").read_text())
        except (OSError, ValueError):
            return None

    def names(self) -> list[str]:
        """Names of the recorded processes, in start order."""
        if not self.pids.is_dir():
            return []
        files = sorted(self.pids.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
        return [f.stem for f in files]

    def stop(self, name: str, grace: float = 10.0, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` (SIGTERM) to the process group of ``name``, SIGKILL after ``grace`` seconds.

        Its record (the command line) stays, so :meth:`restart` can start it again.  A fault
        test passes ``sig=signal.SIGKILL``: the process dies with no chance to clean up.
        """
        rec = self._record(name)
        if rec:
            self._write(name, {**rec, "stopped": True})  # the keeper must not start it again
        if rec and self.alive(name):
            pid = rec["pid"]
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and self.alive(name):
                time.sleep(0.1)
            if self.alive(name):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                while self.alive(name) and time.monotonic() < deadline + 5:
                    time.sleep(0.1)

    def restart(self, name: str, down_for: float = 0.0, sig: int = signal.SIGTERM) -> int:
        """Stop ``name`` (with ``sig``) and start it again with the same command line (a fault
        test's tool)."""
        rec = self._record(name)
        if not rec:
            raise KeyError(f"no process {name!r} was started here")
        self.stop(name, sig=sig)
        time.sleep(down_for)
        return self.start(name, rec["argv"], env=rec.get("env"))

    def keep(self, period: float = 1.0, skip: tuple[str, ...] = (), also=None) -> None:
        """Start again every recorded process that exited without being stopped (forever).

        What a kubelet does for static control-plane pods: kube-scheduler, JobSet and
        kube-controller-manager exit when the API server is gone for a while, and a real control
        plane brings them back. Backoff doubles per process up to 30 s while it keeps dying.
        ``also`` is called once per round (the volume recycler).
        """
        backoff: dict[str, float] = {}
        due: dict[str, float] = {}
        while True:
            now = time.monotonic()
            for name in self.names():
                rec = self._record(name)
                if name in skip or not rec or rec.get("stopped") or self.alive(name):
                    if rec and self.alive(name) and now - due.get(name, now) > 60:
                        backoff.pop(name, None)  # up for a minute: forgive its past
                    continue
                if now < due.get(name, 0):
                    continue
                print(f"devcluster: {name} exited; starting it again", flush=True)
                self.start(name, rec["argv"], env=rec.get("env"))
                backoff[name] = min(2 * backoff.get(name, 0.5), 30.0)
                due[name] = now + backoff[name]
            if also is not None:
                also()
            time.sleep(period)

    def wait_ready(
        self,
        name: str,
        ready,
        timeout: float,
        error: type[Exception],
        what: str,
        where: str = "",
        tolerate: tuple[type[BaseException], ...] = (OSError,),
    ) -> None:
        """Poll ``ready()`` until it is true, after :meth:`start` of ``name`` (``what``: how an error
        names it; ``where``: what it should answer on, for the message). An exception in
        ``tolerate`` counts as not yet; ``error`` with the process's last lines if it exits first
        or ``timeout`` s pass."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive(name):
                raise error(f"{what} exited while starting; its last lines:\n{self.tail(name)}")
            try:
                if ready():
                    return
            except tolerate:
                pass
            if time.monotonic() > deadline:
                at = f" on {where}" if where else ""
                raise error(f"{what} did not answer{at} within {timeout:.0f} s:\n{self.tail(name)}")
            time.sleep(0.2)

    def tail(self, name: str, lines: int = 20) -> str:
        """The last lines of a process's log (for error messages)."""
        try:
            with open(self.logs / f"{name}.log", "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 8192))
                return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
