"""The launch pre-flight check: would these manifests fit the namespace's ResourceQuota?

Pure arithmetic over dicts: :func:`demand` sums what a cluster asks for,
:func:`quota_problems` compares it with ResourceQuota objects (``status.hard``
minus ``status.used``) and :func:`node_problems` with nodes' allocatable
resources.  Each problem is one sentence naming the resource, the need and
what is left.
"""

from __future__ import annotations

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


def _pod_specs(manifest: Manifest) -> list[Manifest]:
    """The pod specs a manifest will run (a Deployment's template × replicas)."""
    if manifest["kind"] == "Pod":
        return [manifest["spec"]]
    if manifest["kind"] == "Deployment":
        spec = manifest["spec"]
        return [spec["template"]["spec"]] * int(spec.get("replicas", 1))
    return []


def _container_resources(pod_spec: Manifest) -> list[Manifest]:
    return [c.get("resources") or {} for c in pod_spec.get("containers", [])]


def demand(manifests: Iterable[Manifest]) -> dict[str, Decimal]:
    """What ``manifests`` need, keyed like ResourceQuota ``hard`` entries."""
    need: dict[str, Decimal] = defaultdict(Decimal)
    for m in manifests:
        for key in _COUNT_KEYS.get(m["kind"], ()):
            need[key] += 1
        if m["kind"] == "Deployment":
            need["pods"] += int(m["spec"].get("replicas", 1))
            need["count/pods"] += int(m["spec"].get("replicas", 1))
        if m["kind"] == "PersistentVolumeClaim":
            size = parse_quantity(m["spec"]["resources"]["requests"]["storage"])
            need["requests.storage"] += size
            sc = m["spec"].get("storageClassName")
            if sc:
                prefix = f"{sc}.storageclass.storage.k8s.io/"
                need[prefix + "requests.storage"] += size
                need[prefix + "persistentvolumeclaims"] += 1
        for pod_spec in _pod_specs(m):
            for res in _container_resources(pod_spec):
                for key, (section, name) in _COMPUTE_KEYS.items():
                    value = (res.get(section) or {}).get(name)
                    if value is not None:
                        need[key] += parse_quantity(value)
    return dict(need)


def _fmt(key: str, value: Decimal) -> str:
    if "memory" in key or "storage" in key:
        return f"{value / (1 << 30):.3g}Gi"
    return f"{value.normalize():f}"


def quota_problems(manifests: list[Manifest], quotas: list[Manifest]) -> list[str]:
    """Why ``manifests`` would not fit ``quotas`` (ResourceQuota dicts); empty if they fit."""
    need = demand(manifests)
    problems = []
    for quota in quotas:
        name = quota.get("metadata", {}).get("name", "?")
        status = quota.get("status") or {}
        hard = status.get("hard") or (quota.get("spec") or {}).get("hard") or {}
        used = status.get("used") or {}
        for key, limit in sorted(hard.items()):
            left = parse_quantity(limit) - parse_quantity(used.get(key, "0"))
            if key in _COMPUTE_KEYS:
                section, res = _COMPUTE_KEYS[key]
                missing = _pods_missing(manifests, section, res)
                if missing:
                    problems.append(
                        f"ResourceQuota {name} limits {key}, so every pod must set "
                        f"{section}.{res}, but {', '.join(missing)} do not: give --{res} for "
                        "every role (e.g. --cpu 1 --memory 2Gi)."
                    )
                    continue
            wanted = need.get(key, Decimal(0))
            if wanted > left:
                problems.append(
                    f"the cluster needs {key} {_fmt(key, wanted)} but ResourceQuota {name} "
                    f"leaves {_fmt(key, max(left, Decimal(0)))} "
                    f"(hard {limit}, used {used.get(key, '0')}): ask for fewer tasks or "
                    "resources, or delete finished clusters."
                )
    return problems


def _pods_missing(manifests: list[Manifest], section: str, res: str) -> list[str]:
    out = []
    for m in manifests:
        for pod_spec in _pod_specs(m)[:1]:
            if any(res not in (r.get(section) or {}) for r in _container_resources(pod_spec)):
                out.append(m["metadata"]["name"])
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
        for pod_spec in _pod_specs(m)[:1]:
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
                    f"{m['metadata']['name']} asks for {asks}, more than any schedulable "
                    "node can allocate: ask for less per task."
                )
    return problems
