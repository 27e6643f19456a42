"""The lifecycle policy, table-driven: one table both backends obey.

The same table is run against the policy itself, against the Kubernetes
backend's pure planner (a failed pod built from the row), and — in
``test_local_lifecycle.py`` — the local supervisor runs real processes
through the rows that matter (signal retried, exit 1 and 3 not).
"""

from __future__ import annotations

import pytest

from tfk8s_magics import lifecycle
from tfk8s_magics.backends.base import Phase
from tfk8s_magics.backends.kubernetes import state
from tfk8s_magics.lifecycle import FAIL, RESTART, SUCCEED, LifecyclePolicy, TaskEnd
from tfk8s_magics.spec import ClusterSpec

# (how a task ended, restarts already used, budget) -> (action, words in the reason)
TABLE = [
    pytest.param(TaskEnd(exit_code=0), 0, 2, SUCCEED, "exit code 0", id="exit 0"),
    pytest.param(TaskEnd(exit_code=1), 0, 2, FAIL, "raised an exception", id="exit 1: raised"),
    pytest.param(TaskEnd(exit_code=3), 0, 2, FAIL, "failed on an import", id="exit 3: broken"),
    pytest.param(TaskEnd(exit_code=7), 0, 2, FAIL, "exit code 7", id="exit 7: chosen"),
    pytest.param(TaskEnd(exit_code=127), 0, 2, FAIL, "exit code 127", id="exit 127: chosen"),
    pytest.param(TaskEnd(signal="SIGKILL"), 0, 2, RESTART, "killed by SIGKILL", id="local SIGKILL"),
    pytest.param(TaskEnd(signal="SIGTERM"), 1, 2, RESTART, "killed by SIGTERM", id="local SIGTERM"),
    pytest.param(TaskEnd(exit_code=137), 0, 2, RESTART, "killed by SIGKILL", id="container 137"),
    pytest.param(TaskEnd(exit_code=143), 0, 2, RESTART, "killed by SIGTERM", id="container 143"),
    pytest.param(TaskEnd(exit_code=137, reason="OOMKilled"), 0, 2, RESTART, "OOMKilled", id="OOM"),
    pytest.param(TaskEnd(reason="Evicted"), 0, 2, RESTART, "Evicted", id="evicted"),
    pytest.param(TaskEnd(exit_code=1, conditions=frozenset({"DisruptionTarget"})), 0, 2, RESTART,
                 "DisruptionTarget", id="disruption beats the exit code"),
    pytest.param(TaskEnd(vanished=True), 0, 2, RESTART, "removed by someone else", id="pod deleted"),
    pytest.param(TaskEnd(exit_code=75), 0, 2, RESTART, "lost a peer", id="exit 75: lost a peer"),
    pytest.param(TaskEnd(exit_code=75), 2, 2, FAIL, "restart budget 2 used up", id="peer lost, no budget"),
    pytest.param(TaskEnd(signal="SIGKILL"), 2, 2, FAIL, "restart budget 2 used up", id="budget spent"),
    pytest.param(TaskEnd(exit_code=137), 0, 0, FAIL, "restart budget 0 used up", id="no budget"),
    pytest.param(TaskEnd(exit_code=3), 0, 5, FAIL, "exit code 3", id="budget never saves exit 3"),
]


@pytest.mark.parametrize(("end", "used", "budget", "action", "words"), TABLE)
def test_policy_table(end, used, budget, action, words):
    decision = LifecyclePolicy(restart_budget=budget).decide(end, used)
    assert decision.action == action
    assert words in decision.reason


def _failed_pod(end: TaskEnd, attempt: int = 0) -> dict:
    terminated = {} if end.exit_code is None else {"exitCode": end.exit_code}
    if end.reason == "OOMKilled":
        terminated["reason"] = end.reason
    status: dict = {"phase": "Failed",
                    "containerStatuses": [{"name": "tensorflow", "state": {"terminated": terminated}}]}
    if end.reason and end.reason != "OOMKilled":
        status["reason"] = end.reason
    if end.conditions:
        status["conditions"] = [{"type": c, "status": "True"} for c in end.conditions]
    return {"metadata": {"name": "c-worker-0" + (f"-r{attempt}" if attempt else ""),
                         "labels": {"tfk8s.io/role": "worker", "tfk8s.io/index": "0"},
                         "annotations": {"tfk8s.io/attempt": str(attempt)}},
            "status": status}


def _running(task: str) -> dict:
    role, _, index = task.rpartition("-")
    return {"metadata": {"name": f"c-{task}", "labels": {"tfk8s.io/role": role, "tfk8s.io/index": index},
                         "annotations": {}},
            "status": {"phase": "Running", "containerStatuses": [{"ready": True, "state": {}}]}}


@pytest.mark.parametrize(("end", "used", "budget", "action", "words"), TABLE)
def test_kubernetes_planner_obeys_the_table(end, used, budget, action, words):
    if end.signal or end.vanished or end.exit_code == 0:
        pytest.skip("a pod cannot show this end (signals arrive as exit codes; see the 'pod deleted' test)")
    spec = ClusterSpec(name="c", ps=1, workers=2, script="pass", restart_budget=budget)
    # ``used`` restarts were spent by worker-1 (the budget is the cluster's, not the task's).
    worker1 = _running("worker-1")
    worker1["metadata"]["annotations"]["tfk8s.io/attempt"] = str(used)
    pods = state.latest_pods([_failed_pod(end), _running("ps-0"), worker1])
    view = state.View(spec=spec, pods=pods)
    actions = state.plan(view, now=0.0)
    creates = [a for a in actions if isinstance(a, state.Create)]
    phase, reason = state.cluster_phase(view, state.task_statuses(view))
    if action == RESTART:
        assert [c.task.name for c in creates] == ["worker-0"] and phase != Phase.FAILED
    else:
        assert creates == [] and phase == Phase.FAILED
        # After a failure the others are stopped at once, not after the grace period.
        assert state.DeletePods(("c-ps-0", "c-worker-1"), "the cluster failed") in actions


def test_a_pod_deleted_by_someone_else_is_replaced_only_within_budget():
    spec = ClusterSpec(name="c", ps=1, workers=2, script="pass", restart_budget=1)
    running = state.latest_pods([_running("ps-0"), _running("worker-1")])
    assert [type(a) for a in state.plan(state.View(spec=spec, pods=running, gone={"worker-0": 0}), 0)] == [
        state.Create]
    assert state.plan(state.View(spec=spec, pods=running, gone={"worker-0": 1}), 0) == []


@pytest.mark.parametrize(
    ("mode", "roles", "success", "recycled"),
    [
        ("between", dict(chief=1, workers=2, ps=1, evaluator=1),
         ["chief-0", "worker-0", "worker-1"], ["ps-0", "evaluator-0"]),
        ("in-graph", dict(workers=2, ps=1), [], ["ps-0", "worker-0", "worker-1"]),
    ],
)
def test_which_roles_decide_success(mode, roles, success, recycled):
    spec = ClusterSpec(name="c", mode=mode, script="pass" if mode == "between" else None, **roles)
    policy = LifecyclePolicy.of(spec)
    assert sorted(t.name for t in policy.success_tasks(spec)) == sorted(success)
    assert sorted(t.name for t in policy.recycled_when_done(spec)) == sorted(recycled)


def test_the_policy_is_built_from_the_spec():
    spec = ClusterSpec(name="c", workers=1, script="pass", restart_budget=4, ps_grace_period=7,
                       ttl_after_finished=60)
    policy = LifecyclePolicy.of(spec)
    assert (policy.restart_budget, policy.grace_period, policy.ttl_after_finished) == (4, 7.0, 60.0)
    assert policy.failure_grace == 0.0  # the others stop at once after a failure
    assert lifecycle.EXIT_SCRIPT_BROKEN == 3  # the task runtime's contract, one definition
