"""The :class:`KubernetesBackend`: every cluster one JobSet in the user's namespace.

State lives in the API, not in this process: the root ConfigMap of each
cluster holds its spec, so ``list``/``status``/``logs`` work after a kernel
restart, from any process with the same namespace.  Nothing connects to a
cluster before the first call that needs it: the constructor only stores
options, and :meth:`KubernetesBackend.render` never connects at all.

The lifecycle — restarts, success, the end of parameter servers, the TTL —
is JobSet's, in the cluster, with or without a notebook attached.  This
process only reads: ``status``/``watch``/``logs``/``events`` keep one
read-only :class:`~.watch.ClusterWatch` (the JobSet and its pods) per
cluster, all fed by the namespace's two watches (:class:`~.feed.NamespaceFeed`).
It acts only when asked: ``launch``, ``stop`` (deletes the JobSet; the record
and volumes stay), ``delete`` (Foreground: returns when the objects are gone),
``tensorboard``.
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

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from ... import options
from ...errors import BackendError, ClusterExists, ClusterNotFound, LaunchFailed, SpecError
from ...lifecycle import LifecyclePolicy
from ...ports import free_port
from ...runtime.progress import parse_record
from ...scriptcheck import check_files_travel, script_dir
from ...spec import IN_GRAPH, ClusterSpec
from ..base import Backend, ClusterStatus, Coordinator, Event, LogLine, LogLocation, Phase, TensorBoardInfo
from . import logs as logs_mod
from . import state
from . import tensorboard as tensorboard_mod
from .apply import apply, failure_sentence, preflight
from .client import KUEUE_API_VERSIONS, Api, api_reason
from .feed import NamespaceFeed
from .feed import events as watch_events
from .jobset import API_VERSION, KIND, cluster_addresses, cluster_manifests, render_yaml
from .manifests import (
    CLUSTER_LABEL,
    COMPONENT_LABEL,
    DETACHED_ANNOTATION,
    LOG_MOUNT,
    SCRIPT_KEY,
    SPEC_KEY,
    STOPPED_ANNOTATION,
    log_claim_name,
    owner_reference,
    selector,
    with_owner,
)
from .serving import (
    MODEL_ANNOTATION,
    SOURCE_ANNOTATION,
    serving_info,
    serving_manifests,
    serving_name,
    serving_options,
)
from .settings import K8sSettings, label_value, settings_from_env
from .storage_pods import BACKUP_GRACE
from .watch import ClusterWatch

#: What to install when the cluster has no JobSet API (one sentence, at launch).
INSTALL_JOBSET = (
    "this cluster does not serve the JobSet API (jobset.x-k8s.io/v1alpha2), which runs "
    "tfk8s clusters: ask your administrator to install JobSet v0.7 or newer (its release "
    "manifest or Helm chart; see helm/README.md), then launch again."
)
#: The PriorityClasses every cluster has (the Priority admission plugin's own).
SYSTEM_PRIORITY_CLASSES = ("system-cluster-critical", "system-node-critical")
#: Seconds a listing's records stand for a read of them on the read-only paths (a status, a
#: watch: see ``KubernetesBackend._listed_root``).
LISTED_FRESH = 5.0
#: Least seconds ``delete`` waits for a cluster's objects to be gone.
DELETE_TIMEOUT = 120.0
#: Seconds ``delete`` waits beyond the longest termination grace of the cluster's pods.
DELETE_MARGIN = 60.0
#: Seconds between two statuses ``watch`` makes while nothing changes (what time alone changes:
#: a stall, a grace passed, Kueue's verdict); ``stop`` is looked at every ``WATCH_TICK``.
WATCH_IDLE = 2.0
WATCH_TICK = 0.5


def delete_wait(spec: ClusterSpec) -> float:
    """How long ``delete`` waits: past the longest grace any of the cluster's pods may take
    to end (a backup step drains for up to :data:`~.storage_pods.BACKUP_GRACE` seconds)."""
    graces = [LifecyclePolicy.of(spec).grace_period]
    if spec.backup_url:
        graces.append(BACKUP_GRACE)
    return max(DELETE_TIMEOUT, max(graces) + DELETE_MARGIN)


def _is_root_of(obj: dict[str, Any] | None, name: str, any_state: bool = False) -> bool:
    """Whether ``obj`` is the root record of cluster ``name`` (and not being deleted, unless
    ``any_state``)."""
    labels = (obj or {}).get("metadata", {}).get("labels") or {}
    if obj is None or labels.get(COMPONENT_LABEL) != "root" or labels.get(CLUSTER_LABEL) != name:
        return False
    return any_state or not obj["metadata"].get("deletionTimestamp")


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
    capabilities = frozenset({"render", "serving", "in_graph"})

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
        self._watches: dict[str, ClusterWatch] = {}  # cluster → its read-only watch
        self._feed: NamespaceFeed | None = None  # the namespace's shared watches (see .feed)
        # root uid → (the versions of its objects, its listed status): see list_clusters
        self._listed: dict[str, tuple[tuple, ClusterStatus]] = {}
        # the roots the last listing read, and when (see _listed_root)
        self._roots_listed: tuple[float, dict[str, dict[str, Any]]] = (0.0, {})
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
        """Check the JobSet API and the quota, create every object with rollback, start watching.

        The cluster's lifecycle is its JobSet's from then on.  Unless
        ``detach``, it is stopped (its JobSet deleted, record kept) when this
        process exits; an in-graph cluster is also owned by this notebook's
        pod, so stopping or culling the server deletes it server-side.
        """
        spec = self._owned(spec)
        spec = with_detached_ttl(spec, detach)
        if spec.script is not None:
            # Its folder is importable in the pods only through the files that travel with it.
            check_files_travel(spec.script, script_dir(spec), list(spec.files))
        manifests = cluster_manifests(spec, self.settings)
        manifests[0]["metadata"]["annotations"][DETACHED_ANNOTATION] = str(detach).lower()
        if detach:  # a label too: the hub's stop hook selects the JobSets it may stop by it
            for m in manifests:
                if m["kind"] == KIND:
                    m["metadata"]["labels"][DETACHED_ANNOTATION] = "true"
        self._check_free(spec.name)
        self._check_service_name(spec.name)
        self._check_jobset_api()
        self._check_secret(spec)
        self._check_priority(spec)
        self._check_queue(spec)
        if spec.mode == IN_GRAPH:
            owner = self._notebook_pod_owner()
            if owner is not None:
                manifests[0]["metadata"]["ownerReferences"] = [owner]
        preflight(self.api, manifests, check_nodes=self.check_nodes)
        created = apply(self.api, manifests)
        self._unlist(spec.name)
        made = next((o for o in created if o.get("kind") == KIND), None)
        watch = self._start_watch(spec, created[0], jobset=made)
        if not detach:
            self._stop_when_exiting(spec.name)
        return watch.snapshot()

    def _check_free(self, name: str) -> None:
        """Refuse a name in use, saying in one sentence when it is a deletion still under way."""
        root = self._root(name, any_state=True)
        if root is None:
            return
        if root["metadata"].get("deletionTimestamp"):
            raise ClusterExists(
                f"cluster {name!r} is still being deleted in namespace "
                f"{self.settings.namespace!r} (its pods are terminating): wait for "
                f"`%tfcluster delete {name}` to return, then launch again."
            )
        raise ClusterExists(
            f"a cluster named {name!r} already exists in namespace "
            f"{self.settings.namespace!r}: launch with --replace to delete it and launch "
            f"again, choose another name, or `%tfcluster delete {name}` first."
        )

    def _check_service_name(self, name: str) -> None:
        """Refuse a name another Service has: JobSet would take that Service as the cluster's
        headless one (it adopts any Service named like the JobSet, whoever owns it), and the
        tasks' host names would never resolve."""
        try:
            service = self.api.get("v1", "Service", name)
        except ApiException as e:
            raise LaunchFailed(f"could not check the cluster name {name!r} against the "
                               f"namespace's Services: {api_reason(e)}.") from e
        if service is None:
            return
        labels = service["metadata"].get("labels") or {}
        what = (f"the {labels[COMPONENT_LABEL]} Service of cluster {labels[CLUSTER_LABEL]!r}"
                if labels.get(CLUSTER_LABEL) and labels.get(COMPONENT_LABEL) else "a Service")
        raise LaunchFailed(
            f"cluster name {name!r} is taken by {what} in namespace {self.settings.namespace!r}: "
            "JobSet would use that Service for the cluster's host names, which would never "
            "resolve; choose another name, so nothing was created."
        )

    def _check_priority(self, spec: ClusterSpec) -> None:
        """Refuse a ``--priority`` no PriorityClass has: the Priority admission plugin would
        refuse every task pod, and the Job controller would retry for ever with no pod shown.
        Where the service account may not read PriorityClasses (the chart grants it:
        ``rbac.readPriorityClasses``), the tasks' status says it instead (``FailedCreate``)."""
        if not spec.priority or spec.priority in SYSTEM_PRIORITY_CLASSES:
            return
        if not self._may("get", "scheduling.k8s.io", "priorityclasses", spec.priority):
            return  # asked first: no denied request in the API server's audit log
        try:
            k8s.SchedulingV1Api(self.api.api_client).read_priority_class(
                spec.priority, _preload_content=False, _request_timeout=self.api.timeout)
        except ApiException as e:
            if e.status == 403:
                return
            if e.status == 404:
                raise LaunchFailed(
                    f"--priority {spec.priority!r}: the cluster has no PriorityClass of that "
                    "name, so no task pod could be created; `kubectl get priorityclasses` lists "
                    "them (ask your administrator), or launch without --priority. Nothing was "
                    "created.") from e
            raise LaunchFailed(f"could not check --priority {spec.priority!r}: "
                               f"{api_reason(e)}.") from e

    def _check_queue(self, spec: ClusterSpec) -> None:
        """Refuse a ``--queue`` the namespace has no LocalQueue of: Kueue would keep the
        cluster suspended, "waiting for admission", for ever.  Where the service account may
        not read LocalQueues (a chart older than this rule), the launch goes ahead."""
        if not spec.queue:
            return
        try:
            version = next((v for v in KUEUE_API_VERSIONS if self.api.serves(v)), None)
            if version is None:
                raise LaunchFailed(
                    f"--queue {spec.queue!r}: this cluster does not serve Kueue's API "
                    "(kueue.x-k8s.io), so no queue would ever admit the cluster; launch without "
                    "--queue, or ask your administrator to install Kueue. Nothing was created.")
            found = self.api.get(version, "LocalQueue", spec.queue)
        except ApiException as e:
            if e.status == 403:
                return
            raise LaunchFailed(f"could not check --queue {spec.queue!r}: {api_reason(e)}.") from e
        if found is None:
            raise LaunchFailed(
                f"--queue {spec.queue!r}: namespace {self.settings.namespace!r} has no Kueue "
                "LocalQueue of that name, so the cluster would wait for admission for ever; "
                "`kubectl get localqueues` lists the queues you may use (ask your administrator "
                "for one), or launch without --queue. Nothing was created.")

    def _may(self, verb: str, group: str, resource: str, name: str) -> bool:
        """Whether this service account may ``verb`` the cluster-scoped object (one
        SelfSubjectAccessReview, which every user may make); False when it cannot tell."""
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "spec": {"resourceAttributes": {"verb": verb, "group": group,
                                                  "resource": resource, "name": name}}}
        try:
            answer = k8s.AuthorizationV1Api(self.api.api_client).create_self_subject_access_review(
                review, _preload_content=False, _request_timeout=self.api.timeout)
        except ApiException:
            return False
        return bool((Api._json(answer).get("status") or {}).get("allowed"))

    def _check_jobset_api(self) -> None:
        try:
            served = self.api.serves(API_VERSION)
        except ApiException as e:
            raise LaunchFailed(f"could not ask the cluster for the JobSet API: {api_reason(e)}.") from e
        if not served:
            raise LaunchFailed(INSTALL_JOBSET)

    def _check_secret(self, spec: ClusterSpec, name: str | None = None, then: str = "launch") -> None:
        """Refuse a ``--credentials-secret`` that does not exist: a pod naming it would wait
        in ``CreateContainerConfigError`` forever.  Reads its metadata only, never its data,
        and only where the Role allows ``get`` on secrets (not the shipped one: see
        :mod:`.rbac`); without it the step's status carries the kubelet's sentence.
        ``name``: another Secret than the spec's (serve --from)."""
        name = name or spec.credentials_secret
        if not name:
            return
        try:
            found = self.api.secret_metadata(name)
        except ApiException as e:
            if e.status == 403:
                # The shipped Role grants no access to Secrets (the hub, which creates
                # it, would then need to read every Secret of the cluster): the pods
                # say so instead, as CreateContainerConfigError in the status.
                return
            raise LaunchFailed(
                f"could not check that Secret {name!r} (--credentials-secret) exists in namespace "
                f"{self.settings.namespace!r}: {api_reason(e)}."
            ) from e
        if found is None:
            raise LaunchFailed(
                f"--credentials-secret {name!r}: there is no Secret of that name in namespace "
                f"{self.settings.namespace!r}; create it there first (e.g. `kubectl create secret "
                f"generic {name} --from-literal=AWS_ACCESS_KEY_ID=...`), then {then} again."
            )

    def _notebook_pod_owner(self) -> dict[str, Any] | None:
        """An ownerReference to this notebook's pod (by its name, ``HOSTNAME``), if it is one."""
        name = os.environ.get("TFK8S_POD_NAME") or os.environ.get("HOSTNAME")
        if not name or not os.environ.get("KUBERNETES_SERVICE_HOST"):
            return None
        try:
            pod = self.api.get("v1", "Pod", name)
        except ApiException:
            return None  # not allowed to read it, or not a pod here: no server-side owner
        if pod is None:
            return None
        # No blockOwnerDeletion: that would need update on pods/finalizers, and
        # the hub deletes notebook pods in the background anyway.
        return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": pod["metadata"]["uid"]}

    def _stop_when_exiting(self, name: str) -> None:
        """Stop ``name`` when this process exits (one exit hook per backend object)."""
        with self._lock:
            self._stop_at_exit.add(name)
            if self._exit_hook:
                return
            self._exit_hook = True
        atexit.register(_stop_all, weakref.ref(self))

    def attach(self, name: str) -> None:
        """Check that the cluster exists: its JobSet runs its lifecycle in the cluster."""
        self._require_root(name)

    # -- state from the API ---------------------------------------------------
    def _root(self, name: str, any_state: bool = False) -> dict[str, Any] | None:
        """The root record of ``name`` (None: none, or being deleted unless ``any_state``)."""
        try:
            root = self.api.get("v1", "ConfigMap", name)
        except ApiException as e:
            raise BackendError(
                f"could not read cluster {name!r} in namespace {self.settings.namespace!r}: "
                f"{api_reason(e)}."
            ) from e
        return root if _is_root_of(root, name, any_state) else None

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

    def _start_watch(self, spec: ClusterSpec, root: dict[str, Any],
                     jobset: dict[str, Any] | None = None) -> ClusterWatch:
        """The cluster's watch (``jobset``: the JobSet this process just created, which the
        namespace's watch may bring only later)."""
        uid = root["metadata"]["uid"]
        with self._lock:
            current = self._watches.get(spec.name)
        if current is not None and current.alive and current.root["metadata"]["uid"] == uid:
            return current
        # waits for the first listings
        new = ClusterWatch(self.api, spec, root, feed=self._namespace_feed(), jobset=jobset).start()
        with self._lock:
            current, self._watches[spec.name] = self._watches.get(spec.name), new
        if current is not None and current is not new:
            current.close()
        return new

    def _namespace_feed(self) -> NamespaceFeed:
        """The namespace's two shared watches (one pair per backend, started on first use)."""
        with self._lock:
            if self._feed is None or not self._feed.alive:
                self._feed = NamespaceFeed(self.api).start()
            return self._feed

    def _forget(self, name: str) -> None:
        with self._lock:
            self._watches.pop(name, None)
            self._stop_at_exit.discard(name)

    def _listed_root(self, name: str) -> dict[str, Any]:
        """The root of ``name`` as this backend's last listing read it, if that listing is at
        most :data:`LISTED_FRESH` seconds old; else read now (raises ClusterNotFound).

        Only the read-only paths use it (a status, a watch, the existence check before them):
        the sidebar's discovery pass lists N clusters and then watches each, which would
        otherwise read every record again, twice. A record deleted since the listing is a race
        that a read now has too (it may be deleted a moment after it); the namespace's watches
        then say the cluster is gone. Every change (stop, delete, serve) reads the record anew.
        """
        at, roots = self._roots_listed
        root = roots.get(name)
        if root is not None and time.monotonic() - at <= LISTED_FRESH:
            return root
        return self._require_root(name)

    def check_exists(self, name: str) -> None:
        self._listed_root(name)

    def _unlist(self, name: str) -> None:
        """Forget the listed record of ``name`` (this process has just changed the cluster)."""
        at, roots = self._roots_listed
        if name in roots:
            self._roots_listed = (at, {k: v for k, v in roots.items() if k != name})

    def _watcher(self, name: str) -> ClusterWatch:
        """The live (read-only) watch of ``name``, started from the API if this process has none
        (from the record a listing has just read, see :meth:`_listed_root`)."""
        with self._lock:
            current = self._watches.get(name)
        if current is not None and current.alive:
            return current
        root = self._listed_root(name)
        return self._start_watch(self._spec_of(root), root)

    # -- Backend --------------------------------------------------------------
    def status(self, name: str) -> ClusterStatus:
        """The cluster's status: a read (pods from the watch, progress from the lead task's log)."""
        watch = self._watcher(name)
        if watch.progress is None and not watch.deleted:
            logs_mod.refresh_progress(watch)
        return watch.snapshot()

    def list_clusters(self) -> list[ClusterStatus]:
        """This user's clusters in the namespace: their records listed, their JobSets and task
        pods from the namespace's watches (started by the first listing, as a watch of any
        cluster starts them), or listed too while those cannot tell (three requests, whatever
        the number of clusters)."""
        try:
            feed = self._namespace_feed()
            roots = self.api.list_objects(
                "v1", "ConfigMap", selector(None, "root", label_value(self.settings.user))
            ).get("items", [])
            known = self._watched_objects(feed, roots)
            if known is not None:
                pods, jobsets = known
            else:
                jobsets = {j["metadata"]["name"]: j for j in self.api.list_objects(
                    API_VERSION, KIND, selector(None, "jobset")).get("items", [])}
                pods = self.api.list_objects("v1", "Pod", selector(None, "task")).get("items", [])
        except ApiException as e:
            raise BackendError(
                f"could not list clusters in namespace {self.settings.namespace!r}: "
                f"{api_reason(e)}."
            ) from e
        by_cluster: dict[str, list[dict[str, Any]]] = {}
        for p in pods:
            by_cluster.setdefault((p["metadata"].get("labels") or {}).get(CLUSTER_LABEL, ""), []).append(p)
        out, listed = [], {}
        for root in roots:
            meta = root["metadata"]
            name = meta["name"]
            mine = by_cluster.get(name, [])
            # a status is a function of these objects only: made again when one has changed
            versions = (meta.get("resourceVersion"), _version(jobsets.get(name)),
                        sorted(_version(p) for p in mine))
            known = self._listed.get(meta["uid"])
            if known is not None and known[0] == versions:
                status = known[1]
            else:
                try:
                    spec = self._spec_of(root)
                except (KeyError, ValueError):
                    continue  # not a record we can read: leave it alone
                view = state.View(
                    spec=spec, jobset=jobsets.get(name), pods=state.latest_pods(mine),
                    stopped=bool((meta.get("annotations") or {}).get(STOPPED_ANNOTATION)),
                    steps=state.latest_steps(mine))
                status = state.cluster_status(view, root)
            if not any(t.reason == "no pod" for t in status.tasks):  # explained from Events below
                listed[meta["uid"]] = (versions, status)
            out.append(state.copy_status(status))
        self._listed = listed
        self._roots_listed = (time.monotonic(), {
            r["metadata"]["name"]: r for r in roots if _is_root_of(r, r["metadata"]["name"])})
        self._explain_no_pod(out, jobsets)
        out.sort(key=lambda s: s.created, reverse=True)
        return out

    def _watched_objects(self, feed: NamespaceFeed, roots: list[dict[str, Any]]):
        """``(pods, JobSets by name)`` from the namespace feed, once it has listed both (waiting
        for its first listings as long as a request may take) and while it holds, for every
        cluster not stopped, the JobSet its record owns; else None, and the caller lists (a
        cluster launched a moment ago, or deleted and launched again under its name, may not
        have reached the feed yet)."""
        if not feed.wait_synced(self.api.timeout):
            return None
        known = feed.snapshot()
        if known is None:
            return None
        _, jobsets = known
        for root in roots:
            meta = root["metadata"]
            if (meta.get("annotations") or {}).get(STOPPED_ANNOTATION):
                continue
            owners = (jobsets.get(meta["name"]) or {}).get("metadata", {}).get("ownerReferences") or []
            if not any(o.get("uid") == meta.get("uid") for o in owners):
                return None
        return known

    def _explain_no_pod(self, clusters: list[ClusterStatus], jobsets: dict[str, Any]) -> None:
        """Tasks without a pod: the Job controller's FailedCreate, from one Event listing made
        only when some task has no pod."""
        if not any(t.reason == "no pod" for c in clusters for t in c.tasks):
            return
        try:
            events = self.api.list_objects("v1", "Event").get("items", [])
        except ApiException:
            return  # the reason stays "no pod": listing must not fail for it
        for c in clusters:
            born = state.parse_time((jobsets.get(c.name) or {}).get("metadata", {}).get(
                "creationTimestamp")) or 0.0
            state.explain_no_pod(c.tasks, events, c.name, born)
            if c.phase == Phase.PENDING and c.reason.endswith(": no pod"):
                waiting = next(t for t in c.tasks if t.phase == Phase.PENDING)
                c.reason = f"{waiting.name}: {waiting.reason}"

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
            # wake for stop often, but make a status only at a change or once idle: fifty
            # watches of a sidebar would otherwise build a hundred statuses a second
            idle_until = time.monotonic() + WATCH_IDLE
            while True:
                version = watcher.wait_change(seen, timeout=WATCH_TICK)
                if version != seen or stop.is_set() or watcher.deleted or not watcher.alive or (
                        time.monotonic() >= idle_until):
                    seen = version
                    break

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
            elif pod is not None:  # a storage step's pod: named by its step (sync, backup)
                task = state.step_of_pod((pod.get("metadata") or {}).get("labels") or {}) or task
            out.append(Event(
                time=state.event_time(e), task=task, reason=e.get("reason", ""),
                message=e.get("message", ""), type=e.get("type", "Normal"),
            ))
        out.sort(key=lambda ev: ev.time)
        return out

    def stop(self, name: str) -> ClusterStatus:
        """Delete the JobSet (its Jobs and pods go with it); keep the record and the volumes.

        Not ``suspend``: Kueue owns a queued JobSet's ``suspend`` (it would
        resume it), and a suspended JobSet never finishes, so its TTL would
        never run.  Launch the same name again after ``delete``.
        """
        self._unlist(name)  # its watch, if this process has none, starts from the record read now
        watch = self._watcher(name)
        watch.mark_stopped("stopped by the user")
        with self._lock:
            self._stop_at_exit.discard(name)
        try:
            self.api.patch("v1", "ConfigMap", name, {
                "metadata": {"annotations": {STOPPED_ANNOTATION: f"{time.time():.3f}"}}
            })
            self.api.delete(API_VERSION, KIND, name, propagation="Foreground")
        except ApiException as e:
            raise BackendError(f"could not stop cluster {name!r}: {api_reason(e)}.") from e
        return watch.snapshot()

    def delete(self, name: str, keep_logs: bool = False, force: bool = False,
               wait: bool = True) -> LogLocation | None:
        """Delete the root with Foreground propagation: the API deletes every object it owns.

        With ``wait`` (the default) this returns once the root is gone — the
        root goes last, after every pod has terminated — so launching the same
        name again works at once.  The log claim survives when ``keep_logs``
        (its owner reference is removed first, and where the logs are is
        returned).  ``force`` changes nothing here: the API's state is always readable.
        """
        root = self._require_root(name)
        spec = self._spec_of(root)
        self._unlist(name)
        with self._lock:
            watch = self._watches.pop(name, None)
            self._stop_at_exit.discard(name)
        if watch is not None:
            watch.close(deleted=True)
        try:
            if keep_logs and not spec.log_claim:
                self.api.patch("v1", "PersistentVolumeClaim", log_claim_name(spec),
                               {"metadata": {"ownerReferences": None}})
            self.api.delete("v1", "ConfigMap", name, propagation="Foreground")
            if wait:
                self._wait_gone(name, root["metadata"]["uid"], delete_wait(spec))
        except ApiException as e:
            raise BackendError(f"could not delete cluster {name!r}: {api_reason(e)}.") from e
        return LogLocation(LOG_MOUNT, log_claim_name(spec)) if keep_logs else None

    def _wait_gone(self, name: str, uid: str, timeout: float = DELETE_TIMEOUT) -> None:
        """Watch the root until the object with ``uid`` is deleted (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            root = self.api.get("v1", "ConfigMap", name)
            if root is None or root["metadata"]["uid"] != uid:
                return
            version = root["metadata"]["resourceVersion"]
            left = max(1, int(deadline - time.monotonic()))
            stream = self.api.core.list_namespaced_config_map(
                self.api.namespace, field_selector=f"metadata.name={name}", watch=True,
                resource_version=version, timeout_seconds=min(left, 30),
                _preload_content=False, _request_timeout=(self.api.timeout, min(left, 30) + 15))
            for event in watch_events(stream):
                if event.get("type") == "DELETED":
                    return
        raise BackendError(
            f"cluster {name!r} is still being deleted after {timeout:g} s (its pods are "
            "terminating): `%tfcluster list` shows when it is gone."
        )

    def addresses(self, name: str) -> dict[str, list[str]]:
        spec = self.spec(name)
        return cluster_addresses(spec, self.settings)

    def tensorboard(self, name: str) -> TensorBoardInfo:
        """Create (or reuse) the cluster's TensorBoard (Secret, Deployment, Service); return once
        it answers (:mod:`.tensorboard`).

        The URL goes through the notebook server's own proxy
        (``<prefix>tfk8s/tensorboard/<host>:<port>/``), which adds the token TensorBoard asks
        of every request: the browser needs no Ingress or port-forward, and another user's
        request to the Service is refused.
        """
        root = self._require_root(name)
        return tensorboard_mod.start(self.api, self._spec_of(root), root, self.settings)

    # -- TF Serving (pure builders in .serving) -----------------------------------
    def render_serving(self, spec: ClusterSpec, model: str, **options: Any) -> list[dict[str, Any]]:
        """The TF Serving Deployment + Service for ``model`` of ``spec``; needs no cluster."""
        opts = serving_options(model, **_serving_secret(spec, options))
        return serving_manifests(self._owned(spec), self.settings, opts)

    def serve(self, name: str, model: str | None = None, **options: Any):
        """Create (or reuse) the cluster's TF Serving Deployment + Service, owned by its root.

        ``source_url``: serve from object storage (an init container fetches the models;
        ``credentials_secret``, default the cluster's, is its environment).  An existing
        Deployment is reused unless it serves another model or source than the one asked for:
        that is refused in one sentence (stop serving first)."""
        root = self._require_root(name)
        spec = self._spec_of(root)
        opts = serving_options(model or spec.name, **_serving_secret(spec, options))
        svc = serving_name(spec)
        try:
            existing = self.api.get("apps/v1", "Deployment", svc)
            if existing is not None:
                _same_serving(name, existing, opts, model is not None)
            elif opts.source_url:
                self._check_secret(spec, opts.credentials_secret, then="serve")
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
        """Stop every watch this object runs (the clusters run on)."""
        with self._lock:
            watches = list(self._watches.values())
            self._watches.clear()
            feed, self._feed = self._feed, None
        for w in watches:
            w.close()
        if feed is not None:
            feed.close()


def _version(obj: dict[str, Any] | None) -> tuple[str, str] | None:
    """``(uid, resourceVersion)`` of an object: equal only if it has not changed."""
    meta = (obj or {}).get("metadata") or {}
    return (meta.get("uid", ""), meta.get("resourceVersion", "")) if obj else None


def _own_ip() -> str:
    # /etc/hosts maps a pod's hostname to its IP: no network lookup involved.
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def with_detached_ttl(spec: ClusterSpec, detach: bool) -> ClusterSpec:
    """``spec`` with the administrator's TTL of detached runs (``$TFK8S_DETACHED_TTL``,
    the hub's ``detached_ttl``) when it is launched detached without a ``--ttl`` of its own:
    no notebook stops a detached run, and finished ones would pile up."""
    if not detach or spec.ttl_after_finished is not None:
        return spec
    ttl = options.get("detached_ttl")
    if ttl is None:
        return spec
    return ClusterSpec.from_dict({**spec.to_dict(), "ttl_after_finished": float(ttl)})


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


def _serving_secret(spec: ClusterSpec, options: dict[str, Any]) -> dict[str, Any]:
    """Serving options with the Secret a fetch from a URL reads: the one given, else the cluster's."""
    if options.get("source_url") and not options.get("credentials_secret") and spec.credentials_secret:
        return {**options, "credentials_secret": spec.credentials_secret}
    return options


def _same_serving(name: str, existing: dict[str, Any], opts, model_given: bool) -> None:
    """Refuse to reuse a Deployment that serves another model or source than the one asked for."""
    notes = (existing["spec"]["template"].get("metadata") or {}).get("annotations") or {}
    model, source = notes.get(MODEL_ANNOTATION), notes.get(SOURCE_ANNOTATION)
    if (model_given and model != opts.model) or (opts.source_url and source != opts.source_url):
        where = f"from {source}" if source else "from its log volume"
        raise SpecError(
            f"cluster {name!r} already serves model {model!r} {where}: `%tfcluster serve {name} --stop` "
            "first, then serve again."
        )
