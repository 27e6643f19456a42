"""The lifecycle policy, table-driven: one table both backends obey.

The same table is run against the policy itself, against the JobSet the
Kubernetes backend creates (what Kubernetes and JobSet do with a failed pod
of it, by their documented rules), and — in
``test_local_lifecycle.py`` — the local supervisor runs real processes
through the rows that matter (signal retried, exit 1 and 3 not).
"""

from __future__ import annotations

import pytest

from tfk8s_magics import lifecycle
from tfk8s_magics.backends.kubernetes import jobset
from tfk8s_magics.backends.kubernetes.settings import K8sSettings
from tfk8s_magics.lifecycle import FAIL, RESTART, SUCCEED, LifecyclePolicy, TaskEnd
from tfk8s_magics.spec import ClusterSpec

# (how a task ended, restarts already used, budget) -> (action, words in the reason)
TABLE = [
    pytest.param(TaskEnd(exit_code=0), 0, 2, SUCCEED, "exit code 0", id="exit 0"),
    pytest.param(TaskEnd(exit_code=1), 0, 2, FAIL, "raised an exception", id="exit 1: raised"),
    pytest.param(TaskEnd(exit_code=3, reason=lifecycle.SCRIPT_BROKEN), 0, 2, FAIL, "failed on an import",
                 id="exit 3 + runtime's mark: broken"),
    pytest.param(TaskEnd(exit_code=3), 0, 2, FAIL, "exit code 3", id="exit 3 alone: sys.exit(3)"),
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


def test_a_scripts_own_exit_3_is_not_called_broken():
    """sys.exit(3) from user code is the user's exit code 3; only the runtime's mark says "cannot run"."""
    assert LifecyclePolicy().decide(TaskEnd(exit_code=3), 0).reason == "exit code 3"
    marked = LifecyclePolicy().decide(TaskEnd(exit_code=3, reason=lifecycle.SCRIPT_BROKEN), 0).reason
    assert marked.startswith("the script cannot run")


def _what_jobset_does(js: dict, end: TaskEnd, used: int) -> str:
    """What Kubernetes does with one failed pod of the JobSet ``js``, by its documented rules.

    A Job's ``podFailurePolicy`` rules are tried in order (``Ignore``: a
    replacement pod, nothing counted; ``FailJob``: the Job fails with reason
    ``PodFailurePolicy``); an unmatched failure counts against ``backoffLimit``
    (0 here: the Job fails with ``BackoffLimitExceeded``).  A failed Job then
    meets the JobSet's ``failurePolicy.rules`` in order; an unmatched one
    restarts the JobSet while ``restarts < maxRestarts``, else fails it.
    Evicted/preempted pods carry the ``DisruptionTarget`` condition.
    """
    job = js["spec"]["replicatedJobs"][-1]["template"]["spec"]
    conditions = set(end.conditions) | ({"DisruptionTarget"} if end.reason == "Evicted" else set())
    code = end.exit_code
    reason = "BackoffLimitExceeded"
    for rule in job["podFailurePolicy"]["rules"]:
        on_codes = rule.get("onExitCodes")
        matched = (
            any(c["type"] in conditions for c in rule.get("onPodConditions", []))
            or (on_codes is not None and code is not None and code != 0
                and (code in on_codes["values"]) == (on_codes["operator"] == "In"))
        )
        if matched:
            if rule["action"] == "Ignore":
                return RESTART  # replaced, nothing counted
            if rule["action"] == "FailJob":
                reason = "PodFailurePolicy"
            break
    policy = js["spec"]["failurePolicy"]
    for rule in policy.get("rules", []):
        if reason in rule.get("onJobFailureReasons", []):
            return FAIL if rule["action"] == "FailJobSet" else RESTART
    return RESTART if used < policy["maxRestarts"] else FAIL


@pytest.mark.parametrize(("end", "used", "budget", "action", "words"), TABLE)
def test_the_kubernetes_jobset_obeys_the_table(end, used, budget, action, words):
    """The same table against the JobSet the Kubernetes backend creates (JobSet enacts it)."""
    if end.signal or end.vanished or end.exit_code == 0:
        pytest.skip("a pod cannot show this end (signals arrive as exit codes 128+N)")
    spec = ClusterSpec(name="c", ps=1, workers=2, script="pass", restart_budget=budget)
    js = jobset.jobset(spec, K8sSettings(namespace="n"), LifecyclePolicy.of(spec))
    assert _what_jobset_does(js, end, used) == action


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


@pytest.mark.parametrize(
    ("mode", "ended", "restarted"),
    [
        ("between", "worker-1", ["chief-0", "worker-0"]),
        ("between", "chief-0", ["worker-0", "worker-1"]),
        # The group's variables live on the parameter server: all of it loses them at once.
        ("between", "ps-0", ["chief-0", "worker-0", "worker-1"]),
        ("between", "evaluator-0", []),  # it only reads checkpoints
        ("in-graph", "ps-0", []),  # the kernel's coordinator reconnects (no group restarts)
        ("in-graph", "worker-0", []),
    ],
)
def test_which_tasks_restart_with_a_retried_end(mode, ended, restarted):
    roles = dict(chief=1, workers=2, ps=1, evaluator=1) if mode == "between" else dict(workers=2, ps=1)
    spec = ClusterSpec(name="c", mode=mode, script="pass" if mode == "between" else None, **roles)
    policy = LifecyclePolicy.of(spec)
    task = next(t for t in spec.tasks() if t.name == ended)
    assert sorted(t.name for t in policy.restarts_with(spec, task)) == restarted


def test_the_policy_is_built_from_the_spec():
    spec = ClusterSpec(name="c", workers=1, script="pass", restart_budget=4, ps_grace_period=7,
                       ttl_after_finished=60)
    policy = LifecyclePolicy.of(spec)
    assert (policy.restart_budget, policy.grace_period, policy.ttl_after_finished) == (4, 7.0, 60.0)
    assert policy.failure_grace == 0.0  # the others stop at once after a failure
    assert lifecycle.EXIT_SCRIPT_BROKEN == 3  # the task runtime's contract, one definition
