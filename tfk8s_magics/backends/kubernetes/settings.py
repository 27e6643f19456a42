"""The cluster-wide choices the Kubernetes manifests depend on, besides the spec.

:class:`K8sSettings` is a small frozen dataclass, so every manifest builder
takes exactly two typed objects: the :class:`~tfk8s_magics.spec.ClusterSpec`
and these settings.  Reading the environment (namespace file, ``TFK8S_*``
variables) happens in :func:`settings_from_env`, never at import.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ... import options
from ...options import DEFAULT_GPU_IMAGE, DEFAULT_IMAGE, DEFAULT_STORAGE_CLASS

#: Where the in-pod namespace of the notebook's ServiceAccount is mounted.
NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True)
class K8sSettings:
    """Choices shared by every cluster a backend launches.

    ``notebook_labels`` select the notebook pod(s) an in-graph cluster's
    NetworkPolicy lets in (KubeSpawner labels its pods
    ``component: singleuser-server``; with one namespace per user these
    are this user's servers only).  ``cluster_domain``, when set, makes
    task addresses fully qualified (``….svc.cluster.local``).
    """

    namespace: str = "default"
    image: str = DEFAULT_IMAGE
    gpu_image: str = DEFAULT_GPU_IMAGE
    #: "" (or None): the cluster's default StorageClass (no ``storageClassName`` is sent).
    storage_class: str | None = DEFAULT_STORAGE_CLASS
    user: str = ""
    log_size: str = "10Gi"
    data_size: str = "10Gi"
    port: int = 2222
    tensorboard_port: int = 6006
    run_as_user: int = 1000
    #: The group of every volume's files: the notebook's (jovyan's group ``users``, KubeSpawner's
    #: ``fs_gid``), so the kubelet never re-chowns a claim the notebook and tasks share.
    fs_group: int = 100
    #: None: Kubernetes' own default (Always for ``:latest`` or no tag, else IfNotPresent), so
    #: nodes never run different builds of a moving tag.
    image_pull_policy: str | None = None
    cluster_domain: str = ""
    notebook_labels: Mapping[str, str] = field(
        default_factory=lambda: {"component": "singleuser-server"}
    )
    #: Hide TensorFlow's C++ logging in the tasks (``TFK8S_QUIET``; see :mod:`tfk8s_magics.taskenv`).
    quiet: bool = True


def label_value(text: str) -> str:
    """``text`` made a valid label value (≤ 63 of ``[A-Za-z0-9._-]``, alphanumeric ends)."""
    value = re.sub(r"[^A-Za-z0-9._-]", "-", text)[:63]
    return value.strip("-._")


def in_pod_namespace(path: str = NAMESPACE_FILE) -> str | None:
    """The namespace of this pod's ServiceAccount, when running in a pod."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


def settings_from_env(**overrides: object) -> K8sSettings:
    """Settings from keyword ``overrides``, else the options (:mod:`tfk8s_magics.options`).

    ``namespace``: the in-pod namespace file, else option ``namespace``
    (``$TFK8S_NAMESPACE``), else the kubeconfig context's namespace (read
    only here, lazily), else ``default``.  ``image``: option
    ``default_image`` (``$TFK8S_IMAGE``); ``gpu_image``: option ``gpu_image``
    (``$TFK8S_GPU_IMAGE``); ``storage_class`` and ``user``:
    the options of those names.
    """
    values = {k: v for k, v in overrides.items() if v is not None}
    if "namespace" not in values:
        values["namespace"] = (
            in_pod_namespace() or options.get("namespace") or _kubeconfig_namespace() or "default"
        )
    values.setdefault("image", options.get("default_image"))
    values.setdefault("gpu_image", options.get("gpu_image"))
    values.setdefault("storage_class", options.get("storage_class"))
    values.setdefault("user", options.get("user"))
    values.setdefault("quiet", options.get("quiet"))
    return K8sSettings(**values)  # type: ignore[arg-type]


def _kubeconfig_namespace() -> str | None:
    try:
        from kubernetes import config

        _, active = config.list_kube_config_contexts()
    except Exception:  # noqa: BLE001 - no kubeconfig is a normal case here
        return None
    return (active or {}).get("context", {}).get("namespace")
