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
