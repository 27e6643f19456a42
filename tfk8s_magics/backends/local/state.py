"""Pure cluster logic: a local cluster's files → its :class:`ClusterStatus` and events.

The local twin of :mod:`..kubernetes.state`: everything a local status says is decided here,
from what the files hold — ``cluster.json`` (the launch's record), ``status.json`` (the
supervisor's snapshot), ``events.jsonl`` (its event journal), the last progress record of each
task and ``coordinator.json`` (an in-graph kernel's connection) — given as bytes (the last
two through readers, since a status reads them only when it needs them), so every rule
is tested with literal files (garbled, foreign, of another cluster) and no process.  The
backend (:mod:`.backend`) only reads the files and asks the process table the two questions
passed in (whether the supervisor recorded is that very process, still running; whether a pid
is alive).  Why a cluster shows a status: :func:`cluster_status`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ... import records, stall
from ...runtime.progress import parse_record
from ...spec import IN_GRAPH
from ..base import ClusterStatus, Event, LogLocation, Phase, Progress
from .layout import MAX_STATE_BYTES, UnreadableState
from .status import LocalTaskStatus

#: The task name an in-graph client reports progress as.
COORDINATOR = "chief-0"
#: The longest line of ``events.jsonl`` read as an event.
MAX_EVENT_LINE = 64 * 1024
#: What the status of a cluster whose supervisor was killed says (its tasks died with it).
SUPERVISOR_DIED = "its supervisor process died; the tasks were killed with it"

_JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}


class Unread(str):
    """A file that exists but could not be read: why (``"<file>: <cause>"``)."""


#: One file as read: its bytes, None when it does not exist, or :class:`Unread`.
FileText = bytes | None | Unread


@dataclass(frozen=True)
class LocalFiles:
    """What one local cluster's files hold, as read."""

    #: The cluster's directory name.
    name: str
    record: FileText  # cluster.json
    status: FileText  # status.json
    #: When the dir was made (its mtime): the date of a status that cannot be read.
    created: float = 0.0


def parse_mapping(file_name: str, data: FileText) -> dict | None:
    """A state file's JSON object (None when the file does not exist); :class:`UnreadableState`
    naming the file and the cause for anything else."""
    if isinstance(data, Unread):
        raise UnreadableState(str(data))
    if data is None:
        return None
    try:
        value = records.loads(data, MAX_STATE_BYTES)
    except ValueError as e:
        what = "valid JSON" if isinstance(e, json.JSONDecodeError) else "a record of ours"
        raise UnreadableState(f"{file_name} is not {what} ({str(e)[:200]})") from None
    if not isinstance(value, dict):
        kind = _JSON_TYPES.get(type(value), "value")
        raise UnreadableState(f"{file_name} holds a JSON {kind}, not an object")
    return value


def check_record(record: dict | None) -> dict:
    """``cluster.json``'s object, checked for the keys every reader needs; UnreadableState."""
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


def check_status(raw: dict | None, record: dict) -> dict:
    """``status.json`` when it is this cluster's (same id); {} before the supervisor wrote it."""
    if raw is None:
        return {}
    if not isinstance(raw.get("tasks"), list) or not isinstance(raw.get("id", ""), str):
        raise UnreadableState("status.json has no task list, or a cluster id that is no string")
    if raw.get("id", "") != record.get("id", ""):
        raise UnreadableState("status.json belongs to another cluster (its id differs)")
    return raw


def unreadable_text(name: str, e: Exception) -> str:
    """The one sentence for a cluster whose state cannot be read."""
    cause = f"missing {e}" if isinstance(e, KeyError) else str(e)
    return (f"unreadable state: {cause}. %tfcluster delete {name} --force (tfk8s delete {name} --force) "
            "stops whatever of it still runs and removes it.")


def supervisor_alive(raw: Mapping[str, Any], same_process: Callable[[Any, Any], bool]) -> bool:
    """Whether the supervisor recorded in ``status.json`` is that very process, still running."""
    return same_process(raw.get("supervisor_pid"), raw.get("supervisor_start"))


def finished(files: LocalFiles, same_process: Callable[[Any, Any], bool]) -> bool:
    """Whether nothing of the cluster runs any more: its supervisor said it is done, or died (an
    unreadable state counts: nothing more will be learnt from it)."""
    try:
        record = check_record(parse_mapping("cluster.json", files.record))
        raw = check_status(parse_mapping("status.json", files.status), record)
    except UnreadableState:
        return True
    return bool(raw.get("supervisor_done")) or (bool(raw) and not supervisor_alive(raw, same_process))


def cluster_status(files: LocalFiles, *, backend: str, same_process: Callable[[Any, Any], bool],
                   pid_alive: Callable[[Any], bool],
                   last_progress: Callable[[str], str | None] = lambda task: None,
                   coordinator: Callable[[], FileText] = lambda: None) -> ClusterStatus:
    """The status of the cluster whose files are ``files``.

    ``same_process(pid, start)``: whether that process (pid and start time) still runs;
    ``pid_alive(pid)``: whether a pid runs; ``last_progress(task)``: the last line of the task's
    progress file (None: none); ``coordinator()``: ``coordinator.json`` (read only for a running
    in-graph cluster, the only one that has it).  A state that cannot be read or makes no sense
    is an ``unknown`` status saying why and how to remove it, never an exception.
    """
    try:
        record = check_record(parse_mapping("cluster.json", files.record))
        return _status(files, record, backend, same_process, pid_alive, last_progress, coordinator)
    except (UnreadableState, KeyError, TypeError, ValueError, AttributeError, RecursionError) as e:
        return ClusterStatus(name=files.name, backend=backend, mode="", phase=Phase.UNKNOWN,
                             reason=unreadable_text(files.name, e), created=files.created)


def _status(files: LocalFiles, record: dict, backend: str, same_process, pid_alive,
            last_progress, coordinator) -> ClusterStatus:
    spec = record["spec"]
    raw = check_status(parse_mapping("status.json", files.status), record)
    tasks = [LocalTaskStatus.from_record(t) for t in raw.get("tasks", [])] or [
        LocalTaskStatus(name=t, host=a) for t, a in record["addresses"].items()
    ]
    phase = raw.get("phase", Phase.PENDING)
    reason = raw.get("reason", "")
    if not isinstance(phase, str) or not isinstance(reason, str):
        raise UnreadableState("status.json has a malformed phase or reason")
    if raw and not raw.get("supervisor_done") and not supervisor_alive(raw, same_process):
        # The supervisor was killed: its tasks died with it (parent-death signal).
        if phase not in Phase.TERMINAL:
            phase, reason = Phase.FAILED, SUPERVISOR_DIED
        for t in tasks:
            if t.phase not in Phase.TERMINAL:
                t.phase, t.reason, t.pid = Phase.FAILED, "supervisor died", None
    status = ClusterStatus(
        name=spec["name"],
        backend=backend,
        mode=spec["mode"],
        phase=phase,
        reason=reason,
        created=float(record["created"]),
        finished=records.number(raw.get("finished")),
        owner=record.get("owner") if isinstance(record.get("owner"), str) else "",
        detached=record.get("detached") is True,
        log_dir=LogLocation(record["log_dir"]),
        tasks=tasks,
        progress=progress_of([t.name for t in tasks], last_progress),
        stall=stall.Stall.from_dict(raw.get("stall")) if phase == Phase.RUNNING else None,
    )
    if phase == Phase.RUNNING:
        status.reason = coordinator_lost(coordinator, status, pid_alive) or status.reason
    return status


def progress_of(names: list[str], last_progress: Callable[[str], str | None]) -> Progress | None:
    """The cluster's progress: the chief's (or an in-graph client's) speaks for it; else
    worker-0's; else whoever is furthest."""
    best: Progress | None = None
    preferred = [n for n in (COORDINATOR, "worker-0") if n in names or n == COORDINATOR]
    for name in preferred + [n for n in names if n not in preferred]:
        line = last_progress(name)
        p = progress_from(parse_record(line)) if line else None
        if p is None:
            continue
        if name in preferred:
            return p
        if best is None or p.step > best.step:
            best = p
    return best


def progress_from(record: dict | None) -> Progress | None:
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


def coordinator_lost(coordinator: Callable[[], FileText], status: ClusterStatus,
                     pid_alive: Callable[[Any], bool]) -> str:
    """Why a live in-graph coordinator's connection is gone (a server restarted after it
    connected), or "" when it is not (no coordinator, or it reconnected since)."""
    if status.mode != IN_GRAPH:
        return ""
    try:
        info = parse_mapping("coordinator.json", coordinator())
    except UnreadableState:
        return ""
    if not isinstance(info, dict) or not pid_alive(info.get("pid")):  # display only: nothing is signalled
        return ""
    lost = status.restarted_since(records.number(info.get("connected")) or 0.0)
    if not lost:
        return ""
    return (f"the coordinator's connection is lost: {', '.join(lost)} restarted after it connected "
            "(its variables are gone); connect() again and restore from the last checkpoint")


# -- the event journal -------------------------------------------------------------------------------
def event_from(line: bytes) -> Event | None:
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


def note(message: str, now: float) -> Event:
    """A Warning event about the events file itself (shown last)."""
    return Event(now, "", "EventsUnreadable", message, "Warning")


def events_from(data: bytes, skipped: int, now: float, limit: int) -> list[Event]:
    """The events in ``data``, the last bytes of ``events.jsonl`` (``skipped`` earlier bytes not
    read, at most ``limit`` read), oldest first: a line that is no event (a torn write, garbage) is
    skipped, and a last Warning event says how many were."""
    lines = data.split(b"\n")
    if skipped:
        lines = lines[1:]  # the first is the end of a line cut in two
    out = [event_from(line) for line in lines if line.strip()]
    events = [e for e in out if e is not None]
    notes = []
    if skipped:
        notes.append(f"only the last {limit} bytes of events.jsonl are read ({skipped} "
                     "earlier bytes not shown)")
    if len(events) < len(out):
        notes.append(f"{len(out) - len(events)} line(s) of events.jsonl are not events (a torn or "
                     "damaged write) and were skipped")
    return events + ([note("; ".join(notes), now)] if notes else [])
