"""JobSet in the fake API server (a TEST DOUBLE): the kind, and the pods it asks for.

The double serves ``jobset.x-k8s.io/v1alpha2`` JobSets (CRUD, watch, strict
CRD-schema validation: :mod:`tests.jobset_schema`) and, as a stand-in for the JobSet and
Job controllers *only where a test needs pods to exist*, it creates:

* the headless Service JobSet creates (named after ``network.subdomain``,
  selector ``jobset.sigs.k8s.io/jobset-name``, ``publishNotReadyAddresses``);
* one pod per (replicated Job, Job index, completion index), named and
  labelled as JobSet's and the Job controller's pods are (read from
  kubernetes-sigs/jobset ``pkg/controllers/jobset_controller.go``
  ``labelAndAnnotateObject`` and Kubernetes' Indexed Job): name
  ``<jobset>-<rjob>-<jobIdx>-<podIdx>-<5 random>``, hostname
  ``<jobset>-<rjob>-<jobIdx>-<podIdx>``, subdomain, the ``jobset.sigs.k8s.io/*``
  labels and annotations, ``batch.kubernetes.io/job-completion-index`` and the
  ``JOB_COMPLETION_INDEX`` environment variable.

What it deliberately does NOT do — JobSet's lifecycle semantics, which tests
assert on the objects *we* create instead: it never restarts, replaces or
deletes a pod, never applies successPolicy/failurePolicy or the TTL, and
never writes JobSet status on its own; ``startupPolicy: InOrder`` only with
the harness's ``jobset_in_order=True`` (pod creation order, see
:meth:`JobSetPods.reconcile`).  A test says what JobSet did:
:meth:`JobSetDriver.finish` (the ``Completed``/``Failed`` condition).  Also
not modelled: the Job objects themselves (pods are owned by the JobSet
directly; garbage collection ends the same way).  JobSet's restarts and Kueue's
admission are proven with their real controllers (tests/test_kube_controlplane.py).
"""

from __future__ import annotations

import copy
import hashlib

from .controllers import _Controller, _owner_ref
from .resources import lookup
from .store import Store, now, random_suffix

GROUP = "jobset.sigs.k8s.io"
JOBSET_NAME = f"{GROUP}/jobset-name"
RESTART_ATTEMPT = f"{GROUP}/restart-attempt"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def _subdomain(js: dict) -> str:
    return ((js["spec"].get("network") or {}).get("subdomain")) or js["metadata"]["name"]


def _pod_labels(js: dict, rjob: dict, job_index: int, pod_index: int, attempt: int) -> dict:
    name, ns = js["metadata"]["name"], js["metadata"]["namespace"]
    job_name = f"{name}-{rjob['name']}-{job_index}"
    job_uid = hashlib.sha1(f"{ns}/{job_name}/{attempt}".encode()).hexdigest()
    return {
        JOBSET_NAME: name,
        f"{GROUP}/jobset-uid": js["metadata"]["uid"],
        f"{GROUP}/replicatedjob-name": rjob["name"],
        RESTART_ATTEMPT: str(attempt),
        f"{GROUP}/replicatedjob-replicas": str(rjob.get("replicas", 1)),
        f"{GROUP}/job-index": str(job_index),
        f"{GROUP}/job-key": hashlib.sha1(f"{ns}/{job_name}".encode()).hexdigest(),
        COMPLETION_INDEX: str(pod_index),
        "batch.kubernetes.io/job-name": job_name,
        "job-name": job_name,
        "batch.kubernetes.io/controller-uid": job_uid,
        "controller-uid": job_uid,
    }


class JobSetPods(_Controller):
    """Creates the Service and the pods of each new JobSet attempt (nothing more)."""

    owner_plural = "jobsets"
    component = "jobset-controller"

    def __init__(self, store: Store, in_order: bool = False):
        super().__init__(store)
        self.services = lookup("services")
        #: Model ``startupPolicy: InOrder`` (the harness's ``jobset_in_order``; off by default).
        self.in_order = in_order
        # (JobSet uid, attempt, replicated Job) whose pods were created: each pod is created
        # once; replacing a deleted or failed pod would be Job/JobSet semantics.
        self._created: set[tuple[str, int, str]] = set()

    def reconcile(self, namespace: str, name: str) -> None:
        """Create the Service and the current attempt's pods that were never created.

        With ``in_order`` and a JobSet whose ``startupPolicyOrder`` is ``InOrder``, a
        replicated Job's pods are created only once every pod of the ones before it is
        ready or has ended: JobSet's ``allReplicasStarted`` (failed + ready + succeeded
        Jobs = replicas; a Job is ready when its ready and succeeded pods cover it).
        """
        with self.store.lock:
            js = self.store.get(self.kind, namespace, name)
            if js is None or js["spec"].get("suspend") or js["metadata"].get("deletionTimestamp"):
                return
            attempt = int((js.get("status") or {}).get("restarts", 0))
            self._service(js)
            ordered = self.in_order and (js["spec"].get("startupPolicy") or {}).get(
                "startupPolicyOrder") == "InOrder"
            for rjob in js["spec"]["replicatedJobs"]:
                key = (js["metadata"]["uid"], attempt, rjob["name"])
                if key not in self._created:
                    self._created.add(key)
                    completions = rjob["template"]["spec"].get("completions", 1)
                    for job_index in range(rjob.get("replicas", 1)):
                        for pod_index in range(completions):
                            self._create_jobset_pod(js, rjob, job_index, pod_index, attempt)
                if ordered and not self._started(js, rjob, attempt):
                    return

    def _service(self, js: dict) -> None:
        network = js["spec"].get("network") or {}
        namespace = js["metadata"]["namespace"]
        if network.get("enableDNSHostnames") and \
                self.store.get(self.services, namespace, _subdomain(js)) is None:
            self.store.create(self.services, {
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": _subdomain(js), "namespace": namespace,
                             "ownerReferences": [_owner_ref(js)]},
                "spec": {"clusterIP": "None", "selector": {JOBSET_NAME: js["metadata"]["name"]},
                         "publishNotReadyAddresses": network.get("publishNotReadyAddresses", True)},
            })

    def _started(self, js: dict, rjob: dict, attempt: int) -> bool:
        """Whether every pod of ``rjob`` (this attempt) is ready or has ended."""
        pods = [p for p in self.store.objects(self.pods, js["metadata"]["namespace"])
                if p["metadata"]["labels"].get(JOBSET_NAME) == js["metadata"]["name"]
                and p["metadata"]["labels"].get(f"{GROUP}/replicatedjob-name") == rjob["name"]
                and p["metadata"]["labels"].get(RESTART_ATTEMPT) == str(attempt)]
        want = rjob.get("replicas", 1) * rjob["template"]["spec"].get("completions", 1)

        def done(p: dict) -> bool:
            status = p.get("status") or {}
            ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in status.get("conditions") or [])
            return ready or status.get("phase") in ("Succeeded", "Failed")

        return len(pods) >= want and all(done(p) for p in pods)

    def _create_jobset_pod(self, js: dict, rjob: dict, job_index: int, pod_index: int,
                           attempt: int) -> None:
        template = copy.deepcopy(rjob["template"]["spec"].get("template") or {})
        host = f"{js['metadata']['name']}-{rjob['name']}-{job_index}-{pod_index}"
        labels = _pod_labels(js, rjob, job_index, pod_index, attempt)
        spec = template.get("spec") or {}
        spec["hostname"] = host
        if (js["spec"].get("network") or {}).get("enableDNSHostnames"):
            spec["subdomain"] = _subdomain(js)
        index_env = {"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
            "fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}}
        # The Job controller gives the index to every container, init containers included.
        for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            container["env"] = [*container.get("env", []), index_env]
        meta = template.get("metadata") or {}
        template["metadata"] = {
            **meta,
            "labels": {**(meta.get("labels") or {}), **labels},
            "annotations": {**(meta.get("annotations") or {}), **labels},
        }
        template["spec"] = spec
        owner = {"spec": {"template": template}, "metadata": js["metadata"],
                 "apiVersion": js["apiVersion"], "kind": js["kind"]}
        # JobSet's pods are the Job controller's: a refused pod is a FailedCreate Event on
        # the Job <jobset>-<replicated job>-<index> (the double makes no Job objects).
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
            "name": f"{js['metadata']['name']}-{rjob['name']}-{job_index}",
            "namespace": js["metadata"]["namespace"]}}
        self._create_pod(owner, f"{host}-{random_suffix()}", {}, event_on=job)


class JobSetDriver:
    """What a test says JobSet did (the double never decides it)."""

    def __init__(self, store: Store, pods: JobSetPods):
        self.store = store
        self.kind = lookup("jobsets")
        self._pods = pods

    def pods(self, namespace: str, name: str, attempt: int | None = None) -> list[dict]:
        """The pods of JobSet ``name`` (of one restart attempt), sorted by hostname."""
        found = [p for p in self.store.objects(lookup("pods"), namespace)
                 if p["metadata"].get("labels", {}).get(JOBSET_NAME) == name
                 and (attempt is None
                      or p["metadata"]["labels"].get(RESTART_ATTEMPT) == str(attempt))]
        return sorted(found, key=lambda p: (p["spec"].get("hostname", ""),
                                            p["metadata"]["labels"].get(RESTART_ATTEMPT)))

    def pod_name(self, namespace: str, name: str, role: str, index: int) -> str:
        """The newest pod running task ``<role>-<index>`` of JobSet ``name``."""
        host = f"{name}-{role}-0-{index}"
        pods = [p for p in self.pods(namespace, name) if p["spec"].get("hostname") == host]
        if not pods:
            raise KeyError(f"JobSet {namespace}/{name} has no pod for {role}-{index}")
        return max(pods, key=lambda p: int(p["metadata"]["labels"][RESTART_ATTEMPT]))[
            "metadata"]["name"]

    def _status(self, namespace: str, name: str) -> dict:
        js = self.store.get(self.kind, namespace, name)
        if js is None:
            raise KeyError(f"no JobSet {namespace}/{name}")
        return js

    def finish(self, namespace: str, name: str, condition: str = "Completed",
               reason: str = "AllJobsCompleted", message: str = "jobset completed successfully",
               delete_active: bool = True) -> None:
        """JobSet finished: its ``Completed``/``Failed`` condition, running pods deleted."""
        with self.store.lock:
            js = self._status(namespace, name)
            stamp = now()
            js.setdefault("status", {})["conditions"] = [
                {"type": condition, "status": "True", "reason": reason, "message": message,
                 "lastTransitionTime": stamp}]
            js["status"]["terminalState"] = condition
            self.store.update(self.kind, js, subresource="status", check_version=False)
            if delete_active:
                for pod in self.pods(namespace, name):
                    if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                        self.store.delete(lookup("pods"), namespace, pod["metadata"]["name"])
