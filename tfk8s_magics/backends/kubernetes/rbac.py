"""The least-privilege rules the Kubernetes backend needs in a user's namespace.

Pure functions, no I/O.  The rules ship once, as a ClusterRole of the chart
(``helm/tfk8s-lab/templates/hub-rbac.yaml``, :func:`backend_cluster_role`);
the hub's per-user bootstrap binds it in each user namespace with a
RoleBinding (:func:`backend_role_binding`), which needs only ``bind`` on that
one ClusterRole — the hub holds none of these rules itself.  The tests
prove that every request the backend makes is allowed by :func:`role_rules`
(and stays inside the user's namespace).

What is *not* granted, on purpose: reading ``secrets`` (only ``create``, for TensorBoard's token;
nothing here reads one),
``pods/exec`` and ``pods/attach`` (logs are read, never a shell), ``nodes``
(cluster-scoped; the node pre-flight check is opt-in and needs a separate
ClusterRole), creating, changing or deleting pods (JobSet's controller makes
and removes the task pods; the notebook only reads them), ``networkpolicies``
(see :func:`role_rules`), and anything in other namespaces.
"""

from __future__ import annotations

from typing import Any

#: Verbs to read a kind, including the watch the backend's watcher keeps open.
_READ = ["get", "list", "watch"]


def role_rules() -> list[dict[str, Any]]:
    """The PolicyRules the backend needs, as Role ``rules`` (one rule per API group).

    * ``configmaps`` — the root object of every cluster (spec + script);
      ``patch`` records the stop time on it; ``configmaps/finalizers``
      (``update``) lets the cluster's objects block the root's Foreground
      deletion (``blockOwnerDeletion``) where the API server enforces it.
    * ``jobsets`` (``jobset.x-k8s.io``) — one per cluster; JobSet makes its
      Jobs, pods and headless Service.  ``delete`` is stop.
    * ``pods`` (read) — task status, and the notebook's own pod (the owner
      of its in-graph clusters); ``pods/log`` streams logs.
    * ``services`` — TensorBoard's and TF Serving's (``ClusterIP`` only: the
      lab's ValidatingAdmissionPolicy refuses other types and ``externalIPs``).
    * ``persistentvolumeclaims`` — ``/data`` and ``/log``; ``patch`` drops the
      owner reference of the log claim when a delete keeps the logs.
    * ``events`` (get, list) — why a pod is pending; ``resourcequotas`` and
      ``limitranges`` (get, list) — the launch pre-flight check applies the
      LimitRange defaults as admission will, then compares with the quota.
      Nothing watches them.
    * ``deployments`` — TensorBoard.
    * ``localqueues`` (``kueue.x-k8s.io``, get) — a launch's ``--queue`` is checked
      first: a queue the namespace lacks would leave the cluster unadmitted for ever.
    * ``secrets`` (``create`` only) — TensorBoard's token (kept by the notebook itself: no
      Secret is ever read back); owned by the cluster's root, it goes with it.

    No ``networkpolicies``: the namespace's isolation policy is the
    administrator's (the hub's bootstrap), and a user who could delete it
    would lift its egress block on private ranges and the cloud metadata
    address.
    """
    return [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "verbs": [*_READ, "create", "patch", "delete"],
        },
        {"apiGroups": [""], "resources": ["configmaps/finalizers"], "verbs": ["update"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": _READ},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
        {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": [*_READ, "create", "delete"]},
        {
            "apiGroups": [""],
            "resources": ["persistentvolumeclaims"],
            "verbs": [*_READ, "create", "patch", "delete"],
        },
        {"apiGroups": [""], "resources": ["services"], "verbs": [*_READ, "create", "delete"]},
        {
            "apiGroups": [""],
            "resources": ["events", "resourcequotas", "limitranges"],
            "verbs": ["get", "list"],
        },
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": [*_READ, "create", "delete"]},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["localqueues"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    ]


def _labels() -> dict[str, str]:
    return {"app.kubernetes.io/name": "tfk8s", "app.kubernetes.io/component": "backend-rbac"}


def backend_role(namespace: str, name: str = "tfk8s-backend") -> dict[str, Any]:
    """The Role granting :func:`role_rules` in ``namespace``."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": namespace, "labels": _labels()},
        "rules": role_rules(),
    }


def backend_cluster_role(name: str = "tfk8s-backend") -> dict[str, Any]:
    """The ClusterRole holding :func:`role_rules`, bound per namespace (never cluster-wide)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name, "labels": _labels()},
        "rules": role_rules(),
    }


def backend_role_binding(
    namespace: str, service_account: str, role_name: str = "tfk8s-backend", role_kind: str = "Role"
) -> dict[str, Any]:
    """The RoleBinding giving the notebook's ServiceAccount the backend rules in ``namespace``:
    those of the Role ``role_name``, or (``role_kind="ClusterRole"``) of the chart's ClusterRole,
    granted in ``namespace`` only."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": role_name, "namespace": namespace, "labels": _labels()},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role_kind,
            "name": role_name,
        },
        "subjects": [
            {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}
        ],
    }
