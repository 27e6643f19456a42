"""Pure builders for object storage on Kubernetes: the ``sync`` and ``backup`` steps.

A cluster whose ``--data-dir`` is a URL and asks for ``--data-sync`` gets a
**sync** step; one with ``--backup URL`` gets a **backup** step.  Each is one
more replicated Job of the cluster's JobSet (:mod:`.jobset`), one pod, the
task image, the restricted Pod Security profile:

``sync`` (first)
    an **init container** ``fetch`` runs ``/opt/storage/bin/python -m
    tfk8s_magics.storage fetch URL /data`` (the task image's storage venv,
    :data:`STORAGE_PYTHON`) into the data claim; then a container ``synced`` prints
    what landed and exits 0.  The JobSet starts ``InOrder``: a replicated Job
    counts as started once its pods are *ready or done* (JobSet's
    ``allReplicasStarted``), and a pod is not ready while an init container
    runs.  So no task pod exists before the data is in ``/data`` — once per
    cluster, not per task — with every JobSet version the backend supports
    (v0.6 on; ``dependsOn`` needs v0.8 and is exclusive with ``InOrder``).
``backup`` (last)
    a container ``backup`` waits until every task that decides success has
    exited 0 in this run (each one's PID 1, :mod:`.logcopy`, leaves a marker
    file per JobSet restart attempt on the log claim), then runs
    ``python -m tfk8s_magics.storage upload`` for ``<log dir>/checkpoints``
    and ``<log dir>/models``.  It is one of the ``successPolicy`` targets, so
    the JobSet succeeds only once the upload did; a failed upload exits
    non-zero and fails the cluster through the same ``podFailurePolicy`` rule
    as a task's own error: visible, never a silent success.  Ended early
    (stop, failure, restart: SIGTERM) it uploads what exists, best effort,
    within :data:`BACKUP_GRACE` seconds.

**Credentials** come from the Secret the user names
(``--credentials-secret``): ``envFrom.secretRef`` — its keys
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``...)
become the environment of exactly the containers that read or write the
storage: ``fetch``, ``backup``, and the task containers only when the script
streams ``TFK8S_DATA_URL`` itself.  Only the Secret's *name* is in the
JobSet, the spec and the rendered YAML; the kubelet resolves it.
"""

from __future__ import annotations

import copy
from typing import Any

from ...errors import SpecError
from ...spec import IN_GRAPH, ClusterSpec
from . import manifests as m
from .settings import K8sSettings

Manifest = dict[str, Any]

SYNC = "sync"
BACKUP = "backup"
#: The steps' replicated Job names (never a task role).
STEPS = (SYNC, BACKUP)
FETCH_CONTAINER = "fetch"
SYNCED_CONTAINER = "synced"
BACKUP_CONTAINER = BACKUP
#: What the backup uploads: these folders of the log dir, each to ``<backup URL>/<folder>``.
BACKUP_FOLDERS = ("checkpoints", "models")
#: Seconds an ended backup step has to upload what exists (SIGTERM → SIGKILL).
BACKUP_GRACE = 120
#: The env var a task pod learns its JobSet restart attempt from (JobSet's pod label).
ATTEMPT_ENV = "TFK8S_RESTART_ATTEMPT"
#: The env var naming the file :mod:`.logcopy` creates when the task exits 0.
DONE_ENV = "TFK8S_DONE_FILE"
#: A step needs little: Python and fsspec moving bytes.
STEP_RESOURCES = {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
_STEPS_MODULE = "tfk8s_magics.backends.kubernetes.steps"
#: The task image's storage venv (images/task/Dockerfile): fsspec, s3fs, aiohttp and the lab's
#: code, without the kubernetes client (whose python-dateutil>=3 botocore refuses) or TensorFlow.
#: Every step container runs it, so ``sys.executable`` in :mod:`.steps` is it too.
STORAGE_PYTHON = "/opt/storage/bin/python"


def syncs(spec: ClusterSpec) -> bool:
    """Whether ``--data-dir URL`` is copied into ``/data`` before the tasks start."""
    return bool(spec.data_url and spec.data_sync)


def streams(spec: ClusterSpec) -> bool:
    """Whether the script reads ``--data-dir URL`` itself (``TFK8S_DATA_URL``)."""
    return bool(spec.data_url and not spec.data_sync)


def backs_up(spec: ClusterSpec) -> bool:
    """Whether checkpoints and models are uploaded after success."""
    if spec.backup_url and spec.mode == IN_GRAPH:
        raise SpecError(
            f"cluster {spec.name!r}: on Kubernetes --backup {spec.backup_url} needs a between-graph "
            "cluster (an in-graph one never succeeds by itself: this kernel is its chief and "
            "writes the checkpoints); drop --backup and upload them from the notebook."
        )
    return bool(spec.backup_url)


def steps(spec: ClusterSpec) -> tuple[list[str], list[str]]:
    """The steps before the tasks and after them: ``([sync]?, [backup]?)``."""
    return ([SYNC] if syncs(spec) else []), ([BACKUP] if backs_up(spec) else [])


def credentials(spec: ClusterSpec) -> list[Manifest]:
    """``envFrom`` of a container that uses the storage: the user's Secret, by name only."""
    return secret_env_from(spec.credentials_secret)


def secret_env_from(name: str | None) -> list[Manifest]:
    """``envFrom`` naming Secret ``name`` (its keys become the environment); nothing without one."""
    return [{"secretRef": {"name": name}}] if name else []


def done_dir(spec: ClusterSpec) -> str:
    """Where the success-deciding tasks leave a marker per restart attempt (log claim)."""
    return f"{m.log_dir(spec)}/.tfk8s/done/$({ATTEMPT_ENV})"


def attempt_env() -> Manifest:
    """The pod's JobSet restart attempt, from the label JobSet puts on it."""
    return {"name": ATTEMPT_ENV, "valueFrom": {"fieldRef": {
        "fieldPath": f"metadata.labels['{m.RESTART_ATTEMPT_LABEL}']"}}}


def task_env(spec: ClusterSpec, role: str, deciding: bool) -> list[Manifest]:
    """What a task container of ``role`` gets besides its usual env (``deciding``: a success role)."""
    out: list[Manifest] = []
    if streams(spec) and role != "ps":
        out.append({"name": "TFK8S_DATA_URL", "value": str(spec.data_url)})
    if backs_up(spec) and deciding:
        out += [attempt_env(), {"name": DONE_ENV, "value": f"{done_dir(spec)}/{{task}}"}]
    return out


def add_to_task(container: Manifest, spec: ClusterSpec, role: str, deciding: bool) -> None:
    """Give a task container the storage env, and the Secret only when its script streams."""
    container["env"] = [*container.get("env", []), *task_env(spec, role, deciding)]
    if streams(spec) and role != "ps" and spec.credentials_secret:
        container["envFrom"] = credentials(spec)


def storage_container(spec: ClusterSpec, settings: K8sSettings, name: str, command: list[str],
                      mounts: list[Manifest], secret: str | None) -> Manifest:
    """A container of the task image that moves bytes (restricted, small): ``secret``'s keys
    as its environment when one is named."""
    out: Manifest = {
        "name": name,
        "image": spec.image or settings.image,
        **m.pull_policy(settings),
        "command": command,
        "env": [{"name": "HOME", "value": "/tmp"}, {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "resources": copy.deepcopy(STEP_RESOURCES),
        "securityContext": copy.deepcopy(m._CONTAINER_SECURITY),
        "volumeMounts": mounts,
    }
    if secret:
        out["envFrom"] = secret_env_from(secret)
    return out


def _pod(spec: ClusterSpec, settings: K8sSettings, step: str, body: Manifest) -> Manifest:
    pod: Manifest = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": m._pod_security(settings),
        **body,
    }
    if spec.node_selector:
        pod["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod["tolerations"] = [dict(t) for t in spec.tolerations]
    if spec.priority:
        pod["priorityClassName"] = spec.priority
    if spec.scheduler:
        pod["schedulerName"] = spec.scheduler
    labels = {**m.object_labels(spec, settings, "task"), m.ROLE_LABEL: step}
    return {"metadata": {"labels": labels}, "spec": pod}


_TMP = {"name": "tmp", "mountPath": "/tmp"}


def sync_pod(spec: ClusterSpec, settings: K8sSettings) -> Manifest:
    """The sync step's pod template: init container ``fetch`` into ``/data``, then ``synced``."""
    data = {"name": "data", "mountPath": m.DATA_MOUNT}
    fetch = storage_container(spec, settings, FETCH_CONTAINER,
                              [STORAGE_PYTHON, "-m", "tfk8s_magics.storage", "fetch", str(spec.data_url),
                               m.DATA_MOUNT], [data, dict(_TMP)], secret=spec.credentials_secret)
    synced = storage_container(spec, settings, SYNCED_CONTAINER,
                               [STORAGE_PYTHON, "-m", _STEPS_MODULE, "synced", m.DATA_MOUNT],
                               [{**data, "readOnly": True}, dict(_TMP)], secret=None)
    return _pod(spec, settings, SYNC, {
        "initContainers": [fetch],
        "containers": [synced],
        "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": m.data_claim_name(spec)}},
            {"name": "tmp", "emptyDir": {}},
        ],
    })


def backup_pod(spec: ClusterSpec, settings: K8sSettings, deciding: list[str]) -> Manifest:
    """The backup step's pod template: wait for ``deciding`` tasks' exit 0, then upload."""
    command = [STORAGE_PYTHON, "-m", _STEPS_MODULE, "backup", "--done-dir", done_dir(spec),
               "--tasks", ",".join(deciding), "--source", m.log_dir(spec),
               "--to", str(spec.backup_url)]
    backup = storage_container(spec, settings, BACKUP_CONTAINER, command,
                               [{"name": "log", "mountPath": m.LOG_MOUNT, "readOnly": True}, dict(_TMP)],
                               secret=spec.credentials_secret)
    backup["env"].insert(0, attempt_env())
    return _pod(spec, settings, BACKUP, {
        "terminationGracePeriodSeconds": BACKUP_GRACE,
        "containers": [backup],
        "volumes": [
            {"name": "log", "persistentVolumeClaim": {"claimName": m.log_claim_name(spec),
                                                      "readOnly": True}},
            {"name": "tmp", "emptyDir": {}},
        ],
    })


def step_job(spec: ClusterSpec, settings: K8sSettings, step: str, pod_failure_policy: Manifest,
             deciding: list[str]) -> Manifest:
    """A step's replicated Job: one pod, no retry of its own (the JobSet decides, as for tasks).

    ``pod_failure_policy`` is the tasks' (:func:`.jobset.pod_failure_policy`)
    with its exit-code rule for every container of the pod (init containers
    included): the storage tool's "missing object" or "wrong credential"
    (exit 1) fails the JobSet at once, a kill by signal restarts it.
    """
    template = sync_pod(spec, settings) if step == SYNC else backup_pod(spec, settings, deciding)
    policy = copy.deepcopy(pod_failure_policy)
    for rule in policy["rules"]:
        (rule.get("onExitCodes") or {}).pop("containerName", None)
    job: Manifest = {
        "parallelism": 1,
        "completions": 1,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "podFailurePolicy": policy,
        "template": template,
    }
    if spec.active_deadline:  # a hung fetch or upload ends like a hung task (DeadlineExceeded)
        job["activeDeadlineSeconds"] = int(spec.active_deadline)
    labels = {**m.object_labels(spec, settings, "task"), m.ROLE_LABEL: step}
    return {"name": step, "replicas": 1, "template": {"metadata": {"labels": labels}, "spec": job}}


def step_of_pod(pod_labels: dict[str, str]) -> str | None:
    """The step a JobSet pod runs (``sync``/``backup``), from its role label; else None."""
    role = pod_labels.get(m.ROLE_LABEL)
    return role if role in STEPS else None
