"""Test helpers for the REAL Kubernetes of ``scripts/kube`` (devcluster): no double involved.

A :class:`RealKube` holds an admin client of the running cluster; :meth:`RealKube.user_namespace`
makes a lab user's namespace exactly as the hub does (``tfk8s_hub.bootstrap``: labels incl. Pod
Security ``restricted``, ServiceAccount, the RoleBinding to the backend's ClusterRole (applied
once, as the chart ships it), LimitRange, quota, NetworkPolicy) and
returns a client that authenticates with **that ServiceAccount's own token** (TokenRequest), so
RBAC, admission and quota are the API server's, not ours. What a client did is read back from the
API server's audit log (:meth:`UserNamespace.requests`). Pods land on kwok nodes (the namespace's
default toleration); a test ends a pod with :meth:`RealKube.exit_pod`, and JobSet's real controller
decides what follows.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import kubernetes.client
from kubernetes import config as kconfig
from kubernetes.client.rest import ApiException

T = TypeVar("T")

EXIT_LABEL = "kwok.tfk8s.dev/exit"
KWOK_TOLERATION = [
    {"key": "kwok.x-k8s.io/node", "operator": "Equal", "value": "fake", "effect": "NoSchedule"}
]
# A namespace with these annotations puts every pod on a kwok node (PodTolerationRestriction gives
# the toleration, PodNodeSelector the node selector), never on the real node of tier 2.
KWOK_ANNOTATIONS = {
    "scheduler.alpha.kubernetes.io/defaultTolerations": json.dumps(KWOK_TOLERATION),
    "scheduler.alpha.kubernetes.io/node-selector": "type=kwok",
}


def wait_for(
    condition: Callable[[], T], timeout: float = 60.0, interval: float = 0.2, message: str = "condition"
) -> T:
    """Poll ``condition()`` until truthy and return it; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {message}")
        time.sleep(interval)


@dataclass
class AuditRecord:
    """One request as the API server's audit log saw it."""

    user: str
    verb: str
    uri: str
    code: int
    namespace: str | None
    resource: str | None
    subresource: str | None


@dataclass
class UserNamespace:
    """A lab user's namespace on the real cluster and a client acting as its ServiceAccount."""

    kube: RealKube
    name: str
    service_account: str
    api_client: kubernetes.client.ApiClient
    audit_offset: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def username(self) -> str:
        """The ServiceAccount's user name as the API server authenticates it."""
        return f"system:serviceaccount:{self.name}:{self.service_account}"

    def requests(self, stage: str = "ResponseComplete") -> list[AuditRecord]:
        """Every request this ServiceAccount made since the namespace was made, oldest first.

        ``stage="ResponseStarted"``: the watches that are open (a watch completes when it ends).
        """
        return [r for r in self.kube.audit(self.audit_offset, stage) if r.user == self.username]


    def grant(self, name: str, rules: list[dict]) -> None:
        """Bind a namespaced Role of ``rules`` to the ServiceAccount too (what an admin adds to the
        shipped one), and wait until the authorizer applies its first rule."""
        rbac = kubernetes.client.RbacAuthorizationV1Api(self.kube.admin)
        rbac.create_namespaced_role(self.name, {"metadata": {"name": name}, "rules": rules})
        rbac.create_namespaced_role_binding(self.name, {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": self.service_account, "namespace": self.name}]})
        first = rules[0]
        review = {"spec": {"resourceAttributes": {
            "namespace": self.name, "verb": first["verbs"][0], "group": first["apiGroups"][0],
            "resource": first["resources"][0]}}}
        auth = kubernetes.client.AuthorizationV1Api(self.api_client)
        wait_for(lambda: auth.create_self_subject_access_review(review).status.allowed, 30,
                 message=f"Role {name} in force")


class RealKube:
    """The running devcluster, seen as its administrator."""

    def __init__(self, kubeconfig: str, audit_log: Path | None):
        self.kubeconfig = kubeconfig
        cfg = kubernetes.client.Configuration()
        kconfig.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        self.configuration = cfg
        self.admin = kubernetes.client.ApiClient(cfg)
        self.audit_log = audit_log
        self._namespaces: list[str] = []
        self.leaving: list[str] = []  # deleted by a test's teardown; must be gone by the session's end
        self._clients: list[kubernetes.client.ApiClient] = []
        self._restricted = ""  # a namespace for restricted_refusal, made on first use

    # -- clients -----------------------------------------------------------------------------
    def client_with_token(self, token: str) -> kubernetes.client.ApiClient:
        """A client that authenticates with ``token`` only (no admin certificate)."""
        cfg = kubernetes.client.Configuration()
        cfg.host = self.configuration.host
        cfg.ssl_ca_cert = self.configuration.ssl_ca_cert
        cfg.api_key = {"BearerToken": token}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
        c = kubernetes.client.ApiClient(cfg)
        self._clients.append(c)
        return c

    @property
    def core(self) -> kubernetes.client.CoreV1Api:
        """CoreV1Api as admin."""
        return kubernetes.client.CoreV1Api(self.admin)

    @property
    def custom(self) -> kubernetes.client.CustomObjectsApi:
        """CustomObjectsApi as admin."""
        return kubernetes.client.CustomObjectsApi(self.admin)

    # -- namespaces --------------------------------------------------------------------------
    def user_namespace(self, prefix: str = "u", *, bootstrap=None, kwok: bool = True) -> UserNamespace:
        """A fresh namespace bootstrapped as the hub does it, with a client acting as its ServiceAccount."""
        from tfk8s_hub.bootstrap import BootstrapSpec, bootstrap_objects, namespace_labels

        spec = bootstrap or BootstrapSpec(hub_namespace="default")
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        annotations = {}
        if kwok:  # the PodTolerationRestriction plugin gives every pod here the kwok toleration
            annotations.update(KWOK_ANNOTATIONS)
        offset = self.audit_size()
        # the backend's rules, shipped once as a ClusterRole (the chart's), bound per namespace
        from tfk8s_magics.backends.kubernetes.rbac import backend_cluster_role

        self.apply([backend_cluster_role(spec.role_name)])
        self.core.create_namespace(
            {"metadata": {"name": name, "labels": namespace_labels(spec), "annotations": annotations}}
        )
        self._namespaces.append(name)
        self.apply(bootstrap_objects(spec, name, self.api_server() if spec.discovers_api_server else None))
        token = self.token(name, spec.service_account)
        # a pod that names no ServiceAccount needs the namespace's "default", which the
        # controller-manager makes a moment after the namespace: admission refuses it until then
        wait_for(lambda: self._has_service_account(name, "default"), 60, message=f"{name}/default")
        return UserNamespace(self, name, spec.service_account, self.client_with_token(token), offset)

    def _has_service_account(self, namespace: str, name: str) -> bool:
        try:
            self.core.read_namespaced_service_account(name, namespace)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    def api_server(self):
        """Where pods reach the API server, read as the hub reads it (``tfk8s_hub.spawner``)."""
        import asyncio

        from tfk8s_hub.spawner import read_api_server

        return asyncio.run(read_api_server(lambda name: getattr(kubernetes.client, name)(self.admin)))

    def namespace(self, prefix: str = "ns", labels: dict | None = None) -> str:
        """A bare namespace (no bootstrap objects, pods land on kwok nodes), deleted at cleanup."""
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        annotations = {"scheduler.alpha.kubernetes.io/defaultTolerations": json.dumps(KWOK_TOLERATION)}
        self.core.create_namespace(
            {"metadata": {"name": name, "labels": labels or {}, "annotations": annotations}}
        )
        self._namespaces.append(name)
        return name

    def token(self, namespace: str, service_account: str, seconds: int = 3600) -> str:
        """A bound token of the ServiceAccount (TokenRequest), as a projected volume would get."""

        def ask():
            try:
                return self.core.create_namespaced_service_account_token(
                    service_account, namespace, {"spec": {"expirationSeconds": seconds}}
                ).status.token
            except ApiException as e:
                if e.status == 404:  # the ServiceAccount appears a moment after apply
                    return None
                raise

        return wait_for(ask, 30, message=f"a token of {namespace}/{service_account}")

    def cleanup(self) -> None:
        """Delete every namespace this object made (foreground: the GC removes their contents)."""
        for c in self._clients:
            c.close()
        for ns in self._namespaces:
            try:
                self.core.delete_namespace(ns, propagation_policy="Background")
            except ApiException as e:
                if e.status != 404:
                    raise
        self._namespaces.clear()
        self._restricted = ""
        self.wait_gone(self.leaving)

    def namespace_exists(self, ns: str) -> bool:
        """Whether namespace ``ns`` exists (a terminating one too)."""
        try:
            self.core.read_namespace(ns)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    def clear_namespaces(self, *names: str, timeout: float = 600) -> None:
        """Delete each of ``names`` an earlier run left behind, and wait until they are gone."""
        left = [ns for ns in names if self.namespace_exists(ns)]
        for ns in left:
            self.core.delete_namespace(ns)
        self.wait_gone(left, timeout)

    def wait_gone(self, namespaces: list[str], timeout: float = 600) -> None:
        """Wait until every namespace in ``namespaces`` is gone; AssertionError naming those left."""

        def left() -> list[str]:
            names = {n.metadata.name for n in self.core.list_namespace().items}
            return [ns for ns in namespaces if ns in names]

        deadline = time.monotonic() + timeout
        while (remaining := left()) and time.monotonic() < deadline:
            time.sleep(1)
        assert not remaining, f"namespaces being deleted are still there after {timeout:g} s: {remaining}"

    def apply(self, objs: list[dict]) -> None:
        """Server-side apply ``objs`` as admin (the cluster's own kubectl)."""
        from devcluster.cluster import Cluster

        Cluster().apply(objs)

    def restricted_refusal(self, pod_spec: dict, namespace: str | None = None) -> str:
        """The API server's Pod Security refusal of ``pod_spec`` under "restricted" ('' if admitted).

        A server-side dry-run as admin (Pod Security is per namespace, not per user) in
        ``namespace``, or in a bare namespace of this object labelled to enforce "restricted":
        admission runs in full, nothing is kept. Any other refusal raises.
        """
        if namespace is None:
            if not self._restricted:
                self._restricted = self.namespace(
                    "psa", {"pod-security.kubernetes.io/enforce": "restricted"})
            namespace = self._restricted
            account = pod_spec.get("serviceAccountName")
            if account:  # the ServiceAccount plugin wants it to exist (a user namespace has it)
                try:
                    self.core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
                except ApiException as e:
                    if e.status != 409:
                        raise
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"}, "spec": pod_spec}
        # the body as sent by its maker (quantities may be numbers, as kubernetes_asyncio sends
        # KubeSpawner's): through the client's transport, not its typed models' checks
        params = self.admin.param_serialize(
            method="POST", resource_path=f"/api/v1/namespaces/{namespace}/pods",
            query_params=[("dryRun", "All")], body=body,
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            auth_settings=["BearerToken"])
        response = self.admin.call_api(*params)
        response.read()
        if response.status < 300:
            return ""
        message = json.loads(response.data or b"{}").get("message", "")
        if response.status == 403 and "PodSecurity" in message:
            return message
        raise AssertionError(f"the dry-run of the pod failed otherwise ({response.status}): {message}")

    # -- pods and objects --------------------------------------------------------------------
    def pods(self, namespace: str, selector: str = "") -> list[Any]:
        """Pods of ``namespace`` matching a label selector, by name."""
        items = self.core.list_namespaced_pod(namespace, label_selector=selector).items
        return sorted(items, key=lambda p: p.metadata.name)

    def exit_pod(self, namespace: str, pod: str, code: int = 0) -> None:
        """End a running kwok pod with exit ``code`` (kwok's stage reacts to the label)."""
        self.core.patch_namespaced_pod(pod, namespace, {"metadata": {"labels": {EXIT_LABEL: str(code)}}})

    def events(self, namespace: str, involved: str | None = None, reason: str | None = None) -> list[Any]:
        """Events of ``namespace`` (optionally about one object / of one reason)."""
        items = self.core.list_namespaced_event(namespace).items
        return [
            e
            for e in items
            if (involved is None or e.involved_object.name == involved)
            and (reason is None or e.reason == reason)
        ]

    # -- the audit log -----------------------------------------------------------------------
    def audit_size(self) -> int:
        """The audit log's current size (an offset to read from later)."""
        try:
            return self.audit_log.stat().st_size if self.audit_log else 0
        except OSError:
            return 0

    def audit(self, offset: int = 0, stage: str = "ResponseComplete") -> list[AuditRecord]:
        """Audit records of one ``stage`` written after ``offset``."""
        if not self.audit_log:
            raise AssertionError("this cluster has no audit log (not a devcluster?)")
        out = []
        with open(self.audit_log, "rb") as f:
            f.seek(offset)
            for line in f:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if ev.get("stage") != stage:
                    continue
                ref = ev.get("objectRef") or {}
                out.append(
                    AuditRecord(
                        user=ev.get("user", {}).get("username", ""),
                        verb=ev.get("verb", ""),
                        uri=ev.get("requestURI", ""),
                        code=int(ev.get("responseStatus", {}).get("code", 0)),
                        namespace=ref.get("namespace"),
                        resource=ref.get("resource"),
                        subresource=ref.get("subresource"),
                    )
                )
        return out


def find_cluster() -> tuple[str, Path | None] | str:
    """``(kubeconfig, audit log)`` of a running devcluster, or the reason there is none."""
    try:
        from devcluster.cluster import Cluster
    except ImportError as e:  # pragma: no cover - the package is in the tree
        return f"devcluster is not importable: {e}"
    c = Cluster()
    if not c.running():
        return f"no devcluster runs in {c.root} (start one: scripts/kube up)"
    return str(c.kubeconfig), c.audit_log


def podman_cluster():
    """The devcluster of this machine, once podman (which builds the lab's images) is known to be here."""
    import shutil

    from devcluster.cluster import Cluster

    if not shutil.which("podman"):
        require_or_skip("podman is not installed: run scripts/bootstrap containers")
    return Cluster()


# the last lines of scripts/test's background ``scripts/kube up`` when it failed (set by conftest)
KUBE_UP_FAILED = ""


def require_or_skip(reason: str) -> None:
    """Skip with ``reason``; in CI (or with TFK8S_REQUIRE_K8S=1) a missing cluster is a failure.

    When scripts/test's start of the cluster failed, its last lines follow the reason.
    """
    import pytest

    if KUBE_UP_FAILED:
        reason += f"\nscripts/kube up failed; its last lines:\n{KUBE_UP_FAILED}"
    if os.environ.get("TFK8S_REQUIRE_K8S") == "1" or os.environ.get("CI") == "true":
        pytest.fail(f"a real Kubernetes is required here: {reason}")
    pytest.skip(reason)
