"""The harness object tests use: one fake Kubernetes API server (a TEST DOUBLE).

Wires the store, the simulated kubelet/scheduler, the controllers, admission
and the HTTP server together, seeds what a fresh cluster has (namespaces
``default`` and ``kube-system``, nodes, a default StorageClass ``standard``),
and offers shortcuts to read and write objects without HTTP.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TypeVar

import kubernetes.client

from . import api as api_module
from .api import ADMIN_TOKEN, KubeAPI, RecordedRequest, Request
from .errors import ApiError
from .jobsets import JobSetDriver, JobSetPods
from .kubelet import SimulatedKubelet
from .quota import QuotaController
from .rbac import RoleAuthorizer
from .resources import kind_for_object, lookup
from .selectors import labels_match, parse_label_selector
from .server import FakeKubeServer
from .store import Store
from .validation import Validator

T = TypeVar("T")


class KubeHarness:
    """A running fake API server plus handles to script and inspect it."""

    def __init__(self, *, kubernetes_version: str = "1.29",
                 nodes: tuple[str, ...] = ("node-1",), history_size: int = 1000,
                 strict_validation: bool = True,
                 jobset_in_order: bool = False):
        self.store = Store(history_size=history_size)
        self.kubelet = SimulatedKubelet(self.store, nodes)
        self.validator = Validator(kubernetes_version, strict=strict_validation)
        self.api = KubeAPI(self.store, self.kubelet, self.validator)
        jobset_pods = JobSetPods(self.store, in_order=jobset_in_order)
        for observer in (QuotaController(self.store), jobset_pods):
            self.store.add_observer(observer)
        #: What a test says JobSet did (finish); see :mod:`.jobsets`.
        self.jobsets = JobSetDriver(self.store, jobset_pods)
        self._server = FakeKubeServer(self.api)
        self._clients: list[kubernetes.client.ApiClient] = []
        self._api_client: kubernetes.client.ApiClient | None = None
        self._admin_client: kubernetes.client.ApiClient | None = None
        self._seed(nodes)

    def _seed(self, nodes: tuple[str, ...]) -> None:
        for ns in ("default", "kube-system"):
            self.create_namespace(ns)
        for node in nodes:
            self.store.create(lookup("nodes"), {
                "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node,
                                                      "kubernetes.io/os": "linux"}},
                "spec": {},
                "status": {"capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                           "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                           "conditions": [{"type": "Ready", "status": "True",
                                           "reason": "KubeletReady"}]},
            })
        self.create_object({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": "standard", "annotations": {
                "storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": "kubernetes.io/no-provisioner",
        })

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> KubeHarness:
        """Start serving on 127.0.0.1 (a free port)."""
        self._server.start()
        return self

    def stop(self) -> None:
        """Close clients, stop the kubelet's timers and the server; joins all threads."""
        for client in self._clients:
            client.close()
        self.kubelet.stop()
        self._server.stop()

    def __enter__(self) -> KubeHarness:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:43121``."""
        return self._server.url

    @property
    def observer_errors(self) -> list[BaseException]:
        """Exceptions raised inside simulated components (should stay empty)."""
        return self.store.observer_errors

    # -- clients ---------------------------------------------------------------

    def new_api_client(self, *, admin: bool = False) -> kubernetes.client.ApiClient:
        """A fresh official ``ApiClient`` bound to this server (closed on ``stop``).

        Without ``admin`` the client acts as the bound ServiceAccount (subject to
        ``set_role``); with ``admin`` it bypasses RBAC, like a cluster admin.
        """
        cfg = kubernetes.client.Configuration(host=self.url)
        if admin:
            cfg.api_key = {"BearerToken": ADMIN_TOKEN}
            cfg.api_key_prefix = {"BearerToken": "Bearer"}
        client = kubernetes.client.ApiClient(cfg)
        self._clients.append(client)
        return client

    @property
    def api_client(self) -> kubernetes.client.ApiClient:
        """The backend's client: acts as the ServiceAccount given to ``set_role``."""
        if self._api_client is None:
            self._api_client = self.new_api_client()
        return self._api_client

    @property
    def admin_api_client(self) -> kubernetes.client.ApiClient:
        """A cluster-admin client that RBAC never denies (for test setup/inspection)."""
        if self._admin_client is None:
            self._admin_client = self.new_api_client(admin=True)
        return self._admin_client

    # -- RBAC and the request log --------------------------------------------------

    def set_role(self, role: dict, namespace: str, service_account: str = "default") -> None:
        """Enforce ``role`` (a rbac/v1 Role dict) bound to ``service_account`` in
        ``namespace`` for every non-admin request from now on (cluster-scoped requests are
        refused: the real authorizer's ClusterRoles are tests/test_k8s_defects_real.py's)."""
        self.api.authorizer = RoleAuthorizer(role, namespace, service_account)

    def clear_role(self) -> None:
        """Stop enforcing RBAC (every request is allowed again)."""
        self.api.authorizer = None

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of every HTTP request served so far, oldest first."""
        return api_module.copy_request_records(self.api)

    def clear_requests(self) -> None:
        """Forget recorded requests (e.g. after test setup)."""
        with self.api._requests_lock:
            self.api.requests.clear()

    # -- direct object access (no HTTP, no RBAC, not recorded) ---------------------

    def create_object(self, obj: dict) -> dict:
        """Create ``obj`` through validation and admission, as an admin would."""
        kind = kind_for_object(obj)
        ns = (obj.get("metadata") or {}).get("namespace") if kind.namespaced else None
        if kind.namespaced and not ns:
            raise ValueError(f"{kind.kind} needs metadata.namespace for create_object")
        path = (f"/api/{kind.version}" if not kind.group else
                f"/apis/{kind.group}/{kind.version}") + \
            (f"/namespaces/{ns}" if ns else "") + f"/{kind.plural}"
        response = self.api.handle(Request("POST", path, {}, json.dumps(obj).encode(),
                                           "application/json", internal=True))
        if response.code >= 300:
            body = response.body
            raise ApiError(response.code, body["reason"], body["message"], body.get("details"))
        return response.body

    def create_namespace(self, name: str, labels: dict[str, str] | None = None) -> dict:
        """Create a namespace (status Active, ``kubernetes.io/metadata.name`` label)."""
        return self.create_object({"apiVersion": "v1", "kind": "Namespace",
                                   "metadata": {"name": name, "labels": dict(labels or {})}})

    def get_object(self, kind: str, name: str, namespace: str | None = None) -> dict | None:
        """The stored object (a copy) or None; ``kind`` like ``Pod``/``pods``/``jobs.batch``."""
        return self.store.get(lookup(kind), namespace, name)

    def list_objects(self, kind: str, namespace: str | None = None,
                     label_selector: str | None = None) -> list[dict]:
        """Stored objects of ``kind`` (copies), optionally filtered by a label selector."""
        reqs = parse_label_selector(label_selector)
        return [o for o in self.store.objects(lookup(kind), namespace)
                if labels_match(reqs, o["metadata"].get("labels"))]

    def events(self, namespace: str, involved_name: str | None = None,
               reason: str | None = None) -> list[dict]:
        """Events in ``namespace``, oldest first, optionally about one object / of one reason."""
        found = [e for e in self.store.objects(lookup("events"), namespace)
                 if (involved_name is None or e["involvedObject"]["name"] == involved_name)
                 and (reason is None or e["reason"] == reason)]
        return sorted(found, key=lambda e: int(e["metadata"]["resourceVersion"]))

    @staticmethod
    def wait_for(condition: Callable[[], T], timeout: float = 5.0,
                 interval: float = 0.02, message: str = "condition") -> T:
        """Poll ``condition()`` until truthy and return it; AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() >= deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {message}")
            time.sleep(interval)
