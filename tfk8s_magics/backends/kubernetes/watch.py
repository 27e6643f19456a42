"""One pod watch per cluster: what its pods, Events and progress are now — read only.

A :class:`PodWatch` lists the cluster's pods once, then keeps one watch
(label selector on the cluster) open, re-opened from the last
resourceVersion when the server ends it.  API requests per minute therefore
do not grow with the number of tasks.  It never acts on the cluster: the
lifecycle (replacing pods, recycling, the TTL) is the
:class:`~.controller.ClusterController`, a PodWatch that also acts, started
only by the process that launched or attached the cluster.

While a task is pending without a precise reason, the namespace's Events
are listed at most every :data:`EVENT_PERIOD` seconds (one request for all
tasks) to surface FailedScheduling, ImagePullBackOff and the like.

Threads: the watch thread writes ``pods``/``gone``/``progress``/
``api_events``/``events`` under ``_cond``; every reader copies them under it
(:meth:`latest_pods`, :meth:`view`) before iterating.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

from kubernetes.client.rest import ApiException

from ...spec import ClusterSpec
from ...stall import timeout_from_env
from ..base import ClusterStatus, Event, Phase, Progress, TaskStatus
from . import state
from .client import Api, abort, api_reason
from .manifests import FINISHED_ANNOTATION, STOPPED_ANNOTATION, selector
from .stallcheck import StallCheck

#: Longest a single watch request stays open (the server ends it; we reopen).
WATCH_SECONDS = 60
#: Least seconds between two Event listings while a task waits unexplained.
EVENT_PERIOD = 10.0
_VAGUE = ("waiting to be scheduled", "no pod", "ContainerCreating", "PodInitializing")


class PodWatch:
    """Keeps one cluster's pod state current, in a daemon thread; never changes the cluster."""

    def __init__(self, api: Api, spec: ClusterSpec, root: dict[str, Any]) -> None:
        self.api = api
        self.spec = spec
        self.root = root
        annotations = root["metadata"].get("annotations") or {}
        self.stopped = bool(annotations.get(STOPPED_ANNOTATION))
        finished = annotations.get(FINISHED_ANNOTATION)
        self.finished_at = float(finished) if finished else None
        self.done_since: float | None = None
        self.pods: dict[str, dict[str, Any]] = {}  # pod name → pod (guarded by _cond)
        self.gone: dict[str, int] = {}  # task → attempt of the pod someone else deleted
        self.progress: Progress | None = None
        self.events: list[Event] = []
        self.api_events: list[dict[str, Any]] = []
        self.deleted = False
        self.error: str = ""
        self.requests = 0  # API requests this watch made (for the bench)
        self._ours: set[str] = set()  # pods this process creates or deletes: their events are expected
        self._cond = threading.Condition()
        self._version = 0
        self._halt = threading.Event()
        self._synced = threading.Event()
        self._events_at = 0.0
        self._response = None  # the open watch request, closed by close()
        self.stalls = StallCheck(timeout_from_env())
        self._thread = threading.Thread(target=self._run, name=f"tfk8s-watch-{spec.name}", daemon=True)

    # -- the watch itself ---------------------------------------------------------
    def start(self, sync_timeout: float = 30.0) -> PodWatch:
        """Start watching; return once the first listing is in (or ``sync_timeout``)."""
        self._thread.start()
        self._synced.wait(sync_timeout)
        return self

    def close(self, deleted: bool = False) -> None:
        """Stop watching (``deleted``: the cluster is being deleted, its pods' ends mean nothing)."""
        if deleted:
            self.deleted = True
        self._halt.set()
        response = self._response
        if response is not None:
            abort(response)  # ends the blocked read in the watch thread
        with self._cond:
            self._cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    @property
    def alive(self) -> bool:
        """Whether the watch thread is running and has not been asked to stop."""
        return self._thread.is_alive() and not self._halt.is_set()

    @property
    def acts(self) -> bool:
        """Whether this watch also runs the cluster's lifecycle (a controller)."""
        return False

    def _run(self) -> None:
        resource_version = None
        backoff = 0.5
        while not self._halt.is_set() and not self.deleted:
            try:
                if resource_version is None:
                    resource_version = self._relist()
                    self._synced.set()
                    self._after_change()
                resource_version = self._follow(resource_version)
                backoff = 0.5
            except ApiException as e:
                self.error = "" if e.status == 410 else api_reason(e)
                resource_version = None
                if e.status != 410:
                    backoff = self._pause(backoff)
            except Exception as e:  # noqa: BLE001 - connection drops: retry, keep the reason
                self.error = str(e)
                resource_version = None
                backoff = self._pause(backoff)

    def _pause(self, backoff: float) -> float:
        self._halt.wait(backoff)
        return min(backoff * 2, 30.0)

    def _follow(self, resource_version: str) -> str | None:
        """One watch request: apply its events; the version to resume from (None: list again)."""
        timeout = WATCH_SECONDS
        wake = self.next_wakeup()
        if wake is not None:
            timeout = max(1, min(WATCH_SECONDS, int(wake - time.time()) + 1))
        self.requests += 1
        self._response = self.api.core.list_namespaced_pod(
            self.api.namespace, label_selector=self._selector(), resource_version=resource_version,
            timeout_seconds=timeout, allow_watch_bookmarks=True, watch=True,
            _preload_content=False, _request_timeout=(self.api.timeout, timeout + 15),
        )
        if self._halt.is_set():  # close() ran while the request was being opened
            abort(self._response)
            return resource_version
        for event in _events(self._response):
            if self._halt.is_set():
                return resource_version
            obj = event.get("object") or {}
            kind = event.get("type")
            if kind == "ERROR":
                if obj.get("code") == 410:  # history compacted: list again
                    return None
                raise RuntimeError(obj.get("message", "watch error"))
            resource_version = obj.get("metadata", {}).get("resourceVersion", resource_version)
            if kind != "BOOKMARK":
                self._apply(kind, obj)
                self._after_change()
        self._after_change()  # the watch timed out: a grace period or TTL may be due
        return resource_version

    def _selector(self) -> str:
        return selector(self.spec.name, "task")

    def _relist(self) -> str:
        self.requests += 1
        listing = self.api.list_objects("v1", "Pod", self._selector())
        with self._cond:
            self.pods = {p["metadata"]["name"]: p for p in listing.get("items", [])}
            self._changed()
        return listing.get("metadata", {}).get("resourceVersion", "")

    def _apply(self, kind: str | None, pod: dict[str, Any]) -> None:
        name = pod.get("metadata", {}).get("name", "")
        task = state.pod_task(pod)
        with self._cond:
            if kind == "DELETED":
                self.pods.pop(name, None)
                if name not in self._ours and task is not None and not self.stopped:
                    newer = any(
                        state.pod_task(p) == task and state.pod_attempt(p) > state.pod_attempt(pod)
                        for p in self.pods.values()
                    )
                    if not newer:
                        self.gone[task.name] = state.pod_attempt(pod)
                        self.record_event(task.name, "PodDeleted", f"pod {name} was deleted", "Warning")
            else:
                self.pods[name] = pod
                if task is not None:
                    self.gone.pop(task.name, None)
            self._changed()

    def _changed(self) -> None:
        self._version += 1
        self._cond.notify_all()

    def _after_change(self) -> None:
        """Called on the watch thread after every change (and watch timeout)."""
        if not self._halt.is_set():
            self._maybe_list_events(self.view())

    def next_wakeup(self) -> float | None:
        """When something is due with no pod event (a controller's grace or TTL); None here."""
        return None

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
        """The cluster was stopped: its pods' ends are expected, nothing is replaced."""
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
            gone = dict(self.gone)
        return state.View(spec=self.spec, pods=state.latest_pods(pods), stopped=self.stopped,
                          finished_at=self.finished_at, done_since=self.done_since, gone=gone)

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
        prefix = f"{self.spec.name}-"
        mine = [
            e for e in items
            if (e.get("involvedObject") or {}).get("name", "") == self.spec.name
            or (e.get("involvedObject") or {}).get("name", "").startswith(prefix)
        ]
        with self._cond:
            self.api_events = mine
            self._changed()
        return mine

    def snapshot(self) -> ClusterStatus:
        """The cluster's status now."""
        view = self.view()
        tasks = state.task_statuses(view)
        self._explain_pending(tasks)
        snap = state.cluster_status(view, self.root, tasks, self.progress)
        self._check_stall(snap)
        return snap

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
        for t in tasks:
            pod = latest.get(t.name)
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


def _events(response) -> Iterator[dict[str, Any]]:
    """The watch events of a streaming response, one JSON object per line."""
    buffer = b""
    try:
        for chunk in response.stream(65536, decode_content=True):
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.strip():
                    yield json.loads(line)
    finally:
        response.release_conn()
