"""Pure manifest builders: ``(ClusterSpec, K8sSettings)`` → Kubernetes objects as dicts.

No I/O and no clock: the same spec and settings always give the same
manifests, which is what ``%tfcluster render`` prints and what the tests
compare against literal dicts.

Per cluster (N tasks):

* the **root** ConfigMap ``<cluster>`` — the training script and the spec
  JSON (the record ``list``/``status`` read after a kernel restart); every
  other object has an ownerReference to it, so deleting it cascades;
* two **PVCs** ``<cluster>-data`` / ``<cluster>-log`` (ReadWriteMany) unless
  the spec names existing claims;
* one **JobSet** running every task (:mod:`.jobset`; it builds its pod
  templates from :func:`pod_spec` here);
* on request, a TensorBoard **Deployment** + **Service** reading ``/log``.

:func:`~.jobset.cluster_manifests` lists them in creation order.

No NetworkPolicy: policies are additive, so one selecting a cluster's pods
cannot narrow what the namespace's isolation policy (the hub's bootstrap,
owned by the administrator) already allows -- every pod of the user's own
namespace, which is the user.  The user's Role has no NetworkPolicy verbs,
so that policy is not theirs to delete either.

Labels: every object carries the recommended ``app.kubernetes.io/*`` set
(what generic tools group by) and the project's own ``tfk8s.io/*`` labels
(what this backend selects by; :data:`LABEL_PREFIX`, one constant).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from ...errors import SpecError
from ...spec import ClusterSpec, Task
from ...taskenv import quiet_env
from .settings import K8sSettings, label_value

Manifest = dict[str, Any]

LABEL_PREFIX = "tfk8s.io/"
CLUSTER_LABEL = LABEL_PREFIX + "cluster"
COMPONENT_LABEL = LABEL_PREFIX + "component"
ROLE_LABEL = LABEL_PREFIX + "role"
USER_LABEL = LABEL_PREFIX + "user"
MANAGED_BY = {"app.kubernetes.io/managed-by": "tfk8s"}
#: The recommended labels' fixed part: which application, and the whole it belongs to.
APP_LABELS = {"app.kubernetes.io/name": "tfk8s", "app.kubernetes.io/part-of": "tfk8s-lab"}
#: Annotations on the root object and pods.
OWNER_ANNOTATION = LABEL_PREFIX + "owner"
STOPPED_ANNOTATION = LABEL_PREFIX + "stopped"

#: Mount points inside every task container.
DATA_MOUNT = "/data"
LOG_MOUNT = "/log"
SCRIPT_DIR = "/etc/tfk8s"
SCRIPT_KEY = "script.py"
SPEC_KEY = "spec.json"
READY_FILE = "/tmp/tfk8s-ready"
CONTAINER = "tensorflow"
#: JobSet's label on its pods: which restart of the JobSet they belong to (0: the first run).
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"


def object_labels(spec: ClusterSpec, settings: K8sSettings, component: str) -> dict[str, str]:
    """The labels every object of the cluster carries."""
    return {
        **MANAGED_BY,
        **APP_LABELS,
        "app.kubernetes.io/instance": spec.name,
        "app.kubernetes.io/component": component,
        CLUSTER_LABEL: spec.name,
        COMPONENT_LABEL: component,
        USER_LABEL: label_value(spec.owner or settings.user) or "unknown",
    }


#: Annotations on the root object.
DETACHED_ANNOTATION = LABEL_PREFIX + "detached"


def selector(name: str | None, component: str | None = None, user: str | None = None) -> str:
    """A label selector for the objects tfk8s manages: of cluster ``name`` (None: every
    cluster), of one ``component`` (``root``, ``task``...), of one ``user``."""
    parts = [f"{key}={value}" for key, value in MANAGED_BY.items()]
    for key, value in ((CLUSTER_LABEL, name), (COMPONENT_LABEL, component), (USER_LABEL, user)):
        if value:
            parts.append(f"{key}={value}")
    return ",".join(parts)


def _meta(spec: ClusterSpec, settings: K8sSettings, name: str, component: str) -> Manifest:
    return {
        "name": name,
        "namespace": settings.namespace,
        "labels": object_labels(spec, settings, component),
    }


def log_claim_name(spec: ClusterSpec) -> str:
    """The claim mounted at ``/log``: the user's, or ``<cluster>-log``."""
    return spec.log_claim or f"{spec.name}-log"


def data_claim_name(spec: ClusterSpec) -> str:
    """The claim mounted at ``/data``: the user's, or ``<cluster>-data``."""
    return spec.data_claim or f"{spec.name}-data"


#: What the API server accepts in one ConfigMap's data (``ValidateConfigMap``: the sum of
#: the values' bytes; more is a 422 "Too long: must have at most 1048576 bytes").
MAX_CONFIGMAP_DATA = 1024 * 1024


def _check_size(spec: ClusterSpec, data: dict[str, str]) -> None:
    size = sum(len(value.encode("utf-8")) for value in data.values())
    if size > MAX_CONFIGMAP_DATA:
        raise SpecError(
            f"cluster {spec.name!r}: its script and spec are {size} bytes, over the "
            f"{MAX_CONFIGMAP_DATA} bytes Kubernetes accepts in the ConfigMap that carries "
            "them: keep large data and code in files on the /data volume (or in the image) "
            "and load them from a small script."
        )


def root_configmap(spec: ClusterSpec, settings: K8sSettings) -> Manifest:
    """The root object: the script and the spec (without the script) as JSON."""
    record = spec.to_dict()
    record.pop("script", None)
    record["files"] = sorted(spec.files)  # their text is in keys of their own
    data = {SPEC_KEY: json.dumps(record, sort_keys=True)}
    if spec.script is not None:
        data[SCRIPT_KEY] = spec.script
    data.update(spec.files)
    _check_size(spec, data)
    meta = _meta(spec, settings, spec.name, "root")
    meta["annotations"] = {OWNER_ANNOTATION: spec.owner or settings.user}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def claims(spec: ClusterSpec, settings: K8sSettings) -> list[Manifest]:
    """The PVCs to create: ``/data`` and ``/log``, except those the spec names."""
    out = []
    for component, given, size in (
        ("data", spec.data_claim, spec.data_size or settings.data_size),
        ("log", spec.log_claim, spec.log_size or settings.log_size),
    ):
        if given:
            continue
        claim_spec: Manifest = {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": size}},
        }
        # No class named: the cluster's default class provisions it.  storageClassName ""
        # would ask for a volume of no class, which only a pre-made PV could satisfy.
        if settings.storage_class:
            claim_spec["storageClassName"] = settings.storage_class
        out.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": _meta(spec, settings, f"{spec.name}-{component}", component),
                "spec": claim_spec,
            }
        )
    return out


def _pod_security(settings: K8sSettings) -> Manifest:
    return {
        "runAsNonRoot": True,
        "runAsUser": settings.run_as_user,
        "runAsGroup": settings.run_as_user,
        "fsGroup": settings.fs_group,
        # Without it the kubelet re-chowns every file of /data and /log at each mount:
        # minutes on a large shared volume.  Root of the volume right: nothing to do.
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pull_policy(settings: K8sSettings) -> Manifest:
    """A container's ``imagePullPolicy``: none (Kubernetes' default) unless the settings name one."""
    return {"imagePullPolicy": settings.image_pull_policy} if settings.image_pull_policy else {}


_CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def _resources(spec: ClusterSpec, role: str) -> Manifest:
    """Requests for CPU and memory; limits for memory and GPUs.

    No CPU limit: throttling a TensorFlow task slows every peer waiting on
    it, while memory over-use must end in a (retryable) OOM kill.
    """
    res = spec.resources_for(role)
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if res.cpu:
        requests["cpu"] = str(res.cpu)
    if res.memory:
        requests["memory"] = limits["memory"] = str(res.memory)
    if res.gpus:
        limits["nvidia.com/gpu"] = str(res.gpus)
    out: Manifest = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _log_mount(spec: ClusterSpec) -> Manifest:
    return {"name": "log", "mountPath": LOG_MOUNT}


def log_dir(spec: ClusterSpec) -> str:
    """The cluster's log directory in its pods: ``/log``, or ``/log/<cluster>`` on a
    claim the user shares between clusters.

    Not a ``subPath`` mount: the kubelet would create that directory as root,
    and tasks run as non-root; the task creates its own directory instead.
    """
    return f"{LOG_MOUNT}/{spec.name}" if spec.log_claim else LOG_MOUNT


def task_image(spec: ClusterSpec, settings: K8sSettings, role: str) -> str:
    """The image of ``role``'s tasks: the spec's; else the GPU image when the role asks
    for GPUs (the CPU image's TensorFlow cannot use them); else the default."""
    if spec.image:
        return spec.image
    if spec.resources_for(role).gpus:
        if not settings.gpu_image:
            raise SpecError(
                f"cluster {spec.name!r}: --gpus asks for GPUs for {role} tasks but no GPU task "
                "image is configured: name an image with "
                "TensorFlow for CUDA with --image, or ask your administrator to set "
                "lab.task_gpu_image."
            )
        return settings.gpu_image
    return settings.image


def role_env(spec: ClusterSpec, settings: K8sSettings, role: str) -> dict[str, str]:
    """The environment every task of ``role`` shares (its identity aside)."""
    env = {
        "TFK8S_CLUSTER": spec.name,
        "TFK8S_LOG_DIR": log_dir(spec),
        "TFK8S_DATA_DIR": DATA_MOUNT,
        "TFK8S_CHECKPOINT_DIR": f"{log_dir(spec)}/checkpoints",
        "TFK8S_READY_FILE": READY_FILE,
        "HOME": "/tmp",
        "PYTHONUNBUFFERED": "1",
    }
    if spec.runs_script(Task(role, 0)):
        env["TFK8S_SCRIPT"] = f"{SCRIPT_DIR}/{SCRIPT_KEY}"
        # Sibling files (--file) are mounted beside the script: its folder is importable.
        env["TFK8S_SCRIPT_DIR"] = SCRIPT_DIR
    if spec.legacy_keras:
        env["TF_USE_LEGACY_KERAS"] = "1"
    if settings.quiet:
        env.update(quiet_env())
    env.update(spec.env)
    return env


def task_command(spec: ClusterSpec, task: Task | None) -> list[str]:
    """The container command: the task runtime, its output copied to ``<log dir>/tasks/<task>.log``.

    No shell: :mod:`.logcopy` runs the runtime as a child and tees its output.
    ``task=None`` (a per-role template) leaves ``{task}`` in the path for
    the pod to fill in from its own identity.
    """
    return [
        "python",
        "-m",
        "tfk8s_magics.backends.kubernetes.logcopy",
        f"{log_dir(spec)}/tasks/{task.name if task else '{task}'}.log",
        "--",
        "python",
        "-m",
        "tfk8s_magics.runtime.task",
    ]


def _storage(spec: ClusterSpec, runs_script: bool) -> tuple[list[Manifest], list[Manifest]]:
    """A task container's volume mounts and its pod's volumes (the script only where it runs)."""
    mounts: list[Manifest] = [
        {"name": "data", "mountPath": DATA_MOUNT},
        _log_mount(spec),
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes: list[Manifest] = [
        {"name": "data", "persistentVolumeClaim": {"claimName": data_claim_name(spec)}},
        {"name": "log", "persistentVolumeClaim": {"claimName": log_claim_name(spec)}},
        {"name": "tmp", "emptyDir": {}},
    ]
    if runs_script:
        mounts.append({"name": "script", "mountPath": SCRIPT_DIR, "readOnly": True})
        volumes.append(
            {
                "name": "script",
                "configMap": {
                    "name": spec.name,
                    "items": [{"key": k, "path": k} for k in (SCRIPT_KEY, *sorted(spec.files))],
                },
            }
        )
    return mounts, volumes


def pod_spec(
    spec: ClusterSpec, settings: K8sSettings, role: str, env: list[Manifest], task: Task | None
) -> Manifest:
    """The pod spec every task of ``role`` runs with ``env`` (the identity is the caller's).

    The JobSet's per-role pod templates (:mod:`.jobset`) pass ``task=None``:
    each pod learns which task it is when it starts.
    """
    mounts, volumes = _storage(spec, spec.runs_script(Task(role, 0)))
    container: Manifest = {
        "name": CONTAINER,
        "image": task_image(spec, settings, role),
        **pull_policy(settings),
        "command": task_command(spec, task),
        "workingDir": DATA_MOUNT,
        "env": env,
        "ports": [{"name": "grpc", "containerPort": settings.port, "protocol": "TCP"}],
        "readinessProbe": {
            "exec": {"command": ["test", "-f", READY_FILE]},
            "periodSeconds": 2,
            "failureThreshold": 1,
        },
        "securityContext": copy.deepcopy(_CONTAINER_SECURITY),
        "volumeMounts": mounts,
    }
    resources = _resources(spec, role)
    if resources:
        container["resources"] = resources
    out: Manifest = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": _pod_security(settings),
        "containers": [container],
        "volumes": volumes,
    }
    if spec.node_selector:
        out["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        out["tolerations"] = [dict(t) for t in spec.tolerations]
    return out


def tensorboard_name(spec: ClusterSpec) -> str:
    """The name of the TensorBoard Deployment and Service."""
    return f"{spec.name}-tensorboard"


#: The environment variable and Secret key holding the token TensorBoard's requests must carry.
TENSORBOARD_TOKEN_ENV = "TFK8S_TENSORBOARD_TOKEN"
TENSORBOARD_TOKEN_KEY = "token"
#: The path TensorBoard's guard answers without a token (the readiness probe's): it reveals nothing.
TENSORBOARD_READY_PATH = "/tfk8s-ready"


def tensorboard_secret(spec: ClusterSpec, settings: K8sSettings, name: str, token: str) -> Manifest:
    """The Secret holding the token TensorBoard asks of every request (a ``Bearer`` header that
    only its owner's notebook server adds: :mod:`tfk8s_magics.sidebar.tbproxy`)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(spec, settings, name, "tensorboard"),
        "type": "Opaque",
        "stringData": {TENSORBOARD_TOKEN_KEY: token},
    }


def tensorboard_deployment(spec: ClusterSpec, settings: K8sSettings, secret: str | None = None) -> Manifest:
    """A TensorBoard reading the cluster's ``/log`` volume (read-only), answering only requests
    that carry the token of the Secret ``secret`` (default: named like the Deployment)."""
    labels = object_labels(spec, settings, "tensorboard")
    match = {CLUSTER_LABEL: spec.name, COMPONENT_LABEL: "tensorboard"}
    port = settings.tensorboard_port
    token_ref = {"name": secret or tensorboard_name(spec), "key": TENSORBOARD_TOKEN_KEY}
    container = {
        "name": "tensorboard",
        "image": spec.image or settings.image,
        **pull_policy(settings),
        # "0": no owner process to live with (the local backend's runner ties it to a kernel).
        "command": ["python", "-m", "tfk8s_magics.runtime.tensorboard", "0",
                    "--logdir", log_dir(spec), "--bind_all", "--port", str(port)],
        "env": [
            {"name": "HOME", "value": "/tmp"},
            {"name": TENSORBOARD_TOKEN_ENV, "valueFrom": {"secretKeyRef": token_ref}},
        ],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": TENSORBOARD_READY_PATH, "port": port}, "periodSeconds": 1},
        "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": copy.deepcopy(_CONTAINER_SECURITY),
        "volumeMounts": [
            {**_log_mount(spec), "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(spec, settings, tensorboard_name(spec), "tensorboard"),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": match},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": _pod_security(settings),
                    "containers": [container],
                    "volumes": [
                        {
                            "name": "log",
                            "persistentVolumeClaim": {
                                "claimName": log_claim_name(spec),
                                "readOnly": True,
                            },
                        },
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }


def tensorboard_service(spec: ClusterSpec, settings: K8sSettings) -> Manifest:
    """The ClusterIP Service in front of TensorBoard (reached through jupyter-server-proxy)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(spec, settings, tensorboard_name(spec), "tensorboard"),
        "spec": {
            "selector": {CLUSTER_LABEL: spec.name, COMPONENT_LABEL: "tensorboard"},
            "ports": [
                {
                    "name": "http",
                    "port": settings.tensorboard_port,
                    "targetPort": "http",
                    "protocol": "TCP",
                }
            ],
        },
    }


def tensorboard_manifests(
    spec: ClusterSpec, settings: K8sSettings, secret: str | None = None
) -> list[Manifest]:
    """TensorBoard's Deployment then Service (its token's Secret ``secret`` is made apart:
    :func:`tensorboard_secret`, with a token only the backend draws)."""
    return [tensorboard_deployment(spec, settings, secret), tensorboard_service(spec, settings)]


def owner_reference(root: Manifest) -> Manifest:
    """An ownerReference to the created root object (it needs the uid the API assigned)."""
    meta = root["metadata"]
    return {
        "apiVersion": root["apiVersion"],
        "kind": root["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "blockOwnerDeletion": True,
    }


def with_owner(manifest: Manifest, owner: Manifest) -> Manifest:
    """A copy of ``manifest`` owned by ``owner`` (an :func:`owner_reference`)."""
    out = copy.deepcopy(manifest)
    out["metadata"]["ownerReferences"] = [dict(owner)]
    return out
