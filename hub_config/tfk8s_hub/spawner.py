"""The Kubernetes profile: KubeSpawner settings and hooks computed from :class:`LabSettings`.

* :func:`kubespawner_config` -- the KubeSpawner traits (pure).
* :class:`Applier` -- server-side apply of bootstrap objects (its own field
  manager: what administrators add stays) through
  Kubernetes API objects (KubeSpawner's own ``kubernetes_asyncio`` clients
  in the hub; any object with the same generated method names in tests).
* :func:`make_modify_pod_hook` -- applies the bootstrap objects to the user's
  namespace just before the pod is created.  KubeSpawner has created the
  namespace (and home PVC) by then, and the pod names the ServiceAccount
  made here, so this is the one hook that runs at the right moment.
* :func:`make_post_stop_hook` -- stops the user's TensorFlow clusters when
  the hub stops or culls the server.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Iterable
from typing import Any

from .bootstrap import (
    KUEUE_GROUP,
    KUEUE_VERSIONS,
    ApiServer,
    BootstrapSpec,
    Manifest,
    bootstrap_objects,
    copied_secret,
    namespace_labels,
    secrets_to_copy,
    with_pull_secrets_of,
)
from .settings import LabSettings

log = logging.getLogger("tfk8s_hub")

#: kind -> (API class, the snake_case name in ``patch_namespaced_<name>``).
KINDS: dict[str, tuple[str, str]] = {
    "ServiceAccount": ("CoreV1Api", "service_account"),
    "Secret": ("CoreV1Api", "secret"),
    "ResourceQuota": ("CoreV1Api", "resource_quota"),
    "LimitRange": ("CoreV1Api", "limit_range"),
    "Role": ("RbacAuthorizationV1Api", "role"),
    "RoleBinding": ("RbacAuthorizationV1Api", "role_binding"),
    "NetworkPolicy": ("NetworkingV1Api", "network_policy"),
}
#: Custom resources the bootstrap applies: kind -> plural.
CUSTOM_KINDS: dict[str, str] = {"LocalQueue": "localqueues"}

#: The field manager of everything the hub applies in user namespaces (``kubectl get -o yaml
#: --show-managed-fields`` shows it): fields other managers set -- an administrator's
#: annotations, pull secrets, labels -- are theirs, and a spawn leaves them alone.
FIELD_MANAGER = "tfk8s-lab-hub"
APPLY_PATCH = "application/apply-patch+yaml"


def _status(exc: BaseException) -> int | None:
    # kubernetes and kubernetes_asyncio raise distinct ApiException classes
    # with the same shape (and the newer client raises subclasses: ConflictException, ...).
    is_api = any(c.__name__ == "ApiException" for c in type(exc).__mro__)
    return getattr(exc, "status", None) if is_api else None


async def _call(method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    result = method(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


class BootstrapError(RuntimeError):
    """What the administrator must fix before a user's server can start (one sentence)."""


class Applier:
    """Server-side apply of objects in a namespace, as :data:`FIELD_MANAGER`.

    ``api`` maps an API class name (``"CoreV1Api"``) to an API object; the
    object's methods may be coroutines (``kubernetes_asyncio``) or plain
    functions (``kubernetes``).
    """

    def __init__(self, api: Callable[[str], Any]) -> None:
        self.api = api

    async def apply(self, obj: Manifest) -> str:
        """Apply ``obj``; return ``"applied"``, or ``"recreated"`` (a RoleBinding whose roleRef
        changed: it cannot be changed in place)."""
        kind = obj["kind"]
        name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
        apply = {"field_manager": FIELD_MANAGER, "force": True, "_content_type": APPLY_PATCH}
        if kind in CUSTOM_KINDS:
            group, version = obj["apiVersion"].split("/")
            await _call(self.api("CustomObjectsApi").patch_namespaced_custom_object,
                        group, version, namespace, CUSTOM_KINDS[kind], name, obj, **apply)
            return "applied"
        if kind not in KINDS:
            raise ValueError(f"cannot apply a {kind}: the bootstrap applies "
                             f"{', '.join([*KINDS, *CUSTOM_KINDS])}.")
        api_name, noun = KINDS[kind]
        api = self.api(api_name)
        try:
            await _call(getattr(api, f"patch_namespaced_{noun}"), name, namespace, obj, **apply)
        except Exception as e:
            # A RoleBinding's roleRef cannot change (422): one made by an older hub binds the
            # per-namespace Role it then made; delete it and bind the chart's ClusterRole.
            if kind != "RoleBinding" or _status(e) != 422:
                raise
            await _call(getattr(api, f"delete_namespaced_{noun}"), name, namespace)
            await _call(getattr(api, f"patch_namespaced_{noun}"), name, namespace, obj, **apply)
            return "recreated"
        return "applied"

    async def read(self, kind: str, name: str, namespace: str) -> Manifest | None:
        """The live object as the API's JSON (None: it does not exist)."""
        api_name, noun = KINDS[kind]
        api = self.api(api_name)
        try:
            found = await _call(getattr(api, f"read_namespaced_{noun}"), name, namespace)
        except Exception as e:
            if _status(e) == 404:
                return None
            raise
        if isinstance(found, dict):
            return found
        return api.api_client.sanitize_for_serialization(found)

    async def apply_all(self, objs: Iterable[Manifest]) -> list[tuple[str, str, str]]:
        """Apply ``objs`` all at once; return ``(kind, name, outcome)`` for each, in their order.

        None of them needs another to exist first (a binding may name a ServiceAccount before it
        exists; the pod that needs them all is created after this returns), so the spawn waits
        for the slowest apply, not for their sum (bench/hub_scale.py: 5 applies one after the
        other took 3 s of each spawn with 100 spawning). The first error is raised.
        """
        objs = list(objs)
        outcomes = await asyncio.gather(*(self.apply(obj) for obj in objs))
        return [(o["kind"], o["metadata"]["name"], out) for o, out in zip(objs, outcomes, strict=True)]


async def namespace_objects(spec: BootstrapSpec, namespace: str, applier: Applier,
                            api_server: ApiServer | None = None) -> list[Manifest]:
    """What the bootstrap applies in ``namespace``, read-dependent parts resolved.

    The Secrets to copy are read from the hub's namespace (each must exist: a spawn that
    would pull with a missing Secret fails here, with its name); the ServiceAccounts keep
    the pull secrets they already name; a LocalQueue takes the Kueue version the cluster
    serves (:func:`kueue_version`).
    """
    copies = []
    for name in secrets_to_copy(spec):
        source = await applier.read("Secret", name, spec.hub_namespace)
        if source is None:
            raise BootstrapError(
                f"Secret {name!r}, which the lab's settings name (imagePullSecrets or "
                f"lab.copy_secrets), does not exist in the hub's namespace {spec.hub_namespace!r}: "
                "create it there, or remove it from the values, then start the server again."
            )
        copies.append(copied_secret(source, namespace))
    out: list[Manifest] = [*copies]
    for obj in bootstrap_objects(spec, namespace, api_server):
        if obj["kind"] == "ServiceAccount" and obj.get("imagePullSecrets"):
            obj = with_pull_secrets_of(obj, await applier.read("ServiceAccount",
                                                              obj["metadata"]["name"], namespace))
        if obj["kind"] == "LocalQueue":
            version = await kueue_version(applier)
            obj = {**obj, "apiVersion": f"{KUEUE_GROUP}/{version}"}
        out.append(obj)
    return out


async def kueue_version(applier: Applier) -> str:
    """The newest Kueue API version the cluster serves (:data:`KUEUE_VERSIONS`)."""
    custom = applier.api("CustomObjectsApi")
    for version in KUEUE_VERSIONS:
        try:
            await _call(custom.get_api_resources, KUEUE_GROUP, version)
        except Exception as e:
            if _status(e) == 404:
                continue
            raise
        return version
    raise BootstrapError(
        "lab.queue names a Kueue ClusterQueue but this cluster serves no Kueue API "
        f"({KUEUE_GROUP} {' or '.join(KUEUE_VERSIONS)}): install Kueue, or unset lab.queue."
    )


def kubespawner_api(api_name: str) -> Any:
    """KubeSpawner's shared ``kubernetes_asyncio`` client (configured by KubeSpawner itself)."""
    from kubespawner.clients import shared_client

    return shared_client(api_name)


#: Where the API server's Service and its EndpointSlices are (every cluster has them).
API_SERVICE = ("default", "kubernetes")


def _plain(obj: Any) -> Any:
    """A client model (either client's, any version), or dicts and lists of them, as the API's
    JSON: the builders read the API's camelCase names. (The sync client's own serializer turns
    a model it did not generate into ``to_dict()``'s snake_case keys.)"""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    names, types = getattr(obj, "attribute_map", None), getattr(obj, "openapi_types", None)
    if isinstance(names, dict) and isinstance(types, dict):
        return {names[a]: _plain(getattr(obj, a)) for a in types if getattr(obj, a) is not None}
    return obj


async def read_api_server(api: Callable[[str], Any]) -> ApiServer:
    """Where pods reach the API server: the ``kubernetes`` Service and its endpoints.

    Raises ``RuntimeError`` naming the setting to use when the hub may not
    read them or finds no address (its NetworkPolicy rule would be empty).
    """
    namespace, name = API_SERVICE
    try:
        service = await _call(api("CoreV1Api").read_namespaced_service, name, namespace)
        try:
            slices = [await _call(api("DiscoveryV1Api").read_namespaced_endpoint_slice, name, namespace)]
        except Exception as e:
            if _status(e) != 404:  # a control plane without an endpoint reconciler: the Service's address
                raise
            slices = []
    except Exception as e:
        if _status(e) is None:
            raise
        raise RuntimeError(
            f"the hub could not read the Service and EndpointSlice {namespace}/{name} to find "
            f"the Kubernetes API server's addresses (HTTP {_status(e)}): set "
            "LabSettings.api_server_cidrs (the chart's lab.api_server_cidrs) to them."
        ) from e
    found = ApiServer.from_objects(_plain(service), [_plain(x) for x in slices])
    if not found.cidrs:
        raise RuntimeError(
            f"the Service {namespace}/{name} names no address of the Kubernetes API server: set "
            "LabSettings.api_server_cidrs (the chart's lab.api_server_cidrs) to them."
        )
    return found


def make_modify_pod_hook(
    settings: LabSettings, api: Callable[[str], Any] = kubespawner_api
) -> Callable[[Any, Any], Any]:
    """A ``KubeSpawner.modify_pod_hook``: bootstrap the user's namespace, return the pod as is."""
    spec = BootstrapSpec.from_settings(settings)

    async def bootstrap_user_namespace(spawner: Any, pod: Any) -> Any:
        applier = Applier(api)
        # read at each spawn: a control plane's addresses change (managed clusters' upgrades)
        api_server = await read_api_server(api) if spec.discovers_api_server else None
        objs = await namespace_objects(spec, spawner.namespace, applier, api_server)
        done = await applier.apply_all(objs)
        spawner.log.info(
            "tfk8s: bootstrapped namespace %s: %s",
            spawner.namespace,
            ", ".join(f"{kind}/{name} {outcome}" for kind, name, outcome in done),
        )
        return pod

    return bootstrap_user_namespace


#: The label a ``--detach``'ed cluster's JobSet carries (the backend's ``DETACHED_ANNOTATION``).
DETACHED_LABEL = "tfk8s.io/detached"
#: The component label of TF Serving Deployments (the backend's ``serving.COMPONENT``).
SERVING_COMPONENT = "serving"


def stop_selectors(selector: str) -> tuple[str, str]:
    """The label selectors of what a server's stop ends: (Deployments, JobSets).

    Detached clusters and served models are meant to outlive the notebook (the
    "close the laptop" workflow): the JobSets labelled detached and the
    serving Deployments are left alone; a detached run ends by its TTL.
    ``!=`` also selects objects without the label (clusters launched before it).
    """
    return (f"{selector},tfk8s.io/component!={SERVING_COMPONENT}",
            f"{selector},{DETACHED_LABEL}!=true")


async def stop_clusters(api: Callable[[str], Any], namespace: str, selector: str) -> None:
    """Stop the user's attached TensorFlow clusters in ``namespace``: TensorBoards, then JobSets.

    Deleting a cluster's JobSet ends its Jobs and pods (deleting the pods
    alone would have JobSet replace them).  ConfigMaps and volumes are kept:
    the user's logs and records survive; in-graph clusters are owned by the
    notebook pod and go with it.  Detached clusters and served models stay
    (:func:`stop_selectors`).
    """
    apps, custom = api("AppsV1Api"), api("CustomObjectsApi")
    deployments, jobsets = stop_selectors(selector)
    await _call(
        apps.delete_collection_namespaced_deployment,
        namespace,
        label_selector=deployments,
        propagation_policy="Background",
    )
    await _call(
        custom.delete_collection_namespaced_custom_object,
        "jobset.x-k8s.io",
        "v1alpha2",
        namespace,
        "jobsets",
        label_selector=jobsets,
        propagation_policy="Foreground",
    )


def make_post_stop_hook(
    settings: LabSettings, api: Callable[[str], Any] = kubespawner_api
) -> Callable[[Any], Any]:
    """A ``Spawner.post_stop_hook`` stopping the user's clusters (if ``stop_clusters_on_stop``)."""

    async def stop_user_clusters(spawner: Any) -> None:
        if not settings.stop_clusters_on_stop:
            return
        spawner.log.info(
            "tfk8s: stopping TensorFlow clusters in %s (%s)",
            spawner.namespace,
            settings.cluster_label_selector,
        )
        await stop_clusters(api, spawner.namespace, settings.cluster_label_selector)

    return stop_user_clusters


def tensorboard_proxy_url(spawner: Any) -> str:
    """``TENSORBOARD_PROXY_URL`` of a server: TensorBoard through jupyter-server-proxy.

    The URL is under the user's server prefix, so it is behind the hub's
    authentication; ``%PORT%`` is filled in by ``tensorboard.notebook``.
    """
    from jupyterhub.utils import url_path_join

    return url_path_join(spawner.user.server_url(spawner.name), "proxy/%PORT%/")


def kubespawner_config(settings: LabSettings) -> dict[str, Any]:
    """The KubeSpawner traits of the Kubernetes profile, ``{trait: value}`` (hooks excluded)."""
    env: dict[str, Any] = {
        **settings.extension_environment(),
        "TFK8S_NAMESPACE": "{namespace}",
        "TENSORBOARD_PROXY_URL": tensorboard_proxy_url,
    }
    return {
        "enable_user_namespaces": True,
        # KubeSpawner reads {hubnamespace} from the service-account file only; use the
        # setting, so the namespace and the NetworkPolicy's hub namespace always agree.
        "user_namespace_template": settings.user_namespace_template.replace(
            "{hubnamespace}", settings.hub_namespace
        ),
        "user_namespace_labels": {
            **namespace_labels(BootstrapSpec.from_settings(settings)),
            "hub.jupyter.org/username": "{username}",
        },
        "image": settings.notebook_image,
        # The notebook pod meets Pod Security "restricted" (the namespace enforces it):
        # jovyan (1000) in group users (100); the home volume's files belong to group 100
        # (fs_gid, as Zero-to-JupyterHub), re-chowned only when its root is wrong.
        "uid": NOTEBOOK_UID,
        "gid": NOTEBOOK_GID,
        "fs_gid": NOTEBOOK_GID,
        "allow_privilege_escalation": False,
        "pod_security_context": {
            "runAsNonRoot": True,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "container_security_context": {"capabilities": {"drop": ["ALL"]}},
        "service_account": settings.service_account,
        "automount_service_account_token": True,
        "storage_pvc_ensure": True,
        # None, not "": KubeSpawner sends "" as storageClassName "" (no class: the claim
        # stays Pending); None leaves the field out, so the cluster's default class binds it.
        "storage_class": settings.storage_class or None,
        # Culling users (cull.users) or deleting one must not delete their home unless the
        # administrator said so (KubeSpawner's default is True).
        "delete_pvc": settings.delete_pvc,
        "start_timeout": settings.start_timeout,
        # KubeSpawner creates the user's namespace in one request bounded by this (no retry): its
        # default of 3 s failed 5 % of 200 spawns at once on a busy API server (bench/hub_scale.py)
        "k8s_api_request_timeout": K8S_REQUEST_TIMEOUT,
        "image_pull_secrets": [{"name": name} for name in settings.image_pull_secrets],
        "storage_capacity": settings.home_storage_capacity,
        "storage_access_modes": list(settings.home_access_modes),
        "pvc_name_template": "home-{user_server}",
        "volumes": [{"name": "home", "persistentVolumeClaim": {"claimName": "{pvc_name}"}}],
        "volume_mounts": [{"name": "home", "mountPath": settings.home_mount_path}],
        "cpu_limit": _cpu(settings.notebook_cpu_limit),
        "cpu_guarantee": _cpu(settings.notebook_cpu_guarantee),
        "mem_limit": _bytes(settings.notebook_mem_limit),
        "mem_guarantee": _bytes(settings.notebook_mem_guarantee),
        "environment": env,
        "default_url": "/lab",
    }


#: Seconds one Kubernetes API request of KubeSpawner may take: 10 × the API server's SLO for a
#: mutating call (p99 <= 1 s), so the tail of a burst of spawns is not a failed spawn.
K8S_REQUEST_TIMEOUT = 10

#: The notebook image's user (jovyan) and group (users), as in the Jupyter docker stacks.
NOTEBOOK_UID = 1000
NOTEBOOK_GID = 100


def _cpu(quantity: str) -> float:
    # KubeSpawner wants CPUs as a float; settings use Kubernetes quantities.
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


_BYTE_SUFFIXES = {
    **{s: 1000**i for i, s in enumerate(["", "k", "M", "G", "T", "P", "E"])},
    **{s: 1024**i for i, s in enumerate(["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"], start=1)},
}


def _bytes(quantity: str) -> int:
    # KubeSpawner's memory traits read "4G" as 4 * 1024**3 and reject "4Gi":
    # hand them plain bytes, computed the Kubernetes way.
    number = quantity.rstrip("kKMGTPEi")
    suffix = quantity[len(number) :]
    if suffix not in _BYTE_SUFFIXES:
        raise ValueError(f"{quantity!r} is not a memory quantity: use e.g. '512Mi' or '4Gi'.")
    return int(float(number) * _BYTE_SUFFIXES[suffix])


def configure_kubernetes(c: Any, settings: LabSettings) -> None:
    """Apply the Kubernetes profile to a JupyterHub config object ``c``."""
    c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"
    for trait, value in kubespawner_config(settings).items():
        setattr(c.KubeSpawner, trait, value)
    c.KubeSpawner.modify_pod_hook = make_modify_pod_hook(settings)
    c.KubeSpawner.post_stop_hook = make_post_stop_hook(settings)
