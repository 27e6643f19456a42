"""Defaulting and admission of the fake API server (a TEST DOUBLE).

What happens to an object between "the request body was valid" and "it was
stored", for API requests and controller-created pods alike: the defaults a
backend would see on the stored object (pod ``restartPolicy``, ``status.phase
Pending``, a Job's selector and labels, a request defaulted to its limit), the
``requests <= limits`` validation and ResourceQuota admission. No LimitRanger, no Pod
Security and no Kueue webhook: the real API server and Kueue run those
(tests/test_kube_admission.py, tests/test_kube_controlplane.py, the dry-runs of
``RealKube.restricted_refusal``).
Call :func:`admit_create` with ``store.lock`` held, together with the create.
"""

from __future__ import annotations

import uuid

from . import errors, quota
from .resources import ResourceKind, lookup
from .store import Store


def _image_pull_policy(image: str) -> str:
    tag = image.rsplit("/", 1)[-1]
    return "Always" if ":" not in tag or tag.endswith(":latest") else "IfNotPresent"


def default_pod(pod: dict) -> None:
    """Apply the apiserver's pod defaults that a backend commonly reads back."""
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    for group in ("initContainers", "containers"):
        for c in spec.get(group) or []:
            c.setdefault("imagePullPolicy", _image_pull_policy(c.get("image", "")))
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            c.setdefault("resources", {})
    pod["status"] = {"phase": "Pending", "qosClass": _qos_class(spec)}


def _qos_class(spec: dict) -> str:
    containers = spec.get("containers") or []
    resources = [c.get("resources") or {} for c in containers]
    if not any(r.get("requests") or r.get("limits") for r in resources):
        return "BestEffort"
    guaranteed = all(
        (r.get("limits") or {}).get(n) is not None
        and (r.get("requests") or {}).get(n, (r.get("limits") or {}).get(n))
        == (r.get("limits") or {}).get(n)
        for r in resources for n in ("cpu", "memory"))
    return "Guaranteed" if guaranteed else "Burstable"


def default_job(job: dict, uid: str) -> None:
    """Generate the Job's selector and pod-template labels from its uid (real defaulting)."""
    spec = job.setdefault("spec", {})
    name = job["metadata"].get("name", "")
    labels = {"batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": name,
              "controller-uid": uid, "job-name": name}
    if not spec.get("manualSelector"):
        spec.setdefault("selector", {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}})
        template_meta = spec.setdefault("template", {}).setdefault("metadata", {})
        template_meta["labels"] = {**(template_meta.get("labels") or {}), **labels}
    spec.setdefault("backoffLimit", 6)
    if "completions" not in spec and "parallelism" not in spec:
        spec["completions"] = 1  # a non-parallel Job; a work queue keeps completions unset
    spec.setdefault("parallelism", 1)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)


#: The PriorityClasses every cluster has (the Priority plugin's built-ins).
SYSTEM_PRIORITY = {"system-cluster-critical": 2000000000, "system-node-critical": 2000001000}


def _admit_priority(store: Store, pod: dict) -> None:
    """The Priority admission plugin: resolve ``priorityClassName``, or refuse the pod (403)
    with the real sentence (plugin/pkg/admission/priority/admission.go)."""
    spec = pod["spec"]
    name = spec.get("priorityClassName")
    if not name:
        return
    found = store.get(lookup("priorityclasses"), None, name)
    if found is None and name not in SYSTEM_PRIORITY:
        raise errors.forbidden(lookup("pods"), pod["metadata"].get("name", ""),
                               f"no PriorityClass with name {name} was found")
    spec["priority"] = found["value"] if found else SYSTEM_PRIORITY[name]


def _containers(pod: dict) -> list[dict]:
    spec = pod.get("spec") or {}
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def _default_requests_to_limits(pod: dict) -> None:
    """Decoding's defaulting: a container's missing request defaults to its limit."""
    for c in _containers(pod):
        res = c.get("resources") or {}
        for name, value in (res.get("limits") or {}).items():
            res.setdefault("requests", {}).setdefault(name, value)
        if res:
            c["resources"] = res


def _request_limit_problems(pod: dict) -> list[tuple[str, str]]:
    """Validation's ``requests <= limits`` (422 causes)."""
    problems = []
    spec = pod.get("spec") or {}
    for group in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(group) or []):
            res = c.get("resources") or {}
            limits = res.get("limits") or {}
            for name, request in sorted((res.get("requests") or {}).items()):
                if name in limits and quota.parse_quantity(request) > quota.parse_quantity(limits[name]):
                    problems.append((
                        f"spec.{group}[{i}].resources.requests[{name}]",
                        f'Invalid value: "{request}": must be less than or equal to {name} '
                        f"limit of {limits[name]}"))
    return problems


def admit_pod(store: Store, namespace: dict, pod: dict) -> None:
    """A pod's way through the real server: defaults, mutation, validation, validating plugins.

    Decoding defaults requests to limits; validation refuses a request above its
    limit (422); ResourceQuota runs last, in :func:`admit_create`.
    """
    default_pod(pod)
    _admit_priority(store, pod)
    _default_requests_to_limits(pod)
    problems = _request_limit_problems(pod)
    if problems:
        raise errors.invalid(lookup("pods"), pod["metadata"].get("name", ""), problems)
    pod["status"]["qosClass"] = _qos_class(pod["spec"])


def admit_create(store: Store, kind: ResourceKind, namespace: str | None, obj: dict) -> str | None:
    """Default and admit ``obj`` for creation; returns a pre-assigned uid or None.

    Raises the real server's errors: 404 when the namespace does not exist,
    403 when it is terminating or a quota or Pod Security level forbids the
    object, 422 when a request is above its limit.
    """
    if kind.namespaced:
        ns = store.get(lookup("namespaces"), None, namespace)
        if ns is None:
            raise errors.not_found(lookup("namespaces"), namespace or "")
        if ns["metadata"].get("deletionTimestamp"):
            raise errors.forbidden(
                kind, obj["metadata"].get("name"),
                f"unable to create new content in namespace {namespace} because it is being "
                "terminated")
    uid = None
    if kind.kind == "Pod":
        admit_pod(store, ns, obj)
    elif kind.kind == "Job":
        uid = str(uuid.uuid4())
        default_job(obj, uid)
    elif kind.kind == "Namespace":
        obj["status"] = {"phase": "Active"}
        labels = obj["metadata"].setdefault("labels", {})
        labels.setdefault("kubernetes.io/metadata.name", obj["metadata"].get("name", ""))
    if kind.namespaced:
        quota.admit(store, kind, namespace, obj)
    return uid
