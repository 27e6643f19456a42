"""Event recording for the fake API server's simulated components (a TEST DOUBLE).

Creates ``core/v1`` Events the way the scheduler, kubelet and controllers
do: named ``<object>.<random hex>``, pointing at the object through
``involvedObject``, with ``source``/``reportingComponent`` naming who spoke.
"""

from __future__ import annotations

import secrets

from .resources import lookup
from .store import Store, now


def record_event(store: Store, obj: dict, reason: str, message: str, *,
                 type_: str = "Normal", component: str = "kubelet",
                 field_path: str | None = None) -> dict | None:
    """Create an Event about ``obj``; skipped when its namespace is gone or terminating."""
    meta = obj["metadata"]
    ns = meta.get("namespace") or "default"
    namespace = store.get(lookup("namespaces"), None, ns)
    if namespace is None or namespace["metadata"].get("deletionTimestamp"):
        return None
    host = (obj.get("spec") or {}).get("nodeName") if component == "kubelet" else None
    stamp = now()
    involved = {"apiVersion": obj.get("apiVersion", "v1"), "kind": obj.get("kind", "Pod"),
                "name": meta["name"], "namespace": ns, "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion")}
    if field_path:
        involved["fieldPath"] = field_path
    source = {"component": component, **({"host": host} if host else {})}
    return store.create(lookup("events"), {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{secrets.token_hex(8)}", "namespace": ns},
        "involvedObject": involved, "reason": reason, "message": message, "type": type_,
        "source": source, "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        "reportingComponent": component, "reportingInstance": host or "",
    })
