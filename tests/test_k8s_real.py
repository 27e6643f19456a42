"""The same scenarios against a real Kubernetes cluster (marker ``k8s``).

Runs when a kubeconfig reaches a cluster (CI: k3d, see .github/workflows/k8s.yml)
and the task image is there (``TFK8S_IMAGE``); skips with the reason otherwise.
The backend acts as a ServiceAccount bound to the shipped Role only, so a
request the Role does not allow fails the test.  Claims are ReadWriteOnce
claims the test makes (k3s's local-path cannot do ReadWriteMany; one node
mounts them in every pod), given to the spec as existing claims.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest

pytestmark = pytest.mark.k8s

SCRIPT = """
import os
from tfk8s_magics.runtime.progress import report_progress
print("hello from", os.environ["TFK8S_TASK"], flush=True)
report_progress(10, total=10)
"""


def _admin_client():
    try:
        from kubernetes import client, config

        config.load_kube_config()
        api = client.ApiClient()
        client.VersionApi(api).get_code(_request_timeout=5)
        return api
    except Exception as e:  # noqa: BLE001 - any failure means: no cluster here
        if os.environ.get("TFK8S_REQUIRE_K8S"):  # CI made a cluster: not reaching it is a failure
            pytest.fail(f"TFK8S_REQUIRE_K8S is set but no Kubernetes cluster answers: {e}")
        pytest.skip(f"no reachable Kubernetes cluster (kubeconfig): {e}")


@pytest.fixture
def real():
    admin = _admin_client()  # the first reason to skip: no cluster at all
    if not os.environ.get("TFK8S_IMAGE"):
        pytest.skip("TFK8S_IMAGE is not set: build the task image and load it into the cluster")
    from kubernetes import client

    from tfk8s_magics.backends.kubernetes import KubernetesBackend
    from tfk8s_magics.backends.kubernetes.rbac import backend_role, backend_role_binding

    core = client.CoreV1Api(admin)
    ns = f"tfk8s-test-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    try:
        core.create_namespaced_service_account(ns, {"metadata": {"name": "jupyter"}})
        rbac = client.RbacAuthorizationV1Api(admin)
        rbac.create_namespaced_role(ns, backend_role(ns))
        rbac.create_namespaced_role_binding(ns, backend_role_binding(ns, "jupyter"))
        token = core.create_namespaced_service_account_token(
            "jupyter", ns, {"spec": {"expirationSeconds": 3600}}).status.token
        for claim in ("logs", "data"):
            core.create_namespaced_persistent_volume_claim(ns, {
                "metadata": {"name": claim},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}}})
        cfg = client.Configuration()
        cfg.host = admin.configuration.host
        cfg.ssl_ca_cert = admin.configuration.ssl_ca_cert
        cfg.verify_ssl = admin.configuration.verify_ssl
        cfg.api_key = {"BearerToken": token}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
        backend = KubernetesBackend(namespace=ns, api_client=client.ApiClient(cfg), user="ci")
        yield backend, core, ns
        backend.close()
    finally:
        core.delete_namespace(ns)


def _wait(backend, name, predicate, timeout=600.0):
    deadline = time.monotonic() + timeout
    stop = threading.Event()
    while time.monotonic() < deadline:
        for status in backend.watch(name, stop):
            if predicate(status):
                return status
            if time.monotonic() > deadline:
                break
        status = backend.status(name)
        if predicate(status):
            return status
        time.sleep(1)
    raise AssertionError(f"timed out; last status {backend.status(name)}")


def test_between_graph_runs_logs_recycles_and_deletes(real):
    from tfk8s_magics.spec import ClusterSpec

    backend, core, ns = real
    spec = ClusterSpec(name="hello", ps=1, workers=2, script=SCRIPT, ps_grace_period=5,
                       log_claim="logs", data_claim="data")
    backend.launch(spec, detach=True)
    status = _wait(backend, "hello", lambda s: s.terminal)
    assert status.phase == "succeeded", status
    assert status.progress is not None and status.progress.step == 10
    lines = {(line.task, line.text) for line in backend.read_logs("hello")}
    assert ("worker-0", "hello from worker-0") in lines
    _wait(backend, "hello", lambda s: s.task("ps-0").phase == "succeeded", timeout=120)
    backend.delete("hello")
    deadline = time.monotonic() + 120
    while core.list_namespaced_pod(ns, label_selector="tfk8s.io/cluster=hello").items:
        assert time.monotonic() < deadline, "pods not deleted by the cascade"
        time.sleep(1)


def test_in_graph_servers_run_until_stopped(real):
    from tfk8s_magics.spec import ClusterSpec

    backend, _, _ = real
    spec = ClusterSpec(name="servers", mode="in-graph", ps=1, workers=1,
                       log_claim="logs", data_claim="data")
    backend.launch(spec, detach=True)
    status = _wait(backend, "servers", lambda s: s.phase == "running" or s.terminal)
    assert status.phase == "running", status
    assert backend.stop("servers").phase == "stopped"
    backend.delete("servers")


# -- the lab installed from the chart (CI: helm install into k3d; see .github/workflows/k8s.yml) --

HUB_USER = "ci-user"


def _sa_client(admin, namespace: str, service_account: str):
    """An ApiClient acting as ``service_account`` (a TokenRequest made by the admin)."""
    from kubernetes import client

    token = client.CoreV1Api(admin).create_namespaced_service_account_token(
        service_account, namespace, {"spec": {"expirationSeconds": 3600}}).status.token
    cfg = client.Configuration()
    cfg.host = admin.configuration.host
    cfg.ssl_ca_cert = admin.configuration.ssl_ca_cert
    cfg.verify_ssl = admin.configuration.verify_ssl
    cfg.api_key = {"BearerToken": token}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    return client.ApiClient(cfg)


@pytest.fixture(scope="module")
def lab():
    """A user logged in to the hub the chart installed, with their server spawned.

    Needs ``TFK8S_HUB_URL`` (the proxy, e.g. a port-forward of proxy-public),
    ``TFK8S_HUB_PASSWORD`` (the shared password) and ``TFK8S_HUB_NAMESPACE``.
    """
    import requests

    admin = _admin_client()
    url = os.environ.get("TFK8S_HUB_URL")
    if not url:
        pytest.skip("TFK8S_HUB_URL is not set: install the chart and port-forward its proxy")
    s = requests.Session()
    s.get(f"{url}/hub/login", timeout=30).raise_for_status()
    xsrf = s.cookies.get("_xsrf", path="/hub/")
    r = s.post(f"{url}/hub/login", allow_redirects=False, timeout=30, data={
        "username": HUB_USER, "password": os.environ["TFK8S_HUB_PASSWORD"], "_xsrf": xsrf})
    assert r.status_code == 302, f"login failed: {r.status_code} {r.text[:300]}"
    headers = {"X-XSRFToken": xsrf}
    r = s.post(f"{url}/hub/api/users/{HUB_USER}/server", headers=headers, timeout=30)
    assert r.status_code in (201, 202), r.text
    deadline = time.monotonic() + 600
    while not s.get(f"{url}/hub/api/users/{HUB_USER}", headers=headers, timeout=30).json()[
            "servers"].get("", {}).get("ready"):
        assert time.monotonic() < deadline, "the user's server never became ready"
        time.sleep(2)
    hub_ns = os.environ.get("TFK8S_HUB_NAMESPACE", "jhub")
    yield admin, f"{hub_ns}-{HUB_USER}", hub_ns
    s.delete(f"{url}/hub/api/users/{HUB_USER}/server", headers=headers, timeout=30)


def test_the_user_spawned_into_their_own_restricted_namespace(lab):
    from kubernetes import client

    admin, user_ns, hub_ns = lab
    core = client.CoreV1Api(admin)
    labels = core.read_namespace(user_ns).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert labels["tfk8s.io/hub-namespace"] == hub_ns
    (nb,) = core.list_namespaced_pod(user_ns, label_selector="component=singleuser-server").items
    assert nb.status.phase == "Running"  # it reached the hub by <svc>.<hub-ns>.svc
    assert {o.metadata.name for o in core.list_namespaced_limit_range(user_ns).items} == {
        "tfk8s-limits"}
    assert core.list_namespaced_resource_quota(user_ns).items


def test_a_default_launch_runs_under_the_default_quota(lab):
    from kubernetes import client

    from tfk8s_magics.backends.kubernetes import KubernetesBackend
    from tfk8s_magics.spec import ClusterSpec

    admin, user_ns, _ = lab
    core = client.CoreV1Api(admin)
    for claim in ("logs", "data"):  # local-path has no ReadWriteMany: one node, RWO claims
        core.create_namespaced_persistent_volume_claim(user_ns, {
            "metadata": {"name": claim},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Gi"}}}})
    # as the notebook's own ServiceAccount, with no --cpu/--memory: the LimitRange decides
    backend = KubernetesBackend(namespace=user_ns, api_client=_sa_client(admin, user_ns,
                                                                          "tfk8s-user"),
                                user=HUB_USER)
    try:
        backend.launch(ClusterSpec(name="defaults", workers=1, script=SCRIPT,
                                   log_claim="logs", data_claim="data"), detach=True)
        status = _wait(backend, "defaults", lambda s: s.terminal)
        assert status.phase == "succeeded", status
        pod = core.read_namespaced_pod("defaults-worker-0", user_ns)
        assert pod.spec.containers[0].resources.limits.get("cpu") is None  # never throttled
        backend.delete("defaults")
    finally:
        backend.close()


def test_a_privileged_pod_is_refused_in_a_user_namespace(lab):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    admin, user_ns, _ = lab
    core = client.CoreV1Api(_sa_client(admin, user_ns, "tfk8s-user"))
    root = {"metadata": {"name": "root"}, "spec": {
        "containers": [{"name": "sh", "image": "busybox", "securityContext": {"privileged": True},
                        "volumeMounts": [{"name": "host", "mountPath": "/host"}]}],
        "volumes": [{"name": "host", "hostPath": {"path": "/"}}]}}
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(user_ns, root)
    assert exc.value.status == 403
    assert 'violates PodSecurity "restricted:latest": privileged' in exc.value.body
    # and the user may not lift the namespace's isolation policy
    net = client.NetworkingV1Api(_sa_client(admin, user_ns, "tfk8s-user"))
    with pytest.raises(ApiException) as exc:
        net.delete_namespaced_network_policy("tfk8s-user-isolation", user_ns)
    assert exc.value.status == 403


def test_the_hub_service_account_is_fenced_out_of_other_namespaces(lab):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    admin, _, hub_ns = lab
    version = client.VersionApi(admin).get_code()
    if (int(version.major), int(version.minor.rstrip("+"))) < (1, 30):
        pytest.skip(f"Kubernetes {version.git_version}: ValidatingAdmissionPolicy v1 needs 1.30")
    sa = next(s.metadata.name for s in client.CoreV1Api(admin).list_namespaced_service_account(
        hub_ns).items if s.metadata.name.endswith("-hub"))
    hub = client.CoreV1Api(_sa_client(admin, hub_ns, sa))
    with pytest.raises(ApiException) as exc:
        hub.create_namespaced_config_map("default", {"metadata": {"name": "escape"}})
    assert exc.value.status == 403
    assert "may write only in its user namespaces" in exc.value.body


def test_the_real_server_says_what_the_double_says(real):
    """LimitRange defaulting, a request above a default limit, ConfigMap size: same words."""
    from kubernetes.client.rest import ApiException

    _, core, ns = real
    core.create_namespaced_limit_range(ns, {"metadata": {"name": "lr"}, "spec": {"limits": [
        {"type": "Container", "default": {"cpu": "2"}, "defaultRequest": {"cpu": "100m"}}]}})
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(ns, {"metadata": {"name": "big"}, "spec": {"containers": [
            {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "4"}}}]}})
    assert exc.value.status == 422
    assert "spec.containers[0].resources.requests" in exc.value.body
    assert "must be less than or equal to cpu limit" in exc.value.body
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map(ns, {"metadata": {"name": "big"},
                                               "data": {"a": "x" * (1024 * 1024 + 1)}})
    assert exc.value.status == 422 and "must have at most 1048576 bytes" in exc.value.body
