"""The launch pre-flight check: would these manifests pass the namespace's admission?

Pure arithmetic over dicts, in the order the API server admits a pod:

1. :func:`admitted` -- the LimitRanger's mutation: every container without
   a request or limit gets the namespace's LimitRange defaults (after the
   LimitRange's own defaulting: a missing ``default`` is its ``max``, a
   missing ``defaultRequest`` its ``default``), exactly as admission will;
2. :func:`limit_problems` -- then validation (a request above its limit is
   a 422) and the LimitRanger's ``min``/``max``/``maxLimitRequestRatio``
   (a 403);
3. :func:`quota_problems` -- the ResourceQuota on what is left
   (``status.hard`` minus ``status.used``), on the *admitted* pods.

:func:`node_problems` compares pods with nodes' allocatable resources.
Each problem is one sentence naming the resource, the need, the limit and
what to do.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

Manifest = dict[str, Any]

#: Quota keys counting objects, by kind.
_COUNT_KEYS = {
    "Pod": ("pods", "count/pods"),
    "ConfigMap": ("configmaps", "count/configmaps"),
    "Service": ("services", "count/services"),
    "PersistentVolumeClaim": ("persistentvolumeclaims", "count/persistentvolumeclaims"),
    "Deployment": ("count/deployments.apps",),
    "NetworkPolicy": ("count/networkpolicies.networking.k8s.io",),
    "JobSet": ("count/jobsets.jobset.x-k8s.io",),
}
#: Compute quota keys and where they come from in a container's resources.
_COMPUTE_KEYS = {
    "requests.cpu": ("requests", "cpu"),
    "cpu": ("requests", "cpu"),
    "requests.memory": ("requests", "memory"),
    "memory": ("requests", "memory"),
    "limits.cpu": ("limits", "cpu"),
    "limits.memory": ("limits", "memory"),
    "requests.nvidia.com/gpu": ("limits", "nvidia.com/gpu"),
    "limits.nvidia.com/gpu": ("limits", "nvidia.com/gpu"),
}


def _pod_groups(manifest: Manifest) -> list[tuple[str, Manifest, int]]:
    """``(name, pod spec, how many)`` for the pods a manifest will run.

    A Deployment runs its template × replicas; a JobSet each replicated
    Job's template × replicas × parallelism (named ``<jobset>-<role>``).
    """
    name, spec = manifest["metadata"]["name"], manifest.get("spec") or {}
    if manifest["kind"] == "Pod":
        return [(name, spec, 1)]
    if manifest["kind"] == "Deployment":
        return [(name, spec["template"]["spec"], int(spec.get("replicas", 1)))]
    if manifest["kind"] == "JobSet":
        return [
            (f"{name}-{r['name']}", r["template"]["spec"]["template"]["spec"],
             int(r.get("replicas", 1)) * int(r["template"]["spec"].get("parallelism", 1)))
            for r in spec.get("replicatedJobs") or []
        ]
    return []


def _pod_specs(manifest: Manifest) -> list[Manifest]:
    """Every pod spec a manifest will run, one per pod."""
    return [pod for _, pod, n in _pod_groups(manifest) for _ in range(n)]


def _container_resources(pod_spec: Manifest) -> list[Manifest]:
    """Every container's resources, init containers included (each must name what a quota asks)."""
    return [c.get("resources") or {}
            for c in [*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])]]


def _pod_resources(pod_spec: Manifest) -> Manifest:
    """What the pod counts for in a quota: per resource the larger of its app containers' sum
    and its largest init container (init containers run one at a time, before the others)."""
    out: dict[str, dict[str, Decimal]] = {"requests": defaultdict(Decimal),
                                          "limits": defaultdict(Decimal)}
    for c in pod_spec.get("containers", []):
        for section, values in (c.get("resources") or {}).items():
            for key, value in (values or {}).items():
                out.setdefault(section, defaultdict(Decimal))[key] += parse_quantity(value)
    for c in pod_spec.get("initContainers", []):
        for section, values in (c.get("resources") or {}).items():
            for key, value in (values or {}).items():
                bucket = out.setdefault(section, defaultdict(Decimal))
                bucket[key] = max(bucket[key], parse_quantity(value))
    return {section: dict(values) for section, values in out.items() if values}


def demand(manifests: Iterable[Manifest]) -> dict[str, Decimal]:
    """What ``manifests`` need, keyed like ResourceQuota ``hard`` entries."""
    need: dict[str, Decimal] = defaultdict(Decimal)
    for m in manifests:
        for key in _COUNT_KEYS.get(m["kind"], ()):
            need[key] += 1
        if m["kind"] in ("Deployment", "JobSet"):
            pods = sum(n for _, _, n in _pod_groups(m))
            need["pods"] += pods
            need["count/pods"] += pods
        if m["kind"] == "JobSet":  # JobSet makes one Job per replica and a headless Service
            jobs = sum(int(r.get("replicas", 1)) for r in m["spec"]["replicatedJobs"])
            need["count/jobs.batch"] += jobs
            need["services"] += 1
            need["count/services"] += 1
        if m["kind"] == "PersistentVolumeClaim":
            size = parse_quantity(m["spec"]["resources"]["requests"]["storage"])
            need["requests.storage"] += size
            sc = m["spec"].get("storageClassName")
            if sc:
                prefix = f"{sc}.storageclass.storage.k8s.io/"
                need[prefix + "requests.storage"] += size
                need[prefix + "persistentvolumeclaims"] += 1
        for pod_spec in _pod_specs(m):
            res = _pod_resources(pod_spec)
            for key, (section, name) in _COMPUTE_KEYS.items():
                value = (res.get(section) or {}).get(name)
                if value is not None:
                    need[key] += value
    return dict(need)


def _fmt(key: str, value: Decimal) -> str:
    if "memory" in key or "storage" in key:
        return f"{value / (1 << 30):.3g}Gi"
    return f"{value.normalize():f}"


def _shown(key: str, quantity: str) -> str:
    """A quota's own quantity as a person reads it: bytes (the quota controller may write
    ``1073741824``) in Gi/Mi, anything else as written."""
    text = str(quantity)
    if "memory" not in key and "storage" not in key or not text.isdigit():
        return text
    value = int(text)
    for unit, size in (("Gi", 1 << 30), ("Mi", 1 << 20)):
        if value >= size and value % size == 0:
            return f"{value // size}{unit}"
    return f"{value / (1 << 20):.4g}Mi" if value >= 1 << 20 else text


_JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
_RJOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"


def _unfinished(jobset: Manifest) -> bool:
    """Whether a JobSet may still create pods: not ended, not being deleted, not suspended
    (Kueue holds a suspended one's quota in its own ClusterQueue, not the namespace's)."""
    meta, spec = jobset.get("metadata") or {}, jobset.get("spec") or {}
    ended = any(c.get("type") in ("Completed", "Failed") and c.get("status") == "True"
                for c in (jobset.get("status") or {}).get("conditions") or [])
    return not (ended or meta.get("deletionTimestamp") or spec.get("suspend"))


def pending_pods(jobsets: list[Manifest], pods: list[Manifest]) -> list[Manifest]:
    """The pods the namespace's unfinished JobSets are still to create, as Pod manifests.

    A ResourceQuota's ``status.used`` counts existing pods only: pods held back by
    ``startupPolicy: InOrder``, between restart attempts, or refused and retried by the
    Job controller are not in it, yet they will take their share when created.  So two
    launches in quick succession would both pass a check on ``used`` alone.
    """
    out = []
    for js in jobsets:
        if js.get("kind", "JobSet") != "JobSet" or not _unfinished(js):
            continue
        name = js["metadata"]["name"]
        attempt = str(int((js.get("status") or {}).get("restarts") or 0))
        for group, pod_spec, n in _pod_groups({**js, "kind": "JobSet"}):
            rjob = group[len(name) + 1:]
            made = sum(1 for p in pods
                       if (labels := (p.get("metadata") or {}).get("labels") or {}).get(
                           _JOBSET_LABEL) == name and labels.get(_RJOB_LABEL) == rjob
                       and labels.get(_ATTEMPT_LABEL, "0") == attempt)
            out += [{"kind": "Pod", "metadata": {"name": group}, "spec": copy.deepcopy(pod_spec)}
                    for _ in range(max(0, n - made))]
    return out


#: Quota keys every container must then name (the API server's rule for CPU and memory only;
#: a pod that names no extended resource, a GPU, simply uses none of it).
_MUST_SPECIFY = {"requests.cpu", "cpu", "requests.memory", "memory", "limits.cpu", "limits.memory"}


def _cross_namespace_affinity(pod_spec: Manifest) -> bool:
    """Whether a pod is in the ``CrossNamespacePodAffinity`` quota scope: an affinity or
    anti-affinity term naming ``namespaces`` or a ``namespaceSelector``."""
    affinity = pod_spec.get("affinity") or {}
    for kind in ("podAffinity", "podAntiAffinity"):
        rules = affinity.get(kind) or {}
        terms = [*rules.get("requiredDuringSchedulingIgnoredDuringExecution", []),
                 *(t.get("podAffinityTerm", {}) for t in
                   rules.get("preferredDuringSchedulingIgnoredDuringExecution", []))]
        if any(t.get("namespaces") or "namespaceSelector" in t for t in terms):
            return True
    return False


def _in_scope(quota: Manifest, manifests: list[Manifest]) -> list[Manifest] | None:
    """The manifests a scoped quota counts, or None when its scope is not one this check
    evaluates (the API server still does).  An unscoped quota counts them all."""
    spec = quota.get("spec") or {}
    scopes = [*spec.get("scopes", []),
              *(e.get("scopeName") for e in (spec.get("scopeSelector") or {}).get(
                  "matchExpressions", []) if e.get("operator") == "Exists")]
    if not scopes and not spec.get("scopeSelector"):
        return manifests
    if scopes != ["CrossNamespacePodAffinity"] or len(
            (spec.get("scopeSelector") or {}).get("matchExpressions", [])) > 1:
        return None
    return [m for m in manifests
            if any(_cross_namespace_affinity(pod) for _, pod, _ in _pod_groups(m))]


def counts_any(quota: Manifest, manifests: list[Manifest]) -> bool:
    """Whether ``quota`` counts any of ``manifests`` (a scoped one may count none of them)."""
    return bool(_in_scope(quota, manifests))


def quota_problems(manifests: list[Manifest], quotas: list[Manifest],
                   pending: list[Manifest] = ()) -> list[str]:
    """Why ``manifests`` would not fit ``quotas`` (ResourceQuota dicts); empty if they fit.

    ``pending``: pods other clusters are still to create (:func:`pending_pods`, admitted),
    counted as used."""
    problems = []
    for quota in quotas:
        counted = _in_scope(quota, manifests)
        if counted is None:
            continue
        need, held = demand(counted), demand(_in_scope(quota, list(pending)) or [])
        name = quota.get("metadata", {}).get("name", "?")
        status = quota.get("status") or {}
        hard = status.get("hard") or (quota.get("spec") or {}).get("hard") or {}
        used = status.get("used") or {}
        for key, limit in sorted(hard.items()):
            left = parse_quantity(limit) - parse_quantity(used.get(key, "0"))
            if key in _MUST_SPECIFY:
                section, res = _COMPUTE_KEYS[key]
                missing = _pods_missing(counted, section, res)
                if missing:
                    problems.append(_must_specify(name, key, section, res, missing))
                    continue
            wanted = need.get(key, Decimal(0))
            waiting = held.get(key, Decimal(0))
            left -= waiting
            if wanted > left:
                others = (f", and {_fmt(key, waiting)} for pods other clusters are still to "
                          "create" if waiting else "")
                problems.append(
                    f"the cluster needs {key} {_fmt(key, wanted)} but ResourceQuota {name} "
                    f"leaves {_fmt(key, max(left, Decimal(0)))} "
                    f"(hard {_shown(key, limit)}, used {_shown(key, used.get(key, '0'))}{others}): "
                    "ask for fewer tasks or "
                    "resources, or delete finished clusters; --queue (Kueue) admits a cluster "
                    "all at once or not at all."
                )
    return problems


def _pods_missing(manifests: list[Manifest], section: str, res: str) -> list[str]:
    out = []
    for m in manifests:
        for name, pod_spec, _ in _pod_groups(m):
            if any(res not in (r.get(section) or {}) for r in _container_resources(pod_spec)):
                out.append(name)
    return out


def node_problems(manifests: list[Manifest], nodes: list[Manifest]) -> list[str]:
    """Pods that no schedulable node could hold (by allocatable CPU, memory, GPUs)."""
    allocatable = [
        n.get("status", {}).get("allocatable") or {}
        for n in nodes
        if not (n.get("spec") or {}).get("unschedulable")
    ]
    problems = []
    for m in manifests:
        for name, pod_spec, _ in _pod_groups(m):
            want: dict[str, Decimal] = defaultdict(Decimal)
            for res in _container_resources(pod_spec):
                for section in ("requests", "limits"):
                    for key, value in (res.get(section) or {}).items():
                        if section == "limits" and key != "nvidia.com/gpu":
                            continue
                        want[key] = max(want[key], parse_quantity(value))
            if not want:
                continue
            fits = any(
                all(parse_quantity(a.get(k, "0")) >= v for k, v in want.items())
                for a in allocatable
            )
            if not fits:
                asks = ", ".join(f"{k} {_fmt(k, v)}" for k, v in sorted(want.items()))
                problems.append(
                    f"{name} asks for {asks}, more than any schedulable "
                    "node can allocate: ask for less per task."
                )
    return problems


#: The magic's flag that sets a resource's request (and, for memory, its limit).
_FLAGS = {"cpu": "--cpu", "memory": "--memory", "nvidia.com/gpu": "--gpus"}


def _must_specify(quota: str, key: str, section: str, res: str, pods: list[str]) -> str:
    who = ", ".join(pods)
    if section == "limits" and res == "cpu":
        # --cpu sets a request only (a CPU limit throttles a task and stalls its peers)
        return (
            f"ResourceQuota {quota} counts {key}, so every pod needs a CPU limit, but {who} "
            "get none (tasks set no CPU limit and the namespace's LimitRange gives no default "
            "one): ask your administrator to drop limits.cpu from the quota or to give the "
            "LimitRange a default CPU limit."
        )
    flag = _FLAGS.get(res, f"a {res} {section[:-1]}")
    return (
        f"ResourceQuota {quota} counts {key}, so every pod must set {section}.{res}, but "
        f"{who} do not and the namespace's LimitRange gives no default: give {flag} for "
        "every role (e.g. --cpu 1 --memory 2Gi)."
    )


# -- LimitRange: what the LimitRanger admission plugin does to a pod -----------


def _defaulted_item(item: Manifest) -> Manifest:
    """A LimitRange item after the API's defaulting (``SetDefaults_LimitRangeItem``)."""
    item = copy.deepcopy(item)
    if item.get("type") != "Container":
        return item
    default = item.setdefault("default", {}) or {}
    request = item.setdefault("defaultRequest", {}) or {}
    for key, value in (item.get("max") or {}).items():
        default.setdefault(key, value)
    for key, value in default.items():
        request.setdefault(key, value)
    for key, value in (item.get("min") or {}).items():
        request.setdefault(key, value)
    item["default"], item["defaultRequest"] = default, request
    return item


def _items(limit_ranges: list[Manifest]) -> list[tuple[str, Manifest]]:
    return [
        (lr.get("metadata", {}).get("name", "?"), _defaulted_item(item))
        for lr in limit_ranges
        for item in (lr.get("spec") or {}).get("limits") or []
    ]


def _containers(pod_spec: Manifest) -> list[Manifest]:
    return [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or [])]


def _merge_defaults(pod_spec: Manifest, limit_ranges: list[Manifest]) -> None:
    # The API server first defaults a missing request to its limit (decoding),
    # then the LimitRanger fills what is still missing from each LimitRange.
    for c in _containers(pod_spec):
        res = c.setdefault("resources", {})
        for key, value in (res.get("limits") or {}).items():
            res.setdefault("requests", {}).setdefault(key, value)
    for lr in limit_ranges:
        defaults: dict[str, dict[str, str]] = {"limits": {}, "requests": {}}
        for _, item in _items([lr]):
            if item.get("type") == "Container":
                defaults["limits"].update(item["default"])
                defaults["requests"].update(item["defaultRequest"])
        for c in _containers(pod_spec):
            res = c["resources"]
            for section, values in defaults.items():
                for key, value in values.items():
                    res.setdefault(section, {}).setdefault(key, value)


def admitted(manifests: list[Manifest], limit_ranges: list[Manifest]) -> list[Manifest]:
    """Copies of ``manifests`` whose pods carry the resources admission will give them."""
    out = []
    for m in manifests:
        m = copy.deepcopy(m)
        # one template per group (a JobSet has one per role): each is admitted on its own
        for _, pod_spec, _ in _pod_groups(m):
            _merge_defaults(pod_spec, limit_ranges)
        out.append(m)
    return out


def limit_problems(manifests: list[Manifest], limit_ranges: list[Manifest]) -> list[str]:
    """Why the admitted pods of ``manifests`` would be refused by validation or the LimitRanger."""
    problems = []
    for m in admitted(manifests, limit_ranges):
        for name, pod_spec, _ in _pod_groups(m):
            for c in pod_spec.get("containers") or []:
                problems += _container_problems(name, c, limit_ranges)
    return problems


def _container_problems(pod: str, c: Manifest, limit_ranges: list[Manifest]) -> list[str]:
    res = c.get("resources") or {}
    requests, limits = res.get("requests") or {}, res.get("limits") or {}
    out = []
    for key, request in sorted(requests.items()):
        limit = limits.get(key)
        if limit is not None and parse_quantity(request) > parse_quantity(limit):
            out.append(
                f"{pod} asks for {key} {request} but the namespace's LimitRange gives its "
                f"container a {key} limit of {limit}: ask for at most {limit} "
                f"({_FLAGS.get(key, key)}), or ask your administrator to raise the "
                f"LimitRange's default {key} limit."
            )
    for lr, item in _items(limit_ranges):
        if item.get("type") == "Container":
            out += _bound_problems(pod, lr, item, requests, limits)
    return out


def _bound_problems(pod: str, lr: str, item: Manifest, requests: dict, limits: dict) -> list[str]:
    """What one Container item of LimitRange ``lr`` refuses (max, min, limit/request ratio)."""
    out = []
    for key, bound in (item.get("max") or {}).items():
        value = limits.get(key)
        if value is None or parse_quantity(value) > parse_quantity(bound):
            out.append(
                f"{pod} has a {key} limit of {value or 'none'} but LimitRange {lr} allows "
                f"at most {bound} per container: ask for less ({_FLAGS.get(key, key)})."
            )
    for key, bound in (item.get("min") or {}).items():
        value = requests.get(key)
        if value is None or parse_quantity(value) < parse_quantity(bound):
            out.append(
                f"{pod} requests {key} {value or 'none'} but LimitRange {lr} asks for at "
                f"least {bound} per container: ask for more ({_FLAGS.get(key, key)})."
            )
    for key, ratio in (item.get("maxLimitRequestRatio") or {}).items():
        req, lim = requests.get(key), limits.get(key)
        if not req or not lim or parse_quantity(req) == 0 or (
            parse_quantity(lim) / parse_quantity(req) > parse_quantity(ratio)
        ):
            out.append(
                f"{pod}'s {key} limit {lim or 'none'} over its request {req or 'none'} "
                f"exceeds LimitRange {lr}'s ratio {ratio}: ask for a larger {key} "
                f"request ({_FLAGS.get(key, key)})."
            )
    return out
