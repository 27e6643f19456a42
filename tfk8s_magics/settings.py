"""Defaults shared by the Python API and the magics.

An administrator sets them for everyone with environment variables (the
hub passes them to every user server) or, in IPython, with
``c.TFClusterMagics.<trait>`` (see :mod:`.magics`), which wins.
"""

from __future__ import annotations

import os
from pathlib import Path

_SA_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


def in_kubernetes_pod() -> bool:
    """Whether this process runs in a pod with a mounted service account."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and _SA_TOKEN.exists()


def default_backend() -> str:
    """``$TFK8S_BACKEND``; else ``kubernetes`` inside a pod with a service account; else ``local``."""
    env = os.environ.get("TFK8S_BACKEND", "").strip()
    if env:
        return env
    return "kubernetes" if in_kubernetes_pod() else "local"


def env_float(name: str, default: float) -> float:
    """A float from the environment, or ``default`` when unset or unreadable."""
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return default


def env_int(name: str, default: int) -> int:
    """An int from the environment, or ``default`` when unset or unreadable."""
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


def default_ps_grace() -> float:
    """Seconds parameter servers live on after the workers finish (``$TFK8S_PS_GRACE``, 30)."""
    return env_float("TFK8S_PS_GRACE", 30.0)


def default_restart_budget() -> int:
    """Restarts a cluster may spend on crashed tasks (``$TFK8S_RESTARTS``, 2)."""
    return env_int("TFK8S_RESTARTS", 2)


def default_legacy_keras() -> bool:
    """Whether tasks and the in-graph client use tf-keras (``TF_USE_LEGACY_KERAS=1``).

    On by default: TensorFlow's own distributed tutorials need it under
    TF 2.21 (see DESIGN.md).  ``$TFK8S_LEGACY_KERAS=0`` turns it off.
    """
    return os.environ.get("TFK8S_LEGACY_KERAS", "1").strip().lower() not in ("0", "false", "no")
