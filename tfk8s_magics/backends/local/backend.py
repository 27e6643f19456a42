"""The local backend: every task a process on this machine, supervised per cluster.

Launching writes the cluster's record under the state dir and starts its
supervisor (:mod:`.supervisor`), which owns the task processes.  Everything
else here reads the files the supervisor and the tasks write, so
``list``/``status``/``logs`` work from any process, after a kernel restart
too.

TF_CONFIG names 127.0.0.1 only, every server the lab itself runs
(TensorBoard) binds 127.0.0.1, and TensorFlow's gRPC servers — which
listen on all interfaces whatever TF_CONFIG says — run in the cluster's
private network namespace (:mod:`.isolation`, :mod:`.relay`), or where
that is refused behind the loopback shim.
"""

from __future__ import annotations

import http.client
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from ... import records, scriptcheck, stall, storage
from ...errors import BackendError, ClusterExists, ClusterNotFound, LaunchFailed, SpecError
from ...isolation import guard, hostside
from ...isolation.shim import shim_path
from ...lifeline import open_pidfd, pid_alive, reap_in_background, same_process, start_time
from ...ports import free_ports, port_open
from ...runtime.progress import append_to, parse_record
from ...serving import local as serving
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
    Phase,
    Progress,
    TensorBoardInfo,
)
from . import logtail, pool
from .inotify import DirWatcher
from .layout import (
    ClusterDir,
    UnreadableState,
    default_state_dir,
    open_for_reading,
    read_bounded,
    read_json,
    read_mapping,
    task_log_path,
    write_json_atomic,
    write_record,
)
from .status import LocalTaskStatus
from .warmpool import LocalWarmPool
from .watchdog import CLUSTER_ID_ENV, cluster_processes, describe

#: Seconds to wait for a new supervisor to report in.
SUPERVISOR_START_TIMEOUT = 30.0
#: Seconds to wait for a stopped cluster's processes to end.
STOP_TIMEOUT = 20.0
#: Where a re-run keeps the previous run's logs: a folder of the new run's log dir (TensorBoard
#: shows its runs as ``previous-run/...``).
PREVIOUS_RUN = "previous-run"
#: How often watchers look at status.json where inotify is unavailable.
WATCH_INTERVAL = 0.1
#: Longest sleep of a watcher between inotify wake-ups (it wakes at once on a change).
IDLE_WAKEUP = 1.0
TENSORBOARD_START_TIMEOUT = 90.0
#: ``events`` reads at most this much of the end of ``events.jsonl`` (~20,000 events).
MAX_EVENTS_BYTES = 4 * 1024 * 1024
#: The longest line of ``events.jsonl`` read as an event.
MAX_EVENT_LINE = 64 * 1024
#: The task name an in-graph client reports progress as.
COORDINATOR = "chief-0"


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
        record = read_mapping(cdir.record)
        if record is None:
            raise UnreadableState("no cluster.json (an interrupted launch, or not a cluster)")
        missing = [k for k in ("spec", "addresses", "cluster", "log_dir", "created") if k not in record]
        if missing:
            raise UnreadableState(f"cluster.json lacks {', '.join(missing)}")
        spec, addresses = record["spec"], record["addresses"]
        wrong = [what for what, ok in (
            ("spec", isinstance(spec, dict) and isinstance(spec.get("name"), str)
             and isinstance(spec.get("mode"), str)),
            ("addresses", isinstance(addresses, dict)
             and all(isinstance(v, str) for v in addresses.values())),
            ("cluster", isinstance(record["cluster"], dict)),
            ("log_dir", isinstance(record["log_dir"], str)),
            ("created", records.number(record["created"]) is not None),
            ("id", isinstance(record.get("id", ""), str)),
        ) if not ok]
        if wrong:
            raise UnreadableState(f"cluster.json has a malformed {', '.join(wrong)}")
        return record

    def _record(self, name: str) -> dict:
        cdir = self._dir(name)
        try:
            return self._read_record(cdir)
        except UnreadableState as e:
            raise BackendError(_unreadable_text(name, e)) from None

    def _raw_status(self, cdir: ClusterDir, record: dict) -> dict:
        """``status.json`` when it is this cluster's (same id); {} before the supervisor wrote it."""
        raw = read_mapping(cdir.status)
        if raw is None:
            return {}
        if not isinstance(raw.get("tasks"), list) or not isinstance(raw.get("id", ""), str):
            raise UnreadableState("status.json has no task list, or a cluster id that is no string")
        if raw.get("id", "") != record.get("id", ""):
            raise UnreadableState("status.json belongs to another cluster (its id differs)")
        return raw

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

    # -- status ------------------------------------------------------------
    def _status_of(self, cdir: ClusterDir) -> ClusterStatus:
        """The cluster's status; an unreadable or malformed state makes an ``unknown`` status that
        says why (and how to remove it), never an exception."""
        try:
            return self._status_from(cdir, self._read_record(cdir))
        except (UnreadableState, KeyError, TypeError, ValueError, AttributeError, RecursionError) as e:
            try:
                created = cdir.root.lstat().st_mtime
            except OSError:
                created = 0.0
            return ClusterStatus(name=cdir.name, backend=self.name, mode="", phase=Phase.UNKNOWN,
                                 reason=_unreadable_text(cdir.name, e), created=created)

    def _status_from(self, cdir: ClusterDir, record: dict) -> ClusterStatus:
        spec = record["spec"]
        raw = self._raw_status(cdir, record)
        tasks = [LocalTaskStatus.from_record(t) for t in raw.get("tasks", [])] or [
            LocalTaskStatus(name=t, host=a) for t, a in record["addresses"].items()
        ]
        phase = raw.get("phase", Phase.PENDING)
        reason = raw.get("reason", "")
        if not isinstance(phase, str) or not isinstance(reason, str):
            raise UnreadableState("status.json has a malformed phase or reason")
        if raw and not raw.get("supervisor_done") and not _supervisor_alive(raw):
            # The supervisor was killed: its tasks died with it (parent-death signal).
            if phase not in Phase.TERMINAL:
                phase, reason = Phase.FAILED, "its supervisor process died; the tasks were killed with it"
            for t in tasks:
                if t.phase not in Phase.TERMINAL:
                    t.phase, t.reason, t.pid = Phase.FAILED, "supervisor died", None
        status = ClusterStatus(
            name=spec["name"],
            backend=self.name,
            mode=spec["mode"],
            phase=phase,
            reason=reason,
            created=float(record["created"]),
            finished=records.number(raw.get("finished")),
            owner=record.get("owner") if isinstance(record.get("owner"), str) else "",
            detached=record.get("detached") is True,
            log_dir=LogLocation(record["log_dir"]),
            tasks=tasks,
            progress=self._progress(cdir, tasks),
            stall=stall.Stall.from_dict(raw.get("stall")) if phase == Phase.RUNNING else None,
        )
        if phase == Phase.RUNNING:
            status.reason = _coordinator_lost(cdir, status) or status.reason
        return status

    def _progress(self, cdir: ClusterDir, tasks: list[LocalTaskStatus]) -> Progress | None:
        best: Progress | None = None
        names = [t.name for t in tasks]
        # The chief (or an in-graph client) speaks for the cluster; else worker-0;
        # else whoever is furthest.
        preferred = [n for n in (COORDINATOR, "worker-0") if n in names or n == COORDINATOR]
        for name in preferred + [n for n in names if n not in preferred]:
            try:
                lines = logtail.tail_lines(cdir.progress_file(name), 1)
            except OSError:  # not a regular file of ours (a symlink, a FIFO): not read
                continue
            p = _progress_from(parse_record(lines[-1])) if lines else None
            if p is None:
                continue
            if name in preferred:
                return p
            if best is None or p.step > best.step:
                best = p
        return best

    def status(self, name: str) -> ClusterStatus:
        return self._status_of(self._dir(name))

    def list_clusters(self) -> list[ClusterStatus]:
        out = [self._status_of(cdir) for cdir in self._cluster_dirs()]
        return sorted(out, key=lambda s: s.created, reverse=True)

    def _finished(self, cdir: ClusterDir) -> bool:
        """Whether nothing of the cluster runs any more (or it was deleted)."""
        if not cdir.record.exists():
            return True
        try:
            raw = self._raw_status(cdir, self._read_record(cdir))
        except UnreadableState:
            return True  # nothing more will be learnt from it
        return bool(raw.get("supervisor_done")) or (bool(raw) and not _supervisor_alive(raw))

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
            return [_note(f"events.jsonl was not read: {e.strerror}")]
        with os.fdopen(fd, "rb") as f:
            start = max(0, os.fstat(fd).st_size - MAX_EVENTS_BYTES)
            f.seek(start)
            lines = f.read(MAX_EVENTS_BYTES).split(b"\n")
        if start:
            lines = lines[1:]  # the first is the end of a line cut in two
        out = [_event_from(line) for line in lines if line.strip()]
        events = [e for e in out if e is not None]
        notes = []
        if start:
            notes.append(f"only the last {MAX_EVENTS_BYTES} bytes of events.jsonl are read ({start} "
                         "earlier bytes not shown)")
        if len(events) < len(out):
            notes.append(f"{len(out) - len(events)} line(s) of events.jsonl are not events (a torn or "
                         "damaged write) and were skipped")
        return events + ([_note("; ".join(notes))] if notes else [])

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
            if not _wait_exit(sup, STOP_TIMEOUT) and _supervisor_alive(raw):
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
                _wait_exit(pid, 2.0)

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
            self._stop_tensorboard(cdir)
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
        shutil.rmtree(cdir.root, ignore_errors=True)
        return None if kept is None else LogLocation(str(kept))

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

    # -- TensorBoard -----------------------------------------------------------
    def tensorboard(self, name: str) -> TensorBoardInfo:
        cdir = self._dir(name)
        record = self._record(name)
        info = _tb_info(cdir)
        if info and same_process(info.get("pid"), info.get("start")) and port_open(info["port"]):
            return TensorBoardInfo(info["port"], _tb_url(info["port"]), record["log_dir"], True, info["pid"])
        port = hostside.free_port()  # in a sandboxed kernel: free on the host too
        proc = subprocess.Popen(
            # The guard makes it answer the owner only (its own namespace + the relay).
            guard.command([port], str(cdir.root), [
                "-m", "tfk8s_magics.runtime.tensorboard", str(os.getpid()),
                "--logdir", record["log_dir"], "--host", "127.0.0.1", "--port", str(port),
            ]),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(cdir.root / "tensorboard.log", "ab"),  # noqa: SIM115 - the child owns it
            start_new_session=True,
        )
        deadline = time.monotonic() + TENSORBOARD_START_TIMEOUT
        while not _http_answers(port):  # not port_open: the guard's relay listens before TensorBoard
            if proc.poll() is not None or time.monotonic() > deadline:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
                tail = "\n".join(logtail.tail_lines(cdir.root / "tensorboard.log", 10))
                raise BackendError(
                    f"TensorBoard for {name!r} did not start (see {cdir.root / 'tensorboard.log'}):\n{tail}"
                )
            time.sleep(0.05)
        write_json_atomic(cdir.tensorboard, {"pid": proc.pid, "start": start_time(proc.pid), "port": port})
        reap_in_background(proc)  # stopped later by pid: no zombie under this kernel
        return TensorBoardInfo(port, _tb_url(port), record["log_dir"], False, proc.pid)

    def _stop_tensorboard(self, cdir: ClusterDir) -> None:
        info = _tb_info(cdir)
        if info and same_process(info.get("pid"), info.get("start")):
            try:
                os.kill(info["pid"], signal.SIGTERM)
            except ProcessLookupError:
                return
            if not _wait_exit(info["pid"], 5) and same_process(info.get("pid"), info.get("start")):
                os.kill(info["pid"], signal.SIGKILL)

    # -- serving (see tfk8s_magics.serving.local) -------------------------------
    def serve(self, name: str, model: str | None = None, source_url: str | None = None, **options):
        """Serve the cluster's newest exported model with the local TF-Serving-compatible server.

        ``replicas``/``cpu``/``memory`` are Kubernetes choices: one process serves here.
        ``source_url``: serve from object storage instead of the log dir (see :func:`_fetch_models`).
        """
        secret = options.pop("credentials_secret", None)
        if secret:
            raise SpecError(f"--credentials-secret {secret!r} names a Kubernetes Secret; the local backend "
                            "reads storage credentials from your environment or fsspec's config: drop it.")
        cdir = self._dir(name)
        if source_url is not None:
            base = _fetch_models(cdir, source_url)
            serving.stop(cdir.root)
            kwargs = {k: v for k, v in options.items() if k in ("poll_seconds", "timeout")}
            return serving.start(name, cdir.root, str(base), model, **kwargs, **_guarded(cdir))
        allowed = {"poll_seconds", "timeout"}
        for key, value in options.items():
            if key not in allowed and value not in (None, 1):
                raise SpecError(f"--{key.replace('_', '-')} applies to Kubernetes serving; "
                                "the local backend runs one server process.")
        kwargs = {k: v for k, v in options.items() if k in allowed}
        return serving.start(name, cdir.root, read_json(cdir.record)["log_dir"], model, **kwargs,
                             **_guarded(cdir))

    def serving(self, name: str):
        """The model this cluster serves, or None."""
        return serving.current(name, self._dir(name).root)

    def warm_pool(self) -> LocalWarmPool:
        """This process's warm pool of task processes (:mod:`.pool`)."""
        return LocalWarmPool()

    def stop_serving(self, name: str) -> bool:
        """Stop serving the cluster's model; return whether a server was running."""
        return serving.stop(self._dir(name).root)


def _guarded(cdir: ClusterDir) -> dict:
    """How a model server starts here: behind the owner-only guard, as TensorBoard (its own
    network namespace + the relay; in a sandboxed kernel also on the host's loopback, for
    jupyter-server-proxy), on two ports free on both sides."""
    rest = hostside.free_port()
    grpc_port = hostside.free_port()
    while grpc_port == rest:
        grpc_port = hostside.free_port()
    return {"ports": (rest, grpc_port),
            "wrap": lambda ports, args: guard.command(ports, str(cdir.root), args)}


def _coordinator_lost(cdir: ClusterDir, status: ClusterStatus) -> str:
    """Why a live in-graph coordinator's connection is gone (a server restarted after it
    connected), or "" when it is not (no coordinator, or it reconnected since)."""
    if status.mode != IN_GRAPH:
        return ""
    try:
        info = read_json(cdir.coordinator)
    except UnreadableState:
        return ""
    if not isinstance(info, dict) or not pid_alive(info.get("pid")):  # display only: nothing is signalled
        return ""
    lost = status.restarted_since(records.number(info.get("connected")) or 0.0)
    if not lost:
        return ""
    return (f"the coordinator's connection is lost: {', '.join(lost)} restarted after it connected "
            "(its variables are gone); connect() again and restore from the last checkpoint")


def _event_from(line: bytes) -> Event | None:
    """One line of ``events.jsonl`` as an :class:`Event`, or None when it is not one."""
    try:
        d = records.loads(line, MAX_EVENT_LINE)
    except ValueError:
        return None
    if not isinstance(d, dict) or records.number(d.get("time")) is None:
        return None
    texts = [d.get(k) for k in ("task", "reason", "message")]
    type_ = d.get("type", "Normal")
    if not all(isinstance(t, str) for t in [*texts, type_]):
        return None
    return Event(float(d["time"]), *texts, type_)


def _note(message: str) -> Event:
    """A Warning event about the events file itself (shown last)."""
    return Event(time.time(), "", "EventsUnreadable", message, "Warning")


def _progress_from(record: dict | None) -> Progress | None:
    """A progress record as :class:`Progress`, or None when it has no integer step; a field of the
    wrong type is dropped."""
    if record is None:
        return None
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    total = record.get("total")
    metrics = record.get("metrics") if isinstance(record.get("metrics"), dict) else {}
    return Progress(
        step=step,
        total=total if isinstance(total, int) and not isinstance(total, bool) else None,
        rate=records.number(record.get("rate")),
        metrics={k: float(v) for k, v in metrics.items()
                 if isinstance(k, str) and records.number(v) is not None},
        task=record.get("task") if isinstance(record.get("task"), str) else "",
        time=records.number(record.get("time")) or 0.0,
    )


def _write_script(cdir: ClusterDir, spec: ClusterSpec) -> None:
    """Write the script the tasks run and the files that travel with it (``--file``)."""
    if spec.script is not None:
        _write_private(cdir.script, spec.script)
    if spec.files:
        cdir.files.mkdir(mode=0o700)
        for file_name, text in spec.files.items():
            _write_private(cdir.files / file_name, text)


def _fetch_models(cdir: ClusterDir, url: str) -> Path:
    """Copy the models under ``url`` (a ``--backup`` URL: its ``models/``; else ``url`` is a models dir,
    ``<model>/<version>/``) to ``<cluster dir>/served/models``; return ``served`` (a log dir to serve
    from).  The copy replaces the previous one only once it is complete."""
    storage.check_url("--from", url)
    served = cdir.root / "served"
    fresh = cdir.root / ".served-new"
    shutil.rmtree(fresh, ignore_errors=True)
    try:
        storage.fetch_models(url, fresh / "models")
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    shutil.rmtree(served, ignore_errors=True)
    os.replace(fresh, served)
    return served


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


def _unreadable_text(name: str, e: Exception) -> str:
    """The one sentence for a cluster whose state cannot be read."""
    cause = f"missing {e}" if isinstance(e, KeyError) else str(e)
    return (f"unreadable state: {cause}. %tfcluster delete {name} --force (tfk8s delete {name} --force) "
            "stops whatever of it still runs and removes it.")


def _supervisor_alive(raw: dict) -> bool:
    """Whether the supervisor recorded in ``status.json`` is that very process, still running."""
    return same_process(raw.get("supervisor_pid"), raw.get("supervisor_start"))


def _wait_exit(pid: int, timeout: float) -> bool:
    """Wait (on a pidfd, no polling) until ``pid`` exits; return whether it did within ``timeout``."""
    fd = open_pidfd(pid)
    if fd is None:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def _tb_info(cdir: ClusterDir) -> dict | None:
    try:
        info = read_mapping(cdir.tensorboard)
    except UnreadableState:
        return None
    ok = info is not None and all(isinstance(info.get(k), int) and not isinstance(info.get(k), bool)
                                  for k in ("pid", "port"))
    return info if ok and 0 < info["port"] < 65536 else None


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


def _http_answers(port: int) -> bool:
    """Whether an HTTP server answers on ``127.0.0.1:port`` (no proxy settings apply)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/data/logdir")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


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
