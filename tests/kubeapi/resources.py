"""The resource-kind table of the fake Kubernetes API server (a TEST DOUBLE).

Adding a kind is one line in :data:`KINDS`. Everything else (routing, RBAC
resource names, watch, selectors, validation) is driven from this table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Field labels every kind supports in a fieldSelector (as the real server does).
_META_FIELDS = frozenset({"metadata.name", "metadata.namespace"})


@dataclass(frozen=True)
class ResourceKind:
    """One REST resource: its group/version/plural and how it behaves.

    ``returns_deleted_object`` mirrors the real registries: DELETE on pods,
    services, PVCs, service accounts and namespaces answers with the object,
    every other kind answers with a ``Status``.
    """

    kind: str
    group: str
    version: str
    plural: str
    namespaced: bool
    subresources: frozenset[str] = frozenset()
    field_labels: frozenset[str] = frozenset()
    returns_deleted_object: bool = False
    # Real apiserver treats .status as a subresource for these: writes to the
    # main resource keep the stored status, writes to /status keep the rest.
    has_status_subresource: bool = field(default=False)

    @property
    def api_version(self) -> str:
        """The ``apiVersion`` string of objects of this kind."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified_resource(self) -> str:
        """``pods`` or ``deployments.apps``: how real error messages name a resource."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def singular(self) -> str:
        """Lower-case kind, accepted by the harness lookups (``pod``)."""
        return self.kind.lower()

    def supports_field(self, label: str) -> bool:
        """Whether ``label`` may appear in a fieldSelector for this kind."""
        return label in _META_FIELDS or label in self.field_labels


def _kind(kind, group, version, plural, namespaced, **kw) -> ResourceKind:
    for key in ("subresources", "field_labels"):
        if key in kw:
            kw[key] = frozenset(kw[key])
    return ResourceKind(kind, group, version, plural, namespaced, **kw)


_POD_FIELDS = (
    "status.phase", "spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
    "spec.serviceAccountName", "status.podIP", "status.nominatedNodeName",
)
_EVENT_FIELDS = (
    "involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
    "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
    "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type",
)

#: Every kind the fake server serves. One line per kind.
KINDS: tuple[ResourceKind, ...] = (
    _kind("Namespace", "", "v1", "namespaces", False, subresources={"status"},
          field_labels={"status.phase"}, returns_deleted_object=True,
          has_status_subresource=True),
    _kind("Node", "", "v1", "nodes", False, subresources={"status"},
          field_labels={"spec.unschedulable"}, has_status_subresource=True),
    _kind("Pod", "", "v1", "pods", True, subresources={"status", "log"},
          field_labels=_POD_FIELDS, returns_deleted_object=True, has_status_subresource=True),
    _kind("Service", "", "v1", "services", True, subresources={"status"},
          returns_deleted_object=True, has_status_subresource=True),
    _kind("ConfigMap", "", "v1", "configmaps", True),
    _kind("Secret", "", "v1", "secrets", True, field_labels={"type"}),
    _kind("ServiceAccount", "", "v1", "serviceaccounts", True, returns_deleted_object=True),
    _kind("PersistentVolumeClaim", "", "v1", "persistentvolumeclaims", True,
          subresources={"status"}, returns_deleted_object=True, has_status_subresource=True),
    _kind("Event", "", "v1", "events", True, field_labels=_EVENT_FIELDS),
    _kind("ResourceQuota", "", "v1", "resourcequotas", True, subresources={"status"},
          has_status_subresource=True),
    _kind("LimitRange", "", "v1", "limitranges", True),
    _kind("Deployment", "apps", "v1", "deployments", True, subresources={"status", "scale"},
          has_status_subresource=True),
    _kind("Job", "batch", "v1", "jobs", True, subresources={"status"},
          field_labels={"status.successful"}, has_status_subresource=True),
    _kind("NetworkPolicy", "networking.k8s.io", "v1", "networkpolicies", True),
    _kind("Role", "rbac.authorization.k8s.io", "v1", "roles", True),
    _kind("RoleBinding", "rbac.authorization.k8s.io", "v1", "rolebindings", True),
    _kind("StorageClass", "storage.k8s.io", "v1", "storageclasses", False),
    _kind("PriorityClass", "scheduling.k8s.io", "v1", "priorityclasses", False),
    # A custom resource (CRD), validated against its schema (crd.py); see jobsets.py.
    _kind("JobSet", "jobset.x-k8s.io", "v1alpha2", "jobsets", True, subresources={"status"},
          has_status_subresource=True),
)

_BY_PATH = {(k.group, k.version, k.plural): k for k in KINDS}


def kind_for_path(group: str, version: str, plural: str) -> ResourceKind | None:
    """The kind served at ``/apis/{group}/{version}/{plural}`` (group "" = core)."""
    return _BY_PATH.get((group, version, plural))


def lookup(name: str) -> ResourceKind:
    """Find a kind by ``Kind``, plural, singular or ``plural.group`` (harness helper)."""
    for k in KINDS:
        if name in (k.kind, k.plural, k.singular, k.qualified_resource):
            return k
    raise KeyError(f"the fake API server has no kind {name!r}; add it to resources.KINDS")


def kind_for_object(obj: dict) -> ResourceKind:
    """The kind of a manifest, from its ``apiVersion`` and ``kind``."""
    for k in KINDS:
        if k.kind == obj.get("kind") and k.api_version == obj.get("apiVersion"):
            return k
    raise KeyError(f"unknown apiVersion/kind {obj.get('apiVersion')}/{obj.get('kind')}")
