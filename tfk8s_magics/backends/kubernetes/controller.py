"""The controller of one cluster: a pod watch that also carries out the lifecycle policy.

After every change (and when a grace period or TTL falls due) it runs
:func:`.state.plan` — the cluster's
:class:`~tfk8s_magics.lifecycle.LifecyclePolicy` applied to its pods — and
does what it says: create a replacement pod for a retryable failure,
delete what still runs a grace period after success (at once after a
failure), record when the cluster ended, delete it when its TTL has passed.

Only the process that launched the cluster (:meth:`KubernetesBackend.launch`)
or took it over (:meth:`KubernetesBackend.attach`) runs one; reading a
cluster never starts one.  It lives in that process, so a detached cluster
whose launching kernel is gone is not restarted until some process attaches
(the JobSet move puts this controller in the cluster).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client.rest import ApiException

from ...spec import ClusterSpec
from ..base import Phase
from . import state
from .client import Api, api_reason
from .manifests import FINISHED_ANNOTATION, owner_reference, task_pod, with_owner
from .settings import K8sSettings
from .watch import PodWatch


class ClusterController(PodWatch):
    """A :class:`PodWatch` that acts: see the module docstring."""

    def __init__(
        self,
        api: Api,
        spec: ClusterSpec,
        settings: K8sSettings,
        root: dict[str, Any],
        on_deleted: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(api, spec, root)
        self.settings = settings
        self.owner = owner_reference({"apiVersion": "v1", "kind": "ConfigMap", **root})
        self._act_lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._on_deleted = on_deleted

    @property
    def acts(self) -> bool:
        """A controller runs the cluster's lifecycle."""
        return True

    def close(self, deleted: bool = False) -> None:
        """Stop watching and acting."""
        timer = self._timer
        if timer is not None:
            timer.cancel()
        super().close(deleted)

    def next_wakeup(self) -> float | None:
        """When the lifecycle must act next with no new pod event (grace or TTL), if ever."""
        return state.next_wakeup(self.view(), time.time())

    def _after_change(self) -> None:
        if self._halt.is_set():
            return
        with self._act_lock:
            self._act()
            wake = self.next_wakeup()
            if wake is not None and not self._halt.is_set():
                # A grace period or TTL ends before the next pod event may come.
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = threading.Timer(max(0.0, wake - time.time()) + 0.01, self._after_change)
                self._timer.daemon = True
                self._timer.start()

    def _act(self) -> None:
        if self.deleted or self._halt.is_set():
            return
        now = time.time()
        view = self.view()
        phase, _ = state.cluster_phase(view, state.task_statuses(view))
        if phase in Phase.TERMINAL and self.done_since is None:
            self.done_since = view.done_since = now
        for action in state.plan(view, now):
            try:
                self._do(action)
            except ApiException as e:
                if e.status not in (404, 409):  # already done by an earlier pass
                    self.error = api_reason(e)
                    self.record_event("", "ActionFailed", f"{action}: {self.error}", "Warning")
        self._maybe_list_events(view)

    def _do(self, action: object) -> None:
        if isinstance(action, state.Create):
            self._create(action)
        elif isinstance(action, state.DeletePods):
            self._delete_pods(action)
        elif isinstance(action, state.MarkFinished):
            self.finished_at = time.time()
            self.requests += 1
            self.api.patch("v1", "ConfigMap", self.spec.name, {
                "metadata": {"annotations": {FINISHED_ANNOTATION: f"{self.finished_at:.3f}"}}
            })
        elif isinstance(action, state.DeleteCluster):
            self.requests += 1
            self.api.delete("v1", "ConfigMap", self.spec.name)
            self.record_event("", "Deleted", action.reason)
            self.deleted = True
            self._halt.set()
            if self._on_deleted:
                self._on_deleted(self.spec.name)

    def _create(self, action: state.Create) -> None:
        manifest = task_pod(self.spec, self.settings, action.task, action.attempt)
        name = manifest["metadata"]["name"]
        if self.pod_named(name) is not None or name in self._ours:
            return
        self._ours.add(name)
        self.requests += 1
        self.api.create(with_owner(manifest, self.owner))
        self.record_event(action.task.name, "Restarted", f"replaced by pod {name} ({action.reason})",
                          "Warning")

    def _delete_pods(self, action: state.DeletePods) -> None:
        for name in action.names:
            if name in self._ours:
                continue
            self._ours.add(name)
            task = state.pod_task(self.pod_named(name) or {})  # before its DELETED event
            self.requests += 1
            self.api.delete("v1", "Pod", name)
            self.record_event(task.name if task else "", "Recycled", f"deleted pod {name}: {action.reason}")
