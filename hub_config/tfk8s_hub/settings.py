"""The administrator's settings of the lab, as one traitlets ``Configurable``.

An administrator sets them the Jupyter way, in ``jupyterhub_config.py``::

    c.LabSettings.storage_class = "kadalu.gluster"
    c.LabSettings.quota = {"requests.cpu": "4", "requests.memory": "16Gi"}

or, with the Helm chart, under the ``lab:`` key of the values (the chart
writes them to a JSON file that :func:`load_values_file` reads into the same
traits).  Everything the hub does for a user -- the KubeSpawner settings, the
bootstrap objects in the user's namespace, the extension's environment -- is
computed from one :class:`LabSettings` object by pure functions.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

from traitlets import Bool, Dict, Enum, Int, List, TraitError, Unicode, default, observe, validate
from traitlets.config import Config

from tfk8s_magics import options
from tfk8s_magics.options import DNS_LABEL, DNS_SUBDOMAIN, QUANTITY

from .bootstrap import EGRESS_ALLOW_RULES

#: Environment variable naming the JSON file of settings written by the Helm chart.
VALUES_ENV = "TFK8S_HUB_VALUES"

#: The extension's defaults the hub passes to every notebook, one trait per option
#: with a ``hub_trait`` (``c.LabSettings.restart_budget`` → ``$TFK8S_RESTARTS``).
ExtensionDefaults = options.defaults_class(
    "ExtensionDefaults", "The extension's defaults the hub sets for every notebook.",
    attr="hub_trait", read_env=False,
)


def _check_quantities(name: str, value: dict[str, Any]) -> dict[str, str]:
    out = {}
    for key, qty in value.items():
        text = str(qty)
        # object counts ("pods", "count/jobs.batch") are plain integers, which match too
        if not QUANTITY.match(text):
            raise TraitError(
                f"LabSettings.{name}[{key!r}] = {qty!r} is not a Kubernetes quantity: "
                "use a number with an optional suffix such as '500m', '4Gi' or '10'."
            )
        out[str(key)] = text
    return out


def _hub_namespace_default() -> str:
    ns_file = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    if ns_file.exists():
        return ns_file.read_text().strip()
    return "default"


class LabSettings(ExtensionDefaults):
    """What an administrator decides for every user of the lab.

    Besides the traits below, it has the extension's defaults
    (:data:`ExtensionDefaults`: ``task_image``, ``restart_budget``,
    ``ps_grace_period``, ``legacy_keras``, ...), which reach every notebook
    as the options' environment variables.
    """

    # --- where users live -------------------------------------------------
    hub_namespace = Unicode(
        help="""Namespace of the hub and its proxy.  User namespaces accept traffic
        from the hub and proxy pods of this namespace only.  Defaults to
        $POD_NAMESPACE, else the namespace of the hub's service account, else
        'default'.""",
    ).tag(config=True)

    @default("hub_namespace")
    def _default_hub_namespace(self) -> str:
        return _hub_namespace_default()

    user_namespace_template = Unicode(
        "{hubnamespace}-{username}",
        help="""Name of each user's namespace (KubeSpawner template fields:
        {hubnamespace}, {username}, {userid}, ...).  Every user gets their own.""",
    ).tag(config=True)

    service_account = Unicode(
        "tfk8s-user",
        help="""ServiceAccount created in every user namespace.  The notebook pod
        runs as it (its token mounted) so the extension's Kubernetes backend can
        create the user's TensorFlow pods; the Role it is bound to is limited to
        that namespace.""",
    ).tag(config=True)

    role_name = Unicode(
        "tfk8s-backend",
        help="""Name of the ClusterRole holding the Kubernetes backend's rules (the chart's,
        which names it <role_name>-<release namespace>), and of the RoleBinding that grants it in
        each user namespace.""",
    ).tag(config=True)

    # --- storage ------------------------------------------------------------
    storage_class = Unicode(
        options.DEFAULT_STORAGE_CLASS,
        help="""StorageClass of users' home volumes and of the volumes the extension
        creates for TensorFlow clusters (logs, data, checkpoints; $TFK8S_STORAGE_CLASS).
        Must offer ReadWriteMany for clusters that span nodes: GlusterFS through a CSI
        driver, CephFS, NFS.  Empty: the cluster's default class (no storageClassName is
        sent, for the home volume and for clusters' volumes alike).""",
    ).tag(config=True)

    home_storage_capacity = Unicode(
        "10Gi", help="Size of each user's home volume (a Kubernetes quantity)."
    ).tag(config=True)

    home_access_modes = List(
        Unicode(),
        default_value=["ReadWriteMany"],
        help="Access modes of the home volume.  ReadWriteMany lets TensorFlow pods mount it too.",
    ).tag(config=True)

    home_mount_path = Unicode(
        "/home/jovyan", help="Where the home volume is mounted in the notebook container."
    ).tag(config=True)

    # --- images and the extension ------------------------------------------
    notebook_image = Unicode(
        "tfk8s/notebook:0.1.0",
        help="Image of the single-user notebook server (images/notebook/Dockerfile).",
    ).tag(config=True)

    default_backend = Enum(
        ["kubernetes", "local"],
        default_value="kubernetes",
        help="""Backend the extension uses when a user names none ($TFK8S_BACKEND):
        'kubernetes' runs clusters as pods in the user's namespace, 'local' as
        processes inside the notebook container.""",
    ).tag(config=True)

    extra_environment = Dict(
        value_trait=Unicode(),
        help="More environment variables of every notebook server (KubeSpawner templates allowed).",
    ).tag(config=True)

    # --- limits ---------------------------------------------------------------
    notebook_cpu_limit = Unicode("2", help="CPU limit of the notebook container.").tag(config=True)
    notebook_cpu_guarantee = Unicode("250m", help="CPU request of the notebook container.").tag(
        config=True
    )
    notebook_mem_limit = Unicode("4Gi", help="Memory limit of the notebook container.").tag(
        config=True
    )
    notebook_mem_guarantee = Unicode("1Gi", help="Memory request of the notebook container.").tag(
        config=True
    )

    quota = Dict(
        default_value={
            "requests.cpu": "12",
            "requests.memory": "32Gi",
            "limits.memory": "64Gi",
            "requests.storage": "200Gi",
            "persistentvolumeclaims": "20",
            "pods": "40",
            "services": "20",
            "requests.nvidia.com/gpu": "0",
        },
        help="""ResourceQuota 'hard' limits of each user namespace (notebook and all
        its TensorFlow pods together).  Empty: no quota object.

        The resource model: CPU is counted by requests only -- TensorFlow tasks
        set no CPU limit, because throttling one task stalls every peer waiting
        on it; memory by requests and limits (a task's memory limit equals its
        request, so over-use ends in a retryable OOM kill).  Adding
        'limits.cpu' here needs a CPU limit in default_limits too, and then
        users cannot ask for more CPU than that limit.

        GPUs: ``requests.nvidia.com/gpu`` is how many GPUs a user's pods may
        hold at once; "0" (the default) keeps users off GPU nodes' GPUs until
        the administrator gives each user a share.  Removing the key lets one
        user take every GPU in the cluster.""",
    ).tag(config=True)

    default_limits = Dict(
        default_value={"memory": "4Gi"},
        help="""LimitRange default limits of a container that sets none (a quota on
        limits.* rejects pods without limits otherwise).  No CPU by default: a
        default CPU limit throttles every task at it, and a user's --cpu above
        it is refused (a request may not exceed its limit).""",
    ).tag(config=True)

    default_requests = Dict(
        default_value={"cpu": "500m", "memory": "1Gi"},
        help="""LimitRange default requests of a container that sets none (a task
        launched without --cpu/--memory; TensorFlow alone takes ~500 MB).""",
    ).tag(config=True)

    max_limits = Dict(
        default_value={},
        help="LimitRange 'max' per container (e.g. {'cpu': '8', 'memory': '32Gi'}).  Empty: none.",
    ).tag(config=True)

    # --- network ----------------------------------------------------------------
    network_policy = Bool(
        True,
        help="""Create a NetworkPolicy in each user namespace: pods there accept
        traffic from their own namespace and from the hub/proxy only, and reach
        their own namespace, the hub API, the Kubernetes API and what
        egress_allow_rules and extra_egress allow (DNS, the internet) -- never
        another user's namespace.""",
    ).tag(config=True)

    egress_allow_rules = Dict(
        value_trait=Bool(),
        default_value=dict(EGRESS_ALLOW_RULES),
        help="""Zero-to-JupyterHub's ``singleuser.networkPolicy.egressAllowRules``, with
        the same names, meaning and defaults: where user pods may connect besides
        their own namespace, the hub API and the Kubernetes API.
        ``dnsPortsKubeSystemNamespace`` (port 53 of pods in kube-system),
        ``dnsPortsPrivateIPs`` (port 53 of private addresses: a NodeLocal DNSCache
        on the kube-dns ClusterIP; here also its link-local 169.254.20.10 and
        169.254.25.10), ``dnsPortsCloudMetadataServer`` (port 53 of 169.254.169.254:
        GKE Cloud DNS), ``nonPrivateIPs`` (the internet: every address but the
        private ranges, 100.64.0.0/10 and 169.254.0.0/16), ``privateIPs`` (every
        private address, other users' pods included where no policy protects them)
        and ``cloudMetadataServer`` (169.254.169.254).  Keys left out keep their
        default.""",
    ).tag(config=True)

    extra_egress = List(
        Dict(),
        default_value=[],
        help="""More egress rules of every user namespace's NetworkPolicy
        (NetworkPolicyEgressRule objects, as Zero-to-JupyterHub's
        ``singleuser.networkPolicy.egress``), e.g. a package mirror or a
        database at a private address.""",
    ).tag(config=True)

    allow_internet = Bool(
        None,
        allow_none=True,
        help="""Deprecated: egress_allow_rules["nonPrivateIPs"].  When set, it
        replaces that rule (None: not set).""",
    ).tag(config=True)

    api_server_cidrs = List(
        Unicode(),
        default_value=[],
        help="""Where the Kubernetes API server is, for the egress rule that lets the
        extension's backend reach it (ports api_server_ports).  Empty: the hub
        reads the addresses of the ``kubernetes`` Service in ``default`` and of
        its endpoints at each spawn (Calico and kube-router match the endpoint a
        Service address is translated to; Cilium needs the chart's
        CiliumClusterwideNetworkPolicy).  Set it when the hub may not read them,
        e.g. ``["10.0.0.2/32"]``: never a whole private range, which would open
        every private service on these ports.""",
    ).tag(config=True)

    api_server_ports = List(
        Int(),
        default_value=[443, 6443],
        help="TCP ports of the Kubernetes API server (the Service's and the endpoints').",
    ).tag(config=True)

    # --- registry, start-up, home volumes, credentials ------------------------------
    image_pull_secrets = List(
        Unicode(),
        default_value=[],
        help="""Names of Secrets (type kubernetes.io/dockerconfigjson) in the hub's namespace
        holding the registry credentials of the lab's images.  The hub copies each into every
        user namespace, names them in the notebook pod (KubeSpawner's image_pull_secrets), and
        puts them on the namespace's ServiceAccounts, so task, TensorBoard and serving pods
        pull with them too.  The chart sets it from its top-level imagePullSecrets.""",
    ).tag(config=True)

    start_timeout = Int(
        300,
        help="""Seconds a notebook server may take to start (KubeSpawner's start_timeout),
        pulling its image included: a multi-GB notebook image on a fresh node takes minutes.""",
    ).tag(config=True)

    delete_pvc = Bool(
        False,
        help="""Delete a user's home volume (its PersistentVolumeClaim) when the user is
        deleted from the hub -- by an admin, or by the idle culler with cull.users.  The files
        are then gone for good when the StorageClass's reclaimPolicy is Delete (the usual
        default).  False: homes outlive their users; delete them by hand.""",
    ).tag(config=True)

    copy_secrets = List(
        Unicode(),
        default_value=[],
        help="""Names of Secrets in the hub's namespace that the hub copies into every user
        namespace at each spawn (e.g. object-storage credentials, so a launch's
        --credentials-secret NAME finds them).  Users can read them: copy only what every
        user may hold.""",
    ).tag(config=True)

    service_account_annotations = Dict(
        value_trait=Unicode(),
        default_value={},
        help="""Annotations of the ServiceAccounts of every user namespace (the notebook's and
        'default', which task, TensorBoard and serving pods run as), for workload identity:
        e.g. {'eks.amazonaws.com/role-arn': 'arn:aws:iam::...'} (EKS IRSA) or
        {'iam.gke.io/gcp-service-account': 'lab@project.iam.gserviceaccount.com'} (GKE).""",
    ).tag(config=True)

    # --- lifecycle --------------------------------------------------------------
    stop_clusters_on_stop = Bool(
        True,
        help="""When the hub stops or culls a user's server, stop that user's running
        TensorFlow clusters too, except detached ones (they end by their TTL,
        ``detached_ttl``) and served models.  Logs and volumes are kept.""",
    ).tag(config=True)

    cluster_label_selector = Unicode(
        "app.kubernetes.io/managed-by=tfk8s",
        help="""Label selector of the objects the extension's Kubernetes backend
        creates for TensorFlow clusters; used to stop them when the server stops.""",
    ).tag(config=True)

    @validate("quota", "default_limits", "default_requests", "max_limits")
    def _valid_quantities(self, proposal: Any) -> dict[str, str]:
        return _check_quantities(proposal.trait.name, proposal.value)

    @validate("start_timeout")
    def _valid_start_timeout(self, proposal: Any) -> int:
        if not 1 <= proposal.value <= 86400:
            raise TraitError(
                f"LabSettings.start_timeout = {proposal.value!r} is out of range: give seconds "
                "from 1 to 86400 (300 lets a fresh node pull the notebook image)."
            )
        return proposal.value

    @validate("image_pull_secrets", "copy_secrets")
    def _valid_secret_names(self, proposal: Any) -> list[str]:
        for name in proposal.value:
            if not DNS_SUBDOMAIN.match(name) or len(name) > 253:
                raise TraitError(
                    f"LabSettings.{proposal.trait.name} names {name!r}, which is not a valid "
                    "Secret name: use lowercase letters, digits, '-' and '.'."
                )
        return list(proposal.value)

    @validate("egress_allow_rules")
    def _known_rules(self, proposal: Any) -> dict[str, bool]:
        unknown = sorted(set(proposal.value) - set(EGRESS_ALLOW_RULES))
        if unknown:
            raise TraitError(
                f"LabSettings.egress_allow_rules has no rule {unknown[0]!r}: use "
                f"{', '.join(EGRESS_ALLOW_RULES)}."
            )
        return {**EGRESS_ALLOW_RULES, **proposal.value}

    @observe("allow_internet")
    def _deprecated_allow_internet(self, change: Any) -> None:
        if change.new is not None:
            warnings.warn(
                "LabSettings.allow_internet is deprecated: set "
                f"egress_allow_rules = {{'nonPrivateIPs': {change.new}}} instead.",
                DeprecationWarning,
                stacklevel=2,
            )

    @validate("service_account", "role_name")
    def _valid_name(self, proposal: Any) -> str:
        value = proposal.value
        if not DNS_LABEL.match(value) or len(value) > 63:
            raise TraitError(
                f"LabSettings.{proposal.trait.name} = {value!r} is not a valid Kubernetes name: "
                "use lowercase letters, digits and '-', at most 63 characters."
            )
        return value

    def extension_environment(self) -> dict[str, str]:
        """Environment variables that configure the extension in every notebook.

        One per option with a ``hub_trait``, plus ``TF_USE_LEGACY_KERAS=1``
        with legacy Keras: TensorFlow reads it at the notebook's own first
        ``tf.keras``.  ``extra_environment`` comes last and wins.
        """
        env = {o.env: o.to_env(getattr(self, o.hub_trait)) for o in options.hub_options()
               if getattr(self, o.hub_trait) is not None}  # None: not set, the built-in rules
        if self.legacy_keras:
            env["TF_USE_LEGACY_KERAS"] = "1"
        env.update(self.extra_environment)
        return env


def load_values_file(config: Config, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Read the chart's values file and copy its ``lab`` settings into ``config.LabSettings``.

    The file (``$TFK8S_HUB_VALUES`` unless ``path`` is given) is JSON:
    ``{"lab": {<LabSettings trait>: value}, "hub": {...}}``; the ``hub`` part
    is for :func:`tfk8s_hub.hub.configure_hub`.  Returns the whole document
    (empty when there is no file).  An unknown lab setting is an error naming
    it, so a typo is never silently ignored.
    """
    path = path or os.environ.get(VALUES_ENV)
    if not path or not Path(path).exists():
        return {}
    values = json.loads(Path(path).read_text(encoding="utf-8"))
    known = set(LabSettings.class_traits(config=True))
    for key, value in values.get("lab", {}).items():
        if key not in known:
            raise ValueError(
                f"unknown lab setting {key!r} in {path}: use one of {', '.join(sorted(known))}."
            )
        config.LabSettings[key] = value
    return values
