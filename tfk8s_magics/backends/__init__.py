"""Backends: where clusters run, behind one interface (:class:`Backend`).

Backends are found through the ``tfk8s_magics.backends`` entry point group,
so a third-party package adds one without touching this package.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import SpecError
from .base import (
    CAPABILITIES,
    Backend,
    ClusterStatus,
    Coordinator,
    Event,
    LogChunk,
    LogLine,
    LogLocation,
    Phase,
    Progress,
    TaskStatus,
    TensorBoardInfo,
    WarmPool,
    check_backend,
)

__all__ = [
    "CAPABILITIES",
    "Backend",
    "ClusterStatus",
    "Coordinator",
    "Event",
    "LogChunk",
    "LogLine",
    "LogLocation",
    "Phase",
    "Progress",
    "TaskStatus",
    "TensorBoardInfo",
    "WarmPool",
    "backend_class",
    "check_backend",
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


def backend_class(name: str) -> type[Backend]:
    """The class of the backend called ``name``, once checked against the Backend contract.

    Registration is where a backend's author learns what it lacks: a class that misses an
    abstract method, or declares a capability without its methods (or the reverse), is refused
    here in one sentence (:func:`check_backend`), before any user calls it.
    """
    registry = _registry()
    if name not in registry:
        raise SpecError(
            f"unknown backend {name!r}: use one of {', '.join(sorted(registry))}."
        )
    entry = registry[name]
    if entry not in _checked:
        module_name, _, attr = entry.partition(":")
        cls = getattr(importlib.import_module(module_name), attr)
        check_backend(cls, entry)
        _checked[entry] = cls
    return _checked[entry]


#: Entry points already checked: entry point value → class.
_checked: dict[str, type[Backend]] = {}


def get_backend(name: str, **options: Any) -> Backend:
    """Make the backend called ``name`` with its ``options``."""
    return backend_class(name)(**options)
