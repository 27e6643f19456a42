"""ResourceQuota admission of the fake API server (a TEST DOUBLE).

Mirrors the real admission plugin closely enough for a backend to meet the
same failures (LimitRange is ``limitranger.py``).  ResourceQuota rejects a
create that would exceed ``spec.hard`` with 403 ``exceeded quota: ...``,
rejects pods that omit a constrained compute
resource with 403 ``failed quota: ...: must specify ...``, and keeps
``status.used`` current as pods come and go (terminal pods stop counting).
Not modelled: quota scopes/scopeSelector, storage-class quotas,
``requests.storage``.
"""

from __future__ import annotations

import copy
import re
from decimal import Decimal

from . import errors
from .resources import ResourceKind, lookup
from .store import Store, WatchEvent

_SUFFIX = {
    "": 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "P": 10**15, "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
    "Pi": 2**50, "Ei": 2**60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")

# Quota keys that count objects of a kind, besides the generic count/<resource>.
_COUNTED = {"pods": "pods", "services": "services", "configmaps": "configmaps",
            "secrets": "secrets", "persistentvolumeclaims": "persistentvolumeclaims",
            "resourcequotas": "resourcequotas"}
_COMPUTE = ("cpu", "memory")
_MUST_SPECIFY = frozenset({"cpu", "memory", "requests.cpu", "requests.memory", "limits.cpu",
                           "limits.memory"})


def parse_quantity(value) -> Decimal:
    """A Kubernetes quantity (``500m``, ``2Gi``, ``1e3``, 4) as a Decimal."""
    m = _QUANTITY.match(str(value).strip())
    if not m:
        raise ValueError(f"quantities must match the regular expression "
                         f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$' (got {value!r})")
    return Decimal(m.group(1)) * Decimal(_SUFFIX[m.group(2) or ""])


def format_quantity(value: Decimal, resource: str) -> str:
    """Render a usage total (milli-CPU when fractional, plain integers otherwise)."""
    if resource.endswith("cpu") and value != value.to_integral_value():
        return f"{int(value * 1000)}m"
    return str(int(value)) if value == value.to_integral_value() else str(value.normalize())


def _containers(pod: dict) -> tuple[list[dict], list[dict]]:
    spec = pod.get("spec") or {}
    return spec.get("containers") or [], spec.get("initContainers") or []


def pod_usage(pod: dict) -> dict[str, Decimal]:
    """What one pod charges against a quota: ``pods`` plus requests.*/limits.*.

    Effective value per resource = max(sum over app containers, max over init
    containers), as the real quota evaluator computes it.
    """
    usage: dict[str, Decimal] = {"pods": Decimal(1)}
    containers, inits = _containers(pod)
    for section in ("requests", "limits"):
        names = {n for c in containers + inits for n in (c.get("resources") or {})
                 .get(section, {}) or {}}
        for name in names:
            def amount(c, _section=section, _name=name):
                val = ((c.get("resources") or {}).get(_section) or {}).get(_name)
                return parse_quantity(val) if val is not None else Decimal(0)
            total = sum((amount(c) for c in containers), Decimal(0))
            peak = max((amount(c) for c in inits), default=Decimal(0))
            usage[f"{section}.{name}"] = max(total, peak)
    return usage


def _charges(kind: ResourceKind, obj: dict) -> dict[str, Decimal]:
    charges = {f"count/{kind.qualified_resource}": Decimal(1)}
    if kind.plural in _COUNTED:
        charges[_COUNTED[kind.plural]] = Decimal(1)
    if kind.kind == "Pod":
        charges.update(pod_usage(obj))
        # Plain "cpu"/"memory" in a quota mean requests.cpu/requests.memory.
        for name in _COMPUTE:
            if f"requests.{name}" in charges:
                charges[name] = charges[f"requests.{name}"]
    return charges


def _counts(kind: ResourceKind, obj: dict) -> bool:
    # Terminal pods release their quota, as the real evaluator does.
    if kind.kind == "Pod":
        return (obj.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    return True


def _used(store: Store, namespace: str, hard: dict) -> dict[str, Decimal]:
    used = {key: Decimal(0) for key in hard}
    kinds = {lookup("pods")}
    for key in hard:
        plural = _COUNTED.get(key) or (key.split("/", 1)[1] if key.startswith("count/") else None)
        if plural:
            try:
                kinds.add(lookup(plural))
            except KeyError:
                continue
    for kind in kinds:
        for obj in store.objects(kind, namespace):
            if not _counts(kind, obj):
                continue
            for key, amount in _charges(kind, obj).items():
                if key in used:
                    used[key] += amount
    return used


def admit(store: Store, kind: ResourceKind, namespace: str, obj: dict) -> None:
    """ResourceQuota admission for a create; raises 403 Forbidden when over quota.

    Call with ``store.lock`` held, together with the create, so two concurrent
    creates cannot both squeeze under the limit.
    """
    charges = _charges(kind, obj)
    name = obj["metadata"].get("name") or obj["metadata"].get("generateName")
    for quota in store.objects(lookup("resourcequotas"), namespace):
        hard = (quota.get("spec") or {}).get("hard") or {}
        if kind.kind == "Pod":
            missing = sorted(k for k in hard if _is_compute(k) and k not in charges)
            if missing:
                raise errors.forbidden(kind, name, f"failed quota: {quota['metadata']['name']}: "
                                                   f"must specify {','.join(missing)}")
        relevant = {k: v for k, v in hard.items() if k in charges}
        if not relevant:
            continue
        used = _used(store, namespace, relevant)
        over = sorted(k for k, v in relevant.items()
                      if used[k] + charges[k] > parse_quantity(v))
        if over:
            def fmt(values, keys=over):
                return ",".join(f"{k}={format_quantity(values[k], k)}" for k in keys)
            raise errors.forbidden(
                kind, name,
                f"exceeded quota: {quota['metadata']['name']}, "
                f"requested: {fmt(charges)}, used: {fmt(used)}, "
                f"limited: {','.join(f'{k}={relevant[k]}' for k in over)}")


def _is_compute(key: str) -> bool:
    # Only cpu/memory must be specified; extended resources (GPUs) need not be.
    return key in _MUST_SPECIFY


class QuotaController:
    """Keeps every ResourceQuota's ``status.hard``/``status.used`` current."""

    def __init__(self, store: Store):
        self.store = store
        self._quota_kind = lookup("resourcequotas")

    def __call__(self, event: WatchEvent) -> None:
        """Store observer: recompute the namespace's quotas after relevant writes."""
        namespace = event.obj["metadata"].get("namespace")
        if not namespace or event.kind.kind == "Event":
            return
        if event.kind is self._quota_kind and event.type == "MODIFIED" and \
                (event.old or {}).get("spec") == event.obj.get("spec"):
            return  # our own status write
        self.recompute(namespace)

    def recompute(self, namespace: str) -> None:
        """Recompute and store ``status`` of every quota in ``namespace``."""
        for quota in self.store.objects(self._quota_kind, namespace):
            hard = (quota.get("spec") or {}).get("hard") or {}
            used = _used(self.store, namespace, hard)
            status = {"hard": dict(hard),
                      "used": {k: format_quantity(v, k) for k, v in used.items()}}
            if quota.get("status") != status:
                new = copy.deepcopy(quota)
                new["status"] = status
                self.store.update(self._quota_kind, new, subresource="status",
                                  check_version=False)
