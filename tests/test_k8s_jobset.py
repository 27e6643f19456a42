"""The pure JobSet builder, against literal dicts, the JobSet CRD schema (strict) and the Job schemas."""

from __future__ import annotations

import copy
import json

import kubernetes_validate
import pytest

from tests import jobset_schema as crd
from tfk8s_magics.backends.kubernetes import jobset as j
from tfk8s_magics.backends.kubernetes import manifests as m
from tfk8s_magics.backends.kubernetes.settings import K8sSettings
from tfk8s_magics.errors import SpecError
from tfk8s_magics.lifecycle import LifecyclePolicy
from tfk8s_magics.runtime.task import resolve_identity, task_from_env
from tfk8s_magics.spec import ClusterSpec, Resources, Task
from tfk8s_magics.tfconfig import tf_config

SETTINGS = K8sSettings(namespace="alice", image="tfk8s/tensorflow-task:0.1.0", user="alice")
SCRIPT = "print('hi')\n"
LABELS = {
    "app.kubernetes.io/managed-by": "tfk8s",
    "app.kubernetes.io/name": "tfk8s",
    "app.kubernetes.io/part-of": "tfk8s-lab",
    "app.kubernetes.io/instance": "mnist",
    "tfk8s.io/cluster": "mnist",
    "tfk8s.io/user": "alice",
}


def labels(component: str) -> dict[str, str]:
    """The recommended app.kubernetes.io labels and the project's own, for one component."""
    return {**LABELS, "app.kubernetes.io/component": component, "tfk8s.io/component": component}
CLUSTER = {
    "ps": ["mnist-ps-0-0.mnist.alice.svc:2222"],
    "worker": ["mnist-worker-0-0.mnist.alice.svc:2222", "mnist-worker-0-1.mnist.alice.svc:2222"],
}
SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def between(**kw) -> ClusterSpec:
    kw.setdefault("ps", 1)
    kw.setdefault("workers", 2)
    return ClusterSpec(name="mnist", script=SCRIPT, owner="alice", **kw)


def in_graph(**kw) -> ClusterSpec:
    return ClusterSpec(name="ig", mode="in-graph", ps=1, workers=2, owner="alice", **kw)


def build(spec: ClusterSpec) -> dict:
    return j.jobset(spec, SETTINGS, LifecyclePolicy.of(spec))


def rjob(js: dict, role: str) -> dict:
    return next(r for r in js["spec"]["replicatedJobs"] if r["name"] == role)


def env_of(template: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in template["spec"]["containers"][0]["env"]}


def _pod(role: str, *, script: bool, extra_env: dict, grace: int | None = None) -> dict:
    mounts = [
        {"name": "data", "mountPath": "/data"},
        {"name": "log", "mountPath": "/log"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes = [
        {"name": "data", "persistentVolumeClaim": {"claimName": "mnist-data"}},
        {"name": "log", "persistentVolumeClaim": {"claimName": "mnist-log"}},
        {"name": "tmp", "emptyDir": {}},
    ]
    env = [
        {"name": "TFK8S_ROLE", "value": role},
        {"name": "TFK8S_CLUSTER_DEF", "value": json.dumps(CLUSTER, sort_keys=True)},
        {"name": "TFK8S_CLUSTER", "value": "mnist"},
        {"name": "TFK8S_LOG_DIR", "value": "/log"},
        {"name": "TFK8S_DATA_DIR", "value": "/data"},
        {"name": "TFK8S_CHECKPOINT_DIR", "value": "/log/checkpoints"},
        {"name": "TFK8S_READY_FILE", "value": "/tmp/tfk8s-ready"},
        {"name": "HOME", "value": "/tmp"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    if script:
        env.append({"name": "TFK8S_SCRIPT", "value": "/etc/tfk8s/script.py"})
        env.append({"name": "TFK8S_SCRIPT_DIR", "value": "/etc/tfk8s"})
        mounts.append({"name": "script", "mountPath": "/etc/tfk8s", "readOnly": True})
        volumes.append({"name": "script", "configMap": {
            "name": "mnist", "items": [{"key": "script.py", "path": "script.py"}]}})
    env += [{"name": "TF_USE_LEGACY_KERAS", "value": "1"}]
    quiet = ("TF_CPP_MIN_LOG_LEVEL", "GLOG_minloglevel", "ABSL_MIN_LOG_LEVEL")
    env += [{"name": k, "value": "2"} for k in quiet]
    env += [{"name": k, "value": v} for k, v in extra_env.items()]
    spec = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 100,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [{
            "name": "tensorflow",
            "image": "tfk8s/tensorflow-task:0.1.0",
            "command": [
                "python", "-m", "tfk8s_magics.backends.kubernetes.logcopy",
                "/log/tasks/{task}.log", "--", "python", "-m", "tfk8s_magics.runtime.task",
            ],
            "workingDir": "/data",
            "env": env,
            "ports": [{"name": "grpc", "containerPort": 2222, "protocol": "TCP"}],
            "readinessProbe": {
                "exec": {"command": ["test", "-f", "/tmp/tfk8s-ready"]},
                "periodSeconds": 2,
                "failureThreshold": 1,
            },
            "securityContext": SECURITY,
            "volumeMounts": mounts,
        }],
        "volumes": volumes,
    }
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"metadata": {"labels": {**labels("task"), "tfk8s.io/role": role}}, "spec": spec}


def _rjob(role: str, n: int, pod: dict) -> dict:
    return {
        "name": role,
        "replicas": 1,
        "template": {
            "metadata": {"labels": {**labels("task"), "tfk8s.io/role": role}},
            "spec": {
                "parallelism": n,
                "completions": n,
                "completionMode": "Indexed",
                "backoffLimit": 0,
                "podFailurePolicy": {"rules": [
                    {"action": "Ignore",
                     "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                    {"action": "FailJob",
                     "onExitCodes": {"containerName": "tensorflow", "operator": "In",
                                     # 75 (EXIT_PEER_LOST) is left out: a lost peer is
                                     # retried, the JobSet restarting every Job at once
                                     "values": [c for c in range(1, 128) if c != 75]}},
                ]},
                "template": pod,
            },
        },
    }


def test_between_graph_jobset_is_exactly_this():
    spec = between(env={"EPOCHS": "3"}, ttl_after_finished=600)
    assert build(spec) == {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": "mnist",
            "namespace": "alice",
            "labels": labels("jobset"),
        },
        "spec": {
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True,
                        "subdomain": "mnist"},
            "replicatedJobs": [
                _rjob("ps", 1, _pod("ps", script=False, extra_env={"EPOCHS": "3"}, grace=30)),
                _rjob("worker", 2, _pod("worker", script=True, extra_env={"EPOCHS": "3"})),
            ],
            "successPolicy": {"operator": "All", "targetReplicatedJobs": ["worker"]},
            "failurePolicy": {
                "maxRestarts": 2,
                "restartStrategy": "Recreate",
                "rules": [{"name": "UserError", "action": "FailJobSet",
                           "onJobFailureReasons": ["PodFailurePolicy"]}],
            },
            "startupPolicy": {"startupPolicyOrder": "InOrder"},
            "ttlSecondsAfterFinished": 600,
        },
    }


def test_policy_maps_onto_jobset_fields():
    spec = between(chief=1, evaluator=1, restart_budget=5, ps_grace_period=0)
    js = build(spec)
    assert [r["name"] for r in js["spec"]["replicatedJobs"]] == ["ps", "chief", "worker", "evaluator"]
    assert js["spec"]["successPolicy"] == {"operator": "All",
                                           "targetReplicatedJobs": ["chief", "worker"]}
    assert js["spec"]["failurePolicy"]["maxRestarts"] == 5
    assert "ttlSecondsAfterFinished" not in js["spec"]
    graces = {r["name"]: r["template"]["spec"]["template"]["spec"].get(
        "terminationGracePeriodSeconds") for r in js["spec"]["replicatedJobs"]}
    assert graces == {"ps": 0, "chief": None, "worker": None, "evaluator": 0}
    chief = rjob(js, "chief")["template"]["spec"]
    assert (chief["parallelism"], chief["completions"]) == (1, 1)


def test_mwms_without_ps_starts_in_any_order():
    js = build(between(ps=0))
    assert js["spec"]["startupPolicy"] == {"startupPolicyOrder": "AnyOrder"}
    assert [r["name"] for r in js["spec"]["replicatedJobs"]] == ["worker"]


def test_in_graph_never_succeeds_by_itself():
    js = build(in_graph())
    # No target roles: All of the servers' Jobs, and servers never exit 0.
    assert js["spec"]["successPolicy"] == {"operator": "All"}
    for r in js["spec"]["replicatedJobs"]:
        pod = r["template"]["spec"]["template"]
        assert "TFK8S_SCRIPT" not in env_of(pod)
        assert [v["name"] for v in pod["spec"]["volumes"]] == ["data", "log", "tmp"]
    assert json.loads(env_of(rjob(js, "ps")["template"]["spec"]["template"])["TFK8S_CLUSTER_DEF"]) == {
        "ps": ["ig-ps-0-0.ig.alice.svc:2222"],
        "worker": ["ig-worker-0-0.ig.alice.svc:2222", "ig-worker-0-1.ig.alice.svc:2222"],
    }


def test_queue_priority_scheduler_and_deadline():
    spec = between(queue="team-a", priority="high-priority", scheduler="volcano",
                   active_deadline=3600)
    js = build(spec)
    assert js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    for r in js["spec"]["replicatedJobs"]:
        job = r["template"]["spec"]
        assert job["activeDeadlineSeconds"] == 3600
        assert job["template"]["spec"]["schedulerName"] == "volcano"
        assert job["template"]["spec"]["priorityClassName"] == "high-priority"
    assert js["spec"]["failurePolicy"]["rules"][-1] == {
        "name": "DeadlineExceeded", "action": "FailJobSet",
        "onJobFailureReasons": ["DeadlineExceeded"]}


def test_resources_per_role_gpu_toleration_and_placement():
    spec = between(
        resources={"worker": Resources(cpu="2", memory="4Gi", gpus=1),
                   "ps": Resources(cpu="1", memory="2Gi")},
        spread=("worker",),
        node_affinity={"ps": ("!nvidia.com/gpu.present", "zone=a", "tier!=spot", "ssd")},
        tolerations=({"key": "team", "operator": "Exists", "effect": "NoSchedule"},),
    )
    js = build(spec)
    worker = rjob(js, "worker")["template"]["spec"]["template"]["spec"]
    ps = rjob(js, "ps")["template"]["spec"]["template"]["spec"]
    assert worker["containers"][0]["resources"] == {
        "requests": {"cpu": "2", "memory": "4Gi"},
        "limits": {"memory": "4Gi", "nvidia.com/gpu": "1"},
    }
    assert ps["containers"][0]["resources"] == {
        "requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}}
    assert worker["tolerations"] == [
        {"key": "team", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert ps["tolerations"] == [{"key": "team", "operator": "Exists", "effect": "NoSchedule"}]
    assert worker["affinity"] == {"podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100,
            "podAffinityTerm": {
                "labelSelector": {"matchLabels": {"tfk8s.io/cluster": "mnist",
                                                  "tfk8s.io/role": "worker"}},
                "topologyKey": "kubernetes.io/hostname",
            },
        }]}}
    assert ps["affinity"] == {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"},
            {"key": "zone", "operator": "In", "values": ["a"]},
            {"key": "tier", "operator": "NotIn", "values": ["spot"]},
            {"key": "ssd", "operator": "Exists"},
        ]}]}}}


@pytest.mark.parametrize("kw, words", [
    ({"queue": "Team A"}, "--queue 'Team A' is not a valid name"),
    ({"priority": "x" * 64}, "--priority"),
    ({"scheduler": "-bad"}, "--scheduler '-bad'"),
    ({"active_deadline": 0}, "--active-deadline 0"),
    ({"active_deadline": "soon"}, "--active-deadline 'soon'"),
    ({"spread": ("workers",)}, "unknown role 'workers'"),
    ({"node_affinity": {"ps": ("a==b",)}}, "node requirement 'a==b' for ps"),
])
def test_bad_scheduling_input_is_one_sentence(kw, words):
    with pytest.raises(SpecError, match=None) as info:
        between(**kw)
    assert words in str(info.value)
    assert str(info.value).count(". ") == 0 or str(info.value).endswith(".")


def test_tf_config_from_jobset_naming_is_the_shared_pure_function():
    spec = between()
    js = build(spec)
    for role, n in (("ps", 1), ("worker", 2)):
        env = env_of(rjob(js, role)["template"]["spec"]["template"])
        for index in range(n):
            pod_env = {**env, "JOB_COMPLETION_INDEX": str(index)}
            resolve_identity(pod_env)
            # The same function the local backend uses, over JobSet's DNS names.
            assert pod_env["TF_CONFIG"] == tf_config(j.cluster_addresses(spec, SETTINGS),
                                                     Task(role, index))
            assert pod_env["TFK8S_TASK"] == f"{role}-{index}"
            assert json.loads(pod_env["TF_CONFIG"])["cluster"] == CLUSTER


def test_identity_needs_role_and_index():
    assert task_from_env({"TFK8S_ROLE": "worker", "JOB_COMPLETION_INDEX": "3"}) == Task("worker", 3)
    assert task_from_env({"TFK8S_TASK": "ps-1"}) == Task("ps", 1)
    assert task_from_env({"TFK8S_ROLE": "worker"}) is None
    with pytest.raises(KeyError, match="JOB_COMPLETION_INDEX"):
        resolve_identity({})
    given = {"TF_CONFIG": "{}", "TFK8S_TASK": "worker-0"}
    resolve_identity(given)
    assert given == {"TF_CONFIG": "{}", "TFK8S_TASK": "worker-0"}  # the local backend's, kept


def test_task_of_pod_reads_jobset_labels():
    labels = {"tfk8s.io/role": "worker", "batch.kubernetes.io/job-completion-index": "1"}
    assert j.task_of_pod(labels) == Task("worker", 1)
    assert j.task_of_pod({"jobset.sigs.k8s.io/replicatedjob-name": "ps",
                          "batch.kubernetes.io/job-completion-index": "0"}) == Task("ps", 0)
    assert j.task_of_pod({"tfk8s.io/role": "worker"}) is None


def test_longest_names_fit_jobset_limits():
    spec = ClusterSpec(name="a" * 40, workers=256, evaluator=1, script=SCRIPT)
    longest = max((j.hostname(spec, t) for t in spec.tasks()), key=len)
    # JobSet's webhook: pod names (hostname + "-" + 5 random characters) within 63.
    assert len(longest + "-abcde") <= 63


def test_builder_is_pure():
    spec = between(queue="q")
    assert build(spec) == build(spec)
    assert build(spec) is not build(spec)


SPECS = {
    "between": lambda: between(ttl_after_finished=0),
    "full": lambda: between(
        chief=1, evaluator=1, queue="q", priority="p", scheduler="s", active_deadline=60,
        resources={"worker": Resources(cpu="1", memory="1Gi", gpus=2)},
        spread=("worker", "ps"), node_affinity={"ps": ("!gpu",)},
        node_selector={"pool": "tf"}, log_claim="shared-logs", data_claim="shared-data"),
    "mwms": lambda: between(ps=0),
    "in-graph": in_graph,
}


@pytest.mark.parametrize("which", sorted(SPECS))
def test_every_jobset_is_valid_against_the_crd_schema_with_unknown_fields_refused(which):
    js = build(SPECS[which]())
    assert crd.problems(js) == []


@pytest.mark.parametrize("version", ["1.29", "1.37"])
@pytest.mark.parametrize("which", sorted(SPECS))
def test_every_job_template_is_a_strictly_valid_job(version, which):
    js = build(SPECS[which]())
    for r in js["spec"]["replicatedJobs"]:
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": f"{js['metadata']['name']}-{r['name']}-0", "namespace": "alice",
                         **r["template"]["metadata"]},
            "spec": r["template"]["spec"],
        }
        kubernetes_validate.validate(job, version, strict=True)


def test_strict_check_refuses_what_a_server_would_prune_or_reject():
    js = build(between())
    bad = copy.deepcopy(js)
    bad["spec"]["successPolicy"]["operater"] = "All"
    bad["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["containers"][0][
        "imagePullPolicie"] = "Always"
    bad["spec"]["replicatedJobs"][0]["replicas"] = "one"
    bad["spec"]["startupPolicy"]["startupPolicyOrder"] = "PSFirst"
    found = dict(crd.problems(bad))
    assert "spec.successPolicy.operater" in found
    assert "spec.replicatedJobs[1].template.spec.template.spec.containers[0].imagePullPolicie" in found
    assert found["spec.replicatedJobs[0].replicas"].endswith('must be of type integer: "string"')
    assert found["spec.startupPolicy.startupPolicyOrder"].startswith('Unsupported value: "PSFirst"')


def test_role_env_is_the_shared_piece_of_every_template():
    spec = between(env={"A": "1"})
    template_env = env_of(rjob(build(spec), "worker")["template"]["spec"]["template"])
    common = m.role_env(spec, SETTINGS, "worker")
    assert {k: template_env[k] for k in common} == common
    assert set(template_env) - set(common) == {"TFK8S_ROLE", "TFK8S_CLUSTER_DEF"}
