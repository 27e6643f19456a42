"""The :class:`KubernetesBackend`: every cluster as pods in the user's namespace.

State lives in the API, not in this process: the root ConfigMap of each
cluster holds its spec, so ``list``/``status``/``logs`` work after a kernel
restart, from any process with the same namespace.  Nothing connects to a
cluster before the first call that needs it: the constructor only stores
options, and :meth:`KubernetesBackend.render` never connects at all.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

from kubernetes.client.rest import ApiException

from ...errors import BackendError, ClusterExists, ClusterNotFound, LaunchFailed
from ...spec import ClusterSpec
from ..base import Backend, ClusterStatus, Event, LogLine, TensorBoardInfo
from . import logs as logs_mod
from . import state
from .apply import apply, failure_sentence, preflight
from .client import Api, api_reason
from .manifests import (
    CLUSTER_LABEL,
    COMPONENT_LABEL,
    SCRIPT_KEY,
    SPEC_KEY,
    STOPPED_ANNOTATION,
    USER_LABEL,
    cluster_addresses,
    cluster_manifests,
    owner_reference,
    render_yaml,
    tensorboard_manifests,
    tensorboard_name,
    with_owner,
)
from .settings import K8sSettings, label_value, settings_from_env
from .watch import ClusterWatcher

DETACHED_ANNOTATION = "tfk8s.io/detached"


class KubernetesBackend(Backend):
    """Runs clusters on Kubernetes with the official ``kubernetes`` client.

    Options (each ``None`` → read lazily from the environment, see
    :func:`.settings.settings_from_env`):

    ``namespace``
        in-pod ServiceAccount namespace, else ``TFK8S_NAMESPACE``, else the
        kubeconfig context's namespace.
    ``api_client``
        a ``kubernetes.client.ApiClient`` to use; otherwise one is made on
        the first API call from the in-cluster config or the kubeconfig.
    ``storage_class`` / ``image`` / ``user``
        ``TFK8S_STORAGE_CLASS`` (default ``glusterfs``) / ``TFK8S_IMAGE``
        (default ``tfk8s/tensorflow-task:0.1.0``) / ``JUPYTERHUB_USER``.
    ``service_account``
        the notebook's ServiceAccount (documentation of who acts; the
        RoleBinding of :mod:`.rbac` names it).
    ``check_nodes``
        also compare requests with nodes' allocatable resources before a
        launch (needs a ClusterRole to list nodes; off by default).
    ``settings``
        a complete :class:`K8sSettings`, overriding all of the above.
    """

    name = "kubernetes"

    def __init__(
        self,
        *,
        namespace: str | None = None,
        api_client: Any = None,
        storage_class: str | None = None,
        image: str | None = None,
        service_account: str | None = None,
        user: str | None = None,
        check_nodes: bool = False,
        request_timeout: float = 30.0,
        settings: K8sSettings | None = None,
    ) -> None:
        self._options = {
            "namespace": namespace,
            "storage_class": storage_class,
            "image": image,
            "service_account": service_account,
            "user": user,
        }
        self._settings = settings
        self._api_client = api_client
        self._api: Api | None = None
        self.check_nodes = check_nodes
        self.request_timeout = request_timeout
        self._watchers: dict[str, ClusterWatcher] = {}
        self._lock = threading.RLock()
        self._attached: set[str] = set()

    # -- lazily made infrastructure ------------------------------------------
    @property
    def settings(self) -> K8sSettings:
        """The settings, read from options and environment on first use."""
        if self._settings is None:
            self._settings = settings_from_env(**self._options)
        return self._settings

    @property
    def api(self) -> Api:
        """The API access, connecting (loading config) on first use."""
        if self._api is None:
            client = self._api_client or _load_api_client()
            self._api = Api(client, self.settings.namespace, self.request_timeout)
        return self._api

    # -- render ---------------------------------------------------------------
    def render(self, spec: ClusterSpec, tensorboard: bool = False) -> list[dict[str, Any]]:
        """The manifests ``launch(spec)`` would create, in order; needs no cluster."""
        return cluster_manifests(self._owned(spec), self.settings, tensorboard=tensorboard)

    def render_yaml(self, spec: ClusterSpec, tensorboard: bool = False) -> str:
        """:meth:`render` as multi-document YAML."""
        return render_yaml(self._owned(spec), self.settings, tensorboard=tensorboard)

    def _owned(self, spec: ClusterSpec) -> ClusterSpec:
        if spec.owner or not self.settings.user:
            return spec
        return ClusterSpec.from_dict({**spec.to_dict(), "owner": self.settings.user})

    # -- launch ---------------------------------------------------------------
    def launch(self, spec: ClusterSpec, *, detach: bool = False) -> ClusterStatus:
        """Pre-flight check, create every object with rollback, start watching.

        Unless ``detach``, the cluster is stopped (pods deleted, record kept)
        when this process exits; a detached cluster runs on, and a later
        process reattaches with :meth:`status`/:meth:`watch`.
        """
        spec = self._owned(spec)
        manifests = cluster_manifests(spec, self.settings)
        manifests[0]["metadata"]["annotations"][DETACHED_ANNOTATION] = str(detach).lower()
        if self._root(spec.name) is not None:
            raise ClusterExists(
                f"a cluster named {spec.name!r} already exists in namespace "
                f"{self.settings.namespace!r}: choose another name, or "
                f"`%tfcluster delete {spec.name}` first."
            )
        preflight(self.api, manifests, check_nodes=self.check_nodes)
        created = apply(self.api, manifests)
        watcher = self._watch(spec, created[0])
        if not detach:
            self._stop_at_exit(spec.name)
        return watcher.snapshot()

    def _stop_at_exit(self, name: str) -> None:
        ref = weakref.ref(self)

        def stop() -> None:
            backend = ref()
            if backend is not None:
                try:
                    backend.stop(name)
                except Exception:  # noqa: BLE001 - exiting: nothing left to tell
                    pass

        atexit.register(stop)

    # -- state from the API ---------------------------------------------------
    def _root(self, name: str) -> dict[str, Any] | None:
        try:
            root = self.api.get("v1", "ConfigMap", name)
        except ApiException as e:
            raise BackendError(
                f"could not read cluster {name!r} in namespace {self.settings.namespace!r}: "
                f"{api_reason(e)}."
            ) from e
        labels = (root or {}).get("metadata", {}).get("labels") or {}
        if root is None or labels.get(COMPONENT_LABEL) != "root" or (
            labels.get(CLUSTER_LABEL) != name
        ):
            return None
        return root

    def _require_root(self, name: str) -> dict[str, Any]:
        root = self._root(name)
        if root is None:
            raise ClusterNotFound(
                f"no cluster named {name!r} in namespace {self.settings.namespace!r}: "
                "`%tfcluster list` shows the clusters there."
            )
        return root

    @staticmethod
    def _spec_of(root: dict[str, Any]) -> ClusterSpec:
        data = root.get("data") or {}
        record = json.loads(data[SPEC_KEY])
        record["script"] = data.get(SCRIPT_KEY)
        return ClusterSpec.from_dict(record)

    def _watch(self, spec: ClusterSpec, root: dict[str, Any]) -> ClusterWatcher:
        with self._lock:
            current = self._watchers.get(spec.name)
            same = current is not None and current.root["metadata"]["uid"] == (
                root["metadata"]["uid"]
            )
            if same and current.alive:
                return current
            if current is not None:
                current.close()
            watcher = ClusterWatcher(
                self.api, spec, self.settings, root, on_deleted=self._forget
            ).start()
            self._watchers[spec.name] = watcher
            return watcher

    def _forget(self, name: str) -> None:
        with self._lock:
            self._watchers.pop(name, None)

    def _watcher(self, name: str) -> ClusterWatcher:
        """The live watcher of ``name``, reattaching (from the API) if this process has none."""
        with self._lock:
            current = self._watchers.get(name)
            if current is not None and current.alive:
                return current
        root = self._require_root(name)
        return self._watch(self._spec_of(root), root)

    # -- Backend --------------------------------------------------------------
    def status(self, name: str) -> ClusterStatus:
        watcher = self._watcher(name)
        if watcher.progress is None and not watcher.deleted:
            logs_mod.refresh_progress(watcher)
        return watcher.snapshot()

    def list_clusters(self) -> list[ClusterStatus]:
        """This user's clusters in the namespace (two requests, whatever their number)."""
        sel = f"app.kubernetes.io/managed-by=tfk8s,{COMPONENT_LABEL}=root"
        user = label_value(self.settings.user)
        if user:
            sel += f",{USER_LABEL}={user}"
        try:
            roots = self.api.list_objects("v1", "ConfigMap", sel).get("items", [])
            pods = self.api.list_objects(
                "v1", "Pod", f"app.kubernetes.io/managed-by=tfk8s,{COMPONENT_LABEL}=task"
            ).get("items", [])
        except ApiException as e:
            raise BackendError(
                f"could not list clusters in namespace {self.settings.namespace!r}: "
                f"{api_reason(e)}."
            ) from e
        out = []
        for root in roots:
            name = root["metadata"]["name"]
            try:
                spec = self._spec_of(root)
            except (KeyError, ValueError):
                continue  # not a record we can read: leave it alone
            mine = [p for p in pods if p["metadata"]["labels"].get(CLUSTER_LABEL) == name]
            annotations = root["metadata"].get("annotations") or {}
            finished = annotations.get("tfk8s.io/finished")
            view = state.View(
                spec=spec,
                pods=state.latest_pods(mine),
                stopped=bool(annotations.get(STOPPED_ANNOTATION)),
                finished_at=float(finished) if finished else None,
            )
            tasks = state.task_statuses(view)
            phase, reason = state.cluster_phase(view, tasks)
            out.append(ClusterStatus(
                name=name, backend=self.name, mode=spec.mode, phase=phase, reason=reason,
                created=state.parse_time(root["metadata"].get("creationTimestamp")) or 0.0,
                finished=view.finished_at, owner=annotations.get("tfk8s.io/owner", ""),
                detached=annotations.get(DETACHED_ANNOTATION) == "true",
                log_dir=f"pvc/{spec.log_claim or name + '-log'}:/log", tasks=tasks,
            ))
        out.sort(key=lambda s: s.created, reverse=True)
        return out

    def spec(self, name: str) -> ClusterSpec:
        return self._spec_of(self._require_root(name))

    def watch(self, name: str, stop: threading.Event) -> Iterator[ClusterStatus]:
        watcher = self._watcher(name)
        seen = watcher.version
        last = None
        while True:
            snap = watcher.snapshot()
            key = (snap.phase, snap.reason, [(t.phase, t.reason, t.restarts) for t in snap.tasks],
                   snap.progress)
            if key != last:
                last = key
                yield snap
            if snap.terminal or stop.is_set() or watcher.deleted:
                return
            seen = watcher.wait_change(seen, timeout=0.5)

    def read_logs(self, name: str, task: str | None = None,
                  tail: int | None = None) -> list[LogLine]:
        watcher = self._watcher(name)
        tasks = [watcher.spec.task(task).name] if task else [t.name for t in watcher.spec.tasks()]
        try:
            return logs_mod.read(watcher, tasks, tail)
        except ApiException as e:
            raise BackendError(f"could not read the logs of {name!r}: {api_reason(e)}.") from e

    def follow_logs(self, name: str, stop: threading.Event, tasks: list[str] | None = None,
                    from_start: bool = True) -> Iterator[LogLine]:
        watcher = self._watcher(name)
        names = ([watcher.spec.task(t).name for t in tasks] if tasks
                 else [t.name for t in watcher.spec.tasks()])
        return logs_mod.follow(watcher, stop, names, from_start)

    def events(self, name: str) -> list[Event]:
        """The cluster's Kubernetes Events and the backend's own (restarts, recycles)."""
        watcher = self._watcher(name)
        out = list(watcher.events)
        for e in watcher.refresh_events():
            obj = (e.get("involvedObject") or {}).get("name", "")
            task = obj[len(name) + 1:] if obj.startswith(name + "-") else ""
            pod = next((p for p in watcher.pods.values() if p["metadata"]["name"] == obj), None)
            if pod is not None and state.pod_task(pod) is not None:
                task = state.pod_task(pod).name
            out.append(Event(
                time=_event_time(e), task=task, reason=e.get("reason", ""),
                message=e.get("message", ""), type=e.get("type", "Normal"),
            ))
        out.sort(key=lambda ev: ev.time)
        return out

    def stop(self, name: str) -> ClusterStatus:
        """Delete the pods (one request); keep the root record, the Service and the volumes."""
        watcher = self._watcher(name)
        watcher.stopped = True
        try:
            self.api.patch("v1", "ConfigMap", name, {
                "metadata": {"annotations": {STOPPED_ANNOTATION: f"{time.time():.3f}"}}
            })
            self.api.delete_pods(f"{CLUSTER_LABEL}={name},{COMPONENT_LABEL}=task")
        except ApiException as e:
            raise BackendError(f"could not stop cluster {name!r}: {api_reason(e)}.") from e
        watcher._event("", "Stopped", "stopped by the user")
        return watcher.snapshot()

    def delete(self, name: str, keep_logs: bool = False) -> None:
        """Delete the root; the API deletes every object owned by it (the log claim
        survives when ``keep_logs``: its owner reference is removed first)."""
        root = self._require_root(name)
        spec = self._spec_of(root)
        with self._lock:
            watcher = self._watchers.pop(name, None)
        if watcher is not None:
            # First: the pods' DELETED events must not look like pods to replace.
            watcher.deleted = True
            watcher.close()
        try:
            if keep_logs and not spec.log_claim:
                self.api.patch("v1", "PersistentVolumeClaim", f"{name}-log",
                               {"metadata": {"ownerReferences": None}})
            self.api.delete("v1", "ConfigMap", name)
        except ApiException as e:
            raise BackendError(f"could not delete cluster {name!r}: {api_reason(e)}.") from e

    def addresses(self, name: str) -> dict[str, list[str]]:
        spec = self.spec(name)
        return cluster_addresses(spec, self.settings)

    def tensorboard(self, name: str) -> TensorBoardInfo:
        """Create (or reuse) the cluster's TensorBoard Deployment + Service.

        The URL goes through jupyter-server-proxy (``<prefix>proxy/<host>:<port>/``):
        the notebook server reaches the Service by its DNS name, so the
        browser needs no Ingress or port-forward.  jupyter-server-proxy must
        allow that host (``c.ServerProxy.host_allowlist``).
        """
        root = self._require_root(name)
        spec = self._spec_of(root)
        svc = tensorboard_name(spec)
        host = f"{svc}.{self.settings.namespace}.svc"
        port = self.settings.tensorboard_port
        prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/")
        url = f"{prefix.rstrip('/')}/proxy/{host}:{port}/"
        try:
            reused = self.api.get("apps/v1", "Deployment", svc) is not None
            if not reused:
                owner = owner_reference(root)
                created = []
                try:
                    for m in tensorboard_manifests(spec, self.settings):
                        created.append(self.api.create(with_owner(m, owner)))
                except ApiException as e:
                    for obj in reversed(created):
                        self.api.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
                    raise LaunchFailed(failure_sentence(e, m, self.settings.namespace)) from e
        except ApiException as e:
            raise BackendError(f"could not start TensorBoard for {name!r}: {api_reason(e)}.") from e
        return TensorBoardInfo(port=port, url=url, logdir="/log", reused=reused)

    def coordinator_address(self, name: str) -> str:
        """This notebook pod's address, where the in-graph client listens as chief."""
        from ...ports import free_port

        ip = os.environ.get("TFK8S_POD_IP") or _own_ip()
        return f"{ip}:{free_port()}"

    def close(self) -> None:
        with self._lock:
            watchers = list(self._watchers.values())
            self._watchers.clear()
        for w in watchers:
            w.close()


def _own_ip() -> str:
    # /etc/hosts maps a pod's hostname to its IP: no network lookup involved.
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _event_time(e: dict[str, Any]) -> float:
    for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
        t = state.parse_time(e.get(key))
        if t:
            return t
    return state.parse_time((e.get("metadata") or {}).get("creationTimestamp")) or 0.0


def _load_api_client():
    """An ApiClient from the in-cluster config, else the kubeconfig (first API call only)."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as e:
            raise BackendError(
                "no Kubernetes cluster is configured: run the notebook in a pod with a "
                f"service account, or set KUBECONFIG ({e})."
            ) from e
    return client.ApiClient()
