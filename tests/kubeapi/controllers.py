"""The controller plumbing of the fake API server (a TEST DOUBLE): what the JobSet stand-in
(:mod:`.jobsets`) builds on to create pods.

Controller-created pods go through the same admission as API requests
(ResourceQuota, Pod Security): a forbidden pod becomes a ``FailedCreate``
warning Event on its owner, as in a real cluster. Deployments and Jobs are the
real kube-controller-manager's (tests/test_kube_backend.py, tests/test_serving_k8s.py).
"""

from __future__ import annotations

import copy

from . import admission, errors
from .events import record_event
from .resources import lookup
from .store import Store, WatchEvent


def _owner_ref(obj: dict) -> dict:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


class _Controller:
    """Shared plumbing: react to events on the owner kind and its pods."""

    owner_plural = ""
    component = ""

    def __init__(self, store: Store):
        self.store = store
        self.kind = lookup(self.owner_plural)
        self.pods = lookup("pods")
        # Observers run nested inside our own writes (creating a pod fires a pod
        # event); a nested reconcile of the same owner is deferred to a re-run
        # of the outer one instead of racing it into creating extra pods.
        self._busy: set[tuple[str, str]] = set()
        self._dirty: set[tuple[str, str]] = set()

    def __call__(self, event: WatchEvent) -> None:
        """Store observer: reconcile the affected owner."""
        meta = event.obj["metadata"]
        if event.kind is self.kind and event.type != "DELETED":
            if event.type == "MODIFIED" and event.old and \
                    event.old.get("spec") == event.obj.get("spec"):
                return  # a status write (often our own)
            self._kick(meta["namespace"], meta["name"])
        elif event.kind is self.pods:
            for ref in meta.get("ownerReferences") or []:
                if ref.get("kind") == self.kind.kind and ref.get("controller"):
                    self._kick(meta["namespace"], ref["name"])

    def _kick(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        with self.store.lock:
            if key in self._busy:
                self._dirty.add(key)
                return
            self._busy.add(key)
            try:
                while True:
                    self._dirty.discard(key)
                    self.reconcile(namespace, name)
                    if key not in self._dirty:
                        break
            finally:
                self._busy.discard(key)

    def _create_pod(self, owner: dict, name: str, extra_labels: dict,
                    event_on: dict | None = None) -> dict | None:
        template = copy.deepcopy(owner["spec"].get("template") or {})
        meta = template.get("metadata") or {}
        ns = owner["metadata"]["namespace"]
        pod = {"apiVersion": "v1", "kind": "Pod", "spec": template.get("spec") or {},
               "metadata": {**meta, "name": name, "namespace": ns,
                            "labels": {**(meta.get("labels") or {}), **extra_labels},
                            "ownerReferences": [_owner_ref(owner)]}}
        try:
            admission.admit_create(self.store, self.pods, ns, pod)
        except errors.ApiError as exc:
            record_event(self.store, event_on or owner, "FailedCreate",
                         f"Error creating: {exc.message}", type_="Warning",
                         component="job-controller" if event_on else self.component)
            return None
        created = self.store.create(self.pods, pod)
        record_event(self.store, owner, "SuccessfulCreate", f"Created pod: {name}",
                     component=self.component)
        return created

    def reconcile(self, namespace: str, name: str) -> None:  # pragma: no cover - abstract
        raise NotImplementedError
