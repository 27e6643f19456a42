"""The :class:`KubernetesBackend`: every cluster as pods in the user's namespace.

State lives in the API, not in this process: the root ConfigMap of each
cluster holds its spec, so ``list``/``status``/``logs`` work after a kernel
restart, from any process with the same namespace.  Nothing connects to a
cluster before the first call that needs it: the constructor only stores
options, and :meth:`KubernetesBackend.render` never connects at all.

Reading never acts: ``status``/``watch``/``logs``/``events`` keep one
read-only :class:`~.watch.PodWatch` per cluster.  Acting — replacing pods,
recycling parameter servers, the TTL — is the
:class:`~.controller.ClusterController`, started by :meth:`~KubernetesBackend.launch`
and by the explicit :meth:`~KubernetesBackend.attach`, nothing else.
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
from ...ports import free_port
from ...runtime.progress import parse_record
from ...scriptcheck import check_files_travel, script_dir
from ...spec import ClusterSpec
from ..base import Backend, ClusterStatus, Coordinator, Event, LogLine, LogLocation, TensorBoardInfo
from . import logs as logs_mod
from . import state
from .apply import apply, failure_sentence, preflight
from .client import Api, api_reason
from .controller import ClusterController
from .manifests import (
    CLUSTER_LABEL,
    COMPONENT_LABEL,
    DETACHED_ANNOTATION,
    FINISHED_ANNOTATION,
    LOG_MOUNT,
    SCRIPT_KEY,
    SPEC_KEY,
    STOPPED_ANNOTATION,
    cluster_addresses,
    cluster_manifests,
    log_claim_name,
    owner_reference,
    render_yaml,
    selector,
    tensorboard_manifests,
    tensorboard_name,
    with_owner,
)
from .serving import serving_info, serving_manifests, serving_name, serving_options
from .settings import K8sSettings, label_value, settings_from_env
from .watch import PodWatch


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
        user: str | None = None,
        check_nodes: bool = False,
        request_timeout: float = 30.0,
        settings: K8sSettings | None = None,
    ) -> None:
        self._options = {
            "namespace": namespace,
            "storage_class": storage_class,
            "image": image,
            "user": user,
        }
        self._settings = settings
        self._api_client = api_client
        self._api: Api | None = None
        self.check_nodes = check_nodes
        self.request_timeout = request_timeout
        self._watches: dict[str, PodWatch] = {}  # cluster → its watch (a controller where attached)
        self._lock = threading.RLock()  # guards _watches and _stop_at_exit; no request under it
        self._stop_at_exit: set[str] = set()  # clusters launched here, not detached
        self._exit_hook = False

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
        if spec.script is not None:
            # Its folder is importable in the pods only through the files that travel with it.
            check_files_travel(spec.script, script_dir(spec), list(spec.files))
        manifests = cluster_manifests(spec, self.settings)
        manifests[0]["metadata"]["annotations"][DETACHED_ANNOTATION] = str(detach).lower()
        if self._root(spec.name) is not None:
            raise ClusterExists(
                f"a cluster named {spec.name!r} already exists in namespace "
                f"{self.settings.namespace!r}: launch with --replace to delete it and launch "
                f"again, choose another name, or `%tfcluster delete {spec.name}` first."
            )
        preflight(self.api, manifests, check_nodes=self.check_nodes)
        created = apply(self.api, manifests)
        controller = self._control(spec, created[0])
        if not detach:
            self._stop_when_exiting(spec.name)
        return controller.snapshot()

    def _stop_when_exiting(self, name: str) -> None:
        """Stop ``name`` when this process exits (one exit hook per backend object)."""
        with self._lock:
            self._stop_at_exit.add(name)
            if self._exit_hook:
                return
            self._exit_hook = True
        atexit.register(_stop_all, weakref.ref(self))

    def attach(self, name: str) -> None:
        """Run the lifecycle of ``name`` from this process: replace pods the policy retries,
        recycle parameter servers, delete at the TTL (a detached cluster, or one whose
        launching kernel is gone).  Nothing else starts acting on a cluster."""
        root = self._require_root(name)
        self._control(self._spec_of(root), root)

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
        record["files"] = {n: data[n] for n in record.get("files") or [] if n in data}
        return ClusterSpec.from_dict(record)

    def _control(self, spec: ClusterSpec, root: dict[str, Any]) -> PodWatch:
        """The controller of the cluster of ``root``, started (in place of a read-only watch) if needed."""
        return self._start_watch(spec, root, acting=True)

    def _start_watch(self, spec: ClusterSpec, root: dict[str, Any], acting: bool) -> PodWatch:
        uid = root["metadata"]["uid"]
        with self._lock:
            current = self._watches.get(spec.name)
        if current is not None and current.alive and current.root["metadata"]["uid"] == uid and (
            current.acts or not acting
        ):
            return current
        if acting:
            new: PodWatch = ClusterController(self.api, spec, self.settings, root, on_deleted=self._forget)
        else:
            new = PodWatch(self.api, spec, root)
        new.start()  # waits for the first listing: no lock held
        with self._lock:
            current, self._watches[spec.name] = self._watches.get(spec.name), new
        if current is not None and current is not new:
            current.close()
        return new

    def _forget(self, name: str) -> None:
        with self._lock:
            self._watches.pop(name, None)
            self._stop_at_exit.discard(name)

    def _watcher(self, name: str) -> PodWatch:
        """The live watch of ``name`` (read-only unless this process controls it), from the API if new."""
        with self._lock:
            current = self._watches.get(name)
        if current is not None and current.alive:
            return current
        root = self._require_root(name)
        return self._start_watch(self._spec_of(root), root, acting=False)

    # -- Backend --------------------------------------------------------------
    def status(self, name: str) -> ClusterStatus:
        """The cluster's status: a read (pods from the watch, progress from the lead task's log)."""
        watch = self._watcher(name)
        if watch.progress is None and not watch.deleted:
            logs_mod.refresh_progress(watch)
        return watch.snapshot()

    def list_clusters(self) -> list[ClusterStatus]:
        """This user's clusters in the namespace (two requests, whatever their number)."""
        try:
            roots = self.api.list_objects(
                "v1", "ConfigMap", selector(None, "root", label_value(self.settings.user))
            ).get("items", [])
            pods = self.api.list_objects("v1", "Pod", selector(None, "task")).get("items", [])
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
            finished = annotations.get(FINISHED_ANNOTATION)
            view = state.View(
                spec=spec,
                pods=state.latest_pods(mine),
                stopped=bool(annotations.get(STOPPED_ANNOTATION)),
                finished_at=float(finished) if finished else None,
            )
            out.append(state.cluster_status(view, root))
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
                   snap.progress, snap.stall is not None)
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
        out = watcher.own_events()
        for e in watcher.refresh_events():
            obj = (e.get("involvedObject") or {}).get("name", "")
            task = obj[len(name) + 1:] if obj.startswith(name + "-") else ""
            pod = watcher.pod_named(obj)
            if pod is not None and state.pod_task(pod) is not None:
                task = state.pod_task(pod).name
            out.append(Event(
                time=state.event_time(e), task=task, reason=e.get("reason", ""),
                message=e.get("message", ""), type=e.get("type", "Normal"),
            ))
        out.sort(key=lambda ev: ev.time)
        return out

    def stop(self, name: str) -> ClusterStatus:
        """Delete the pods (one request); keep the root record, the Service and the volumes."""
        watch = self._watcher(name)
        watch.mark_stopped("stopped by the user")
        with self._lock:
            self._stop_at_exit.discard(name)
        try:
            self.api.patch("v1", "ConfigMap", name, {
                "metadata": {"annotations": {STOPPED_ANNOTATION: f"{time.time():.3f}"}}
            })
            self.api.delete_pods(selector(name, "task"))
        except ApiException as e:
            raise BackendError(f"could not stop cluster {name!r}: {api_reason(e)}.") from e
        return watch.snapshot()

    def delete(self, name: str, keep_logs: bool = False) -> LogLocation | None:
        """Delete the root; the API deletes every object owned by it (the log claim
        survives when ``keep_logs``: its owner reference is removed first, and where
        the logs are is returned)."""
        root = self._require_root(name)
        spec = self._spec_of(root)
        with self._lock:
            watch = self._watches.pop(name, None)
            self._stop_at_exit.discard(name)
        if watch is not None:
            # First: the pods' DELETED events must not look like pods to replace.
            watch.close(deleted=True)
        try:
            if keep_logs and not spec.log_claim:
                self.api.patch("v1", "PersistentVolumeClaim", log_claim_name(spec),
                               {"metadata": {"ownerReferences": None}})
            self.api.delete("v1", "ConfigMap", name)
        except ApiException as e:
            raise BackendError(f"could not delete cluster {name!r}: {api_reason(e)}.") from e
        return LogLocation(LOG_MOUNT, log_claim_name(spec)) if keep_logs else None

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

    # -- TF Serving (pure builders in .serving) -----------------------------------
    def render_serving(self, spec: ClusterSpec, model: str, **options: Any) -> list[dict[str, Any]]:
        """The TF Serving Deployment + Service for ``model`` of ``spec``; needs no cluster."""
        return serving_manifests(self._owned(spec), self.settings, serving_options(model, **options))

    def serve(self, name: str, model: str | None = None, **options: Any):
        """Create (or reuse) the cluster's TF Serving Deployment + Service, owned by its root."""
        root = self._require_root(name)
        spec = self._spec_of(root)
        opts = serving_options(model or spec.name, **options)
        svc = serving_name(spec)
        try:
            existing = self.api.get("apps/v1", "Deployment", svc)
            if existing is None:
                created: list[dict[str, Any]] = []
                try:
                    for m in serving_manifests(spec, self.settings, opts):
                        created.append(self.api.create(with_owner(m, owner_reference(root))))
                except ApiException as e:
                    for obj in reversed(created):
                        self.api.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
                    raise LaunchFailed(failure_sentence(e, m, self.settings.namespace)) from e
        except ApiException as e:
            raise BackendError(f"could not serve {name!r}: {api_reason(e)}.") from e
        return serving_info(spec, self.settings, existing or serving_manifests(spec, self.settings, opts)[0],
                            reused=existing is not None)

    def serving(self, name: str):
        """What the cluster serves (a ServingInfo), or None."""
        spec = self._spec_of(self._require_root(name))
        dep = self.api.get("apps/v1", "Deployment", serving_name(spec))
        return None if dep is None else serving_info(spec, self.settings, dep, reused=True)

    def stop_serving(self, name: str) -> bool:
        """Delete the cluster's TF Serving Deployment and Service; return whether they existed."""
        spec = self._spec_of(self._require_root(name))
        found = False
        try:
            for api_version, kind in (("apps/v1", "Deployment"), ("v1", "Service")):
                found = self.api.delete(api_version, kind, serving_name(spec)) or found
        except ApiException as e:
            raise BackendError(f"could not stop serving {name!r}: {api_reason(e)}.") from e
        return found

    def coordinator(self, name: str) -> Coordinator:
        """This notebook pod listens as chief on its own address.  Its progress records go to
        the cluster's watch in this process: ``status`` here shows them; another process
        (the CLI) does not see an in-graph client's progress."""
        watch = self._watcher(name)
        ip = os.environ.get("TFK8S_POD_IP") or _own_ip()

        def progress(line: str) -> None:
            record = parse_record(line)
            if record is not None:
                watch.record_progress(logs_mod.progress_of(record, "chief-0"))

        return Coordinator(f"{ip}:{free_port()}", progress)

    def close(self) -> None:
        """Stop every watch and controller this object runs (the clusters run on)."""
        with self._lock:
            watches = list(self._watches.values())
            self._watches.clear()
        for w in watches:
            w.close()


def _own_ip() -> str:
    # /etc/hosts maps a pod's hostname to its IP: no network lookup involved.
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _stop_all(ref: weakref.ref) -> None:
    """At exit: stop the clusters a backend launched here, not detached (best effort)."""
    backend = ref()
    if backend is None:
        return
    with backend._lock:
        names = sorted(backend._stop_at_exit)
    for name in names:
        try:
            backend.stop(name)
        except Exception:  # noqa: BLE001 - exiting: nothing left to tell
            pass


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
