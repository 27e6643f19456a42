"""The same scenarios against a real Kubernetes cluster with JobSet (marker ``k8s``).

Runs when a kubeconfig reaches a cluster (CI: k3d + JobSet, see
.github/workflows/k8s.yml), the cluster serves ``jobset.x-k8s.io/v1alpha2``
and the task image is there (``TFK8S_IMAGE``); skips with the reason
otherwise.  The backend acts as a ServiceAccount bound to the shipped Role
only, so a request the Role does not allow fails the test.

Claims: k3s's ``local-path`` provisioner gives ReadWriteOnce volumes only
(no ReadWriteMany), so each test makes two RWO claims and names them as the
spec's existing claims; the CI cluster has one node, which mounts them in
every pod.  On a multi-node cluster use a ReadWriteMany class instead.

What runs here: a 2-worker MultiWorkerMirroredStrategy cluster whose workers
all-reduce across pods (through JobSet's DNS names); an in-graph cluster
driven from a client pod (through the NetworkPolicy); a worker pod killed and
the cluster restarted by JobSet within its budget; and a detached cluster
that finishes, has its parameter server ended and is removed by its TTL with
no client attached (watched with the admin client only).
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

        from devcluster.cluster import Cluster

        dev = Cluster()  # the suite's own cluster (scripts/kube) unless KUBECONFIG names another
        own = None if os.environ.get("KUBECONFIG") or not dev.running() else str(dev.kubeconfig)
        config.load_kube_config(own)
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
    from kubernetes import client as kclient
    from kubernetes.client.rest import ApiException

    try:
        kclient.CustomObjectsApi(admin).get_api_resources("jobset.x-k8s.io", "v1alpha2")
    except ApiException as e:
        if os.environ.get("TFK8S_REQUIRE_K8S"):
            pytest.fail(f"the cluster does not serve jobset.x-k8s.io/v1alpha2: {e.status}")
        pytest.skip("the cluster does not serve jobset.x-k8s.io/v1alpha2: install JobSet")
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
        yield backend, core, ns, admin
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


MWMS = """
import os
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
total = strategy.reduce(tf.distribute.ReduceOp.SUM,
                        strategy.run(lambda: tf.constant(1.0)), axis=None)
print("sum", float(total), "from", os.environ["TFK8S_TASK"], flush=True)
"""


def _claims(**kw):
    return {"log_claim": "logs", "data_claim": "data", **kw}


def _jobset(admin, ns, name):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        return client.CustomObjectsApi(admin).get_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", ns, "jobsets", name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def test_mwms_workers_all_reduce_across_pods_and_delete_waits(real):
    from tfk8s_magics.spec import ClusterSpec

    backend, core, ns, _ = real
    spec = ClusterSpec(name="mwms", workers=2, script=MWMS, **_claims())
    backend.launch(spec, detach=True)
    status = _wait(backend, "mwms", lambda s: s.terminal)
    assert status.phase == "succeeded", status
    lines = {line.text for line in backend.read_logs("mwms")}
    assert "sum 2.0 from worker-0" in lines and "sum 2.0 from worker-1" in lines, lines
    backend.delete("mwms")  # Foreground + wait: returns when the objects are gone
    assert not core.list_namespaced_pod(ns, label_selector="tfk8s.io/cluster=mwms").items
    backend.launch(spec, detach=True)  # the same name again, at once
    backend.delete("mwms")


def test_in_graph_cluster_driven_from_a_client_pod(real):
    import json

    from tfk8s_magics.spec import ClusterSpec

    backend, core, ns, _ = real
    spec = ClusterSpec(name="ig", mode="in-graph", ps=1, workers=2, **_claims())
    backend.launch(spec, detach=True)
    _wait(backend, "ig", lambda s: s.phase == "running" or s.terminal)
    client_script = (
        "import json, os, socket\n"
        "import tensorflow as tf\n"
        "cluster = json.loads(os.environ['CLUSTER'])\n"
        "cluster['chief'] = [socket.gethostbyname(socket.gethostname()) + ':2223']\n"
        "resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(\n"
        "    tf.train.ClusterSpec(cluster), task_type='chief', task_id=0, rpc_layer='grpc')\n"
        "strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)\n"
        "coord = tf.distribute.coordinator.ClusterCoordinator(strategy)\n"
        "with strategy.scope():\n"
        "    v = tf.Variable(0.0)\n"
        "@tf.function\n"
        "def step():\n"
        "    v.assign_add(1.0)\n"
        "    return v.read_value()\n"
        "for _ in range(10):\n"
        "    coord.schedule(step)\n"
        "coord.join()\n"
        "print('in-graph total', float(v.numpy()), flush=True)\n"
    )
    pod = {
        "metadata": {"name": "ig-client", "labels": {"component": "singleuser-server"}},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "client", "image": os.environ["TFK8S_IMAGE"],
            "imagePullPolicy": "IfNotPresent", "command": ["python", "-c", client_script],
            "env": [{"name": "CLUSTER", "value": json.dumps(backend.addresses("ig"))},
                    {"name": "HOME", "value": "/tmp"}]}]},
    }
    core.create_namespaced_pod(ns, pod)  # as the notebook's pod would be (admin creates it)
    deadline = time.monotonic() + 600
    while core.read_namespaced_pod("ig-client", ns).status.phase not in ("Succeeded", "Failed"):
        assert time.monotonic() < deadline, "the in-graph client did not finish"
        time.sleep(2)
    log = core.read_namespaced_pod_log("ig-client", ns)
    assert "in-graph total 10.0" in log, log
    assert backend.stop("ig").phase == "stopped"
    backend.delete("ig")


def test_a_killed_worker_is_restarted_by_jobset_within_the_budget(real):
    from tfk8s_magics.spec import ClusterSpec

    backend, core, ns, admin = real
    script = "import time\nprint('working', flush=True)\ntime.sleep(45)\nprint('done', flush=True)\n"
    spec = ClusterSpec(name="kill", workers=2, script=script, restart_budget=2, **_claims())
    backend.launch(spec, detach=True)
    _wait(backend, "kill", lambda s: s.phase == "running")
    victim = core.list_namespaced_pod(
        ns, label_selector="tfk8s.io/cluster=kill,tfk8s.io/role=worker,"
        "batch.kubernetes.io/job-completion-index=0").items[0].metadata.name
    core.delete_namespaced_pod(victim, ns, grace_period_seconds=0)
    _wait(backend, "kill", lambda s: all(t.restarts == 1 for t in s.tasks)
          and s.phase == "running", timeout=300)
    assert _jobset(admin, ns, "kill")["status"]["restarts"] == 1
    status = _wait(backend, "kill", lambda s: s.terminal)
    assert status.phase == "succeeded", status
    backend.delete("kill")


def test_detached_cluster_finishes_ends_its_ps_and_is_removed_by_its_ttl(real):
    from tfk8s_magics.spec import ClusterSpec

    backend, core, ns, admin = real
    spec = ClusterSpec(name="alone", ps=1, workers=1, script=SCRIPT, ttl_after_finished=20,
                       **_claims())
    backend.launch(spec, detach=True)
    backend.close()  # no client from here on: only the admin client looks
    deadline = time.monotonic() + 600
    completed = False
    while time.monotonic() < deadline:
        js = _jobset(admin, ns, "alone")
        if js is None:
            break  # removed by its TTL
        conditions = {c["type"]: c["status"] for c in js.get("status", {}).get("conditions", [])}
        completed = completed or conditions.get("Completed") == "True"
        time.sleep(2)
    assert completed, "the JobSet never completed"
    assert _jobset(admin, ns, "alone") is None, "the TTL did not remove the JobSet"
    assert not core.list_namespaced_pod(ns, label_selector="tfk8s.io/cluster=alone").items


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
        (pod,) = core.list_namespaced_pod(
            user_ns, label_selector="tfk8s.io/cluster=defaults,tfk8s.io/role=worker").items
        assert (pod.spec.containers[0].resources.limits or {}).get("cpu") is None  # never throttled
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

    _, core, ns, _ = real
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
