"""The object store of the fake Kubernetes API server (a TEST DOUBLE).

It does what etcd plus the generic registry do for a real apiserver: stamps
``uid``, ``resourceVersion`` (one global monotonic counter bumped on every
write), ``creationTimestamp``, ``generation`` and ``generateName``; enforces
optimistic concurrency; keeps a bounded history of watch events so a watch
can resume from a resourceVersion (410 Expired when it is too old); and runs
the garbage collector's cascade when an owner is deleted.

Admission (RBAC, validation, quota) is *not* here: see ``api.py``.
"""

from __future__ import annotations

import copy
import datetime as dt
import random
import threading
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from . import errors
from .resources import KINDS, ResourceKind, lookup

#: The finalizer an owner carries while a Foreground deletion waits for its dependents.
FOREGROUND = "foregroundDeletion"
# generateName suffix alphabet of the real apiserver (no vowels, no look-alikes).
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def now() -> str:
    """RFC 3339 UTC timestamp with second precision, as metadata timestamps are."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def random_suffix(length: int = 5) -> str:
    """A random name suffix like the ones generateName and ReplicaSets use."""
    return "".join(random.choice(_SUFFIX_ALPHABET) for _ in range(length))


@dataclass(frozen=True)
class WatchEvent:
    """One committed change; ``seq`` is the resourceVersion it produced."""

    seq: int
    type: str  # ADDED | MODIFIED | DELETED
    kind: ResourceKind
    obj: dict
    old: dict | None  # the previous state, so watches can honour selectors on transitions


def _key(kind: ResourceKind, namespace: str | None, name: str) -> tuple[str, str, str]:
    return (kind.qualified_resource, namespace or "", name)


def _without_rv(obj: dict) -> dict:
    meta = {k: v for k, v in obj.get("metadata", {}).items() if k != "resourceVersion"}
    return {**obj, "metadata": meta}


def _spec_part(obj: dict) -> dict:
    """Everything that counts for ``metadata.generation``: not metadata, not status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


class Store:
    """Thread-safe object store with a global resourceVersion and event history.

    ``lock`` is re-entrant so admission code can hold it across check-then-write
    (the quota check and the create must be atomic, as in the real server).
    Observers run synchronously *inside* the lock after every commit; they may
    write to the store (controllers, quota status) but must never block.
    """

    def __init__(self, history_size: int = 1000):
        self.lock = threading.RLock()
        self._changed = threading.Condition(self.lock)
        self._objects: dict[tuple[str, str, str], dict] = {}
        self._rv = 0
        self._history: deque[WatchEvent] = deque(maxlen=history_size)
        self._floor = 0  # oldest resourceVersion a watch may resume from
        self._observers: list[Callable[[WatchEvent], None]] = []
        self.observer_errors: list[BaseException] = []
        self.closed = False
        # uid → last state of removed objects (what a Foreground DELETE answers with).
        self._finished: dict[str, dict] = {}

    # -- reading ---------------------------------------------------------

    @property
    def resource_version(self) -> int:
        """The current (latest) resourceVersion."""
        with self.lock:
            return self._rv

    def get(self, kind: ResourceKind, namespace: str | None, name: str) -> dict | None:
        """A deep copy of the stored object, or None."""
        with self.lock:
            obj = self._objects.get(_key(kind, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def objects(self, kind: ResourceKind, namespace: str | None = None) -> list[dict]:
        """Deep copies of every object of ``kind`` (in ``namespace`` if given), sorted."""
        with self.lock:
            found = [
                copy.deepcopy(obj)
                for (qr, ns, _), obj in self._objects.items()
                if qr == kind.qualified_resource and (namespace is None or ns == namespace)
            ]
        found.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        return found

    def find_by_uid(self, uid: str) -> tuple[ResourceKind, dict] | None:
        """The kind and a copy of the object whose ``metadata.uid`` is ``uid``."""
        with self.lock:
            for (qr, _, _), obj in self._objects.items():
                if obj["metadata"].get("uid") == uid:
                    return lookup(qr), copy.deepcopy(obj)
        return None

    # -- writing ---------------------------------------------------------

    def _commit(self, event_type: str, kind: ResourceKind, obj: dict, old: dict | None) -> None:
        if self._history.maxlen and len(self._history) == self._history.maxlen:
            self._floor = self._history[0].seq
        event = WatchEvent(self._rv, event_type, kind, copy.deepcopy(obj),
                           copy.deepcopy(old) if old is not None else None)
        self._history.append(event)
        self._changed.notify_all()
        for observer in list(self._observers):
            try:
                observer(event)
            except Exception as exc:  # noqa: BLE001 - surfaced by the fixture at teardown
                self.observer_errors.append(exc)

    def create(self, kind: ResourceKind, obj: dict, uid: str | None = None) -> dict:
        """Store a new object; stamps server-owned metadata; 409 if the name is taken.

        ``uid`` lets admission pre-assign the uid when defaulting depends on it
        (a Job's selector), as the real registry's BeforeCreate does.
        """
        with self.lock:
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            if not kind.namespaced:
                meta.pop("namespace", None)
            ns = meta.get("namespace")
            if not meta.get("name") and meta.get("generateName"):
                # Retry like the real registry would on a (rare) collision.
                for _ in range(20):
                    candidate = meta["generateName"] + random_suffix()
                    if _key(kind, ns, candidate) not in self._objects:
                        meta["name"] = candidate
                        break
            key = _key(kind, ns, meta["name"])
            if key in self._objects:
                raise errors.already_exists(kind, meta["name"])
            self._rv += 1
            meta["uid"] = uid or str(uuid.uuid4())
            meta["resourceVersion"] = str(self._rv)
            meta["creationTimestamp"] = now()
            for server_owned in ("deletionTimestamp", "deletionGracePeriodSeconds"):
                meta.pop(server_owned, None)
            if kind.has_status_subresource:
                meta["generation"] = 1
            obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
            self._objects[key] = obj
            self._commit("ADDED", kind, obj, None)
            return copy.deepcopy(obj)

    def update(self, kind: ResourceKind, obj: dict, *, subresource: str | None = None,
               check_version: bool = True) -> dict:
        """Replace a stored object (PUT semantics).

        With ``subresource="status"`` only ``.status`` changes; otherwise, for
        kinds with a status subresource, ``.status`` is kept (as the real
        strategies do). A stale ``metadata.resourceVersion`` is 409 Conflict.
        """
        with self.lock:
            meta = obj.get("metadata") or {}
            key = _key(kind, meta.get("namespace") if kind.namespaced else None, meta.get("name"))
            current = self._objects.get(key)
            if current is None:
                raise errors.not_found(kind, meta.get("name", ""))
            given_rv = meta.get("resourceVersion")
            if check_version and given_rv and given_rv != current["metadata"]["resourceVersion"]:
                raise errors.conflict(kind, meta["name"])
            if subresource == "status":
                new = copy.deepcopy(current)
                new["status"] = copy.deepcopy(obj.get("status", {}))
            else:
                new = copy.deepcopy(obj)
                new["metadata"] = {**copy.deepcopy(meta)}
                if kind.has_status_subresource:
                    if "status" in current:
                        new["status"] = copy.deepcopy(current["status"])
                    else:
                        new.pop("status", None)
                # Server-owned metadata cannot be changed by a client.
                for owned in ("uid", "creationTimestamp", "generation", "deletionTimestamp",
                              "namespace", "name"):
                    if owned in current["metadata"]:
                        new["metadata"][owned] = current["metadata"][owned]
                    else:
                        new["metadata"].pop(owned, None)
                if kind.has_status_subresource and _spec_part(new) != _spec_part(current):
                    new["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
            new["apiVersion"], new["kind"] = kind.api_version, kind.kind
            if _without_rv(new) == _without_rv(current):
                # A no-op write: the real server does not bump resourceVersion.
                return copy.deepcopy(current)
            return self._write(kind, key, new, current)

    def _write(self, kind: ResourceKind, key: tuple, new: dict, current: dict) -> dict:
        self._rv += 1
        new["metadata"]["resourceVersion"] = str(self._rv)
        self._objects[key] = new
        self._commit("MODIFIED", kind, new, current)
        return copy.deepcopy(new)

    def delete(self, kind: ResourceKind, namespace: str | None, name: str,
               propagation: str = "Background") -> dict:
        """Delete an object and cascade to its dependents (garbage collector).

        ``Background``: the object goes at once, then its dependents.
        ``Foreground``: the object stays, with a ``deletionTimestamp`` and the
        ``foregroundDeletion`` finalizer, until every dependent is gone; then
        it goes.  ``Orphan`` strips the ownerReference from dependents
        instead.  Namespaces delete their contents first and are marked
        Terminating meanwhile.  (Pods held Terminating by a kubelet's graceful
        shutdown: tests/test_kube_backend.py on the real cluster.)
        """
        with self.lock:
            key = _key(kind, namespace if kind.namespaced else None, name)
            current = self._objects.get(key)
            if current is None:
                raise errors.not_found(kind, name)
            if current["metadata"].get("deletionTimestamp") and kind.kind != "Namespace":
                return copy.deepcopy(current)  # already on its way out
            if kind.kind == "Namespace":
                terminating = copy.deepcopy(current)
                terminating["metadata"]["deletionTimestamp"] = now()
                terminating.setdefault("status", {})["phase"] = "Terminating"
                self._write(kind, key, terminating, current)
                for other in KINDS:
                    if other.namespaced:
                        for obj in self.objects(other, name):
                            self._delete_if_present(other, name, obj["metadata"]["name"])
                current = self._objects[key]
            uid = current["metadata"]["uid"]
            if propagation == "Orphan":
                for dep_kind, dep in self._dependents_of(uid):
                    dep["metadata"]["ownerReferences"] = [
                        r for r in dep["metadata"]["ownerReferences"] if r.get("uid") != uid]
                    self.update(dep_kind, dep, check_version=False)
            elif propagation == "Foreground" and self._dependents_of(uid):
                marked = copy.deepcopy(current)
                marked["metadata"]["deletionTimestamp"] = now()
                marked["metadata"]["finalizers"] = [
                    *(marked["metadata"].get("finalizers") or []), FOREGROUND]
                self._write(kind, key, marked, current)
                for dep_kind, dep in self._dependents_of(uid):
                    if not self._has_live_owner(dep, excluding=uid):
                        self._delete_if_present(dep_kind, dep["metadata"].get("namespace"),
                                                dep["metadata"]["name"], "Foreground")
                return copy.deepcopy(self._objects.get(key) or self._finished[uid])
            return self._remove(kind, key)

    def _remove(self, kind: ResourceKind, key: tuple) -> dict:
        """Take the object out (DELETED), cascade to dependents, release a waiting owner."""
        current = self._objects[key]
        self._rv += 1
        gone = copy.deepcopy(current)
        gone["metadata"]["resourceVersion"] = str(self._rv)
        gone["metadata"]["finalizers"] = [
            f for f in gone["metadata"].get("finalizers") or [] if f != FOREGROUND] or None
        if gone["metadata"]["finalizers"] is None:
            del gone["metadata"]["finalizers"]
        del self._objects[key]
        self._finished[current["metadata"]["uid"]] = gone
        self._commit("DELETED", kind, gone, current)
        uid = current["metadata"]["uid"]
        for dep_kind, dep in self._dependents_of(uid):
            if not self._has_live_owner(dep):
                self._delete_if_present(dep_kind, dep["metadata"].get("namespace"),
                                        dep["metadata"]["name"])
        for ref in current["metadata"].get("ownerReferences") or []:
            self._release(ref.get("uid"))
        return gone

    def _release(self, owner_uid: str | None) -> None:
        """An owner in foreground deletion goes once its last dependent is gone."""
        found = self.find_by_uid(owner_uid) if owner_uid else None
        if found is None:
            return
        kind, owner = found
        if FOREGROUND in (owner["metadata"].get("finalizers") or []) and \
                not self._dependents_of(owner_uid):
            meta = owner["metadata"]
            self._remove(kind, _key(kind, meta.get("namespace") if kind.namespaced else None,
                                    meta["name"]))

    def _delete_if_present(self, kind: ResourceKind, namespace: str | None, name: str,
                           propagation: str = "Background") -> None:
        if _key(kind, namespace, name) in self._objects:
            self.delete(kind, namespace, name, propagation)

    def _dependents_of(self, uid: str) -> list[tuple[ResourceKind, dict]]:
        found = []
        for (qr, _, _), obj in list(self._objects.items()):
            refs = obj["metadata"].get("ownerReferences") or []
            if any(r.get("uid") == uid for r in refs):
                found.append((lookup(qr), copy.deepcopy(obj)))
        return found

    def _has_live_owner(self, obj: dict, excluding: str | None = None) -> bool:
        uids = {r.get("uid") for r in obj["metadata"].get("ownerReferences") or []} - {excluding}
        return any(o["metadata"].get("uid") in uids for o in self._objects.values())

    # -- watching ----------------------------------------------------------

    def add_observer(self, observer: Callable[[WatchEvent], None]) -> None:
        """Call ``observer(event)`` after every commit (inside the lock)."""
        with self.lock:
            self._observers.append(observer)

    def events_after(self, resource_version: int) -> list[WatchEvent]:
        """Committed events newer than ``resource_version``; 410 if already discarded."""
        with self.lock:
            if resource_version < self._floor:
                raise errors.gone(
                    f"too old resource version: {resource_version} ({self._floor})")
            return [e for e in self._history if e.seq > resource_version]

    def wait_for_change(self, after: int, timeout: float) -> bool:
        """Block until the resourceVersion passes ``after``, the store closes, or timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self._rv > after or self.closed, timeout)

    def close(self) -> None:
        """Wake every waiting watch so server threads can exit."""
        with self._changed:
            self.closed = True
            self._changed.notify_all()
