"""Admission on a real cluster, as the test double now models it, and what the lab does about it.

The double (tests/kubeapi) was taught the real rules this lab met on a real
cluster: LimitRange defaulting and bounds (LimitRanger), a request above its
limit (422), Pod Security "restricted", the 1 MiB ConfigMap limit (422) and
the 3 MiB request limit (413).  Each rule is checked here against the real
server's wording, then the lab is checked against it: a default launch in a
namespace holding exactly the hub's bootstrap objects, the pre-flight that
applies LimitRange defaults as admission does, the sentences users get, and
the pods (tasks, TensorBoard, the notebook) passing "restricted".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.kubeapi import podsecurity
from tfk8s_magics.backends.kubernetes import KubernetesBackend
from tfk8s_magics.backends.kubernetes import jobset as j
from tfk8s_magics.backends.kubernetes.apply import failure_sentence
from tfk8s_magics.backends.kubernetes.quota import admitted, limit_problems
from tfk8s_magics.backends.kubernetes.rbac import backend_role
from tfk8s_magics.backends.kubernetes.settings import K8sSettings
from tfk8s_magics.errors import LaunchFailed, SpecError
from tfk8s_magics.lifecycle import LifecyclePolicy
from tfk8s_magics.spec import MAX_FILES_BYTES, ClusterSpec, Resources

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "hub_config"))
from tfk8s_hub.bootstrap import BootstrapSpec, bootstrap_objects, namespace_labels  # noqa: E402
from tfk8s_hub.settings import LabSettings  # noqa: E402

NS = "jhub-alice"
SCRIPT = "print('training')\n"


def status_of(exc: ApiException) -> dict:
    return json.loads(exc.body)


def user_namespace(kube, settings: LabSettings | None = None) -> None:
    """A user namespace exactly as the hub makes it: its labels and every bootstrap object."""
    spec = BootstrapSpec.from_settings(settings or LabSettings(hub_namespace="jhub"))
    kube.create_namespace(NS, labels=namespace_labels(spec))
    for obj in bootstrap_objects(spec, NS):
        kube.create_object(obj)


@pytest.fixture
def core(kube):
    return client.CoreV1Api(kube.api_client)


def pod(name: str, container: dict | None = None, **spec) -> dict:
    c = container or {
        "name": "main",
        "image": "python:3.11",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [c],
            **spec,
        },
    }


# -- the double, against the real server's rules and words -------------------------------


def test_limit_range_is_defaulted_like_the_api_does(kube, core):
    kube.create_namespace(NS)
    core.create_namespaced_limit_range(NS, {"metadata": {"name": "lr"}, "spec": {"limits": [
        {"type": "Container", "max": {"cpu": "2"}, "min": {"memory": "64Mi"}}]}})
    (item,) = kube.get_object("limitranges", "lr", NS)["spec"]["limits"]
    # SetDefaults_LimitRangeItem: default <- max, defaultRequest <- default, then <- min
    assert item["default"] == {"cpu": "2"}
    assert item["defaultRequest"] == {"cpu": "2", "memory": "64Mi"}


def test_a_request_above_a_defaulted_limit_is_a_422_with_the_real_words(kube, core):
    kube.create_namespace(NS)
    core.create_namespaced_limit_range(NS, {"metadata": {"name": "lr"}, "spec": {"limits": [
        {"type": "Container", "default": {"cpu": "2", "memory": "4Gi"},
         "defaultRequest": {"cpu": "100m", "memory": "256Mi"}}]}})
    asks = {"name": "main", "image": "python:3.11", "resources": {"requests": {"cpu": "4"}}}
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(NS, pod("big", asks))
    assert exc.value.status == 422
    assert status_of(exc.value)["message"] == (
        'Pod "big" is invalid: spec.containers[0].resources.requests[cpu]: Invalid value: '
        '"4": must be less than or equal to cpu limit of 2')
    made = core.create_namespaced_pod(NS, pod("small"))
    c = made.spec.containers[0]
    assert c.resources.requests == {"cpu": "100m", "memory": "256Mi"}
    assert c.resources.limits == {"cpu": "2", "memory": "4Gi"}
    assert made.metadata.annotations["kubernetes.io/limit-ranger"] == (
        "LimitRanger plugin set: cpu, memory request for container main; "
        "cpu, memory limit for container main")


def test_limit_range_bounds_per_container_and_per_pod(kube, core):
    kube.create_namespace(NS)
    core.create_namespaced_limit_range(NS, {"metadata": {"name": "lr"}, "spec": {"limits": [
        {"type": "Container", "min": {"memory": "128Mi"}, "maxLimitRequestRatio": {"memory": "2"}},
        {"type": "Pod", "max": {"memory": "1Gi"}}]}})
    small = {"name": "main", "image": "python:3.11",
             "resources": {"requests": {"memory": "64Mi"}, "limits": {"memory": "2Gi"}}}
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(NS, pod("p", small))
    assert exc.value.status == 403
    assert status_of(exc.value)["message"] == (
        'pods "p" is forbidden: [Minimum memory usage per Container is 128Mi, but request is '
        "64Mi., memory max limit to request ratio per Container is 2, but provided ratio is "
        "32.000000., Maximum memory usage per Pod is 1Gi, but limit is 2147483648.]")


def test_a_privileged_host_path_pod_is_refused_by_pod_security_restricted(kube, core):
    user_namespace(kube)
    root = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "root"}, "spec": {
        "hostPID": True, "hostNetwork": True,
        "containers": [{"name": "sh", "image": "busybox", "securityContext": {"privileged": True},
                        "volumeMounts": [{"name": "host", "mountPath": "/host"}]}],
        "volumes": [{"name": "host", "hostPath": {"path": "/"}}]}}
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(NS, root)
    assert exc.value.status == 403
    assert status_of(exc.value)["message"] == (
        'pods "root" is forbidden: violates PodSecurity "restricted:latest": '
        "host namespaces (hostNetwork, hostPID), "
        'privileged (container "sh" must not set securityContext.privileged=true), '
        'allowPrivilegeEscalation != false (container "sh" must set '
        "securityContext.allowPrivilegeEscalation=false), "
        'unrestricted capabilities (container "sh" must set '
        'securityContext.capabilities.drop=["ALL"]), '
        'restricted volume types (volumes ["host"] have restricted types), '
        'runAsNonRoot != true (pod or container "sh" must set securityContext.runAsNonRoot=true), '
        'seccompProfile (pod or container "sh" must set securityContext.seccompProfile.type to '
        '"RuntimeDefault" or "Localhost")')
    assert kube.get_object("pods", "root", NS) is None
    # the same pod is fine where no level is enforced (PSA is per namespace)
    kube.create_namespace("ops")
    core.create_namespaced_pod("ops", root)


def test_baseline_allows_what_restricted_refuses(kube, core):
    kube.create_namespace("base", labels={"pod-security.kubernetes.io/enforce": "baseline"})
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
             "spec": {"containers": [{"name": "c", "image": "python:3.11"}]}}
    core.create_namespaced_pod("base", plain)  # root, no seccomp: baseline lets it run
    plain["metadata"]["name"] = "host"
    plain["spec"]["volumes"] = [{"name": "h", "hostPath": {"path": "/etc"}}]
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod("base", plain)
    assert 'violates PodSecurity "baseline:latest": hostPath volumes (volume "h")' in \
        status_of(exc.value)["message"]


def test_a_config_map_over_one_mib_is_a_422_and_a_body_over_three_mib_a_413(kube, core):
    kube.create_namespace(NS)
    limit = 1024 * 1024
    core.create_namespaced_config_map(NS, {"metadata": {"name": "fits"},
                                           "data": {"a": "x" * (limit - 1), "b": "y"}})
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map(NS, {"metadata": {"name": "big"},
                                               "data": {"a": "x" * limit, "b": "y"}})
    assert exc.value.status == 422
    assert status_of(exc.value)["message"] == (
        'ConfigMap "big" is invalid: []: Too long: must have at most 1048576 bytes')
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map(NS, {"metadata": {"name": "huge"},
                                               "data": {"a": "x" * (3 * limit + 1)}})
    assert exc.value.status == 413
    assert status_of(exc.value)["message"] == "Request entity too large: limit is 3145728"


def test_the_user_role_cannot_touch_the_isolation_policy(kube):
    user_namespace(kube)
    kube.set_role(backend_role(NS), NS, service_account="tfk8s-user")
    net = client.NetworkingV1Api(kube.api_client)
    for call in (lambda: net.delete_namespaced_network_policy("tfk8s-user-isolation", NS),
                 lambda: net.create_namespaced_network_policy(NS, {
                     "metadata": {"name": "open"}, "spec": {"podSelector": {}}})):
        with pytest.raises(ApiException) as exc:
            call()
        assert exc.value.status == 403
    assert kube.get_object("networkpolicies", "tfk8s-user-isolation", NS) is not None


# -- the lab against those rules ------------------------------------------------------


@pytest.fixture
def backend(kube):
    """A backend acting as the user's ServiceAccount, bound to the shipped Role only."""
    made = []

    def make(settings: LabSettings | None = None) -> KubernetesBackend:
        user_namespace(kube, settings)
        kube.set_role(backend_role(NS), NS, service_account="tfk8s-user")
        b = KubernetesBackend(namespace=NS, api_client=kube.api_client, user="alice",
                              storage_class="standard")
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()
    for r in kube.requests:
        assert r.allowed, f"{r.method} {r.path} was denied by the shipped Role"


def _writes(kube) -> list[str]:
    return [f"{r.method} {r.path}" for r in kube.requests if r.method != "GET"]


def test_a_default_launch_fits_the_default_quota_and_limit_range(kube, backend):
    b = backend()
    b.launch(ClusterSpec(name="mnist", ps=1, workers=2, script=SCRIPT), detach=True)
    for role, index in (("ps", 0), ("worker", 0), ("worker", 1)):
        pod = kube.jobsets.pod_name(NS, "mnist", role, index)  # the pod JobSet made for the task
        res = kube.get_object("pods", pod, NS)["spec"]["containers"][0]["resources"]
        # no CPU limit (no throttling), requests and the memory limit from the LimitRange
        assert res == {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}
    # --cpu above what any default would allow is fine too: CPU has no limit
    b.launch(ClusterSpec(name="big", workers=1, script=SCRIPT,
                         resources={"worker": Resources(cpu="4", memory="2Gi")}), detach=True)
    pod = kube.jobsets.pod_name(NS, "big", "worker", 0)
    res = kube.get_object("pods", pod, NS)["spec"]["containers"][0]["resources"]
    assert res == {"requests": {"cpu": "4", "memory": "2Gi"}, "limits": {"memory": "2Gi"}}


def test_the_preflight_applies_limit_range_defaults_exactly_as_admission_does(kube, backend):
    b = backend(LabSettings(hub_namespace="jhub", default_limits={"cpu": "2", "memory": "3Gi"},
                            default_requests={"memory": "512Mi"}, max_limits={"memory": "8Gi"}))
    spec = ClusterSpec(name="eq", ps=1, workers=1, script=SCRIPT,
                       resources={"worker": Resources(cpu="1")})
    ranges = kube.list_objects("limitranges", NS)
    predicted = admitted(j.cluster_manifests(spec, b.settings), ranges)
    b.launch(spec, detach=True)
    (jobset,) = [d for d in predicted if d["kind"] == "JobSet"]
    for rjob in jobset["spec"]["replicatedJobs"]:  # each role's template, as admitted
        template = rjob["template"]["spec"]["template"]["spec"]
        stored = kube.get_object("pods", kube.jobsets.pod_name(NS, "eq", rjob["name"], 0), NS)
        assert stored["spec"]["containers"][0]["resources"] == \
            template["containers"][0]["resources"], rjob["name"]


def test_cpu_above_a_default_cpu_limit_is_refused_before_any_write(kube, backend):
    # the first chart's LimitRange: every container got a 2-CPU limit by default
    b = backend(LabSettings(hub_namespace="jhub", default_limits={"cpu": "2", "memory": "4Gi"}))
    kube.clear_requests()
    spec = ClusterSpec(name="fast", workers=1, script=SCRIPT,
                       resources={"worker": Resources(cpu="4", memory="2Gi")})
    with pytest.raises(LaunchFailed) as exc:
        b.launch(spec, detach=True)
    assert str(exc.value) == (
        "the cluster would not fit, so nothing was created: fast-worker asks for cpu 4 but "
        "the namespace's LimitRange gives its container a cpu limit of 2: ask for at most 2 "
        "(--cpu), or ask your administrator to raise the LimitRange's default cpu limit.")
    assert _writes(kube) == []


def test_a_quota_on_cpu_limits_without_a_default_says_who_must_act(kube, backend):
    b = backend(LabSettings(hub_namespace="jhub", quota={"limits.cpu": "16"},
                            default_limits={}, default_requests={}))
    kube.clear_requests()
    with pytest.raises(LaunchFailed) as exc:
        b.launch(ClusterSpec(name="q", workers=1, script=SCRIPT), detach=True)
    assert "ResourceQuota tfk8s-quota counts limits.cpu, so every pod needs a CPU limit" in \
        str(exc.value)
    assert "ask your administrator" in str(exc.value)
    assert _writes(kube) == []


def test_limit_problems_name_max_min_and_ratio():
    ranges = [{"metadata": {"name": "lr"}, "spec": {"limits": [{
        "type": "Container", "max": {"memory": "2Gi"}, "min": {"cpu": "250m"}}]}}]
    spec = ClusterSpec(name="c", workers=1, script=SCRIPT,
                       resources={"worker": Resources(cpu="100m", memory="4Gi")})
    problems = limit_problems(j.cluster_manifests(spec, K8sSettings(namespace=NS)), ranges)
    assert problems == [  # named per role: one JobSet template runs every worker
        "c-worker has a memory limit of 4Gi but LimitRange lr allows at most 2Gi per "
        "container: ask for less (--memory).",
        "c-worker requests cpu 100m but LimitRange lr asks for at least 250m per container: "
        "ask for more (--cpu).",
    ]


@pytest.mark.parametrize("status, message, words", [
    (403, 'pods "p" is forbidden: exceeded quota: q, requested: pods=1, used: pods=4, '
          "limited: pods=4", "ResourceQuota"),
    (403, 'pods "p" is forbidden: failed quota: q: must specify limits.cpu',
     "give --cpu and --memory"),
    (403, 'pods "p" is forbidden: Maximum cpu usage per Container is 2, but limit is 4.',
     "LimitRange refuses"),
    (403, 'pods "p" is forbidden: violates PodSecurity "restricted:latest": privileged (...)',
     "Pod Security level refuses"),
    (422, 'Pod "p" is invalid: spec.containers[0].resources.requests[cpu]: Invalid value: '
          '"4": must be less than or equal to cpu limit of 2', "ask for less (--cpu"),
    (422, 'ConfigMap "p" is invalid: []: Too long: must have at most 1048576 bytes',
     "/data volume"),
])
def test_admission_refusals_become_sentences_a_user_can_act_on(status, message, words):
    e = ApiException(status=status, reason="x")
    e.body = json.dumps({"kind": "Status", "message": message, "code": status})
    sentence = failure_sentence(e, {"kind": "Pod", "metadata": {"name": "p"}}, NS)
    assert words in sentence and "bug" not in sentence
    assert message.split(": ", 1)[1][:30] in sentence  # the API's own reason is kept


def test_a_script_over_one_mib_is_refused_before_any_api_call(kube, backend):
    b = backend()
    kube.clear_requests()
    big = "x = 1\n" * 180_000  # 1.08 MB
    with pytest.raises(SpecError) as exc:
        b.launch(ClusterSpec(name="big", workers=1, script=big), detach=True)
    # The spec refuses it first: the script and its --file files may take at most
    # MAX_FILES_BYTES of the ConfigMap, leaving room for the spec record.
    assert str(exc.value).startswith(
        f"the script and its --file files are 1080000 bytes, more than the {MAX_FILES_BYTES}"
    )
    assert kube.requests == []
    # The ConfigMap's own 1 MiB check still stands behind it (a spec record grown by --env).
    fat = ClusterSpec(name="fat", workers=1, script="#" * MAX_FILES_BYTES, env={"X": "y" * 200_000})
    with pytest.raises(SpecError, match="its script and spec are .* over the 1048576 bytes"):
        j.render_yaml(fat, K8sSettings())
    with pytest.raises(SpecError):
        b.launch(fat, detach=True)
    assert kube.requests == []
    # At the spec's limit, the double (like a real server) takes it.
    b.launch(ClusterSpec(name="edge", workers=1, script="#" * MAX_FILES_BYTES), detach=True)


def test_task_and_tensorboard_pods_pass_pod_security_restricted(kube, backend, monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/alice/")
    b = backend()
    b.launch(ClusterSpec(name="ig", mode="in-graph", ps=1, workers=1), detach=True)
    b.tensorboard("ig")
    kube.wait_for(lambda: kube.list_objects("pods", NS, "tfk8s.io/component=tensorboard"),
                  message="TensorBoard's pod created by its Deployment through admission")
    for p in kube.list_objects("pods", NS):
        assert podsecurity.violations(p["spec"], "restricted") == [], p["metadata"]["name"]
        assert p["spec"]["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"


def test_every_object_carries_the_recommended_labels():
    spec = ClusterSpec(name="mnist", ps=1, workers=1, script=SCRIPT)
    for obj in j.cluster_manifests(spec, K8sSettings(namespace=NS), tensorboard=True):
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "tfk8s"
        assert labels["app.kubernetes.io/instance"] == "mnist"
        assert labels["app.kubernetes.io/part-of"] == "tfk8s-lab"
        assert labels["app.kubernetes.io/managed-by"] == "tfk8s"
        assert labels["app.kubernetes.io/component"] == labels["tfk8s.io/component"]
    jobset = j.jobset(spec, K8sSettings(namespace=NS), LifecyclePolicy.of(spec))
    worker = next(r for r in jobset["spec"]["replicatedJobs"] if r["name"] == "worker")
    assert worker["template"]["spec"]["template"]["metadata"]["labels"]["tfk8s.io/role"] == "worker"
