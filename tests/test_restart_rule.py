"""The restart rule (:class:`tfk8s_magics.lifecycle.RestartRule`), table-driven, with no process.

Each row is one sequence the local supervisor meets (the sequences its comments and the fault
tests in ``test_local_faults.py``, ``test_local_lifecycle.py`` and ``test_faults_state.py`` run
with real TensorFlow): what happens to the cluster's processes, and the actions the rule must
answer at each step.  A tiny driver plays the supervisor: it starts what the rule says to start
now (the ``started`` event follows at once) and leaves ending to the ``end`` steps, so a row reads
as what the processes did, in order.  ``stop`` and ``recycle`` are the supervisor's own decisions
(a stop asked for; the grace period after success over): it tells the rule which tasks it ends.
"""

from __future__ import annotations

import pytest

from tfk8s_magics.lifecycle import (
    PORT_MOVES,
    Blame,
    EndTasks,
    Fail,
    LifecyclePolicy,
    MovePort,
    Restart,
    RestartRule,
    SettleTask,
    StartDeferred,
    Succeed,
    TaskEnd,
)
from tfk8s_magics.runtime.exitcodes import PORT_TAKEN_MARK
from tfk8s_magics.spec import ClusterSpec

KILL = TaskEnd(signal="SIGKILL")
TERM = TaskEnd(signal="SIGTERM")
LOST = TaskEnd(exit_code=75)
OK = TaskEnd(exit_code=0)
RAISED = TaskEnd(exit_code=1)
PORT = TaskEnd(exit_code=3, reason=PORT_TAKEN_MARK)
STOPPED_PEER = ("worker-1", "worker-1 was stopped (SIGSTOP or SIGTSTP), silent for 4 s")
ZOMBIE_PEER = ("worker-1", "worker-1 had ended (its end not handled yet)")
LOST_W1 = "lost worker-1 (lost a peer (exit code 75)); restart 1 of 2"

BETWEEN_3 = dict(workers=3, ps=0, script="pass")
BETWEEN_PS = dict(workers=2, ps=1, script="pass")
BETWEEN_EVAL = dict(workers=2, ps=0, evaluator=1, script="pass")
BETWEEN_2 = dict(workers=2, ps=0, script="pass")
IN_GRAPH = dict(mode="in-graph", workers=2, ps=1)


def _play(rule: RestartRule, step: tuple) -> list:
    """Feed one step to the rule; perform what a supervisor performs at once (starts)."""
    kind, *args = step
    if kind == "end":
        name, end, now, *culprit = args
        actions = rule.ended(name, end, now, culprit=culprit[0] if culprit else None)
    elif kind == "moved":
        name, old, now = args
        actions = rule.port_moved(name, old)
    elif kind == "recycle":
        rule.ending(args[0], "recycle")
        return []
    elif kind == "stop":
        rule.stop_requested(failed=bool(args and args[0]))
        for name in sorted(rule.running):
            rule.ending(name, "stop")
        return []
    else:
        raise AssertionError(f"unknown step {kind}")
    for a in actions:  # what the supervisor does with them that the rule hears of
        if isinstance(a, Restart) and not a.deferred:
            rule.started(a.task, now)
        elif isinstance(a, StartDeferred) and not rule.stopping:
            for name in a.tasks:
                rule.started(name, now)
    return actions


# (id, spec, budget, [(step, expected actions)], restarts used at the end)
ROWS = [
    ("a killed worker of three: one incident, the group ends first, then all start", BETWEEN_3, 2, [
        (("end", "worker-1", KILL, 10.0), [
            EndTasks(("worker-0", "worker-2"), "restart"),
            Restart("worker-1", "killed by SIGKILL; restart 1 of 2", deferred=True)]),
        (("end", "worker-0", TERM, 10.2), [
            Restart("worker-0", "restarted with its group (worker-1: killed by SIGKILL)", deferred=True)]),
        (("end", "worker-2", LOST, 10.3), [
            Restart("worker-2", "restarted with its group (worker-1: killed by SIGKILL)"),
            StartDeferred(("worker-1", "worker-0"))]),
    ], 1),
    ("a killed worker is the cause even when a peer that noticed is already a zombie", BETWEEN_3, 2, [
        (("end", "worker-1", KILL, 10.0, ("worker-2", "worker-2 had ended (its end not handled yet)")), [
            EndTasks(("worker-0", "worker-2"), "restart"),
            Restart("worker-1", "killed by SIGKILL; restart 1 of 2", deferred=True)]),
        (("end", "worker-2", LOST, 10.0), [
            Restart("worker-2", "restarted with its group (worker-1: killed by SIGKILL)", deferred=True)]),
        (("end", "worker-0", TERM, 10.2), [
            Restart("worker-0", "restarted with its group (worker-1: killed by SIGKILL)"),
            StartDeferred(("worker-1", "worker-2"))]),
    ], 1),
    ("the same worker killed again after the incident's window: a second restart", BETWEEN_3, 2, [
        (("end", "worker-1", KILL, 10.0), [
            EndTasks(("worker-0", "worker-2"), "restart"),
            Restart("worker-1", "killed by SIGKILL; restart 1 of 2", deferred=True)]),
        (("end", "worker-0", TERM, 10.1), [
            Restart("worker-0", "restarted with its group (worker-1: killed by SIGKILL)", deferred=True)]),
        (("end", "worker-2", TERM, 10.2), [
            Restart("worker-2", "restarted with its group (worker-1: killed by SIGKILL)"),
            StartDeferred(("worker-1", "worker-0"))]),
        (("end", "worker-2", KILL, 90.0), [
            EndTasks(("worker-0", "worker-1"), "restart"),
            Restart("worker-2", "killed by SIGKILL; restart 2 of 2", deferred=True)]),
    ], 2),
    ("a PS lost, the workers notice 0.2 s and 7 s later: one restart (between-graph)", BETWEEN_PS, 2, [
        (("end", "ps-0", KILL, 10.0), [
            EndTasks(("worker-0", "worker-1"), "restart"),
            Restart("ps-0", "killed by SIGKILL; restart 1 of 2", deferred=True)]),
        (("end", "worker-0", LOST, 10.2), [
            Restart("worker-0", "restarted with its group (ps-0: killed by SIGKILL)", deferred=True)]),
        (("end", "worker-1", LOST, 17.0), [
            Restart("worker-1", "restarted with its group (ps-0: killed by SIGKILL)"),
            StartDeferred(("ps-0", "worker-0"))]),
    ], 1),
    ("in-graph: a PS lost, servers notice in the window and 30 s late: not counted again", IN_GRAPH, 2, [
        (("end", "ps-0", KILL, 10.0), [Restart("ps-0", "killed by SIGKILL; restart 1 of 2")]),
        (("end", "worker-0", LOST, 10.2), [
            Restart("worker-0", "lost a peer (exit code 75); same incident as ps-0: killed by SIGKILL")]),
        (("end", "worker-1", LOST, 45.0), [  # running since before the incident: its late notice
            Restart("worker-1", "lost a peer (exit code 75); same incident as ps-0: killed by SIGKILL")]),
        (("end", "worker-0", LOST, 50.0), [  # restarted in it: a new loss, a new incident
            Restart("worker-0", "lost a peer (exit code 75); restart 2 of 2")]),
    ], 2),
    ("a second end of a task restarted in the incident is a new failure", IN_GRAPH, 2, [
        (("end", "ps-0", KILL, 10.0), [Restart("ps-0", "killed by SIGKILL; restart 1 of 2")]),
        (("end", "ps-0", KILL, 12.0), [Restart("ps-0", "killed by SIGKILL; restart 2 of 2")]),
        (("end", "ps-0", KILL, 14.0), [
            Fail("ps-0 failed: killed by SIGKILL (restart budget 2 used up)", "ps-0",
                 "killed by SIGKILL (restart budget 2 used up)")]),
    ], 2),
    ("a peer lost after its group restarted: the stopped peer is named and restarts", BETWEEN_2, 2, [
        (("end", "worker-0", LOST, 10.0, STOPPED_PEER), [
            Blame("worker-1", f"{STOPPED_PEER[1]}; worker-0 lost it (lost a peer (exit code 75))"),
            EndTasks(("worker-1",), "restart"),
            Restart("worker-0", LOST_W1, deferred=True)]),
        (("end", "worker-1", KILL, 15.0), [
            Restart("worker-1", f"{STOPPED_PEER[1]}; restart 1 of 2 (the cause of this incident)"),
            StartDeferred(("worker-0",))]),
        (("end", "worker-0", LOST, 20.0), [  # restarted already: counted, its group restarts
            EndTasks(("worker-1",), "restart"),
            Restart("worker-0", "lost a peer (exit code 75); restart 2 of 2", deferred=True)]),
    ], 2),
    ("a zombie peer: named, and its own end told once it is reaped", BETWEEN_2, 2, [
        (("end", "worker-0", LOST, 10.0, ZOMBIE_PEER), [
            Blame("worker-1", f"{ZOMBIE_PEER[1]}; worker-0 lost it (lost a peer (exit code 75))"),
            EndTasks(("worker-1",), "restart"),
            Restart("worker-0", LOST_W1, deferred=True)]),
        (("end", "worker-1", KILL, 10.0), [
            Restart("worker-1", "killed by SIGKILL; restart 1 of 2 (the cause of this incident)"),
            StartDeferred(("worker-0",))]),
    ], 1),
    ("a stopped peer with no budget: the cause fails the cluster, named", BETWEEN_2, 0, [
        (("end", "worker-0", LOST, 10.0, STOPPED_PEER), [
            Blame("worker-1", f"{STOPPED_PEER[1]}; worker-0 lost it "
                  "(lost a peer (exit code 75) (restart budget 0 used up))"),
            Fail(f"worker-1 failed: {STOPPED_PEER[1]}; worker-0 lost it "
                 "(lost a peer (exit code 75) (restart budget 0 used up))",
                 "worker-0", "lost worker-1 (lost a peer (exit code 75) (restart budget 0 used up))")]),
        (("stop", True), []),
        (("end", "worker-1", KILL, 11.0), [SettleTask("worker-1", "failed", STOPPED_PEER[1])]),
    ], 0),
    ("an evaluator's end restarts it alone; its exit 1 fails the cluster", BETWEEN_EVAL, 2, [
        (("end", "evaluator-0", KILL, 10.0), [Restart("evaluator-0", "killed by SIGKILL; restart 1 of 2")]),
        (("end", "evaluator-0", RAISED, 60.0), [
            Fail("evaluator-0 failed: the script raised an exception (exit code 1); the traceback is in "
                 "its log", "evaluator-0",
                 "the script raised an exception (exit code 1); the traceback is in its log")]),
    ], 1),
    ("the workers finish; the evaluator is recycled after the grace period", BETWEEN_EVAL, 2, [
        (("end", "worker-0", OK, 10.0), [Succeed("worker-0", "exit code 0")]),
        (("end", "worker-1", OK, 11.0), [Succeed("worker-1", "exit code 0")]),
        (("recycle", "evaluator-0"), []),  # the supervisor's grace period is over
        (("end", "evaluator-0", TERM, 41.0), [SettleTask("evaluator-0", "succeeded",
                                                        "recycled after the workers finished")]),
    ], 0),
    ("a port taken: moved and every task restarted with the new addresses, not counted", IN_GRAPH, 0, [
        (("end", "worker-1", PORT, 1.0), [MovePort("worker-1")]),
        (("moved", "worker-1", "127.0.0.1:4000", 1.1), [
            EndTasks(("ps-0", "worker-0"), "ports"),
            Restart("worker-1", "on a new port (127.0.0.1:4000 was taken)", deferred=True)]),
        (("end", "ps-0", TERM, 1.2), [
            Restart("ps-0", "restarted with the cluster's new addresses (not counted)", deferred=True)]),
        (("end", "worker-0", TERM, 1.3), [
            Restart("worker-0", "restarted with the cluster's new addresses (not counted)"),
            StartDeferred(("worker-1", "ps-0"))]),
    ], 0),
    (f"a port taken {PORT_MOVES + 1} times: the last is the task's failure", dict(IN_GRAPH, workers=1), 2,
     [step for _ in range(PORT_MOVES) for step in [
         (("end", "worker-0", PORT, 1.0), [MovePort("worker-0")]),
         (("moved", "worker-0", "127.0.0.1:4000", 1.1), [
             EndTasks(("ps-0",), "ports"),
             Restart("worker-0", "on a new port (127.0.0.1:4000 was taken)", deferred=True)]),
         (("end", "ps-0", TERM, 1.2), [
             Restart("ps-0", "restarted with the cluster's new addresses (not counted)"),
             StartDeferred(("worker-0",))]),
     ]] + [
         (("end", "worker-0", PORT, 2.0), [Fail("worker-0 failed: exit code 3", "worker-0", "exit code 3")]),
     ], 0),
    ("the budget spent: the next retryable end fails the cluster", BETWEEN_2, 1, [
        (("end", "worker-0", KILL, 10.0), [
            EndTasks(("worker-1",), "restart"),
            Restart("worker-0", "killed by SIGKILL; restart 1 of 1", deferred=True)]),
        (("end", "worker-1", TERM, 10.5), [
            Restart("worker-1", "restarted with its group (worker-0: killed by SIGKILL)"),
            StartDeferred(("worker-0",))]),
        (("end", "worker-1", KILL, 100.0), [
            Fail("worker-1 failed: killed by SIGKILL (restart budget 1 used up)", "worker-1",
                 "killed by SIGKILL (restart budget 1 used up)")]),
    ], 1),
    ("a stop during a group restart: the ended tasks are stopped, nothing starts", BETWEEN_3, 2, [
        (("end", "worker-2", KILL, 10.0), [
            EndTasks(("worker-0", "worker-1"), "restart"),
            Restart("worker-2", "killed by SIGKILL; restart 1 of 2", deferred=True)]),
        (("stop",), []),
        (("end", "worker-0", TERM, 10.1), [SettleTask("worker-0", "stopped")]),
        (("end", "worker-1", LOST, 10.2), [SettleTask("worker-1", "stopped")]),
    ], 1),
    ("a retryable end while stopping is not restarted", BETWEEN_2, 2, [
        (("stop",), []),
        (("end", "worker-0", TERM, 10.0), [SettleTask("worker-0", "stopped")]),
        (("end", "worker-1", TERM, 10.0), [SettleTask("worker-1", "stopped")]),
    ], 0),
    ("the script's own outcome is never restarted", BETWEEN_2, 5, [
        (("end", "worker-0", TaskEnd(exit_code=3), 10.0), [
            Fail("worker-0 failed: exit code 3", "worker-0", "exit code 3")]),
    ], 0),
]


@pytest.mark.parametrize(("spec_kw", "budget", "steps", "used"),
                         [pytest.param(s, b, st, u, id=i) for i, s, b, st, u in ROWS])
def test_the_restart_rule_table(spec_kw, budget, steps, used):
    spec = ClusterSpec(name="c", restart_budget=budget, **spec_kw)
    rule = RestartRule(LifecyclePolicy.of(spec), spec)
    for t in spec.tasks():
        rule.started(t.name, 0.0)
    for i, (step, expected) in enumerate(steps):
        assert _play(rule, step) == expected, f"step {i}: {step}"
    assert rule.restarts_used == used


def test_a_note_on_the_disk_replaces_the_promise_of_a_traceback():
    spec = ClusterSpec(name="c", restart_budget=2, **BETWEEN_2)
    rule = RestartRule(LifecyclePolicy.of(spec), spec)
    for t in spec.tasks():
        rule.started(t.name, 0.0)
    note = "; its log dir /l is full (No space left on device)"
    [fail] = rule.ended("worker-0", RAISED, 1.0, note=note)
    assert fail.task_reason == ("the script raised an exception (exit code 1); its traceback may be "
                                f"missing from its log{note}")
