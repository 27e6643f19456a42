"""Admission on the REAL API server (``scripts/kube up``), and what the lab does about it.

LimitRange defaulting and bounds (LimitRanger), a request above its limit (422), Pod Security
"restricted" and "baseline", the 1 MiB ConfigMap limit (422) and the 3 MiB request limit (413),
the shipped Role against the isolation NetworkPolicy: each rule is the kube-apiserver's own, and
the assertions hold its own words. Then the lab against them, as the user's ServiceAccount in a
namespace bootstrapped as the hub does it: a default launch, the pre-flight that predicts the
LimitRange defaults exactly as admission applies them, refusals before any write (read back from
the audit log), and every pod the lab makes (tasks, TensorBoard, storage steps, serving, the
notebook KubeSpawner builds) admitted under "restricted" — checked by a server-side dry-run.
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.realkube import wait_for
from tfk8s_magics.backends.kubernetes import jobset as j
from tfk8s_magics.backends.kubernetes.quota import admitted
from tfk8s_magics.backends.kubernetes.settings import K8sSettings
from tfk8s_magics.errors import LaunchFailed, SpecError
from tfk8s_magics.spec import MAX_FILES_BYTES, ClusterSpec, Resources

pytestmark = pytest.mark.k8s

SCRIPT = "print('training')\n"


def status_of(exc: ApiException) -> dict:
    return json.loads(exc.body)


def pod(name: str, container: dict | None = None, **spec) -> dict:
    c = container or {
        "name": "main",
        "image": "python:3.11",
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
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


@pytest.fixture
def core(realkube):
    return realkube.core


# -- the API server's rules and words ---------------------------------------------------------


def test_limit_range_is_defaulted_by_the_api(realkube, core):
    ns = realkube.namespace("lr")
    core.create_namespaced_limit_range(ns, {"metadata": {"name": "lr"}, "spec": {"limits": [
        {"type": "Container", "max": {"cpu": "2"}, "min": {"memory": "64Mi"}}]}})
    (item,) = core.read_namespaced_limit_range("lr", ns).spec.limits
    # SetDefaults_LimitRangeItem: default <- max, defaultRequest <- default, then <- min
    assert item.default == {"cpu": "2"}
    assert item.default_request == {"cpu": "2", "memory": "64Mi"}


def test_a_request_above_a_defaulted_limit_is_a_422_with_the_real_words(realkube, core):
    ns = realkube.namespace("lr")
    core.create_namespaced_limit_range(ns, {"metadata": {"name": "lr"}, "spec": {"limits": [
        {"type": "Container", "default": {"cpu": "2", "memory": "4Gi"},
         "defaultRequest": {"cpu": "100m", "memory": "256Mi"}}]}})
    asks = {"name": "main", "image": "python:3.11", "resources": {"requests": {"cpu": "4"}}}
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(ns, pod("big", asks))
    assert exc.value.status == 422
    assert status_of(exc.value)["message"] == (
        'Pod "big" is invalid: spec.containers[0].resources.requests: Invalid value: '
        '"4": must be less than or equal to cpu limit of 2')
    made = core.create_namespaced_pod(ns, pod("small"))
    c = made.spec.containers[0]
    assert c.resources.requests == {"cpu": "100m", "memory": "256Mi"}
    assert c.resources.limits == {"cpu": "2", "memory": "4Gi"}
    assert made.metadata.annotations["kubernetes.io/limit-ranger"] == (
        "LimitRanger plugin set: cpu, memory request for container main; "
        "cpu, memory limit for container main")


def test_limit_range_bounds_per_container_and_per_pod(realkube, core):
    ns = realkube.namespace("lr")
    core.create_namespaced_limit_range(ns, {"metadata": {"name": "lr"}, "spec": {"limits": [
        {"type": "Container", "min": {"memory": "128Mi"}, "maxLimitRequestRatio": {"memory": "2"}},
        {"type": "Pod", "max": {"memory": "1Gi"}}]}})
    small = {"name": "main", "image": "python:3.11",
             "resources": {"requests": {"memory": "64Mi"}, "limits": {"memory": "2Gi"}}}
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(ns, pod("p", small))
    assert exc.value.status == 403
    assert status_of(exc.value)["message"] == (
        'pods "p" is forbidden: [minimum memory usage per Container is 128Mi, but request is '
        "64Mi, memory max limit to request ratio per Container is 2, but provided ratio is "
        "32.000000, maximum memory usage per Pod is 1Gi, but limit is 2Gi]")


def test_a_privileged_host_path_pod_is_refused_by_pod_security_restricted(realkube, core):
    user = realkube.user_namespace("alice")
    root = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "root"}, "spec": {
        "hostPID": True, "hostNetwork": True,
        "containers": [{"name": "sh", "image": "busybox", "securityContext": {"privileged": True},
                        "volumeMounts": [{"name": "host", "mountPath": "/host"}]}],
        "volumes": [{"name": "host", "hostPath": {"path": "/"}}]}}
    with pytest.raises(ApiException) as exc:  # as admin: Pod Security is per namespace, not per user
        core.create_namespaced_pod(user.name, root)
    assert exc.value.status == 403
    assert status_of(exc.value)["message"] == (
        'pods "root" is forbidden: violates PodSecurity "restricted:latest": '
        "host namespaces (hostNetwork=true, hostPID=true), "
        'privileged (container "sh" must not set securityContext.privileged=true), '
        'allowPrivilegeEscalation != false (container "sh" must set '
        "securityContext.allowPrivilegeEscalation=false), "
        'unrestricted capabilities (container "sh" must set '
        'securityContext.capabilities.drop=["ALL"]), '
        'restricted volume types (volume "host" uses restricted volume type "hostPath"), '
        'runAsNonRoot != true (pod or container "sh" must set securityContext.runAsNonRoot=true), '
        'seccompProfile (pod or container "sh" must set securityContext.seccompProfile.type to '
        '"RuntimeDefault" or "Localhost")')
    assert not core.list_namespaced_pod(user.name).items
    # the same pod is admitted where no level is enforced (dry-run: nothing is kept)
    core.create_namespaced_pod(realkube.namespace("ops"), root, dry_run="All")


def test_baseline_allows_what_restricted_refuses(realkube, core):
    ns = realkube.namespace("base", labels={"pod-security.kubernetes.io/enforce": "baseline"})
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
             "spec": {"containers": [{"name": "c", "image": "python:3.11"}]}}
    core.create_namespaced_pod(ns, plain)  # root, no seccomp: baseline lets it run
    plain["metadata"]["name"] = "host"
    plain["spec"]["volumes"] = [{"name": "h", "hostPath": {"path": "/etc"}}]
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(ns, plain)
    assert 'violates PodSecurity "baseline:latest": hostPath volumes (volume "h")' in \
        status_of(exc.value)["message"]


def test_a_config_map_over_one_mib_is_a_422_and_a_body_over_three_mib_a_413(realkube, core):
    ns = realkube.namespace("cm")
    limit = 1024 * 1024
    core.create_namespaced_config_map(ns, {"metadata": {"name": "fits"},
                                           "data": {"a": "x" * (limit - 1), "b": "y"}})
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map(ns, {"metadata": {"name": "big"},
                                               "data": {"a": "x" * limit, "b": "y"}})
    assert exc.value.status == 422
    assert status_of(exc.value)["message"] == (
        'ConfigMap "big" is invalid: []: Too long: may not be more than 1048576 bytes')
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map(ns, {"metadata": {"name": "huge"},
                                               "data": {"a": "x" * (3 * limit + 1)}})
    assert exc.value.status == 413
    assert status_of(exc.value)["message"] == "Request entity too large: limit is 3145728"


def test_the_user_role_cannot_touch_the_isolation_policy(realkube):
    user = realkube.user_namespace("alice")
    net = client.NetworkingV1Api(user.api_client)
    for call in (lambda: net.delete_namespaced_network_policy("tfk8s-user-isolation", user.name),
                 lambda: net.create_namespaced_network_policy(user.name, {
                     "metadata": {"name": "open"}, "spec": {"podSelector": {}}})):
        with pytest.raises(ApiException) as exc:
            call()
        assert exc.value.status == 403
    admin_net = client.NetworkingV1Api(realkube.admin)
    assert admin_net.read_namespaced_network_policy("tfk8s-user-isolation", user.name)


def test_the_restricted_dry_run_refuses_what_it_must(realkube):
    """The dry-run check the lab's pods pass below is not vacuous: a privileged init container fails it."""
    user = realkube.user_namespace("alice")
    spec = pod("p")["spec"]
    spec["initContainers"] = [{"name": "fetch", "image": "busybox", "securityContext": {"privileged": True}}]
    assert 'container "fetch" must not set securityContext.privileged=true' in \
        realkube.restricted_refusal(spec, user.name)


# -- the lab against those rules, as the user ------------------------------------------------


@pytest.fixture
def backend(kube_user):
    """``make(settings)``: a namespace bootstrapped from ``settings`` and a backend as its ServiceAccount."""
    from tfk8s_hub.bootstrap import BootstrapSpec
    from tfk8s_hub.settings import LabSettings

    def make(settings=None):
        spec = BootstrapSpec.from_settings(settings or LabSettings(hub_namespace="default"))
        return kube_user("alice", bootstrap=spec)

    return make


def writes(ns) -> list[str]:
    return [f"{r.verb} {r.uri}" for r in ns.requests() if r.verb not in ("get", "list", "watch")]


def role_pod(realkube, ns: str, name: str, role: str):
    """The pod JobSet's controller made for task 0 of ``role`` (waited for)."""
    sel = f"jobset.sigs.k8s.io/jobset-name={name},jobset.sigs.k8s.io/replicatedjob-name={role}"
    return wait_for(lambda: (p := realkube.pods(ns, sel)) and p[0], 90, message=f"the {name} {role} pod")


def test_a_default_launch_fits_the_default_quota_and_limit_range(realkube, backend):
    ns, b = backend()
    b.launch(ClusterSpec(name="mnist", ps=1, workers=2, script=SCRIPT), detach=True)
    for role in ("ps", "worker"):
        res = role_pod(realkube, ns.name, "mnist", role).spec.containers[0].resources
        # no CPU limit (no throttling), requests and the memory limit from the LimitRange
        assert (res.requests, res.limits) == ({"cpu": "500m", "memory": "1Gi"}, {"memory": "4Gi"})
    # --cpu above what any default would allow is fine too: CPU has no limit
    b.launch(ClusterSpec(name="big", workers=1, script=SCRIPT,
                         resources={"worker": Resources(cpu="4", memory="2Gi")}), detach=True)
    res = role_pod(realkube, ns.name, "big", "worker").spec.containers[0].resources
    assert (res.requests, res.limits) == ({"cpu": "4", "memory": "2Gi"}, {"memory": "2Gi"})


def test_the_preflight_applies_limit_range_defaults_exactly_as_admission_does(realkube, backend):
    from tfk8s_hub.settings import LabSettings

    ns, b = backend(LabSettings(hub_namespace="default", default_limits={"cpu": "2", "memory": "3Gi"},
                                default_requests={"memory": "512Mi"}, max_limits={"memory": "8Gi"}))
    spec = ClusterSpec(name="eq", ps=1, workers=1, script=SCRIPT, resources={"worker": Resources(cpu="1")})
    ranges = [realkube.admin.sanitize_for_serialization(r)
              for r in realkube.core.list_namespaced_limit_range(ns.name).items]
    predicted = admitted(j.cluster_manifests(spec, b.settings), ranges)
    b.launch(spec, detach=True)
    (jobset,) = [d for d in predicted if d["kind"] == "JobSet"]
    for rjob in jobset["spec"]["replicatedJobs"]:  # each role's template, as admitted
        template = rjob["template"]["spec"]["template"]["spec"]
        stored = realkube.admin.sanitize_for_serialization(role_pod(realkube, ns.name, "eq", rjob["name"]))
        assert stored["spec"]["containers"][0]["resources"] == template["containers"][0]["resources"], \
            rjob["name"]


def test_cpu_above_a_default_cpu_limit_is_refused_before_any_write(backend):
    from tfk8s_hub.settings import LabSettings

    # the first chart's LimitRange: every container got a 2-CPU limit by default
    ns, b = backend(LabSettings(hub_namespace="default", default_limits={"cpu": "2", "memory": "4Gi"}))
    spec = ClusterSpec(name="fast", workers=1, script=SCRIPT,
                       resources={"worker": Resources(cpu="4", memory="2Gi")})
    with pytest.raises(LaunchFailed) as exc:
        b.launch(spec, detach=True)
    assert str(exc.value) == (
        "the cluster would not fit, so nothing was created: fast-worker asks for cpu 4 but "
        "the namespace's LimitRange gives its container a cpu limit of 2: ask for at most 2 "
        "(--cpu), or ask your administrator to raise the LimitRange's default cpu limit.")
    assert writes(ns) == []


def test_a_quota_on_cpu_limits_without_a_default_says_who_must_act(backend):
    from tfk8s_hub.settings import LabSettings

    ns, b = backend(LabSettings(hub_namespace="default", quota={"limits.cpu": "16"},
                                default_limits={}, default_requests={}))
    with pytest.raises(LaunchFailed) as exc:
        b.launch(ClusterSpec(name="q", workers=1, script=SCRIPT), detach=True)
    assert "ResourceQuota tfk8s-quota counts limits.cpu, so every pod needs a CPU limit" in str(exc.value)
    assert "ask your administrator" in str(exc.value)
    assert writes(ns) == []


def test_a_script_over_one_mib_is_refused_before_any_api_call(backend):
    ns, b = backend()
    big = "x = 1\n" * 180_000  # 1.08 MB
    with pytest.raises(SpecError) as exc:
        b.launch(ClusterSpec(name="big", workers=1, script=big), detach=True)
    assert str(exc.value).startswith(
        f"the script and its --file files are 1080000 bytes, more than the {MAX_FILES_BYTES}")
    fat = ClusterSpec(name="fat", workers=1, script="#" * MAX_FILES_BYTES, env={"X": "y" * 200_000})
    with pytest.raises(SpecError, match="its script and spec are .* over the 1048576 bytes"):
        j.render_yaml(fat, K8sSettings())
    with pytest.raises(SpecError):
        b.launch(fat, detach=True)
    assert ns.requests() == []
    # at the spec's limit, the real API server takes it (its ConfigMap stays under 1 MiB)
    b.launch(ClusterSpec(name="edge", workers=1, script="#" * MAX_FILES_BYTES), detach=True)
    cm = client.CoreV1Api(ns.api_client).read_namespaced_config_map("edge", ns.name)
    assert sum(len(k) + len(v.encode()) for k, v in (cm.data or {}).items()) <= 1024 * 1024


def test_task_and_tensorboard_pods_are_admitted_under_restricted(realkube, backend, monkeypatch, tmp_path):
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/alice/")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))  # where TensorBoard's token is kept
    ns, b = backend()
    b.launch(ClusterSpec(name="ig", mode="in-graph", ps=1, workers=1), detach=True)
    b.tensorboard("ig")
    # the namespace enforces "restricted": a pod that exists was admitted under it
    pods = wait_for(
        lambda: (p := realkube.pods(ns.name)) and len(p) >= 3
        and any(x.metadata.labels.get("tfk8s.io/component") == "tensorboard" for x in p) and p,
        90, message="the task pods and TensorBoard's pod (made by its Deployment through admission)")
    for p in pods:
        assert p.spec.security_context.fs_group_change_policy == "OnRootMismatch", p.metadata.name
