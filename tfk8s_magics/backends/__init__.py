"""Backends: where clusters run, behind one interface (:class:`Backend`).

Backends are found through the ``tfk8s_magics.backends`` entry point group,
so a third-party package adds one without touching this package.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import SpecError
from .base import (
    Backend,
    ClusterStatus,
    Event,
    LogChunk,
    LogLine,
    Phase,
    Progress,
    TaskStatus,
    TensorBoardInfo,
)

__all__ = [
    "Backend",
    "ClusterStatus",
    "Event",
    "LogChunk",
    "LogLine",
    "Phase",
    "Progress",
    "TaskStatus",
    "TensorBoardInfo",
    "get_backend",
]

ENTRY_POINT_GROUP = "tfk8s_magics.backends"
# Used when the package runs from a source tree without being installed.
_BUILTIN = {
    "local": "tfk8s_magics.backends.local:LocalBackend",
    "kubernetes": "tfk8s_magics.backends.kubernetes:KubernetesBackend",
}


def _registry() -> dict[str, str]:
    # Deferred: importlib.metadata scans the installed distributions, which every task
    # process would pay for at start; only choosing a backend needs it.
    from importlib.metadata import entry_points

    found = dict(_BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found[ep.name] = ep.value
    return found


def get_backend(name: str, **options: Any) -> Backend:
    """Make the backend called ``name`` with its ``options``."""
    registry = _registry()
    if name not in registry:
        raise SpecError(
            f"unknown backend {name!r}: use one of {', '.join(sorted(registry))}."
        )
    module_name, _, attr = registry[name].partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    return cls(**options)
