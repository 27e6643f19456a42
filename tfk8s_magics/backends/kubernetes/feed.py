"""One pair of watches per namespace, shared by every cluster a backend watches there.

A :class:`NamespaceFeed` lists the namespace's task pods and JobSets once, then keeps two watches
open (pods by the lab's task label, JobSets by the lab's JobSet label), each re-opened from its
last resourceVersion when the server ends it and re-listed after ``410 Gone``. Every change goes
to the :class:`~.watch.ClusterWatch` of the cluster it belongs to (the pod's cluster label, the
JobSet's name). So a notebook that watches five clusters holds two watches, not ten, and makes
about two requests a minute at rest whatever the number of clusters and tasks.

Threads: ``_pods``/``_jobsets`` (written by their watch threads) and ``_subs`` (cluster name →
its watch) are guarded by ``_lock``, which is never held while a subscriber is called (a subscriber
takes its own lock) nor during a request.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from kubernetes.client.rest import ApiException

from .client import Api, abort, api_reason
from .jobset import API_VERSION, KIND
from .manifests import CLUSTER_LABEL, selector

if TYPE_CHECKING:  # pragma: no cover
    from .watch import ClusterWatch

#: Longest a single watch request stays open (the server ends it; we reopen).
WATCH_SECONDS = 60


class NamespaceFeed:
    """The namespace's task pods and JobSets, kept current in two daemon threads; read-only."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.requests = 0  # API requests this feed made (for the bench)
        self.error = ""
        self._lock = threading.Lock()
        self._subs: dict[str, ClusterWatch] = {}
        self._pods: dict[str, dict[str, Any]] = {}  # pod name → pod (watch thread only)
        self._jobsets: dict[str, dict[str, Any]] = {}  # JobSet name → JobSet (watch thread only)
        self._halt = threading.Event()
        self._synced = {"pods": threading.Event(), "jobsets": threading.Event()}
        self._jobsets_listed_at: float | None = None  # when the newest JobSet listing began
        self._responses: dict[str, Any] = {}
        self._threads = [
            threading.Thread(target=self._loop, args=(what,), daemon=True,
                             name=f"tfk8s-feed-{api.namespace}-{what}")
            for what in ("pods", "jobsets")
        ]

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> NamespaceFeed:
        """Start both watch threads (returns at once; :meth:`subscribe` waits for the listings)."""
        for t in self._threads:
            t.start()
        return self

    @property
    def alive(self) -> bool:
        """Whether both watch threads run and have not been asked to stop."""
        return all(t.is_alive() for t in self._threads) and not self._halt.is_set()

    def close(self) -> None:
        """Stop watching and wait for the threads (bounded)."""
        self._halt.set()
        for response in list(self._responses.values()):
            abort(response)
        for t in self._threads:
            if t.is_alive() and t is not threading.current_thread():
                t.join(timeout=5.0)

    def subscribe(self, watch: ClusterWatch, timeout: float = 30.0) -> None:
        """Feed ``watch`` its cluster's objects from now on; returns once both listings are in."""
        with self._lock:
            self._subs[watch.spec.name] = watch
        for synced in self._synced.values():
            synced.wait(timeout)
        # the listing may have come before the subscription: hand over what is known
        self._deliver_all(only=watch.spec.name)

    def wait_synced(self, timeout: float) -> bool:
        """Whether both listings are in, waiting up to ``timeout`` s for them (False at once
        when a watch fails or the feed has stopped)."""
        deadline = time.monotonic() + timeout
        for synced in self._synced.values():
            while not synced.wait(0.05):
                if self.error or not self.alive or time.monotonic() >= deadline:
                    return False
        return True

    def snapshot(self) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]] | None:
        """The task pods and the JobSets (by name) as the watches know them now; None while a
        listing is not in yet, a watch is failing, or the feed has stopped (then ask the API)."""
        if not self.alive or self.error or len(self._synced_names()) < len(self._synced):
            return None
        with self._lock:
            return list(self._pods.values()), dict(self._jobsets)

    def unsubscribe(self, watch: ClusterWatch) -> None:
        """Stop feeding ``watch`` (a newer watch of the same name stays subscribed)."""
        with self._lock:
            if self._subs.get(watch.spec.name) is watch:
                del self._subs[watch.spec.name]

    # -- dispatch ----------------------------------------------------------------------------
    def _sub(self, name: str | None) -> ClusterWatch | None:
        with self._lock:
            return self._subs.get(name or "")

    def _deliver_all(self, only: str | None = None) -> None:
        with self._lock:
            if only is None:
                subs = dict(self._subs)
            else:
                subs = {only: self._subs[only]} if only in self._subs else {}
            pods, jobsets = dict(self._pods), dict(self._jobsets)
        for name, watch in subs.items():
            mine = [p for p in pods.values()
                    if (p["metadata"].get("labels") or {}).get(CLUSTER_LABEL) == name]
            watch.replace_state(mine, jobsets.get(name), listed="jobsets" in self._synced_names(),
                                listed_at=self._jobsets_listed_at)
            watch.after_change()

    def _synced_names(self) -> set[str]:
        return {k for k, e in self._synced.items() if e.is_set()}

    # -- the watches -------------------------------------------------------------------------
    def _loop(self, what: str) -> None:
        relist, opener, apply = {
            "pods": (self._relist_pods, self._open_pods, self._apply_pod),
            "jobsets": (self._relist_jobsets, self._open_jobsets, self._apply_jobset),
        }[what]
        resource_version = None
        backoff = 0.5
        while not self._halt.is_set():
            try:
                if resource_version is None:
                    resource_version = relist()
                    self._synced[what].set()
                    self._deliver_all()
                resource_version = self._follow(what, opener, apply, resource_version)
                backoff = 0.5
                self._set_error("")
            except ApiException as e:
                resource_version = None
                if e.status != 410:  # 410: history compacted, list again at once
                    self._set_error(api_reason(e))
                    backoff = self._pause(backoff)
            except Exception as e:  # noqa: BLE001 - connection drops: retry, keep the reason
                self._set_error(str(e))
                resource_version = None
                backoff = self._pause(backoff)

    def _set_error(self, error: str) -> None:
        self.error = error
        with self._lock:
            subs = list(self._subs.values())
        for watch in subs:
            watch.error = error

    def _pause(self, backoff: float) -> float:
        self._halt.wait(backoff)
        return min(backoff * 2, 30.0)

    def _follow(self, what: str, opener: Callable, apply: Callable, resource_version: str) -> str | None:
        self.requests += 1
        response = self._responses[what] = opener(resource_version)
        if self._halt.is_set():
            abort(response)
            return resource_version
        for event in events(response):
            if self._halt.is_set():
                return resource_version
            obj = event.get("object") or {}
            kind = event.get("type")
            if kind == "ERROR":
                if obj.get("code") == 410:
                    return None
                raise RuntimeError(obj.get("message", "watch error"))
            resource_version = obj.get("metadata", {}).get("resourceVersion", resource_version)
            if kind != "BOOKMARK":
                apply(kind, obj)
        return resource_version

    def _watch_args(self, resource_version: str) -> dict[str, Any]:
        return {"resource_version": resource_version, "timeout_seconds": WATCH_SECONDS,
                "allow_watch_bookmarks": True, "watch": True, "_preload_content": False,
                "_request_timeout": (self.api.timeout, WATCH_SECONDS + 15)}

    def _open_pods(self, resource_version: str):
        return self.api.core.list_namespaced_pod(self.api.namespace, label_selector=selector(None, "task"),
                                                 **self._watch_args(resource_version))

    def _open_jobsets(self, resource_version: str):
        group, version = API_VERSION.split("/")
        return self.api.custom.list_namespaced_custom_object(
            group, version, self.api.namespace, "jobsets", label_selector=selector(None, "jobset"),
            **self._watch_args(resource_version))

    def _relist_pods(self) -> str:
        self.requests += 1
        listing = self.api.list_objects("v1", "Pod", selector(None, "task"))
        with self._lock:
            self._pods = {p["metadata"]["name"]: p for p in listing.get("items", [])}
        return listing.get("metadata", {}).get("resourceVersion", "")

    def _relist_jobsets(self) -> str:
        self.requests += 1
        began = time.monotonic()
        listing = self.api.list_objects(API_VERSION, KIND, selector(None, "jobset"))
        with self._lock:
            self._jobsets = {j["metadata"]["name"]: j for j in listing.get("items", [])}
            self._jobsets_listed_at = began
        return listing.get("metadata", {}).get("resourceVersion", "")

    def _apply_pod(self, kind: str | None, pod: dict[str, Any]) -> None:
        name = pod.get("metadata", {}).get("name", "")
        with self._lock:
            if kind == "DELETED":
                self._pods.pop(name, None)
            else:
                self._pods[name] = pod
        watch = self._sub((pod["metadata"].get("labels") or {}).get(CLUSTER_LABEL))
        if watch is not None:
            watch.apply_pod(kind, pod)
            watch.after_change()

    def _apply_jobset(self, kind: str | None, jobset: dict[str, Any]) -> None:
        name = jobset.get("metadata", {}).get("name", "")
        with self._lock:
            if kind == "DELETED":
                self._jobsets.pop(name, None)
            else:
                self._jobsets[name] = jobset
        watch = self._sub(name)
        if watch is not None:
            watch.apply_jobset(kind, jobset)
            watch.after_change()


def events(response) -> Iterator[dict[str, Any]]:
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
