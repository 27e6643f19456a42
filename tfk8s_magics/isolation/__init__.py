"""Isolation: what keeps other users away from a cluster's servers, and why — one layer.

TensorFlow's gRPC servers (and a cluster's TensorBoard and model server) have no
authentication.  :mod:`.plan` decides, once per cluster, kernel or server, how each is isolated
(an :class:`~.plan.IsolationPlan`: the namespace kind, the loopback shim, the owner-only relay,
the fallback and its one-sentence reason); the rest performs it:

* :mod:`.netns` — private network namespaces (make, enter, join; who owns a socket);
* :mod:`.shim` — the loopback shim (``loopback_bind.c``) where no namespace is used;
* :mod:`.guard` and :mod:`.relay` — a server in a namespace of its own that only its owner reaches;
* :mod:`.hostside` and :mod:`.kernelns` — the sandboxed kernel's host side.

The layer imports nothing above it (``tests/test_layers.py``), and this package imports none of
its modules until one is used, so the relay, a security component, loads only what it runs.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["IsolationPlan", "Platform", "plan_cluster", "plan_kernel", "plan_pool", "plan_server"]


def __getattr__(name: str) -> Any:
    """The plan's names, loaded at first use (PEP 562)."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(".plan", __name__), name)
