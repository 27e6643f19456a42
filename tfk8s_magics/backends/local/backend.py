"""The local backend: every task a process on this machine, supervised per cluster.

Launching writes the cluster's record under the state dir and starts its
supervisor (:mod:`.supervisor`), which owns the task processes.  Everything
else here reads the files the supervisor and the tasks write, so
``list``/``status``/``logs`` work from any process, after a kernel restart
too.

TF_CONFIG names 127.0.0.1 only, every server the lab itself runs
(TensorBoard) binds 127.0.0.1, and TensorFlow's gRPC servers — which
would listen on all interfaces whatever TF_CONFIG says — are kept on
loopback by the preloaded shim of :mod:`.isolation`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ... import scriptcheck, stall
from ...errors import BackendError, ClusterExists, ClusterNotFound, LaunchFailed, SpecError
from ...lifeline import pid_alive
from ...ports import free_ports, port_open
from ...runtime.progress import append_to, parse_record
from ...serving import local as serving
from ...spec import ClusterSpec
from ...tfconfig import cluster_def
from ..base import (
    Backend,
    ClusterStatus,
    Coordinator,
    Event,
    LogLine,
    LogLocation,
    Phase,
    Progress,
    TensorBoardInfo,
)
from . import isolation, logtail
from .inotify import DirWatcher
from .layout import (
    ClusterDir,
    default_state_dir,
    read_json,
    task_log_path,
    write_json_atomic,
    write_record,
)
from .status import LocalTaskStatus

#: Seconds to wait for a new supervisor to report in.
SUPERVISOR_START_TIMEOUT = 30.0
#: Seconds to wait for a stopped cluster's processes to end.
STOP_TIMEOUT = 20.0
#: How often watchers look at status.json where inotify is unavailable.
WATCH_INTERVAL = 0.1
#: Longest sleep of a watcher between inotify wake-ups (it wakes at once on a change).
IDLE_WAKEUP = 1.0
TENSORBOARD_START_TIMEOUT = 90.0
#: The task name an in-graph client reports progress as.
COORDINATOR = "chief-0"


class LocalBackend(Backend):
    """Run clusters as processes on 127.0.0.1.

    ``state_dir`` holds every cluster's record, status and default log and
    data dirs (default: ``$TFK8S_STATE_DIR`` or ``~/.local/share/tfk8s``).
    """

    name = "local"

    def __init__(self, state_dir: str | os.PathLike | None = None) -> None:
        self.state_dir = Path(state_dir) if state_dir else default_state_dir()
        self.clusters_dir = self.state_dir / "clusters"

    # -- helpers -----------------------------------------------------------
    def _dir(self, name: str) -> ClusterDir:
        cdir = ClusterDir(self.clusters_dir / name)
        if not cdir.record.exists():
            known = sorted(p.name for p in self.clusters_dir.glob("*") if (p / "cluster.json").exists())
            hint = f" Known clusters: {', '.join(known)}." if known else " There are none yet."
            raise ClusterNotFound(
                f"no local cluster named {name!r}.{hint} Launch one with %tfcluster launch {name} ..."
            )
        return cdir

    def _record(self, name: str) -> dict:
        return read_json(self._dir(name).record)

    def spec(self, name: str) -> ClusterSpec:
        return ClusterSpec.from_dict(self._record(name)["spec"])

    # -- launch ------------------------------------------------------------
    def preflight(self, spec: ClusterSpec) -> None:
        """Checks that need this machine: imports the tasks cannot resolve, unusable dirs."""
        if spec.script is not None:
            # Exactly the tasks' rules: the script's folder, then PYTHONPATH (see scriptcheck).
            scriptcheck.check_imports(
                spec.script, scriptcheck.script_dir(spec), scriptcheck.task_pythonpath(spec.env, os.environ),
                provided=list(spec.files),
            )
        for what, value in (("--log-dir", spec.log_dir), ("--data-dir", spec.data_dir)):
            if value and Path(value).expanduser().exists() and not Path(value).expanduser().is_dir():
                raise SpecError(f"{what} {value!r} is a file, not a directory: give a directory.")
        if spec.log_claim or spec.data_claim:
            raise SpecError(
                "--log-claim/--data-claim name Kubernetes volumes; on the local backend use "
                "--log-dir/--data-dir instead."
            )
        if spec.ttl_after_finished is not None:
            # The lifecycle policy's TTL needs a controller that outlives the cluster's processes.
            raise SpecError(
                f"ttl_after_finished={spec.ttl_after_finished:g} is enforced on Kubernetes only; on the "
                "local backend leave it unset and remove a finished cluster with %tfcluster delete NAME."
            )

    def launch(self, spec: ClusterSpec, *, detach: bool = False) -> ClusterStatus:
        self.preflight(spec)
        self.clusters_dir.mkdir(parents=True, exist_ok=True)
        cdir = ClusterDir(self.clusters_dir / spec.name)
        try:
            cdir.root.mkdir()
        except FileExistsError:
            raise ClusterExists(
                f"a cluster named {spec.name!r} already exists: launch with --replace to delete it "
                f"and launch again, pick another name, or %tfcluster delete {spec.name} first."
            ) from None
        created: list[Path] = [cdir.root]  # removed again if the launch fails
        sup: subprocess.Popen | None = None
        try:
            log_dir = Path(spec.log_dir).expanduser().resolve() if spec.log_dir else cdir.default_log_dir
            data_dir = Path(spec.data_dir).expanduser().resolve() if spec.data_dir else cdir.default_data_dir
            for d in (log_dir / "tasks", log_dir / "checkpoints", data_dir, cdir.progress_dir):
                top = _first_missing(d)
                d.mkdir(parents=True, exist_ok=True)
                if top is not None and not _inside(top, cdir.root):
                    created.append(top)
            tasks = spec.tasks()
            ports = dict(zip((t.name for t in tasks), free_ports(len(tasks)), strict=True))
            addresses = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
            _write_script(cdir, spec)
            record = {
                "backend": self.name,
                "spec": spec.to_dict(),
                "created": time.time(),
                "owner_pid": os.getpid(),
                "owner": spec.owner or os.environ.get("JUPYTERHUB_USER") or _user(),
                "detached": bool(detach),
                "addresses": addresses,
                "cluster": cluster_def(spec, lambda t: addresses[t.name]),
                "workdir": os.getcwd(),
                "script_dir": scriptcheck.script_dir(spec),
                "stall_timeout": stall.timeout_from_env(),
                "loopback_shim": str(shim) if (shim := isolation.shim_path()) else None,
                "log_dir": str(log_dir),
                "data_dir": str(data_dir),
            }
            write_record(cdir.record, record)
            with open(cdir.supervisor_log, "ab") as out:
                sup = subprocess.Popen(
                    [sys.executable, "-m", "tfk8s_magics.backends.local.supervisor", str(cdir.root)],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # a kernel interrupt must not reach it
                )
            self._await_supervisor(cdir, sup)
        except BaseException:
            if sup is not None and sup.poll() is None:
                sup.kill()  # its tasks die with it (parent-death signal)
                sup.wait()
            for path in reversed(created):
                shutil.rmtree(path, ignore_errors=True)
            raise
        return self.status(spec.name)

    def _await_supervisor(self, cdir: ClusterDir, sup: subprocess.Popen) -> None:
        deadline = time.monotonic() + SUPERVISOR_START_TIMEOUT
        while not cdir.status.exists():
            if sup.poll() is not None:
                raise LaunchFailed(
                    f"the supervisor of {cdir.name!r} exited at start (code {sup.returncode}); "
                    "nothing was left running.",
                    "\n".join(logtail.tail_lines(cdir.supervisor_log, 20)),
                )
            if time.monotonic() > deadline:
                raise LaunchFailed(
                    f"the supervisor of {cdir.name!r} did not start within "
                    f"{SUPERVISOR_START_TIMEOUT:g} s; the machine may be overloaded. Try again."
                )
            time.sleep(0.01)

    # -- status ------------------------------------------------------------
    def _status_from(self, cdir: ClusterDir, record: dict) -> ClusterStatus:
        spec = record["spec"]
        raw = read_json(cdir.status) or {}
        tasks = [LocalTaskStatus.from_record(t) for t in raw.get("tasks", [])] or [
            LocalTaskStatus(name=t, host=a) for t, a in record["addresses"].items()
        ]
        phase = raw.get("phase", Phase.PENDING)
        reason = raw.get("reason", "")
        sup_pid = raw.get("supervisor_pid")
        if raw and not raw.get("supervisor_done") and not pid_alive(sup_pid):
            # The supervisor was killed: its tasks died with it (parent-death signal).
            if phase not in Phase.TERMINAL:
                phase, reason = Phase.FAILED, "its supervisor process died; the tasks were killed with it"
            for t in tasks:
                if t.phase not in Phase.TERMINAL:
                    t.phase, t.reason, t.pid = Phase.FAILED, "supervisor died", None
        return ClusterStatus(
            name=spec["name"],
            backend=self.name,
            mode=spec["mode"],
            phase=phase,
            reason=reason,
            created=record["created"],
            finished=raw.get("finished"),
            owner=record.get("owner", ""),
            detached=record.get("detached", False),
            log_dir=LogLocation(record["log_dir"]),
            tasks=tasks,
            progress=self._progress(cdir, tasks),
            stall=stall.Stall.from_dict(raw.get("stall")) if phase == Phase.RUNNING else None,
        )

    def _progress(self, cdir: ClusterDir, tasks: list[LocalTaskStatus]) -> Progress | None:
        best: Progress | None = None
        names = [t.name for t in tasks]
        # The chief (or an in-graph client) speaks for the cluster; else worker-0;
        # else whoever is furthest.
        preferred = [n for n in (COORDINATOR, "worker-0") if n in names or n == COORDINATOR]
        for name in preferred + [n for n in names if n not in preferred]:
            lines = logtail.tail_lines(cdir.progress_file(name), 1)
            record = parse_record(lines[-1]) if lines else None
            if record is None:
                continue
            p = Progress(**{k: record[k] for k in ("step", "total", "rate", "metrics", "task", "time")})
            if name in preferred:
                return p
            if best is None or p.step > best.step:
                best = p
        return best

    def status(self, name: str) -> ClusterStatus:
        cdir = self._dir(name)
        return self._status_from(cdir, read_json(cdir.record))

    def list_clusters(self) -> list[ClusterStatus]:
        out = []
        for root in self.clusters_dir.glob("*"):
            cdir = ClusterDir(root)
            record = read_json(cdir.record)
            if record is not None:
                out.append(self._status_from(cdir, record))
        return sorted(out, key=lambda s: s.created, reverse=True)

    def _finished(self, cdir: ClusterDir) -> bool:
        """Whether nothing of the cluster runs any more (or it was deleted)."""
        if not cdir.record.exists():
            return True
        raw = read_json(cdir.status) or {}
        return bool(raw.get("supervisor_done")) or (bool(raw) and not pid_alive(raw.get("supervisor_pid")))

    def _finished_check(self, cdir: ClusterDir):
        """A cheap :meth:`_finished` for loops: re-reads status.json when it changed, and
        at most every second otherwise (a SIGKILLed supervisor cannot update its status)."""
        cache: dict[str, object] = {"mark": None, "checked": float("-inf"), "done": False}

        def check() -> bool:
            try:
                mark = cdir.status.stat().st_mtime_ns
            except FileNotFoundError:
                mark = None
            now = time.monotonic()
            if mark != cache["mark"] or now - cache["checked"] >= 1.0:
                cache.update(mark=mark, checked=now, done=self._finished(cdir))
            return bool(cache["done"])

        return check

    def watch(self, name: str, stop: threading.Event) -> Iterator[ClusterStatus]:
        cdir = self._dir(name)
        finished = self._finished_check(cdir)
        last = None
        with DirWatcher([cdir.root, cdir.progress_dir]) as watcher:
            while not stop.is_set():
                try:
                    marks = [cdir.status.stat().st_mtime_ns]
                    marks += [p.stat().st_mtime_ns for p in cdir.progress_dir.glob("*.jsonl")]
                except FileNotFoundError:
                    if not cdir.record.exists():
                        return  # deleted
                    marks = None
                if marks != last or finished():
                    last = marks
                    try:
                        st = self.status(name)
                    except ClusterNotFound:
                        return
                    yield st
                    if st.terminal and finished():
                        return
                watcher.wait(IDLE_WAKEUP if watcher.active else WATCH_INTERVAL)

    # -- logs --------------------------------------------------------------
    def _log_files(self, name: str, tasks: list[str] | None) -> dict[str, Path]:
        record = self._record(name)
        spec = ClusterSpec.from_dict(record["spec"])
        names = [spec.task(t).name for t in tasks] if tasks else [t.name for t in spec.tasks()]
        return {t: task_log_path(record["log_dir"], t) for t in names}

    def read_logs(self, name: str, task: str | None = None, tail: int | None = None) -> list[LogLine]:
        files = self._log_files(name, [task] if task else None)
        out: list[LogLine] = []
        for t, path in files.items():
            out += [LogLine(t, line) for line in logtail.tail_lines(path, tail)]
        return out

    def follow_logs(
        self,
        name: str,
        stop: threading.Event,
        tasks: list[str] | None = None,
        from_start: bool = True,
    ) -> Iterator[LogLine]:
        files = self._log_files(name, tasks)
        cdir = self._dir(name)
        return logtail.follow(files, stop, self._finished_check(cdir), from_start, wake_dirs=[cdir.root])

    def events(self, name: str) -> list[Event]:
        cdir = self._dir(name)
        out = []
        try:
            with open(cdir.events, encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        out.append(Event(**json.loads(line)))
        except FileNotFoundError:
            pass
        return out

    def addresses(self, name: str) -> dict[str, list[str]]:
        return self._record(name)["cluster"]

    def coordinator(self, name: str) -> Coordinator:
        """This process listens as chief on a free loopback port; its progress records go
        where the cluster's chief's would (they speak for the cluster)."""
        path = self._dir(name).progress_file(COORDINATOR)
        return Coordinator(f"127.0.0.1:{free_ports(1)[0]}", append_to(str(path)), COORDINATOR)

    # -- stop / delete -------------------------------------------------------
    def stop(self, name: str) -> ClusterStatus:
        cdir = self._dir(name)
        raw = read_json(cdir.status) or {}
        sup = raw.get("supervisor_pid")
        if pid_alive(sup) and not raw.get("supervisor_done"):
            os.kill(sup, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT
            while pid_alive(sup) and time.monotonic() < deadline:
                time.sleep(0.02)
            if pid_alive(sup):
                os.kill(sup, signal.SIGKILL)  # the tasks die with it
        # Whatever happened above, no task of this cluster may survive.
        for t in (read_json(cdir.status) or {}).get("tasks", []):
            if t.get("pid") and pid_alive(t["pid"]):
                try:
                    os.killpg(t["pid"], signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        return self.status(name)

    def delete(self, name: str, keep_logs: bool = False) -> LogLocation | None:
        """Stop and remove the cluster; return where its logs were kept, if asked to keep them."""
        cdir = self._dir(name)
        record = read_json(cdir.record)
        self.stop(name)
        self._stop_tensorboard(cdir)
        self.stop_serving(name)
        kept = None
        log_dir = Path(record["log_dir"])
        if keep_logs and _inside(log_dir, cdir.root) and log_dir.exists():
            kept = self.state_dir / "kept-logs" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(log_dir), str(kept))
        elif keep_logs:
            kept = log_dir
        # A log or data dir the user named is theirs: only the cluster dir goes.
        shutil.rmtree(cdir.root, ignore_errors=True)
        return None if kept is None else LogLocation(str(kept))

    # -- TensorBoard -----------------------------------------------------------
    def tensorboard(self, name: str) -> TensorBoardInfo:
        cdir = self._dir(name)
        record = read_json(cdir.record)
        info = read_json(cdir.tensorboard)
        if info and pid_alive(info.get("pid")) and port_open(info["port"]):
            return TensorBoardInfo(info["port"], _tb_url(info["port"]), record["log_dir"], True, info["pid"])
        port = free_ports(1)[0]
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "tfk8s_magics.runtime.tensorboard", str(os.getpid()),
                "--logdir", record["log_dir"], "--host", "127.0.0.1", "--port", str(port),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(cdir.root / "tensorboard.log", "ab"),  # noqa: SIM115 - the child owns it
            start_new_session=True,
        )
        deadline = time.monotonic() + TENSORBOARD_START_TIMEOUT
        while not port_open(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
                tail = "\n".join(logtail.tail_lines(cdir.root / "tensorboard.log", 10))
                raise BackendError(
                    f"TensorBoard for {name!r} did not start (see {cdir.root / 'tensorboard.log'}):\n{tail}"
                )
            time.sleep(0.05)
        write_json_atomic(cdir.tensorboard, {"pid": proc.pid, "port": port})
        return TensorBoardInfo(port, _tb_url(port), record["log_dir"], False, proc.pid)

    def _stop_tensorboard(self, cdir: ClusterDir) -> None:
        info = read_json(cdir.tensorboard)
        if info and pid_alive(info.get("pid")):
            try:
                os.kill(info["pid"], signal.SIGTERM)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + 5
            while pid_alive(info["pid"]) and time.monotonic() < deadline:
                time.sleep(0.02)
            if pid_alive(info["pid"]):
                os.kill(info["pid"], signal.SIGKILL)

    # -- serving (see tfk8s_magics.serving.local) -------------------------------
    def serve(self, name: str, model: str | None = None, **options):
        """Serve the cluster's newest exported model with the local TF-Serving-compatible server.

        ``replicas``/``cpu``/``memory`` are Kubernetes choices: one process serves here.
        """
        cdir = self._dir(name)
        allowed = {"poll_seconds", "timeout"}
        for key, value in options.items():
            if key not in allowed and value not in (None, 1):
                raise SpecError(f"--{key.replace('_', '-')} applies to Kubernetes serving; "
                                "the local backend runs one server process.")
        kwargs = {k: v for k, v in options.items() if k in allowed}
        return serving.start(name, cdir.root, read_json(cdir.record)["log_dir"], model, **kwargs)

    def serving(self, name: str):
        """The model this cluster serves, or None."""
        return serving.current(name, self._dir(name).root)

    def stop_serving(self, name: str) -> bool:
        """Stop serving the cluster's model; return whether a server was running."""
        return serving.stop(self._dir(name).root)


def _write_script(cdir: ClusterDir, spec: ClusterSpec) -> None:
    """Write the script the tasks run and the files that travel with it (``--file``)."""
    if spec.script is not None:
        cdir.script.write_text(spec.script, encoding="utf-8")
    if spec.files:
        cdir.files.mkdir()
        for file_name, text in spec.files.items():
            (cdir.files / file_name).write_text(text, encoding="utf-8")


def _tb_url(port: int) -> str:
    proxy = os.environ.get("TENSORBOARD_PROXY_URL")
    if proxy:
        return proxy.replace("%PORT%", str(port))
    return f"http://127.0.0.1:{port}/"


def _first_missing(path: Path) -> Path | None:
    """The outermost ancestor of ``path`` (or itself) that does not exist yet."""
    path = path.resolve()
    if path.exists():
        return None
    while not path.parent.exists():
        path = path.parent
    return path


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())
