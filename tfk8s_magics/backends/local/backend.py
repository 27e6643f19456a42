"""The local backend: every task a process on this machine, supervised per cluster.

Launching writes the cluster's record under the state dir and starts its
supervisor (:mod:`.supervisor`), which owns the task processes.  Everything
else here reads the files the supervisor and the tasks write, so
``list``/``status``/``logs`` work from any process, after a kernel restart
too.

TF_CONFIG names 127.0.0.1 only, every server the lab itself runs
(TensorBoard) binds 127.0.0.1, and TensorFlow's gRPC servers — which
listen on all interfaces whatever TF_CONFIG says — run in the cluster's
private network namespace (:mod:`tfk8s_magics.isolation`), or where
that is refused behind the loopback shim.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from ... import scriptcheck, stall, storage
from ...errors import BackendError, ClusterExists, ClusterNotFound, LaunchFailed, SpecError
from ...isolation.shim import shim_path
from ...lifeline import pid_alive, reap_in_background, same_process, wait_exit
from ...ports import free_ports
from ...runtime.progress import append_to
from ...spec import IN_GRAPH, ClusterSpec
from ...tfconfig import cluster_def
from ..base import (
    Backend,
    ClusterStatus,
    Coordinator,
    Event,
    LogChunk,
    LogLine,
    LogLocation,
    TensorBoardInfo,
)
from . import logtail, pool, sidecars, state
from .inotify import DirWatcher
from .layout import (
    MAX_STATE_BYTES,
    ClusterDir,
    UnreadableState,
    default_state_dir,
    open_for_reading,
    read_bounded,
    read_mapping,
    task_log_path,
    write_json_atomic,
    write_record,
)
from .warmpool import LocalWarmPool
from .watchdog import CLUSTER_ID_ENV, cluster_processes, describe

#: Seconds to wait for a new supervisor to report in.
SUPERVISOR_START_TIMEOUT = 30.0
#: Seconds to wait for a stopped cluster's processes to end.
STOP_TIMEOUT = 20.0
#: Times delete tries to remove a cluster's dir before it says it cannot.
REMOVE_ATTEMPTS = 5
#: Where a re-run keeps the previous run's logs: a folder of the new run's log dir (TensorBoard
#: shows its runs as ``previous-run/...``).
PREVIOUS_RUN = "previous-run"
#: How often watchers look at status.json where inotify is unavailable.
WATCH_INTERVAL = 0.1
#: Longest sleep of a watcher between inotify wake-ups (it wakes at once on a change).
IDLE_WAKEUP = 1.0
#: ``events`` reads at most this much of the end of ``events.jsonl`` (~20,000 events).
MAX_EVENTS_BYTES = 4 * 1024 * 1024
#: The task name an in-graph client reports progress as.
COORDINATOR = state.COORDINATOR


class LocalBackend(Backend):
    """Run clusters as processes on 127.0.0.1.

    ``state_dir`` holds every cluster's record, status and default log and
    data dirs (default: ``$TFK8S_STATE_DIR`` or ``~/.local/share/tfk8s``).
    """

    name = "local"
    capabilities = frozenset({"serving", "pool", "in_graph"})
    #: The local model server is a child of the process that started it.
    serving_ends_with_caller = True

    def __init__(self, state_dir: str | os.PathLike | None = None) -> None:
        self.state_dir = Path(state_dir) if state_dir else default_state_dir()
        self.clusters_dir = self.state_dir / "clusters"

    # -- helpers -----------------------------------------------------------
    def _cluster_dirs(self) -> list[ClusterDir]:
        """Every cluster dir (a real directory; never a symlink or a hidden temporary)."""
        try:
            entries = list(os.scandir(self.clusters_dir))
        except FileNotFoundError:
            return []
        return [ClusterDir(Path(e.path)) for e in entries
                if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)]

    def _dir(self, name: str) -> ClusterDir:
        cdir = ClusterDir(self.clusters_dir / name)
        if not (cdir.root.is_dir() and not cdir.root.is_symlink()):
            known = sorted(c.name for c in self._cluster_dirs())
            hint = f" Known clusters: {', '.join(known)}." if known else " There are none now."
            raise ClusterNotFound(
                f"no local cluster named {name!r}.{hint} Launch one with %tfcluster launch {name} ..."
            )
        return cdir

    def _read_record(self, cdir: ClusterDir) -> dict:
        """The cluster's record, checked for the keys every reader needs; raises UnreadableState."""
        return state.check_record(read_mapping(cdir.record))

    def _record(self, name: str) -> dict:
        cdir = self._dir(name)
        try:
            return self._read_record(cdir)
        except UnreadableState as e:
            raise BackendError(_unreadable_text(name, e)) from None

    def _raw_status(self, cdir: ClusterDir, record: dict) -> dict:
        """``status.json`` when it is this cluster's (same id); {} before the supervisor wrote it."""
        return state.check_status(read_mapping(cdir.status), record)

    def check_exists(self, name: str) -> None:
        """A cluster exists while its dir does, even when its state is unreadable."""
        self._dir(name)

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
        self._preflight_storage(spec)
        if spec.ttl_after_finished is not None:
            # The lifecycle policy's TTL needs a controller that outlives the cluster's processes.
            raise SpecError(
                f"ttl_after_finished={spec.ttl_after_finished:g} is enforced on Kubernetes only; on the "
                "local backend leave it unset and remove a finished cluster with %tfcluster delete NAME."
            )

    def _preflight_storage(self, spec: ClusterSpec) -> None:
        """A data or backup URL that cannot be used is refused before anything exists (one sentence)."""
        if spec.credentials_secret:
            raise SpecError(
                f"--credentials-secret {spec.credentials_secret!r} names a Kubernetes Secret; the local "
                "backend takes storage credentials from your environment (e.g. AWS_ACCESS_KEY_ID/"
                "AWS_SECRET_ACCESS_KEY) or fsspec's config: drop the flag."
            )
        if spec.data_url:
            storage.probe(spec.data_url, "--data-dir")
        if spec.backup_url:
            storage.probe(spec.backup_url, "--backup", write=True)

    def _make_cluster_dir(self, name: str) -> ClusterDir:
        """Create the cluster's private dir (0700); the name is taken by whoever creates it first."""
        self.clusters_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        cdir = ClusterDir(self.clusters_dir / name)
        try:
            cdir.root.mkdir(mode=0o700)
            return cdir
        except FileExistsError:
            pass
        if _abandoned_empty(cdir.root):  # an interrupted launch left it: the name is free again
            try:
                cdir.root.rmdir()
                cdir.root.mkdir(mode=0o700)
                return cdir
            except OSError:
                pass
        raise ClusterExists(
            f"a cluster named {name!r} already exists: launch with --replace to delete it "
            f"and launch again, pick another name, or %tfcluster delete {name} first."
        ) from None

    def _check_log_dir(self, log_dir: Path, given: str | None) -> None:
        """A user-named log dir must be new, empty or a tfk8s log dir, and no other cluster's."""
        if not given:
            return
        try:
            entries = sorted(os.listdir(log_dir)) if log_dir.is_dir() else []
        except OSError as e:
            raise SpecError(f"--log-dir {given!r} cannot be read ({e.strerror}): give a directory "
                            "you can write.") from None
        if entries and "tasks" not in entries:
            raise SpecError(
                f"--log-dir {given!r} already holds other files (e.g. {entries[0]!r}): give a new or empty "
                "directory, or the log dir of an earlier cluster."
            )
        for other in self._cluster_dirs():
            try:
                used = self._read_record(other)["log_dir"]
            except (UnreadableState, TypeError):
                continue
            if Path(used) == log_dir:
                raise SpecError(
                    f"--log-dir {given!r} is the log dir of cluster {other.name!r}: two clusters would "
                    f"show each other's logs. Give another dir, or delete {other.name} first (its "
                    "logs stay)."
                )

    def _make_dirs(self, cdir: ClusterDir, log_dir: Path, data_dir: Path, created: list[Path]) -> None:
        """Create the log, data and progress dirs (0700), adding to ``created`` the outermost ones
        made outside the cluster dir as soon as each is made (a later failure removes them too).
        A dir that cannot be made is a SpecError naming it and the cause."""
        for d in (log_dir / "tasks", log_dir / "checkpoints", data_dir, cdir.progress_dir):
            top = _first_missing(d)
            if top is not None and not _inside(top, cdir.root):
                created.append(top)  # before it is made: a part made before a failure goes too
            try:
                _mkdir_private(d)
            except OSError as e:
                flag = "--data-dir" if d == data_dir else "--log-dir"
                raise SpecError(f"{flag} cannot be used: cannot create {e.filename or d}: {e.strerror}. "
                                "Give a directory you can write.") from None

    def launch(self, spec: ClusterSpec, *, detach: bool = False) -> ClusterStatus:
        self.preflight(spec)
        try:
            return self._launch(spec, detach)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            # Rolled back already; one sentence, not the OSError's chain.
            raise BackendError(
                f"cannot launch {spec.name!r}: the disk holding {self.clusters_dir} is full "
                f"({e.strerror}): free space there (%tfcluster delete removes a cluster and its "
                "logs), then launch again."
            ) from None

    def _launch(self, spec: ClusterSpec, detach: bool) -> ClusterStatus:
        cdir = self._make_cluster_dir(spec.name)
        created: list[Path] = [cdir.root]  # removed again if the launch fails
        sup: subprocess.Popen | None = None
        try:
            log_dir = Path(spec.log_dir).expanduser().resolve() if spec.log_dir else cdir.default_log_dir
            data_dir = Path(spec.data_dir).expanduser().resolve() if spec.data_dir else cdir.default_data_dir
            self._check_log_dir(log_dir, spec.log_dir)
            self._make_dirs(cdir, log_dir, data_dir, created)
            cluster_id = uuid.uuid4().hex
            tasks = spec.tasks()
            ports = dict(zip((t.name for t in tasks), free_ports(len(tasks)), strict=True))
            addresses = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
            _write_script(cdir, spec)
            record = {
                "id": cluster_id,
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
                "loopback_shim": str(shim) if (shim := shim_path()) else None,
                # Detached: it outlives our pool, so cold.  The pool starts with the kind this launch needs.
                "pool": None if detach else pool.ensure(pool.default_kind(spec.mode == IN_GRAPH)),
                "log_dir": str(log_dir),
                "data_dir": str(data_dir),
                "created_dirs": [str(p) for p in created[1:]],
            }
            write_record(cdir.record, record)
            fd = os.open(cdir.supervisor_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "ab") as out:
                sup = subprocess.Popen(
                    [sys.executable, "-m", "tfk8s_magics.backends.local.supervisor", str(cdir.root)],
                    env={**os.environ, CLUSTER_ID_ENV: cluster_id},
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # a kernel interrupt must not reach it
                )
            self._await_supervisor(cdir, sup)
            reap_in_background(sup)  # it ends with its cluster: no zombie under this kernel
        except BaseException:
            if sup is not None and sup.poll() is None:
                sup.kill()  # its watchdog kills the tasks
                sup.wait()
            if sup is not None:
                self._kill_cluster(cdir, cluster_id, [])
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

    # -- status (the rules: .state) -----------------------------------------
    def _status_of(self, cdir: ClusterDir) -> ClusterStatus:
        """The cluster's status, read by :func:`.state.cluster_status` from its files; an
        unreadable or malformed state makes an ``unknown`` status that says why, never an exception."""
        return state.cluster_status(
            _files(cdir), backend=self.name, same_process=same_process, pid_alive=pid_alive,
            last_progress=lambda task: _last_progress(cdir, task),
            coordinator=lambda: _read_file(cdir.coordinator))

    def status(self, name: str) -> ClusterStatus:
        return self._status_of(self._dir(name))

    def list_clusters(self) -> list[ClusterStatus]:
        out = [self._status_of(cdir) for cdir in self._cluster_dirs()]
        return sorted(out, key=lambda s: s.created, reverse=True)

    def _finished(self, cdir: ClusterDir) -> bool:
        """Whether nothing of the cluster runs any more (or it was deleted)."""
        return state.finished(_files(cdir), same_process)

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

    def retire_for_rerun(self, name: str) -> Path | None:
        """Delete ended cluster ``name``, keeping its default log dir (minus its own previous run:
        one previous run is kept) for :meth:`attach_previous`; a log dir the user named stays."""
        location = self.delete(name, keep_logs=True)
        kept = None if location is None else Path(location.path)
        if kept is None or kept.parent != self.state_dir / "kept-logs":
            return None  # a --log-dir the user named: it stays where it is
        shutil.rmtree(kept / PREVIOUS_RUN, ignore_errors=True)
        return kept

    def attach_previous(self, name: str, kept: Path | None) -> None:
        """Move the previous run's logs into the new run's log dir as ``previous-run/`` (so its
        TensorBoard shows both runs and ``logs --previous`` reads them)."""
        if kept is None or not kept.exists():
            return
        target = Path(self._record(name)["log_dir"]) / PREVIOUS_RUN
        try:
            shutil.move(str(kept), str(target))
        except OSError as e:
            raise BackendError(f"the previous run's logs stay in {kept}: they could not be moved to "
                               f"{target} ({e.strerror or e})") from e

    def read_previous_logs(self, name: str, task: str | None = None,
                           tail: int | None = None) -> list[LogLine] | None:
        record = self._record(name)
        previous = Path(record["log_dir"]) / PREVIOUS_RUN
        if not previous.is_dir():
            return None
        spec = ClusterSpec.from_dict(record["spec"])
        names = [spec.task(task).name] if task else sorted(
            p.name[:-4] for p in (previous / "tasks").glob("*.log"))
        out: list[LogLine] = []
        for t in names:
            out += [LogLine(t, line) for line in logtail.tail_lines(task_log_path(previous, t), tail)]
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

    def follow_log_batches(
        self,
        name: str,
        stop: threading.Event,
        tasks: list[str] | None = None,
        from_start: bool = True,
    ) -> Iterator[LogChunk]:
        files = self._log_files(name, tasks)
        cdir = self._dir(name)
        return logtail.follow_batches(files, stop, self._finished_check(cdir), from_start,
                                      wake_dirs=[cdir.root])

    def events(self, name: str) -> list[Event]:
        """The cluster's events, oldest first: the last :data:`MAX_EVENTS_BYTES` of ``events.jsonl``;
        a line that is no event (a torn write, garbage) is skipped, and a last Warning event says
        how many were."""
        cdir = self._dir(name)
        try:
            fd = open_for_reading(cdir.events)
        except FileNotFoundError:
            return []
        except OSError as e:
            return [state.note(f"events.jsonl was not read: {e.strerror}", time.time())]
        with os.fdopen(fd, "rb") as f:
            start = max(0, os.fstat(fd).st_size - MAX_EVENTS_BYTES)
            f.seek(start)
            data = f.read(MAX_EVENTS_BYTES)
        return state.events_from(data, start, time.time(), MAX_EVENTS_BYTES)

    def addresses(self, name: str) -> dict[str, list[str]]:
        return self._record(name)["cluster"]

    def coordinator(self, name: str) -> Coordinator:
        """This process listens as chief on a free loopback port; its progress records go
        where the cluster's chief's would (they speak for the cluster)."""
        cdir = self._dir(name)

        def connected(when: float) -> None:
            write_json_atomic(cdir.coordinator, {"pid": os.getpid(), "connected": when})

        return Coordinator(f"127.0.0.1:{free_ports(1)[0]}", append_to(str(cdir.progress_file(COORDINATOR))),
                           COORDINATOR, connected)

    # -- stop / delete -------------------------------------------------------
    def stop(self, name: str) -> ClusterStatus:
        cdir = self._dir(name)
        record = self._record(name)
        try:
            raw = self._raw_status(cdir, record)
        except UnreadableState:
            raw = {}
        if not raw.get("supervisor_done") and _supervisor_alive(raw):
            sup = raw["supervisor_pid"]
            os.kill(sup, signal.SIGTERM)
            if not wait_exit(sup, STOP_TIMEOUT) and _supervisor_alive(raw):
                os.kill(sup, signal.SIGKILL)  # its watchdog kills the tasks
        self._kill_cluster(cdir, record.get("id"), raw.get("tasks", []))
        return self.status(name)

    def _kill_cluster(self, cdir: ClusterDir, cluster_id: str | None, tasks: list) -> None:
        """SIGKILL whatever of the cluster still runs: each task's process group (only a verified
        (pid, start time)), then every process marked with the cluster's id or working in its dir."""
        for t in tasks:
            if isinstance(t, dict) and same_process(t.get("pid"), t.get("pid_start")):
                try:
                    os.killpg(t["pid"], signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for _ in range(50):
            left = cluster_processes(cdir.root, cluster_id)
            if not left:
                return
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for pid in left:
                wait_exit(pid, 2.0)

    def delete(self, name: str, keep_logs: bool = False, force: bool = False) -> LogLocation | None:
        """Stop and remove the cluster; return where its logs were kept, if asked to keep them.

        ``force`` removes a cluster whose state is unreadable: it kills what is verifiably the
        cluster's (marked with its id or working in its dir) and removes the dir.  Either way the
        deletion is reported only once nothing of the cluster runs.
        """
        cdir = self._dir(name)
        try:
            record = self._read_record(cdir)
        except UnreadableState as e:
            if not force:
                raise BackendError(_unreadable_text(name, e)) from None
            record = None
        kept = None
        if record is not None:
            self.stop(name)
            sidecars.stop_tensorboard(cdir)
            self.stop_serving(name)
            kept = self._keep_logs(cdir, record, keep_logs)
        else:
            self._kill_cluster(cdir, _salvage_id(cdir), [])
        left = cluster_processes(cdir.root, (record or {}).get("id") or _salvage_id(cdir))
        if left:
            raise BackendError(f"{name!r} was not deleted: still running: {describe(left)}. "
                               "Kill them and delete again.")
        # A log or data dir the user named is theirs: only the cluster dir (and what launch made) goes.
        for path in (record or {}).get("created_dirs", []):
            _remove_empty_tree(Path(path))
        self._remove_cluster_dir(cdir, (record or {}).get("id") or _salvage_id(cdir))
        return None if kept is None else LogLocation(str(kept))

    def _remove_cluster_dir(self, cdir: ClusterDir, cluster_id: str | None) -> None:
        """Remove the cluster's dir, and say so if it cannot be: a dir left behind would keep its
        name taken, and a re-run would be refused as if another launch had taken it."""
        problem = ""
        for _ in range(REMOVE_ATTEMPTS):
            try:
                shutil.rmtree(cdir.root)
                return
            except FileNotFoundError:
                if not cdir.root.exists():
                    return
            except OSError as e:  # e.g. a late writer's file made a folder non-empty: kill, try again
                problem = f"{e.filename}: {e.strerror or e}"
            self._kill_cluster(cdir, cluster_id, [])
            time.sleep(0.1)
        raise BackendError(f"{cdir.name!r} was stopped but its dir {cdir.root} could not be removed "
                           f"({problem}): remove it by hand, then launch again.")

    def _keep_logs(self, cdir: ClusterDir, record: dict, keep_logs: bool) -> Path | None:
        """Move the default log dir out of the cluster dir when asked to keep it; a dir the user named
        stays where it is."""
        log_dir = Path(record["log_dir"])
        if keep_logs and _inside(log_dir, cdir.root) and log_dir.exists():
            kept = self.state_dir / "kept-logs" / f"{cdir.name}-{time.strftime('%Y%m%d-%H%M%S')}"
            kept.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            shutil.move(str(log_dir), str(kept))
            return kept
        return log_dir if keep_logs else None

    # -- TensorBoard and serving (see .sidecars) -------------------------------------
    def tensorboard(self, name: str) -> TensorBoardInfo:
        """The cluster's TensorBoard, started (behind the owner-only guard) if none runs."""
        return sidecars.tensorboard(name, self._dir(name), self._record(name))

    def serve(self, name: str, model: str | None = None, source_url: str | None = None, **options):
        """Serve the cluster's newest exported model (see :func:`.sidecars.serve`)."""
        sidecars.refuse_secret(options)
        return sidecars.serve(name, self._dir(name), model, source_url, **options)

    def serving(self, name: str):
        """The model this cluster serves, or None."""
        return sidecars.serving(name, self._dir(name))

    def warm_pool(self) -> LocalWarmPool:
        """This process's warm pool of task processes (:mod:`.pool`)."""
        return LocalWarmPool()

    def stop_serving(self, name: str) -> bool:
        """Stop serving the cluster's model; return whether a server was running."""
        return sidecars.stop_serving(self._dir(name))


def _read_file(path: Path) -> state.FileText:
    """A state file's bytes for :mod:`.state` (None: absent; :class:`.state.Unread`: why not)."""
    try:
        return read_bounded(path, MAX_STATE_BYTES)
    except OSError as e:
        return state.Unread(f"{path.name}: {e.strerror or e}")


def _files(cdir: ClusterDir) -> state.LocalFiles:
    """What the cluster's record and status files hold, as :mod:`.state` reads them."""
    try:
        created = cdir.root.lstat().st_mtime
    except OSError:
        created = 0.0
    return state.LocalFiles(cdir.name, _read_file(cdir.record), _read_file(cdir.status), created)


def _last_progress(cdir: ClusterDir, task: str) -> str | None:
    """The last line of ``task``'s progress file (None: none, or not a regular file of ours)."""
    try:
        lines = logtail.tail_lines(cdir.progress_file(task), 1)
    except OSError:  # not a regular file of ours (a symlink, a FIFO): not read
        return None
    return lines[-1] if lines else None


def _write_script(cdir: ClusterDir, spec: ClusterSpec) -> None:
    """Write the script the tasks run and the files that travel with it (``--file``)."""
    if spec.script is not None:
        _write_private(cdir.script, spec.script)
    if spec.files:
        cdir.files.mkdir(mode=0o700)
        for file_name, text in spec.files.items():
            _write_private(cdir.files / file_name, text)


def _mkdir_private(d: Path) -> None:
    """``mkdir -p`` where every dir it creates is 0700 (what exists is left as it is)."""
    missing = []
    while not d.exists():
        missing.append(d)
        d = d.parent
    for path in reversed(missing):
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            pass


def _write_private(path: Path, text: str) -> None:
    """Create ``path`` (0600, never through a symlink) holding ``text``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


#: An empty cluster dir older than this was left by an interrupted launch (a launch writes its
#: record within milliseconds of creating the dir).
ABANDONED_AFTER = 60.0


def _abandoned_empty(root: Path) -> bool:
    try:
        return not any(os.scandir(root)) and time.time() - root.lstat().st_mtime > ABANDONED_AFTER
    except OSError:
        return False


_unreadable_text = state.unreadable_text


def _supervisor_alive(raw: dict) -> bool:
    """Whether the supervisor recorded in ``status.json`` is that very process, still running."""
    return state.supervisor_alive(raw, same_process)


def _salvage_id(cdir: ClusterDir) -> str | None:
    """The cluster id from an unreadable record's or status's text, when it can still be found."""
    for path in (cdir.record, cdir.status):
        try:
            found = re.search(rb'"id": "([0-9a-f]{32})"', read_bounded(path, MAX_SALVAGE) or b"")
        except OSError:
            continue
        if found:
            return found.group(1).decode()
    return None


#: How much of a damaged state file is searched for the cluster id.
MAX_SALVAGE = 1 << 20


def _remove_empty_tree(top: Path) -> None:
    """Remove the dirs launch created outside the cluster dir, if nothing else was put there."""
    for dirpath, _dirs, _files in sorted(os.walk(top, topdown=False), key=lambda x: -len(x[0])):
        try:
            os.rmdir(dirpath)
        except OSError:
            pass


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
