"""One pod watch per cluster, driving task phases and the lifecycle.

A :class:`ClusterWatcher` lists the cluster's pods once, then keeps one
watch (label selector on the cluster) open, re-opened from the last
resourceVersion when the server ends it.  API requests per minute therefore
do not grow with the number of tasks.  After each change it runs
:func:`.state.plan`: replace pods that failed for a retryable reason,
delete parameter servers a grace period after the workers finish, record
when the cluster finished, and delete it when its TTL has passed.

While a task is pending without a precise reason, the namespace's Events
are listed at most every :data:`EVENT_PERIOD` seconds (one request for all
tasks) to surface FailedScheduling, ImagePullBackOff and the like.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes.client.rest import ApiException

from ...spec import ClusterSpec
from ..base import ClusterStatus, Event, Phase, Progress, TaskStatus
from . import state
from .client import Api, abort, api_reason
from .manifests import (
    CLUSTER_LABEL,
    FINISHED_ANNOTATION,
    STOPPED_ANNOTATION,
    task_pod,
    with_owner,
)
from .settings import K8sSettings

#: Longest a single watch request stays open (the server ends it; we reopen).
WATCH_SECONDS = 60
#: Least seconds between two Event listings while a task waits unexplained.
EVENT_PERIOD = 10.0
_VAGUE = ("waiting to be scheduled", "no pod", "ContainerCreating", "PodInitializing")


class ClusterWatcher:
    """Keeps one cluster's pod state current and acts on it, in a daemon thread."""

    def __init__(
        self,
        api: Api,
        spec: ClusterSpec,
        settings: K8sSettings,
        root: dict[str, Any],
        on_deleted: Callable[[str], None] | None = None,
    ) -> None:
        self.api = api
        self.spec = spec
        self.settings = settings
        self.root = root
        self.owner = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": root["metadata"]["name"],
            "uid": root["metadata"]["uid"],
            "blockOwnerDeletion": True,
        }
        annotations = root["metadata"].get("annotations") or {}
        self.stopped = bool(annotations.get(STOPPED_ANNOTATION))
        finished = annotations.get(FINISHED_ANNOTATION)
        self.finished_at = float(finished) if finished else None
        self.done_since: float | None = None
        self.pods: dict[str, dict[str, Any]] = {}  # pod name → pod
        self.gone: dict[str, int] = {}  # task → attempt of the pod someone else deleted
        self.progress: Progress | None = None
        self.events: list[Event] = []
        self.api_events: list[dict[str, Any]] = []
        self.deleted = False
        self.error: str = ""
        self.requests = 0  # API requests this watcher made (for the bench)
        self._ours: set[str] = set()  # pods we create or delete: their events are expected
        self._cond = threading.Condition()
        self._version = 0
        self._halt = threading.Event()
        self._synced = threading.Event()
        self._events_at = 0.0
        self._act_lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._response = None  # the open watch request, closed by close()
        self._on_deleted = on_deleted
        self._thread = threading.Thread(
            target=self._run, name=f"tfk8s-watch-{spec.name}", daemon=True
        )

    # -- lifecycle of the watcher itself ------------------------------------
    def start(self, sync_timeout: float = 30.0) -> ClusterWatcher:
        """Start watching; return once the first listing is in (or ``sync_timeout``)."""
        self._thread.start()
        self._synced.wait(sync_timeout)
        return self

    def close(self) -> None:
        """Stop watching (the thread ends at its next event or watch timeout)."""
        self._halt.set()
        if self._timer is not None:
            self._timer.cancel()
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

    def _run(self) -> None:
        resource_version = None
        backoff = 0.5
        while not self._halt.is_set():
            try:
                if resource_version is None:
                    resource_version = self._relist()
                    self._synced.set()
                    self._act()
                timeout = WATCH_SECONDS
                wake = self._next_wakeup()
                if wake is not None:
                    timeout = max(1, min(WATCH_SECONDS, int(wake - time.time()) + 1))
                self.requests += 1
                self._response = self.api.core.list_namespaced_pod(
                    self.api.namespace,
                    label_selector=self._selector(),
                    resource_version=resource_version,
                    timeout_seconds=timeout,
                    allow_watch_bookmarks=True,
                    watch=True,
                    _preload_content=False,
                    _request_timeout=(self.api.timeout, timeout + 15),
                )
                if self._halt.is_set():  # close() ran while the request was being opened
                    abort(self._response)
                    return
                stream = _events(self._response)
                for event in stream:
                    if self._halt.is_set():
                        return
                    obj = event.get("object") or {}
                    kind = event.get("type")
                    if kind == "ERROR":
                        if obj.get("code") == 410:  # history compacted: list again
                            resource_version = None
                            break
                        raise RuntimeError(obj.get("message", "watch error"))
                    resource_version = obj.get("metadata", {}).get(
                        "resourceVersion", resource_version
                    )
                    if kind == "BOOKMARK":
                        continue
                    self._apply(kind, obj)
                    self._act()
                else:
                    self._act()  # the watch timed out: a grace period or TTL may be due
                backoff = 0.5
            except ApiException as e:
                if e.status == 410:
                    resource_version = None
                    continue
                self.error = api_reason(e)
                resource_version = None
                self._halt.wait(backoff)
                backoff = min(backoff * 2, 30.0)
            except Exception as e:  # noqa: BLE001 - connection drops: retry, keep the reason
                self.error = str(e)
                resource_version = None
                self._halt.wait(backoff)
                backoff = min(backoff * 2, 30.0)
            if self.deleted:
                return

    def _selector(self) -> str:
        return f"{CLUSTER_LABEL}={self.spec.name},tfk8s.io/component=task"

    def _relist(self) -> str:
        self.requests += 1
        listing = self.api.list_objects("v1", "Pod", self._selector())
        with self._cond:
            self.pods = {p["metadata"]["name"]: p for p in listing.get("items", [])}
            self._changed()
        return listing.get("metadata", {}).get("resourceVersion", "")

    def _apply(self, kind: str | None, pod: dict[str, Any]) -> None:
        name = pod.get("metadata", {}).get("name", "")
        with self._cond:
            if kind == "DELETED":
                self.pods.pop(name, None)
                task = state.pod_task(pod)
                if name not in self._ours and task is not None and not self.stopped:
                    newer = any(
                        state.pod_task(p) == task and state.pod_attempt(p) > state.pod_attempt(pod)
                        for p in self.pods.values()
                    )
                    if not newer:
                        self.gone[task.name] = state.pod_attempt(pod)
                        self._event(task.name, "PodDeleted", f"pod {name} was deleted", "Warning")
            else:
                self.pods[name] = pod
                task = state.pod_task(pod)
                if task is not None:
                    self.gone.pop(task.name, None)
            self._changed()

    def _changed(self) -> None:
        self._version += 1
        self._cond.notify_all()

    def _event(self, task: str, reason: str, message: str, kind: str = "Normal") -> None:
        self.events.append(Event(time.time(), task, reason, message, kind))

    # -- the lifecycle ------------------------------------------------------
    def view(self) -> state.View:
        """The cluster as :mod:`.state` sees it now."""
        with self._cond:
            pods = state.latest_pods(list(self.pods.values()))
        return state.View(
            spec=self.spec,
            pods=pods,
            stopped=self.stopped,
            finished_at=self.finished_at,
            done_since=self.done_since,
            gone=dict(self.gone),
        )

    def _next_wakeup(self) -> float | None:
        return state.next_wakeup(self.view(), time.time())

    def _act(self) -> None:
        if self._halt.is_set():
            return
        with self._act_lock:
            self._act_locked()
            wake = self._next_wakeup()
            if wake is not None and not self._halt.is_set():
                # A grace period or TTL ends before the next pod event may come.
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = threading.Timer(max(0.0, wake - time.time()) + 0.01, self._act)
                self._timer.daemon = True
                self._timer.start()

    def _act_locked(self) -> None:
        if self.deleted or self._halt.is_set():
            return
        now = time.time()
        view = self.view()
        phase, _ = state.cluster_phase(view, state.task_statuses(view))
        if phase in Phase.TERMINAL and self.done_since is None:
            self.done_since = now
            view.done_since = now
        for action in state.plan(view, now):
            try:
                self._do(action)
            except ApiException as e:
                if e.status not in (404, 409):  # already done by an earlier pass
                    self.error = api_reason(e)
                    self._event("", "ActionFailed", f"{action}: {self.error}", "Warning")
        self._maybe_list_events(view)

    def _do(self, action: object) -> None:
        if isinstance(action, state.Create):
            manifest = task_pod(self.spec, self.settings, action.task, action.attempt)
            name = manifest["metadata"]["name"]
            if name in self.pods or name in self._ours:
                return
            self._ours.add(name)
            self.requests += 1
            self.api.create(with_owner(manifest, self.owner))
            self._event(action.task.name, "Restarted",
                        f"replaced by pod {name} ({action.reason})", "Warning")
        elif isinstance(action, state.DeletePods):
            for name in action.names:
                if name in self._ours:
                    continue
                self._ours.add(name)
                task = state.pod_task(self.pods.get(name, {}))  # before its DELETED event
                self.requests += 1
                self.api.delete("v1", "Pod", name)
                self._event(task.name if task else "", "Recycled",
                            f"deleted pod {name}: {action.reason}")
        elif isinstance(action, state.MarkFinished):
            self.finished_at = time.time()
            self.requests += 1
            self.api.patch("v1", "ConfigMap", self.spec.name, {
                "metadata": {"annotations": {FINISHED_ANNOTATION: f"{self.finished_at:.3f}"}}
            })
        elif isinstance(action, state.DeleteCluster):
            self.requests += 1
            self.api.delete("v1", "ConfigMap", self.spec.name)
            self._event("", "Deleted", action.reason)
            self.deleted = True
            self._halt.set()
            if self._on_deleted:
                self._on_deleted(self.spec.name)

    def _maybe_list_events(self, view: state.View) -> None:
        vague = [
            t for t in state.task_statuses(view)
            if t.phase == Phase.PENDING and (not t.reason or t.reason.startswith(_VAGUE))
        ]
        if not vague or time.time() - self._events_at < EVENT_PERIOD:
            return
        self.refresh_events()

    def refresh_events(self) -> list[dict[str, Any]]:
        """List the namespace's Events (one request) and keep this cluster's."""
        self._events_at = time.time()
        self.requests += 1
        try:
            items = self.api.list_objects("v1", "Event").get("items", [])
        except ApiException as e:
            self.error = api_reason(e)
            return self.api_events
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

    # -- what users see -----------------------------------------------------
    def snapshot(self) -> ClusterStatus:
        """The cluster's status now."""
        view = self.view()
        tasks = state.task_statuses(view)
        self._explain_pending(tasks)
        phase, reason = state.cluster_phase(view, tasks)
        meta = self.root["metadata"]
        annotations = meta.get("annotations") or {}
        return ClusterStatus(
            name=self.spec.name,
            backend="kubernetes",
            mode=self.spec.mode,
            phase=phase,
            reason=reason,
            created=state.parse_time(meta.get("creationTimestamp")) or 0.0,
            finished=self.finished_at,
            owner=self.spec.owner or annotations.get("tfk8s.io/owner", ""),
            detached=annotations.get("tfk8s.io/detached") == "true",
            log_dir=f"pvc/{self.spec.log_claim or self.spec.name + '-log'}:/log",
            tasks=tasks,
            progress=self.progress,
        )

    def _explain_pending(self, tasks: list[TaskStatus]) -> None:
        """Give pending tasks the newest Warning event of their pod as the reason."""
        if not self.api_events:
            return
        with self._cond:
            latest = state.latest_pods(list(self.pods.values()))
        for t in tasks:
            pod = latest.get(t.name)
            if t.phase != Phase.PENDING or pod is None:
                continue
            name = pod["metadata"]["name"]
            warnings = [
                e for e in self.api_events
                if (e.get("involvedObject") or {}).get("name") == name
                and e.get("type") == "Warning"
            ]
            if warnings:
                last = max(warnings, key=_event_time)
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


def _event_time(e: dict[str, Any]) -> float:
    for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
        t = state.parse_time(e.get(key))
        if t:
            return t
    return state.parse_time(e.get("metadata", {}).get("creationTimestamp")) or 0.0


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
