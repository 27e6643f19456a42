"""One read-only view per cluster: its JobSet and its pods, Events and progress.

A :class:`ClusterWatch` holds one cluster's JobSet and pods as the namespace's
shared watches (:class:`~.feed.NamespaceFeed`: one watch of the JobSets, one
of the task pods, for every cluster a backend watches) deliver them.  It
never acts on the cluster: the lifecycle (restarts, success, the end of
parameter servers, the TTL) is JobSet's, in the cluster, whether or not a
notebook watches.

While a task is pending without a precise reason, the namespace's Events
are listed at most every :data:`EVENT_PERIOD` seconds (one request for all
tasks) to surface FailedScheduling, ImagePullBackOff and the like, and
while Kueue holds the JobSet, the ``Pending`` Event of its Workload.

Threads: the feed's two watch threads write ``pods``/``jobset``/``progress``/
``api_events``/``events`` under ``_cond``; every reader copies them under it
(:meth:`latest_pods`, :meth:`view`) before iterating.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from kubernetes.client.rest import ApiException

from ...spec import ClusterSpec
from ...stall import timeout_from_env
from ..base import ClusterStatus, Event, Phase, Progress, TaskStatus
from . import state
from .client import Api, api_reason
from .feed import NamespaceFeed
from .manifests import STOPPED_ANNOTATION
from .stallcheck import StallCheck

#: Least seconds between two Event listings while a task waits unexplained.
EVENT_PERIOD = 10.0
#: Seconds between two reads of a working step's last log line (its progress).
STEP_LOG_PERIOD = 2.0
_VAGUE = ("waiting to be scheduled", "no pod", "ContainerCreating", "PodInitializing",
          state.WAITING_FOR_QUEUE)


def _ending(pod: dict[str, Any]) -> bool:
    """Whether a pod's end has begun: its deletion was asked for, or its container ended."""
    status = pod.get("status") or {}
    if (pod.get("metadata") or {}).get("deletionTimestamp") or status.get("phase") in ("Failed", "Succeeded"):
        return True
    return any("terminated" in (c.get("state") or {}) for c in status.get("containerStatuses") or [])


class ClusterWatch:
    """Keeps one cluster's JobSet and pod state current, in daemon threads; never changes it."""

    def __init__(self, api: Api, spec: ClusterSpec, root: dict[str, Any], feed: NamespaceFeed,
                 jobset: dict[str, Any] | None = None) -> None:
        self.api = api
        self.feed = feed  # the namespace's shared watches bring this cluster's objects
        self.spec = spec
        self.root = root
        annotations = root["metadata"].get("annotations") or {}
        self.stopped = bool(annotations.get(STOPPED_ANNOTATION))
        self.pods: dict[str, dict[str, Any]] = {}  # pod name → pod (guarded by _cond)
        self._gone: dict[str, dict[str, Any]] = {}  # pod name → last state of a pod that went
        self._ends: dict[str, float] = {}  # pod name → when the watch saw its end begin
        # ``jobset``: the JobSet this process has just created (launch). The namespace's
        # watch may bring it seconds later on a loaded machine: until then a listing made
        # before its creation says nothing about it, and it is not "gone".
        self.jobset: dict[str, Any] | None = jobset  # guarded by _cond
        self.jobset_seen = jobset is not None  # the JobSet has been listed once (absent means gone)
        self._known_since = time.monotonic() if jobset is not None else None
        self.progress: Progress | None = None
        self.events: list[Event] = []
        self.api_events: list[dict[str, Any]] = []
        self.deleted = False
        self.superseded = False  # a newer cluster of this name exists (see _apply_jobset)
        self.error: str = ""
        self.requests = 0  # API requests this watch made (for the bench)
        self._cond = threading.Condition()
        self._version = 0
        self._halt = threading.Event()
        self._events_at = 0.0
        self._step_at, self._step_line = 0.0, ""
        self.stalls = StallCheck(timeout_from_env())
        self.blocked = ""  # the condition of pods that cannot be created (see _check_blocked)

    # -- the watches --------------------------------------------------------------
    def start(self, sync_timeout: float = 30.0) -> ClusterWatch:
        """Start watching; return once the first listings are in (or ``sync_timeout``)."""
        self.feed.subscribe(self, sync_timeout)
        return self

    def close(self, deleted: bool = False) -> None:
        """Stop watching (``deleted``: the cluster is being deleted)."""
        if deleted:
            self.deleted = True
        self._halt.set()
        self.feed.unsubscribe(self)
        with self._cond:
            self._cond.notify_all()

    @property
    def alive(self) -> bool:
        """Whether the namespace feed runs, this view has not been asked to stop, and no newer
        cluster of its name has replaced the one it watches."""
        return self.feed.alive and not self._halt.is_set() and not self.superseded

    def _apply_pod(self, kind: str | None, pod: dict[str, Any]) -> None:
        name = pod.get("metadata", {}).get("name", "")
        with self._cond:
            if name not in self._ends and _ending(pod):
                self._ends[name] = time.monotonic()  # the order the ends began in names the cause
            if kind == "DELETED":
                self.pods.pop(name, None)
                self._keep_gone(name, pod)
                if name not in self._gone:
                    self._ends.pop(name, None)
            else:
                self.pods[name] = pod
            self._changed()

    def _keep_gone(self, name: str, pod: dict[str, Any]) -> None:
        """Keep a failed pod that went while its cluster runs (deleted by hand, its end read):
        until a newer pod of its task comes, it is that task's last word, and the cause of
        what its peers do next. Call under ``_cond``."""
        ended = (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded")
        if self.stopped or self.jobset is None or state.jobset_condition(self.jobset) or not ended:
            self._gone.pop(name, None)
            return
        self._gone[name] = pod
        attempt = state.jobset_restarts(self.jobset)
        for old in [n for n, p in self._gone.items() if state.pod_attempt(p) < attempt]:
            del self._gone[old]  # a finished restart attempt: its pods say nothing any more

    def _mine(self, jobset: dict[str, Any] | None) -> bool:
        """Whether ``jobset`` belongs to this cluster's root (not to a deleted namesake's)."""
        owners = (jobset or {}).get("metadata", {}).get("ownerReferences") or []
        uid = self.root["metadata"].get("uid")
        return not owners or not uid or any(o.get("uid") == uid for o in owners)

    def _apply_jobset(self, kind: str | None, jobset: dict[str, Any]) -> None:
        if not self._mine(jobset):
            # Another root's JobSet of this name: a deleted namesake's last events (ignored), or
            # a new cluster of this name, launched elsewhere after this one was deleted: then
            # this view is over, and the backend reads the new root (see ``alive``).
            if kind != "DELETED":
                self.superseded = True
            return
        with self._cond:
            before = self.jobset
            self.jobset = None if kind == "DELETED" else jobset
            restarts = state.jobset_restarts(self.jobset)
            if restarts > state.jobset_restarts(before):
                self.record_event("", "Restarted", f"JobSet restart {restarts} of at most "
                                  f"{self.spec.restart_budget}", "Warning")
            self._changed()

    # -- what the namespace feed calls (on its threads) ----------------------------------
    def replace_state(self, pods: list[dict[str, Any]], jobset: dict[str, Any] | None,
                      listed: bool, listed_at: float | None = None) -> None:
        """A (re-)listing of this cluster's pods and JobSet (``listed``: JobSets were listed,
        the listing began at ``listed_at``, monotonic, and the watch events since are in)."""
        if not self._mine(jobset):
            self.superseded = True
            jobset = None
        with self._cond:
            self.pods = {p["metadata"]["name"]: p for p in pods}
            listed_now = time.monotonic()  # ends found by a listing: at once, before later ones
            for name, p in self.pods.items():
                if name not in self._ends and _ending(p):
                    self._ends[name] = listed_now
            stale = (jobset is None and self._known_since is not None
                     and (listed_at is None or listed_at < self._known_since))
            if listed and not stale:  # a listing older than the launch cannot say it is gone
                self.jobset = jobset
                self.jobset_seen = True
            self._changed()

    def apply_pod(self, kind: str | None, pod: dict[str, Any]) -> None:
        """One watch event of a pod of this cluster."""
        self._apply_pod(kind, pod)

    def apply_jobset(self, kind: str | None, jobset: dict[str, Any]) -> None:
        """One watch event of this cluster's JobSet."""
        self._apply_jobset(kind, jobset)

    def after_change(self) -> None:
        """Called by the feed after it changed this cluster's state."""
        self._after_change()

    def _changed(self) -> None:
        self._version += 1
        self._cond.notify_all()

    def _after_change(self) -> None:
        """Called on a watch thread after every change."""
        if not self._halt.is_set():
            self._maybe_list_events(self.view())

    # -- what other objects may record --------------------------------------------
    def record_event(self, task: str, reason: str, message: str, kind: str = "Normal") -> None:
        """Add one of the backend's own events (a restart, a recycle, a stop)."""
        with self._cond:  # an RLock underneath: callers may hold it already
            self.events.append(Event(time.time(), task, reason, message, kind))

    def own_events(self) -> list[Event]:
        """The backend's own events so far (a copy)."""
        with self._cond:
            return list(self.events)

    def record_progress(self, progress: Progress) -> None:
        """Keep ``progress`` if it is newer than what is known."""
        with self._cond:
            if self.progress is None or progress.time >= self.progress.time:
                self.progress = progress
                self._changed()

    def mark_stopped(self, reason: str) -> None:
        """The cluster was stopped: its pods' ends are expected."""
        with self._cond:
            self.stopped = True
            self.record_event("", "Stopped", reason)
            self._changed()

    # -- reading --------------------------------------------------------------------
    def latest_pods(self) -> dict[str, dict[str, Any]]:
        """Task name → its newest pod (a copy, taken under the lock)."""
        with self._cond:
            pods = list(self.pods.values())
        return state.latest_pods(pods)

    def pod_named(self, name: str) -> dict[str, Any] | None:
        """The pod called ``name``, if it exists."""
        with self._cond:
            return self.pods.get(name)

    def view(self) -> state.View:
        """The cluster as :mod:`.state` sees it now."""
        with self._cond:
            pods = list(self.pods.values())
            gone = [p for n, p in self._gone.items() if n not in self.pods]
            jobset, seen, ends = self.jobset, self.jobset_seen, dict(self._ends)
            if self.stopped or jobset is None:
                gone = []
        # a gone pod first: a live pod of the same task and attempt made in the same second wins
        return state.View(spec=self.spec, jobset=jobset, pods=state.latest_pods(gone + pods),
                          stopped=self.stopped, jobset_seen=seen, steps=state.latest_steps(pods),
                          ends=ends)

    def _maybe_list_events(self, view: state.View) -> None:
        vague = [
            t for t in state.task_statuses(view)
            if t.phase == Phase.PENDING and (not t.reason or t.reason.startswith(_VAGUE))
        ]
        if vague and time.time() - self._events_at >= EVENT_PERIOD:
            self.refresh_events()

    def refresh_events(self) -> list[dict[str, Any]]:
        """List the namespace's Events (one request) and keep this cluster's."""
        self._events_at = time.time()
        self.requests += 1
        try:
            items = self.api.list_objects("v1", "Event").get("items", [])
        except ApiException as e:
            self.error = api_reason(e)
            return list(self.api_events)
        name, prefix = self.spec.name, f"{self.spec.name}-"
        with self._cond:
            pods = {**self._gone, **self.pods}
            known = {p["metadata"].get("uid") for p in pods.values()}
            jobset_uid = ((self.jobset or {}).get("metadata") or {}).get("uid")
            known |= {self.root["metadata"].get("uid"), jobset_uid}
        born = state.parse_time(self.root["metadata"].get("creationTimestamp")) or 0.0
        mine = [
            e for e in items
            if ((e.get("involvedObject") or {}).get("name", "") == name
                or (e.get("involvedObject") or {}).get("name", "").startswith(prefix)
                or state.is_kueue_workload(e.get("involvedObject") or {}, name))
            and (state.is_own_kueue_workload(e.get("involvedObject") or {}, name, jobset_uid)
                 or not state.of_another_incarnation(e, born, known))
            and not state.startup_probe_noise(e, pods.get((e.get("involvedObject") or {}).get("name", "")))
        ]
        with self._cond:
            self.api_events = mine
            self._changed()
        return mine

    def snapshot(self) -> ClusterStatus:
        """The cluster's status now."""
        view = self.view()
        # Kueue's verdict changes its Workload, never the JobSet or a pod: nothing the
        # watches see, so a reader asks again (at most every EVENT_PERIOD seconds)
        self._maybe_list_events(view)
        view.step_line = self._working_step_line(view)
        tasks = state.task_statuses(view)
        self._explain_pending(tasks)
        snap = state.cluster_status(view, self.root, tasks, self.progress)
        self._check_stall(snap)
        self._check_blocked(snap, view)
        return snap

    def _born(self, view: state.View) -> float:
        """When this incarnation of the cluster was made (older Events are of a deleted one)."""
        meta = (view.jobset or {}).get("metadata") or self.root["metadata"]
        return state.parse_time(meta.get("creationTimestamp")) or 0.0

    def _check_blocked(self, snap: ClusterStatus, view: state.View) -> None:
        """Say when the Job controller cannot create pods past the grace, and record it once."""
        if snap.phase != Phase.PENDING:
            self.blocked = ""
            return
        with self._cond:
            events = list(self.api_events)
        # Event times are the API server's, to the second: compare with the wall clock.
        now = time.time()
        created = state.create_blocked(snap.tasks, events, self.spec.name, self._born(view), now)
        blocked = created or state.cannot_start(view, now) or ""
        if blocked:
            snap.reason = snap.cannot_start = blocked
            for t in snap.tasks:  # the container's own words, not the kubelet's back-off Events
                pulled = state.pull_failure(view.pods[t.name]) if t.name in view.pods else None
                if pulled and t.phase == Phase.PENDING:
                    t.reason = pulled
            if not self.blocked:
                self.record_event("", "FailedCreate" if created else "CannotStart", blocked, "Warning")
        self.blocked = blocked

    def _working_step_line(self, view: state.View) -> str:
        """The newest log line of the step at work (the fetch's or upload's progress), read at
        most every :data:`STEP_LOG_PERIOD` seconds; empty when no step works."""
        working = state.working_step(view)
        if working is None:
            return ""
        if time.time() - self._step_at >= STEP_LOG_PERIOD:
            self._step_at = time.time()
            self.requests += 1
            pod, container = working
            try:
                text = self.api.pod_log(pod["metadata"]["name"], tail=1, container=container)
            except ApiException:
                text = ""  # not started yet, or gone: the phase says the rest
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            self._step_line = lines[-1][:200] if lines else ""
        return self._step_line

    def _check_stall(self, snap: ClusterStatus) -> None:
        """Attach the stall (see :mod:`.stallcheck`) and record when one starts or ends."""
        before = self.stalls.stall
        with self._cond:
            pods = dict(self.pods)
        snap.stall = self.stalls.update(self.api, pods, snap)
        if snap.stall is not None and before is None:
            self.record_event("", "Stalled", snap.stall.describe(time.time()), "Warning")
        elif snap.stall is None and before is not None:
            self.record_event("", "Resumed", "a task showed activity again")

    def _explain_pending(self, tasks: list[TaskStatus]) -> None:
        """Give pending tasks the newest Warning event of their pod as the reason."""
        with self._cond:
            events = list(self.api_events)
        if not events:
            return
        latest = self.latest_pods()
        queued = state.admission_message(events, self.spec.name)
        state.explain_no_pod(tasks, events, self.spec.name, self._born(self.view()))
        for t in tasks:
            pod = latest.get(t.name)
            if t.phase == Phase.PENDING and pod is None and queued and \
                    t.reason.startswith(state.WAITING_FOR_QUEUE):
                t.reason = f"{t.reason}: {queued}"
            if t.phase != Phase.PENDING or pod is None:
                continue
            name = pod["metadata"]["name"]
            warnings = [
                e for e in events
                if (e.get("involvedObject") or {}).get("name") == name and e.get("type") == "Warning"
            ]
            if warnings:
                last = max(warnings, key=state.event_time)
                t.reason = f"{last.get('reason')}: {last.get('message', '')}".rstrip(": ")

    def wait_change(self, seen: int, timeout: float) -> int:
        """Block until the state changes after version ``seen`` (or ``timeout``); new version."""
        with self._cond:
            self._cond.wait_for(lambda: self._version != seen or self._halt.is_set(), timeout)
            return self._version

    @property
    def version(self) -> int:
        """A counter bumped at every change of the watched state (see :meth:`wait_change`)."""
        return self._version
