"""A cluster's TensorBoard on Kubernetes: its Secret, Deployment and Service, shown once it answers.

TensorBoard answers only requests carrying a token (:mod:`tfk8s_magics.runtime.tensorboard`): the
kernel draws one per Deployment, puts it in a Secret TensorBoard reads and in the user's own
token file (:mod:`tfk8s_magics.tbtokens`), from which the notebook server's proxy adds it. A
Deployment whose token this user's files do not hold (made by another notebook home, or before
the token existed) is made again with a new one.

The URL is handed out only when TensorBoard is ready (its pod passed its readiness probe, and the
Service answers where the kernel can reach it): an iframe shown earlier got the proxy's 502 with
``frame-ancestors 'none'`` and never tried again.
"""

from __future__ import annotations

import os
import secrets
import time
import urllib.error
import urllib.request
from typing import Any

from kubernetes.client.rest import ApiException

from ... import tbtokens
from ...errors import BackendError, LaunchFailed
from ..base import TensorBoardInfo
from .apply import failure_sentence
from .client import Api, api_reason
from .manifests import (
    TENSORBOARD_READY_PATH,
    owner_reference,
    tensorboard_manifests,
    tensorboard_name,
    tensorboard_secret,
    with_owner,
)

#: Seconds TensorBoard may take to be ready (a pod start and TensorBoard's ~3 s on a loaded node).
READY_TIMEOUT = 180.0
#: Seconds the Service may take to answer the kernel once the pod is ready (endpoints, kube-proxy).
ANSWER_TIMEOUT = 15.0
#: The annotation naming the Secret whose token the Deployment asks for.
SECRET_ANNOTATION = "tfk8s.io/tensorboard-secret"


def proxy_url(prefix: str, host: str, port: int) -> str:
    """The URL under the user's server where its proxy adds the token (:mod:`..sidebar.tbproxy`)."""
    return f"{prefix.rstrip('/')}/tfk8s/tensorboard/{host}:{port}/"


def start(api: Api, spec, root: dict[str, Any], settings, timeout: float = READY_TIMEOUT) -> TensorBoardInfo:
    """Create (or reuse) the TensorBoard of the cluster ``spec`` and wait until it answers."""
    svc = tensorboard_name(spec)
    host = f"{svc}.{settings.namespace}.svc"
    port = settings.tensorboard_port
    url = proxy_url(os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/"), host, port)
    try:
        existing = api.get("apps/v1", "Deployment", svc)
        kept = tbtokens.load(host)
        notes = ((existing or {}).get("metadata") or {}).get("annotations") or {}
        reused = existing is not None and kept is not None and notes.get(SECRET_ANNOTATION) == kept[0]
        if existing is not None and not reused:  # its token is not ours to add: a new one
            api.delete("apps/v1", "Deployment", svc)
            _wait_gone(api, svc, timeout)
        if not reused:
            _create(api, spec, root, settings, host)
        _wait_ready(api, spec, svc, timeout)
    except ApiException as e:
        raise BackendError(f"could not start TensorBoard for {spec.name!r}: {api_reason(e)}.") from e
    _wait_answer(api, svc, port)
    return TensorBoardInfo(port=port, url=url, logdir="/log", reused=reused)


def _create(api: Api, spec, root: dict[str, Any], settings, host: str) -> None:
    token = secrets.token_urlsafe(32)
    secret = f"{tensorboard_name(spec)}-{secrets.token_hex(3)}"
    owner = owner_reference(root)
    objects = [tensorboard_secret(spec, settings, secret, token),
               *tensorboard_manifests(spec, settings, secret)]
    objects[1]["metadata"].setdefault("annotations", {})[SECRET_ANNOTATION] = secret
    created = []
    try:
        for m in objects:
            if m["kind"] == "Service" and api.get("v1", "Service", m["metadata"]["name"]) is not None:
                continue  # kept from the Deployment made before: it selects the new pods alike
            created.append(api.create(with_owner(m, owner)))
            if m["kind"] == "Secret":
                tbtokens.save(host, secret, token)
    except ApiException as e:
        for obj in reversed(created):
            if obj["kind"] != "Secret":  # no right to delete one; the cluster's root owns it
                api.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
        raise LaunchFailed(failure_sentence(e, m, settings.namespace)) from e


def _wait_gone(api: Api, name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while api.get("apps/v1", "Deployment", name) is not None:
        if time.monotonic() > deadline:
            raise BackendError(f"TensorBoard {name!r} is still being deleted after {timeout:g} s; "
                               "try `%tfcluster tensorboard` again in a moment.")
        time.sleep(0.5)


def _wait_ready(api: Api, spec, name: str, timeout: float) -> None:
    """Until the Deployment's pod is ready; one sentence with the pod's reason when it is not."""
    deadline = time.monotonic() + timeout
    while True:
        dep = api.get("apps/v1", "Deployment", name) or {}
        status = dep.get("status") or {}
        current = status.get("observedGeneration", 0) >= (dep.get("metadata") or {}).get("generation", 1)
        if current and (status.get("readyReplicas") or 0) >= 1 and not status.get("unavailableReplicas"):
            return
        if time.monotonic() > deadline:
            raise BackendError(
                f"TensorBoard of {spec.name!r} is not ready after {timeout:g} s ({_why(api, spec)}); "
                f"`%tfcluster tensorboard {spec.name}` shows it once it is."
            )
        time.sleep(0.5)


def _why(api: Api, spec) -> str:
    """The TensorBoard pod's waiting reason, as far as the API says."""
    try:
        pods = api.list_objects("v1", "Pod", f"tfk8s.io/cluster={spec.name},tfk8s.io/component=tensorboard")
    except ApiException:
        return "its pod cannot be read"
    for pod in pods.get("items") or []:
        for c in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (c.get("state") or {}).get("waiting") or {}
            if waiting.get("reason"):
                return f"{waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
        return f"its pod is {(pod.get('status') or {}).get('phase', 'unknown')}"
    return "no pod yet"


def _wait_answer(api: Api, name: str, port: int) -> None:
    """Until the Service answers the readiness path from here, while it refuses (its endpoint not
    programmed yet). Best effort: where the kernel cannot reach the cluster network at all (it runs
    outside it) the first other error ends the wait, and the pod's readiness is all there is."""
    svc = api.get("v1", "Service", name) or {}
    ip = (svc.get("spec") or {}).get("clusterIP")
    if not ip or ip == "None":
        return
    deadline = time.monotonic() + ANSWER_TIMEOUT
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{ip}:{port}{TENSORBOARD_READY_PATH}", timeout=2):
                return
        except urllib.error.HTTPError as e:
            if e.code != 503:
                return  # something answers: TensorBoard's guard or a proxy in between
        except urllib.error.URLError as e:
            if not isinstance(e.reason, ConnectionRefusedError):
                return  # not reachable from here (or too slow to tell): nothing to wait for
        except OSError:
            return
        time.sleep(0.3)
