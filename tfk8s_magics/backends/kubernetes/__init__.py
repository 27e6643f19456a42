"""The Kubernetes backend: every cluster one JobSet, built by pure functions, applied with rollback.

Modules, each doing one thing:

* :mod:`.settings` — :class:`K8sSettings`, the few cluster-wide choices (namespace, image, ...);
* :mod:`.manifests` — pure builders, ``ClusterSpec`` + settings → manifest dicts;
* :mod:`.jobset` — the pure JobSet builder (the lifecycle policy as JobSet fields);
* :mod:`.rbac` — the least-privilege Role the backend needs;
* :mod:`.quota` — the pre-flight ResourceQuota check (pure arithmetic);
* :mod:`.apply` — create in dependency order, roll back on any failure;
* :mod:`.state` — JobSet + pods → task and cluster statuses (pure);
* :mod:`.watch` — one read-only watch of the JobSet and its pods per cluster
  (status, Events, progress); the lifecycle itself runs in JobSet, in the cluster;
* :mod:`.logs` — log streaming with progress records taken out;
* :mod:`.backend` — :class:`KubernetesBackend`, the :class:`~..base.Backend` itself.

Importing this package neither imports the ``kubernetes`` client eagerly nor
reads a kubeconfig: :class:`KubernetesBackend` is loaded on first access.
"""

from __future__ import annotations

from typing import Any

from .jobset import render_yaml

__all__ = ["KubernetesBackend", "render_yaml"]


def __getattr__(name: str) -> Any:
    # Deferred: the backend imports the official kubernetes client, a heavy import that
    # rendering YAML or using the local backend never needs.
    if name == "KubernetesBackend":
        from .backend import KubernetesBackend

        return KubernetesBackend
    raise AttributeError(name)
