"""What the hub creates in a user's namespace besides what KubeSpawner does.

KubeSpawner (``enable_user_namespaces``) creates the namespace, the home PVC
and the pod; it creates no ServiceAccount, no RBAC, no quota and no network
policy.  The functions here build those objects as plain dicts from one typed
:class:`BootstrapSpec` and a namespace name -- no I/O, no cluster -- so they
are tested against literal dicts and validated against the Kubernetes
schemas.  :mod:`tfk8s_hub.spawner` applies them.

The backend's rules are the extension's own (``tfk8s_magics.backends.kubernetes.rbac``):
the backend that needs the permissions is the one place that lists them.  The
chart ships them as one ClusterRole; here a RoleBinding grants it in one
namespace.  Nothing here is cluster-scoped.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from tfk8s_magics.backends.kubernetes.rbac import backend_role_binding

Manifest = dict[str, Any]

#: Labels of every bootstrap object (what ``kubectl get -l`` finds them by).
BOOTSTRAP_LABELS = {
    "app.kubernetes.io/name": "tfk8s-lab",
    "app.kubernetes.io/component": "user-namespace",
    "app.kubernetes.io/part-of": "tfk8s-lab",
    "app.kubernetes.io/managed-by": "tfk8s-lab-hub",
}

#: Marks a namespace as a lab user namespace; the value is the hub's namespace.  The
#: chart's admission policy lets the hub write only in namespaces carrying it, and the
#: hub's NetworkPolicy lets notebooks from them in.
USER_NAMESPACE_LABEL = "tfk8s.io/hub-namespace"

#: Pod Security Admission: user pods must meet the "restricted" profile (no
#: privileged pods, no hostPath, non-root, no capabilities...), or a user with
#: the right to create pods would have root on the node.
POD_SECURITY_LABELS = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
    "pod-security.kubernetes.io/warn": "restricted",
    "pod-security.kubernetes.io/audit": "restricted",
}


def namespace_labels(spec: BootstrapSpec) -> dict[str, str]:
    """The labels of every user namespace (KubeSpawner puts them on the namespace it creates)."""
    return {
        **BOOTSTRAP_LABELS,
        USER_NAMESPACE_LABEL: spec.hub_namespace,
        **POD_SECURITY_LABELS,
    }

#: Hub and proxy pods carry this label (as in zero-to-jupyterhub): user pods accept them.
HUB_ACCESS_LABEL = "hub.jupyter.org/network-access-singleuser"
#: The hub pod's component label: notebook servers call the hub API on :data:`HUB_API_PORT`.
HUB_COMPONENT = {"app.kubernetes.io/component": "hub"}
HUB_API_PORT = 8081

#: NodeLocal DNSCache's link-local addresses: the upstream manifest's and kubespray's defaults.
#: Pods whose kubelet names one as ``clusterDNS`` ask it directly, never a pod in kube-system.
NODE_LOCAL_DNS = ("169.254.20.10/32", "169.254.25.10/32")

#: The cloud metadata server (GKE's Cloud DNS also answers DNS there).
CLOUD_METADATA = "169.254.169.254/32"

#: Private ranges: RFC 1918, and RFC 6598's shared range (EKS custom networking, GKE
#: non-RFC 1918 pod ranges).  Pods, Services and nodes live in them.
PRIVATE_CIDRS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")

#: Link-local: never the internet (the metadata server, node-local caches, instance services).
LINK_LOCAL = "169.254.0.0/16"

#: Zero-to-JupyterHub's ``singleuser.networkPolicy.egressAllowRules``, with its defaults for
#: user servers; :func:`egress_allow_rules` renders them as its ``_helpers-netpol.tpl`` does.
EGRESS_ALLOW_RULES: dict[str, bool] = {
    "cloudMetadataServer": False,
    "dnsPortsCloudMetadataServer": True,
    "dnsPortsKubeSystemNamespace": True,
    "dnsPortsPrivateIPs": True,
    "nonPrivateIPs": True,
    "privateIPs": False,
}

DNS_PORTS = ({"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53})

NETWORK_POLICY_NAME = "tfk8s-user-isolation"
QUOTA_NAME = "tfk8s-quota"
#: The quota that refuses pods with cross-namespace affinity terms (:func:`affinity_quota`).
AFFINITY_QUOTA_NAME = "tfk8s-no-cross-namespace-affinity"
LIMIT_RANGE_NAME = "tfk8s-limits"


@dataclass(frozen=True)
class ApiServer:
    """Where pods reach the Kubernetes API server: addresses (CIDRs) and TCP ports.

    Calico and kube-router match a NetworkPolicy against the address a packet
    reaches after kube-proxy's DNAT, so the rule must name the ``kubernetes``
    Service's endpoints, not only its ClusterIP (Cilium matches neither: the
    chart's CiliumClusterwideNetworkPolicy names its ``kube-apiserver`` entity).
    """

    cidrs: tuple[str, ...]
    ports: tuple[int, ...] = ()

    @classmethod
    def from_objects(cls, service: Manifest | None, slices: list[Manifest]) -> ApiServer:
        """The addresses and ports of the ``default/kubernetes`` Service and its EndpointSlices."""
        addresses, ports = _service_addresses(service)
        for s in slices:
            more, more_ports = _slice_addresses(s)
            addresses += more
            ports += more_ports
        cidrs = [f"{a}/128" if ":" in a else f"{a}/32" for a in addresses]
        return cls(tuple(dict.fromkeys(cidrs)), tuple(dict.fromkeys(ports)))


def _tcp_ports(ports: list[dict[str, Any]]) -> list[int]:
    return [p["port"] for p in ports if p.get("port") and p.get("protocol", "TCP") == "TCP"]


def _service_addresses(service: Manifest | None) -> tuple[list[str], list[int]]:
    """A Service's cluster addresses and TCP ports."""
    spec = (service or {}).get("spec") or {}
    ips = [ip for ip in spec.get("clusterIPs") or [spec.get("clusterIP")] if ip and ip != "None"]
    return ips, _tcp_ports(spec.get("ports") or [])


def _slice_addresses(endpoint_slice: Manifest) -> tuple[list[str], list[int]]:
    """An EndpointSlice's endpoint addresses and TCP ports."""
    addresses = [a for e in endpoint_slice.get("endpoints") or [] for a in e.get("addresses") or []]
    return addresses, _tcp_ports(endpoint_slice.get("ports") or [])


@dataclass(frozen=True)
class BootstrapSpec:
    """Everything the bootstrap objects depend on (see :class:`~tfk8s_hub.settings.LabSettings`)."""

    hub_namespace: str = "default"
    service_account: str = "tfk8s-user"
    role_name: str = "tfk8s-backend"
    quota: dict[str, str] = field(default_factory=dict)
    default_limits: dict[str, str] = field(default_factory=dict)
    default_requests: dict[str, str] = field(default_factory=dict)
    max_limits: dict[str, str] = field(default_factory=dict)
    network_policy: bool = True
    egress_allow_rules: dict[str, bool] = field(default_factory=lambda: dict(EGRESS_ALLOW_RULES))
    extra_egress: tuple[dict[str, Any], ...] = ()
    #: Empty: the hub reads them from the cluster at each spawn (:class:`ApiServer`).
    api_server_cidrs: tuple[str, ...] = ()
    api_server_ports: tuple[int, ...] = (443, 6443)
    # registry credentials, storage credentials, workload identity, Kueue (see LabSettings)
    image_pull_secrets: tuple[str, ...] = ()
    copy_secrets: tuple[str, ...] = ()
    service_account_annotations: dict[str, str] = field(default_factory=dict)
    queue: str | None = None

    @classmethod
    def from_settings(cls, settings: Any) -> BootstrapSpec:
        """The spec of a :class:`~tfk8s_hub.settings.LabSettings` instance."""
        rules = {**EGRESS_ALLOW_RULES, **settings.egress_allow_rules}
        if settings.allow_internet is not None:  # the deprecated name of nonPrivateIPs
            rules["nonPrivateIPs"] = settings.allow_internet
        return cls(
            hub_namespace=settings.hub_namespace,
            service_account=settings.service_account,
            role_name=settings.role_name,
            quota=dict(settings.quota),
            default_limits=dict(settings.default_limits),
            default_requests=dict(settings.default_requests),
            max_limits=dict(settings.max_limits),
            network_policy=settings.network_policy,
            egress_allow_rules=rules,
            extra_egress=tuple(copy.deepcopy(list(settings.extra_egress))),
            api_server_cidrs=tuple(settings.api_server_cidrs),
            api_server_ports=tuple(settings.api_server_ports),
            image_pull_secrets=tuple(settings.image_pull_secrets),
            copy_secrets=tuple(settings.copy_secrets),
            service_account_annotations=dict(settings.service_account_annotations),
            queue=settings.queue or None,
        )

    @property
    def discovers_api_server(self) -> bool:
        """Whether the NetworkPolicy needs the API server's addresses read from the cluster."""
        return self.network_policy and not self.api_server_cidrs


def _meta(name: str, namespace: str) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": dict(BOOTSTRAP_LABELS)}


#: The namespace's own ServiceAccount: task, TensorBoard and serving pods run as it.
DEFAULT_SERVICE_ACCOUNT = "default"


def service_account(spec: BootstrapSpec, namespace: str, name: str | None = None) -> Manifest:
    """A ServiceAccount of the user's namespace: the notebook's (``spec.service_account``), or
    ``name``.  It carries the registry Secrets (the ServiceAccount admission plugin gives them
    to every pod without its own) and the workload-identity annotations.

    Applied with server-side apply, so what an administrator adds by hand stays; the list of
    pull secrets is atomic, so the hub merges the object's current list in first
    (:func:`with_pull_secrets_of`).
    """
    meta = _meta(name or spec.service_account, namespace)
    if spec.service_account_annotations:
        meta["annotations"] = dict(spec.service_account_annotations)
    obj: Manifest = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}
    if spec.image_pull_secrets:
        obj["imagePullSecrets"] = [{"name": n} for n in spec.image_pull_secrets]
    return obj


def service_accounts(spec: BootstrapSpec, namespace: str) -> list[Manifest]:
    """The notebook's ServiceAccount, and ``default`` when it has something to carry."""
    out = [service_account(spec, namespace)]
    if spec.service_account != DEFAULT_SERVICE_ACCOUNT and (
        spec.image_pull_secrets or spec.service_account_annotations
    ):
        out.append(service_account(spec, namespace, DEFAULT_SERVICE_ACCOUNT))
    return out


def with_pull_secrets_of(obj: Manifest, current: Manifest | None) -> Manifest:
    """``obj`` (a ServiceAccount to apply) with the pull secrets ``current`` (the live object,
    None: none yet) already names kept, ours appended after them.

    ``imagePullSecrets`` is an atomic list for server-side apply: applying ours alone would
    replace the administrator's.
    """
    theirs = [dict(r) for r in (current or {}).get("imagePullSecrets") or []]
    ours = obj.get("imagePullSecrets") or []
    if not ours:
        return obj
    names = {r.get("name") for r in theirs}
    out = {**obj, "imagePullSecrets": theirs + [r for r in ours if r["name"] not in names]}
    return out


#: Marks a Secret the hub copied: the value is ``<hub namespace>/<name>`` of its source.
COPIED_FROM_ANNOTATION = "tfk8s.io/copied-from"


def copied_secret(source: Manifest, namespace: str) -> Manifest:
    """The copy, in user ``namespace``, of a Secret read from the hub's namespace.

    Only what makes a Secret what it is travels: its name, type and data; the source's own
    metadata (owner references, resourceVersion, managed fields) does not.
    """
    meta = source["metadata"]
    out_meta = _meta(meta["name"], namespace)
    out_meta["annotations"] = {COPIED_FROM_ANNOTATION: f"{meta.get('namespace', '')}/{meta['name']}"}
    obj: Manifest = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": out_meta,
        "type": source.get("type") or "Opaque",
    }
    if source.get("data"):
        obj["data"] = dict(source["data"])
    return obj


def secrets_to_copy(spec: BootstrapSpec) -> list[str]:
    """Names of the hub namespace's Secrets every user namespace gets: pull secrets first."""
    return list(dict.fromkeys((*spec.image_pull_secrets, *spec.copy_secrets)))


#: Kueue's API group and the versions the bootstrap may use, newest first.
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSIONS = ("v1beta2", "v1beta1")


def local_queue(spec: BootstrapSpec, namespace: str, version: str = KUEUE_VERSIONS[0]) -> Manifest | None:
    """The namespace's Kueue LocalQueue, named as the ClusterQueue it feeds (None: no queue)."""
    if not spec.queue:
        return None
    return {
        "apiVersion": f"{KUEUE_GROUP}/{version}",
        "kind": "LocalQueue",
        "metadata": _meta(spec.queue, namespace),
        "spec": {"clusterQueue": spec.queue},
    }


def role_binding(spec: BootstrapSpec, namespace: str) -> Manifest:
    """Binds the backend's ClusterRole (the chart's, named ``role_name``) to the user's
    ServiceAccount, in ``namespace`` only.  The hub needs only ``bind`` on that ClusterRole
    to create it, not the rules themselves."""
    obj = backend_role_binding(namespace, spec.service_account, role_name=spec.role_name,
                               role_kind="ClusterRole")
    obj["metadata"]["labels"] = {**obj["metadata"].get("labels", {}), **BOOTSTRAP_LABELS}
    return obj


def resource_quota(spec: BootstrapSpec, namespace: str) -> Manifest | None:
    """The namespace's ResourceQuota (None when the administrator set no quota)."""
    if not spec.quota:
        return None
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": _meta(QUOTA_NAME, namespace),
        "spec": {"hard": dict(spec.quota)},
    }


def affinity_quota(spec: BootstrapSpec, namespace: str) -> Manifest:
    """A quota of no pods in the ``CrossNamespacePodAffinity`` scope.

    A pod affinity or anti-affinity term with ``namespaces`` or a
    ``namespaceSelector`` (``{}``: every namespace) lets one user keep every
    other user's pods off a node or a zone -- directly in a JobSet or
    Deployment, or through JobSet's ``alpha.jobset.sigs.k8s.io/exclusive-topology``
    annotation, whose webhook injects such a term.  The API server's quota
    admission refuses every pod in this scope; the lab's own pods carry none.
    """
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": _meta(AFFINITY_QUOTA_NAME, namespace),
        "spec": {
            "hard": {"pods": "0"},
            "scopeSelector": {
                "matchExpressions": [{"scopeName": "CrossNamespacePodAffinity", "operator": "Exists"}]
            },
        },
    }


def limit_range(spec: BootstrapSpec, namespace: str) -> Manifest | None:
    """Per-container defaults (and maximums), so pods without limits pass a limits quota."""
    limits: dict[str, Any] = {"type": "Container"}
    if spec.default_limits:
        limits["default"] = dict(spec.default_limits)
    if spec.default_requests:
        limits["defaultRequest"] = dict(spec.default_requests)
    if spec.max_limits:
        limits["max"] = dict(spec.max_limits)
    if len(limits) == 1:
        return None
    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": _meta(LIMIT_RANGE_NAME, namespace),
        "spec": {"limits": [limits]},
    }


def _hub_namespace_selector(spec: BootstrapSpec) -> dict[str, Any]:
    return {"matchLabels": {"kubernetes.io/metadata.name": spec.hub_namespace}}


def network_policy(
    spec: BootstrapSpec, namespace: str, api_server: ApiServer | None = None
) -> Manifest | None:
    """Isolate the user's namespace: in from itself and the hub/proxy, out to itself and services.

    Ingress: pods of the same namespace (the notebook reaches its TensorFlow
    pods, tasks reach each other) and the hub namespace's pods labelled
    :data:`HUB_ACCESS_LABEL` (proxy and hub reach the notebook).  Every other
    namespace is denied -- which is what keeps users apart, since each user
    namespace carries this policy.

    Egress: the same namespace, the hub API, the Kubernetes API server
    (``api_server_cidrs`` x ``api_server_ports``, or, when no CIDR is set, the
    addresses in ``api_server``), Zero-to-JupyterHub's ``egressAllowRules``
    (:func:`egress_allow_rules`: DNS, the internet) and ``extra_egress``.
    """
    if not spec.network_policy:
        return None
    same_namespace = {"podSelector": {}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(NETWORK_POLICY_NAME, namespace),
        "spec": {
            "podSelector": {},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [
                        dict(same_namespace),
                        {
                            "namespaceSelector": _hub_namespace_selector(spec),
                            "podSelector": {"matchLabels": {HUB_ACCESS_LABEL: "true"}},
                        },
                    ]
                }
            ],
            "egress": _egress(spec, api_server),
        },
    }


def egress_allow_rules(rules: dict[str, bool]) -> list[dict[str, Any]]:
    """Egress rules of Zero-to-JupyterHub's ``egressAllowRules`` flags, in its order.

    The same meaning as Zero-to-JupyterHub's (``jupyterhub/templates/_helpers-netpol.tpl``),
    the chart's ``tfk8s-lab.egressAllowRules`` renders the same rules for the hub, with
    these ranges: "private" includes RFC 6598's 100.64.0.0/10; DNS to private addresses
    includes NodeLocal DNSCache's link-local addresses (:data:`NODE_LOCAL_DNS`); the
    internet (``nonPrivateIPs``) excludes all of 169.254.0.0/16, not only the metadata server.
    """
    out: list[dict[str, Any]] = []
    dns: list[dict[str, Any]] = []
    if rules.get("dnsPortsCloudMetadataServer"):
        dns.append({"ipBlock": {"cidr": CLOUD_METADATA}})
    if rules.get("dnsPortsKubeSystemNamespace"):
        dns.append({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}})
    if rules.get("dnsPortsPrivateIPs"):
        dns += [{"ipBlock": {"cidr": c}} for c in (*PRIVATE_CIDRS, *NODE_LOCAL_DNS)]
    if dns:
        out.append({"ports": [dict(p) for p in DNS_PORTS], "to": dns})
    if rules.get("nonPrivateIPs"):
        out.append({"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": [*PRIVATE_CIDRS, LINK_LOCAL]}}]})
    if rules.get("privateIPs"):
        out.append({"to": [{"ipBlock": {"cidr": c}} for c in PRIVATE_CIDRS]})
    if rules.get("cloudMetadataServer"):
        out.append({"to": [{"ipBlock": {"cidr": CLOUD_METADATA}}]})
    return out


def _egress(spec: BootstrapSpec, api_server: ApiServer | None) -> list[dict[str, Any]]:
    """The egress rules of :func:`network_policy`."""
    egress: list[dict[str, Any]] = [
        {"to": [{"podSelector": {}}]},
        {
            "to": [
                {
                    "namespaceSelector": _hub_namespace_selector(spec),
                    "podSelector": {"matchLabels": dict(HUB_COMPONENT)},
                }
            ],
            "ports": [{"protocol": "TCP", "port": HUB_API_PORT}],
        },
    ]
    cidrs, ports = spec.api_server_cidrs, spec.api_server_ports
    if not cidrs and api_server is not None:
        cidrs, ports = api_server.cidrs, tuple(dict.fromkeys((*ports, *api_server.ports)))
    if cidrs and ports:
        egress.append(
            {
                "to": [{"ipBlock": {"cidr": cidr}} for cidr in cidrs],
                "ports": [{"protocol": "TCP", "port": p} for p in ports],
            }
        )
    egress += egress_allow_rules(spec.egress_allow_rules)
    egress += copy.deepcopy(list(spec.extra_egress))
    return egress


def bootstrap_objects(
    spec: BootstrapSpec, namespace: str, api_server: ApiServer | None = None
) -> list[Manifest]:
    """Every object of a user namespace.

    All of them must exist before the notebook pod (which names the ServiceAccount and
    relies on the LimitRange's defaults); none needs another to exist first, so the hub
    applies them at once (``Applier.apply_all``).  The copied Secrets are not here: they
    are read from the hub's namespace first (:func:`copied_secret`). ``api_server``: where the
    API server is when ``spec.api_server_cidrs`` is empty (:class:`ApiServer`, read from the
    cluster by the hub).
    """
    built = [
        *service_accounts(spec, namespace),
        role_binding(spec, namespace),
        limit_range(spec, namespace),
        resource_quota(spec, namespace),
        affinity_quota(spec, namespace),
        network_policy(spec, namespace, api_server),
        local_queue(spec, namespace),
    ]
    return [obj for obj in built if obj is not None]
