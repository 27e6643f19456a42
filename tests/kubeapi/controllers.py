"""Deployment and Job controllers of the fake API server (a TEST DOUBLE).

Just enough of kube-controller-manager for a backend to see pods appear for
its workloads and workload status follow them:

* Deployment: pods are created *directly* owned by the Deployment (there is
  no ReplicaSet object), named ``<deployment>-<template hash>-<suffix>`` and
  labelled ``pod-template-hash``; a template change replaces them all
  (Recreate, not a rolling update). Status: replicas, updatedReplicas,
  readyReplicas, availableReplicas, observedGeneration, Available condition.
* Job: keeps ``parallelism`` pods active until ``completions`` succeed
  (Complete condition) or more than ``backoffLimit`` fail (Failed condition,
  reason BackoffLimitExceeded). Work-queue jobs (no completions) complete when
  one pod succeeds. Not modelled: indexed jobs, suspend, podFailurePolicy,
  activeDeadlineSeconds, ttlSecondsAfterFinished.

Controller-created pods go through the same admission as API requests
(LimitRange defaults, ResourceQuota): a forbidden pod becomes a
``FailedCreate`` warning Event on the workload, as in a real cluster.
"""

from __future__ import annotations

import copy
import hashlib
import json

from . import admission, errors
from .events import record_event
from .resources import lookup
from .store import Store, WatchEvent, now, random_suffix


def _owned_by(pod: dict, uid: str) -> bool:
    return any(r.get("uid") == uid for r in pod["metadata"].get("ownerReferences") or [])


def _owner_ref(obj: dict) -> dict:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def _is_ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _condition(type_: str, reason: str, message: str, *, deployment: bool = False) -> dict:
    stamp = now()
    # Deployment conditions carry lastUpdateTime; Job conditions lastProbeTime.
    probe = "lastUpdateTime" if deployment else "lastProbeTime"
    return {"type": type_, "status": "True", "reason": reason, "message": message,
            probe: stamp, "lastTransitionTime": stamp}


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

    def _owned_pods(self, owner: dict) -> list[dict]:
        return [p for p in self.store.objects(self.pods, owner["metadata"]["namespace"])
                if _owned_by(p, owner["metadata"]["uid"])]

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

    def _write_status(self, owner: dict, status: dict) -> None:
        if owner.get("status") != status:
            owner["status"] = status
            self.store.update(self.kind, owner, subresource="status", check_version=False)

    def reconcile(self, namespace: str, name: str) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class DeploymentController(_Controller):
    """Keeps ``spec.replicas`` pods of the current template (no ReplicaSets)."""

    owner_plural = "deployments"
    component = "deployment-controller"

    def reconcile(self, namespace: str, name: str) -> None:
        """Create/delete pods towards ``spec.replicas`` and update status."""
        with self.store.lock:
            dep = self.store.get(self.kind, namespace, name)
            if dep is None or dep["metadata"].get("deletionTimestamp"):
                return  # being deleted (Foreground): no new pods, as the real controller
            spec = dep.get("spec") or {}
            want = spec.get("replicas", 1)
            template_hash = hashlib.sha256(
                json.dumps(spec.get("template"), sort_keys=True).encode()).hexdigest()[:10]
            pods = self._owned_pods(dep)
            current = [p for p in pods
                       if p["metadata"].get("labels", {}).get("pod-template-hash") == template_hash]
            for stale in [p for p in pods if p not in current] + current[want:]:
                self.store.delete(self.pods, namespace, stale["metadata"]["name"])
            current = current[:want]
            for _ in range(want - len(current)):
                pod = self._create_pod(dep, f"{name}-{template_hash}-{random_suffix()}",
                                       {"pod-template-hash": template_hash})
                if pod is None:
                    break
                current.append(pod)
            dep = self.store.get(self.kind, namespace, name)
            if dep is None:
                return
            current = [p for p in self._owned_pods(dep)]
            ready = sum(1 for p in current if _is_ready(p))
            available = ready >= want
            status = {"observedGeneration": dep["metadata"].get("generation", 1),
                      "replicas": len(current), "updatedReplicas": len(current),
                      "readyReplicas": ready, "availableReplicas": ready,
                      "unavailableReplicas": max(0, want - ready)}
            old = {c["type"]: c for c in (dep.get("status") or {}).get("conditions") or []}
            avail = old.get("Available") or {}
            if avail.get("status") != ("True" if available else "False"):
                avail = _condition("Available",
                                   "MinimumReplicasAvailable" if available
                                   else "MinimumReplicasUnavailable",
                                   "Deployment has minimum availability." if available
                                   else "Deployment does not have minimum availability.",
                                   deployment=True)
                avail["status"] = "True" if available else "False"
            status["conditions"] = [avail]
            for key in ("readyReplicas", "availableReplicas", "unavailableReplicas"):
                if not status[key]:
                    del status[key]  # the real controller omits zero counts
            self._write_status(dep, status)


class JobController(_Controller):
    """Runs a Job's pods to completion or to its backoff limit."""

    owner_plural = "jobs"
    component = "job-controller"

    def reconcile(self, namespace: str, name: str) -> None:
        """Start pods up to parallelism; record success/failure; finish the Job."""
        with self.store.lock:
            job = self.store.get(self.kind, namespace, name)
            if job is None or job["metadata"].get("deletionTimestamp"):
                return
            status = copy.deepcopy(job.get("status") or {})
            if any(c["type"] in ("Complete", "Failed") and c["status"] == "True"
                   for c in status.get("conditions") or []):
                return
            spec = job["spec"]
            completions = spec.get("completions")
            pods = self._owned_pods(job)
            phases = [(p.get("status") or {}).get("phase") for p in pods]
            succeeded, failed = phases.count("Succeeded"), phases.count("Failed")
            active = [p for p, ph in zip(pods, phases, strict=True)
                      if ph not in ("Succeeded", "Failed")]
            status.setdefault("startTime", now())
            done = succeeded >= completions if completions else succeeded > 0
            if done:
                status["completionTime"] = now()
                status["conditions"] = [_condition("SuccessCriteriaMet", "CompletionsReached",
                                                   "Reached expected number of succeeded pods"),
                                        _condition("Complete", "CompletionsReached",
                                                   "Reached expected number of succeeded pods")]
                record_event(self.store, job, "Completed", "Job completed",
                             component=self.component)
            elif failed > spec.get("backoffLimit", 6):
                msg = "Job has reached the specified backoff limit"
                status["conditions"] = [
                    _condition("FailureTarget", "BackoffLimitExceeded", msg),
                    _condition("Failed", "BackoffLimitExceeded", msg)]
                for pod in active:
                    self.store.delete(self.pods, namespace, pod["metadata"]["name"])
                active = []
                record_event(self.store, job, "BackoffLimitExceeded", msg, type_="Warning",
                             component=self.component)
            else:
                remaining = (completions - succeeded) if completions else spec["parallelism"]
                labels = (spec.get("template") or {}).get("metadata", {}).get("labels") or {}
                for _ in range(max(0, min(spec.get("parallelism", 1), remaining) - len(active))):
                    pod = self._create_pod(job, f"{name}-{random_suffix()}", labels)
                    if pod is None:
                        break
                    active.append(pod)
            status.update(active=len(active), succeeded=succeeded, failed=failed,
                          ready=sum(1 for p in active if _is_ready(p)))
            for key in ("active", "succeeded", "failed"):
                if not status[key]:
                    del status[key]
            current = self.store.get(self.kind, namespace, name)
            if current is not None:
                self._write_status(current, status)
