"""Pure cluster logic: pods → task statuses, restart decisions, recycling, TTL, quota."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tfk8s_magics.backends.base import Phase
from tfk8s_magics.backends.kubernetes import state
from tfk8s_magics.backends.kubernetes.manifests import cluster_manifests
from tfk8s_magics.backends.kubernetes.quota import demand, node_problems, quota_problems
from tfk8s_magics.backends.kubernetes.rbac import (
    backend_role,
    backend_role_binding,
    role_rules,
)
from tfk8s_magics.backends.kubernetes.settings import K8sSettings
from tfk8s_magics.spec import ClusterSpec, Resources

SPEC = ClusterSpec(name="c", ps=1, workers=2, script="pass", restart_budget=1,
                   ps_grace_period=30, ttl_after_finished=60)


def pod(task: str, phase: str = "Running", attempt: int = 0, ready: bool = True,
        terminated: dict | None = None, **status) -> dict:
    role, _, index = task.rpartition("-")
    name = f"c-{task}" + (f"-r{attempt}" if attempt else "")
    container: dict = {"name": "tensorflow", "ready": ready and phase == "Running", "state": {}}
    if terminated is not None:
        container["state"] = {"terminated": terminated}
    return {
        "metadata": {
            "name": name,
            "labels": {"tfk8s.io/role": role, "tfk8s.io/index": index},
            "annotations": {"tfk8s.io/attempt": str(attempt)},
        },
        "status": {"phase": phase, "containerStatuses": [container], **status},
    }


def view(*pods, **kw) -> state.View:
    return state.View(spec=kw.pop("spec", SPEC), pods=state.latest_pods(list(pods)), **kw)


def test_pending_reason_comes_from_the_scheduler_or_the_container():
    unsched = pod("worker-0", "Pending", conditions=[{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}])
    s = state.task_status("worker-0", unsched)
    assert (s.phase, s.reason) == (
        Phase.PENDING, "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")
    pulling = pod("worker-0", "Pending")
    pulling["status"]["containerStatuses"][0]["state"] = {
        "waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}
    s = state.task_status("worker-0", pulling)
    assert (s.phase, s.reason) == (Phase.PENDING, "ImagePullBackOff: Back-off pulling image")


def test_running_is_starting_until_ready():
    assert state.task_status("ps-0", pod("ps-0", ready=False)).phase == Phase.STARTING
    assert state.task_status("ps-0", pod("ps-0")).phase == Phase.RUNNING


def test_exit_codes_are_explained():
    s = state.task_status("worker-0", pod("worker-0", "Failed",
                                          terminated={"exitCode": 3}))
    assert (s.phase, s.exit_code, s.reason) == (
        Phase.FAILED, 3, "the script cannot run: it failed on an import or did not compile (exit code 3)")
    s = state.task_status("worker-0", pod("worker-0", "Failed",
                                          terminated={"exitCode": 137, "reason": "OOMKilled"}))
    assert (s.exit_code, s.signal, s.reason) == (137, "SIGKILL", "OOMKilled")


def test_restart_budget_is_enforced():
    killed = pod("worker-0", "Failed", attempt=1, terminated={"exitCode": 137})
    v = view(pod("worker-0", "Failed", terminated={"exitCode": 137}), killed,
             pod("ps-0"), pod("worker-1"))
    phase, reason = state.cluster_phase(v, state.task_statuses(v))
    assert (phase, reason) == (Phase.FAILED, "worker-0 failed: killed by SIGKILL")
    assert not any(isinstance(a, state.Create) for a in state.plan(v, 0.0))
    assert state.task_statuses(v)[1].restarts == 1


def test_parameter_servers_are_recycled_after_the_grace_period_then_ttl():
    done = {"exitCode": 0}
    pods = [pod("ps-0"), pod("worker-0", "Succeeded", terminated=done),
            pod("worker-1", "Succeeded", terminated=done)]
    v = view(*pods, done_since=100.0)
    assert state.cluster_phase(v, state.task_statuses(v))[0] == Phase.SUCCEEDED
    assert state.plan(v, 110.0) == [state.MarkFinished(Phase.SUCCEEDED)]
    assert state.next_wakeup(v, 110.0) == 130.0
    assert state.plan(v, 130.0)[0] == state.DeletePods(("c-ps-0",), "the workers finished")
    # after the recycle the PS reads as succeeded, and the TTL deletes the cluster
    v = view(*pods[1:], done_since=100.0, finished_at=100.0)
    assert state.task_statuses(v)[0].phase == Phase.SUCCEEDED
    assert state.task_statuses(v)[0].reason == "recycled after the workers finished"
    assert state.plan(v, 159.0) == []
    assert state.plan(v, 160.0) == [state.DeleteCluster("finished 60 s ago (TTL)")]


def test_stopped_cluster_is_left_alone():
    v = view(pod("ps-0"), stopped=True)
    assert state.plan(v, 0.0) == []
    assert all(t.phase == Phase.STOPPED for t in state.task_statuses(v))
    assert state.cluster_phase(v, state.task_statuses(v)) == (Phase.STOPPED, "stopped by the user")


def test_in_graph_cluster_runs_until_stopped():
    spec = ClusterSpec(name="c", mode="in-graph", ps=1, workers=1)
    v = view(pod("ps-0"), pod("worker-0"), spec=spec)
    assert state.cluster_phase(v, state.task_statuses(v)) == (Phase.RUNNING, "")
    assert state.plan(v, 1e9) == []


# -- quota pre-flight -----------------------------------------------------------

SETTINGS = K8sSettings(namespace="u", user="u", storage_class="gluster")


def _manifests(**res):
    spec = ClusterSpec(name="q", ps=1, workers=2, script="pass",
                       resources={k: Resources(**v) for k, v in res.items()})
    return cluster_manifests(spec, SETTINGS)


def test_demand_sums_requests_objects_and_storage():
    need = demand(_manifests(worker={"cpu": "1500m", "memory": "1Gi", "gpus": 1},
                             ps={"cpu": "1", "memory": "512Mi"}))
    assert need["requests.cpu"] == Decimal("4")
    assert need["requests.memory"] == Decimal(2 * 2**30 + 2**29)
    assert need["requests.nvidia.com/gpu"] == 2
    assert need["pods"] == 3
    assert need["persistentvolumeclaims"] == 2
    assert need["requests.storage"] == 20 * 2**30
    assert need["gluster.storageclass.storage.k8s.io/requests.storage"] == 20 * 2**30


def test_quota_problems_name_the_resource_and_what_is_left():
    quota = {"metadata": {"name": "user-quota"},
             "status": {"hard": {"requests.cpu": "4", "pods": "10"},
                        "used": {"requests.cpu": "1500m", "pods": "2"}}}
    ms = _manifests(worker={"cpu": "1", "memory": "1Gi"}, ps={"cpu": "1", "memory": "1Gi"})
    assert quota_problems(ms, [quota]) == [
        "the cluster needs requests.cpu 3 but ResourceQuota user-quota leaves 2.5 "
        "(hard 4, used 1500m): ask for fewer tasks or resources, or delete finished clusters."
    ]
    quota["status"]["used"]["requests.cpu"] = "1"
    assert quota_problems(ms, [quota]) == []


def test_quota_on_cpu_requires_every_pod_to_ask_for_cpu():
    quota = {"metadata": {"name": "q"}, "status": {"hard": {"requests.cpu": "100"}}}
    problems = quota_problems(_manifests(worker={"cpu": "1"}), [quota])
    assert problems == [
        "ResourceQuota q counts requests.cpu, so every pod must set requests.cpu, but "
        "q-ps-0 do not and the namespace's LimitRange gives no default: give --cpu for "
        "every role (e.g. --cpu 1 --memory 2Gi)."
    ]


def test_node_problems():
    nodes = [{"status": {"allocatable": {"cpu": "4", "memory": "8Gi"}}},
             {"spec": {"unschedulable": True},
              "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"}}}]
    assert node_problems(_manifests(worker={"cpu": "2", "memory": "4Gi"}), nodes) == []
    problems = node_problems(_manifests(worker={"cpu": "2", "gpus": 1}), nodes)
    assert problems == [
        "q-worker-0 asks for cpu 2, nvidia.com/gpu 1, more than any schedulable node can "
        "allocate: ask for less per task.",
        "q-worker-1 asks for cpu 2, nvidia.com/gpu 1, more than any schedulable node can "
        "allocate: ask for less per task.",
    ]


# -- RBAC objects ---------------------------------------------------------------

def test_role_and_binding_are_namespaced_and_least_privilege():
    role = backend_role("alice")
    assert role["kind"] == "Role" and role["metadata"]["namespace"] == "alice"
    assert role["rules"] == role_rules()
    granted = {(g, r, v) for rule in role_rules() for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    assert not any(r in ("secrets", "pods/exec", "pods/attach", "roles", "rolebindings")
                   for _, r, _ in granted)
    assert not any(v in ("*", "escalate", "bind", "impersonate") for _, _, v in granted)
    assert backend_role_binding("alice", "default") == {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "tfk8s-backend", "namespace": "alice",
                     "labels": {"app.kubernetes.io/name": "tfk8s",
                                "app.kubernetes.io/component": "backend-rbac"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "tfk8s-backend"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "alice"}],
    }


@pytest.mark.parametrize("version", ["1.29", "1.37"])
def test_rbac_objects_validate(version):
    import kubernetes_validate

    kubernetes_validate.validate(backend_role("alice"), version, strict=True)
    kubernetes_validate.validate(backend_role_binding("alice", "sa"), version, strict=True)


def test_the_restart_budget_is_shared_by_the_whole_cluster():
    # worker-1 already spent the cluster's only restart: a kill of worker-0 is not retried.
    v = view(pod("ps-0"), pod("worker-0", "Failed", terminated={"exitCode": 137}),
             pod("worker-1", attempt=1))
    assert state.restarts_used(v) == 1
    assert not any(isinstance(a, state.Create) for a in state.plan(v, 0.0))
    assert state.cluster_phase(v, state.task_statuses(v))[0] == Phase.FAILED


def test_an_evaluator_does_not_hold_up_success_and_is_recycled():
    spec = ClusterSpec(name="c", ps=1, workers=1, evaluator=1, script="pass", ps_grace_period=30)
    done = {"exitCode": 0}
    v = view(pod("ps-0"), pod("worker-0", "Succeeded", terminated=done), pod("evaluator-0"),
             spec=spec, done_since=100.0)
    assert state.cluster_phase(v, state.task_statuses(v))[0] == Phase.SUCCEEDED
    deletes = [a for a in state.plan(v, 131.0) if isinstance(a, state.DeletePods)]
    assert deletes and set(deletes[0].names) == {"c-ps-0", "c-evaluator-0"}
