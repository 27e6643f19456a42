"""TensorFlow Serving on Kubernetes: pure builders of its Deployment and Service.

The official ``tensorflow/serving`` image (pinned) runs
``tensorflow_model_server`` with the model's base path on the cluster's
``/log`` claim, mounted read-only: REST on 8501, gRPC on 8500, readiness
on the REST model-status endpoint (``GET /v1/models/<model>``), and the
base path polled so a later export is served without a restart.  The pod
meets the *restricted* Pod Security profile (non-root, no privilege
escalation, every capability dropped, RuntimeDefault seccomp, read-only
root file system).  The Service is a ClusterIP: inside the namespace it is
``<cluster>-serving:8500/8501``; a browser reaches the REST port through
jupyter-server-proxy behind the hub's login — never a NodePort.

**From object storage** (``serve --from URL``: a ``--backup`` URL or a models
dir, e.g. once the cluster's volumes are gone): the pod gets no claim; an
init container ``fetch`` of the task image runs its storage venv
(``/opt/storage/bin/python -m tfk8s_magics.storage fetch-models URL /models
--model M``) into an ``emptyDir``, which TensorFlow Serving then serves
read-only.  Each replica fetches its own copy when it starts; a missing
model or a refused credential is the init container's exit 1 and one
sentence in its log (the pod shows ``Init:Error``).  Credentials: the
Secret of ``--credentials-secret`` (default: the cluster's) as the
environment of ``fetch`` only (``envFrom``), by name — never in the
Deployment, the spec or the rendered YAML.
"""

from __future__ import annotations

import copy
import json
import os
import urllib.request
from dataclasses import dataclass

from ... import options, storage
from ...errors import SpecError
from ...serving import ServingInfo
from ...spec import ClusterSpec
from . import storage_pods
from .manifests import (
    _CONTAINER_SECURITY,
    CLUSTER_LABEL,
    COMPONENT_LABEL,
    Manifest,
    _meta,
    _pod_security,
    log_claim_name,
    log_dir,
    object_labels,
    pull_policy,
)
from .settings import K8sSettings

#: The official image, pinned to a TensorFlow Serving release tag.
SERVING_IMAGE = "tensorflow/serving:2.20.0"
GRPC_PORT = 8500
REST_PORT = 8501
COMPONENT = "serving"
#: Where the init container puts the models fetched from a URL (an emptyDir).
MODELS_MOUNT = "/models"
MODEL_ANNOTATION = "tfk8s.io/model"
SOURCE_ANNOTATION = "tfk8s.io/source"


@dataclass(frozen=True)
class ServingOptions:
    """What a user chooses for a served model: which model, how many replicas, what resources."""

    model: str
    replicas: int = 1
    cpu: str | None = None
    memory: str | None = None
    image: str = SERVING_IMAGE
    poll_seconds: int = 5
    #: Serve from this URL (fetched by an init container) instead of the ``/log`` claim.
    source_url: str | None = None
    #: The Secret whose keys the fetch gets as its environment (with ``source_url`` only).
    credentials_secret: str | None = None


def serving_name(spec: ClusterSpec) -> str:
    """The Deployment's and Service's name: ``<cluster>-serving``."""
    return f"{spec.name}-serving"


def model_base_path(spec: ClusterSpec, model: str, source_url: str | None = None) -> str:
    """Where the model's versions are: on the ``/log`` claim (the Trainer's export layout), or
    in the pod's fetched copy when served from a URL."""
    if source_url:
        return f"{MODELS_MOUNT}/{model}"
    return f"{log_dir(spec)}/models/{model}"


def fetch_container(spec: ClusterSpec, settings: K8sSettings, opts: ServingOptions) -> Manifest:
    """The init container that copies ``opts.model`` from ``opts.source_url`` into ``/models``."""
    command = [storage_pods.STORAGE_PYTHON, "-m", "tfk8s_magics.storage", "fetch-models",
               str(opts.source_url), MODELS_MOUNT, "--model", opts.model]
    return storage_pods.storage_container(
        spec, settings, storage_pods.FETCH_CONTAINER, command,
        [{"name": "models", "mountPath": MODELS_MOUNT}, {"name": "tmp", "mountPath": "/tmp"}],
        secret=opts.credentials_secret)


def _resources(opts: ServingOptions) -> Manifest:
    requests = {"cpu": opts.cpu or "250m", "memory": opts.memory or "512Mi"}
    return {"requests": requests, "limits": {"memory": requests["memory"]}}


def _server_container(spec: ClusterSpec, settings: K8sSettings, opts: ServingOptions) -> Manifest:
    """``tensorflow_model_server`` with the exact flags, probes and mounts (``/log``, ``/tmp``)."""
    return {
        "name": "serving",
        "image": opts.image,
        **pull_policy(settings),
        # The binary directly (the image's entrypoint is a shell script): no shell, exact flags.
        "command": ["tensorflow_model_server"],
        "args": [
            f"--port={GRPC_PORT}",
            f"--rest_api_port={REST_PORT}",
            f"--model_name={opts.model}",
            f"--model_base_path={model_base_path(spec, opts.model, opts.source_url)}",
            f"--file_system_poll_wait_seconds={opts.poll_seconds}",
        ],
        "ports": [
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "rest", "containerPort": REST_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {
            "httpGet": {"path": f"/v1/models/{opts.model}", "port": "rest"},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        "resources": _resources(opts),
        "securityContext": copy.deepcopy(_CONTAINER_SECURITY),
        "volumeMounts": [
            {"name": "log", "mountPath": "/log", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }


def serving_deployment(spec: ClusterSpec, settings: K8sSettings, opts: ServingOptions) -> Manifest:
    """The Deployment of ``tensorflow_model_server`` serving ``opts.model`` from ``/log`` (or from
    ``opts.source_url``, fetched by an init container)."""
    match = {CLUSTER_LABEL: spec.name, COMPONENT_LABEL: COMPONENT}
    container = _server_container(spec, settings, opts)
    annotations = {MODEL_ANNOTATION: opts.model}
    pod: Manifest = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": _pod_security(settings),
    }
    data: Manifest = {"name": "log", "persistentVolumeClaim": {"claimName": log_claim_name(spec),
                                                               "readOnly": True}}
    if opts.source_url:  # no claim: the models come from the URL through the init container
        container["volumeMounts"][0] = {"name": "models", "mountPath": MODELS_MOUNT, "readOnly": True}
        pod["initContainers"] = [fetch_container(spec, settings, opts)]
        data = {"name": "models", "emptyDir": {}}
        annotations[SOURCE_ANNOTATION] = opts.source_url
    pod["containers"] = [container]
    pod["volumes"] = [data, {"name": "tmp", "emptyDir": {}}]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(spec, settings, serving_name(spec), COMPONENT),
        "spec": {
            "replicas": opts.replicas,
            "selector": {"matchLabels": match},
            "template": {
                "metadata": {
                    "labels": object_labels(spec, settings, COMPONENT),
                    "annotations": annotations,
                },
                "spec": pod,
            },
        },
    }


def serving_service(spec: ClusterSpec, settings: K8sSettings) -> Manifest:
    """The ClusterIP Service: gRPC 8500 and REST 8501 by name inside the namespace."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(spec, settings, serving_name(spec), COMPONENT),
        "spec": {
            "type": "ClusterIP",
            "selector": {CLUSTER_LABEL: spec.name, COMPONENT_LABEL: COMPONENT},
            "ports": [
                {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"},
                {"name": "rest", "port": REST_PORT, "targetPort": "rest", "protocol": "TCP"},
            ],
        },
    }


def serving_manifests(spec: ClusterSpec, settings: K8sSettings, opts: ServingOptions) -> list[Manifest]:
    """The Deployment then the Service."""
    return [serving_deployment(spec, settings, opts), serving_service(spec, settings)]


def serving_options(model: str, replicas: int | None = None, cpu: str | None = None,
                    memory: str | None = None, image: str | None = None, source_url: str | None = None,
                    credentials_secret: str | None = None) -> ServingOptions:
    """Validated :class:`ServingOptions` (the checks of the options registry: one sentence each)."""
    if not model:
        raise SpecError("serving needs a model name: give --model NAME (a directory under <log dir>/models).")
    if source_url is not None:
        storage.check_url("--from", source_url)  # a URL carrying credentials is refused here
    elif credentials_secret is not None:
        raise SpecError(f"--credentials-secret {credentials_secret!r} goes with serve --from URL (the "
                        "Secret the fetch of the models reads); give --from, or drop it.")
    return ServingOptions(
        model=options.OPTIONS["model"].validate(model),
        replicas=options.OPTIONS["replicas"].validate(options.get("replicas", replicas)),
        cpu=options.OPTIONS["serving_cpu"].validate(cpu),
        memory=options.OPTIONS["serving_memory"].validate(memory),
        image=image or SERVING_IMAGE,
        source_url=source_url,
        credentials_secret=options.OPTIONS["credentials_secret"].validate(credentials_secret),
    )


def serving_info(spec: ClusterSpec, settings: K8sSettings, deployment: Manifest, reused: bool):
    """Where the served model is reached: the Service by name, and through jupyter-server-proxy."""
    host = f"{serving_name(spec)}.{settings.namespace}.svc"
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/")
    pod = deployment["spec"]["template"]
    annotations = pod["metadata"].get("annotations", {})
    model = annotations.get(MODEL_ANNOTATION, spec.name)
    return ServingInfo(
        cluster=spec.name, model=model, version=_live_version(host, model),
        rest_url=f"{prefix.rstrip('/')}/proxy/{host}:{REST_PORT}/", rest_local=f"http://{host}:{REST_PORT}/",
        grpc_address=f"{host}:{GRPC_PORT}",
        base_path=model_base_path(spec, model, annotations.get(SOURCE_ANNOTATION)), reused=reused,
        replicas=int(deployment["spec"].get("replicas", 1)),
    )


def _live_version(host: str, model: str) -> int | None:
    """The AVAILABLE version the Service answers with now (None: not reachable or still loading)."""
    if not options.in_kubernetes_pod():
        return None  # the Service's name resolves only inside the cluster
    try:
        with urllib.request.urlopen(f"http://{host}:{REST_PORT}/v1/models/{model}", timeout=2) as r:
            states = json.loads(r.read()).get("model_version_status", [])
    except (OSError, ValueError):
        return None
    ready = [int(s["version"]) for s in states if s.get("state") == "AVAILABLE"]
    return max(ready, default=None)
