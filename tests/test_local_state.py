"""A local cluster's status from its files (:mod:`tfk8s_magics.backends.local.state`), against
literal files: what a supervisor writes, and garbled, foreign, hostile and half-written ones.

No process runs: the two questions the status asks the process table (is the recorded supervisor
that very process, still running? is a pid alive?) are answered by the test.
"""

from __future__ import annotations

import json

import pytest

from tfk8s_magics.backends.base import Phase
from tfk8s_magics.backends.local import state
from tfk8s_magics.backends.local.state import LocalFiles, Unread

CID = "0123456789abcdef0123456789abcdef"

RECORD = {
    "id": CID, "backend": "local", "created": 1000.0, "owner_pid": 4242, "owner": "ada", "detached": False,
    "spec": {"name": "mnist", "mode": "between", "workers": 2, "ps": 1},
    "addresses": {"ps-0": "127.0.0.1:4000", "worker-0": "127.0.0.1:4001", "worker-1": "127.0.0.1:4002"},
    "cluster": {"ps": ["127.0.0.1:4000"], "worker": ["127.0.0.1:4001", "127.0.0.1:4002"]},
    "workdir": "/home/ada", "log_dir": "/home/ada/logs/mnist", "data_dir": "/home/ada/data",
}
IN_GRAPH_RECORD = {**RECORD, "spec": {"name": "ig", "mode": "in-graph", "workers": 2, "ps": 1}}


def row(name, phase="running", **kw):
    return {"name": name, "phase": phase, "reason": "", "host": RECORD["addresses"][name], "restarts": 0,
            "pid": 100 + len(name), "pid_start": 7, "started": 1001.0, "finished": None, **kw}


STATUS = {
    "id": CID, "phase": "running", "reason": "every task is ready", "finished": None,
    "supervisor_pid": 99, "supervisor_start": 55, "watchdog_pid": 98, "supervisor_done": False,
    "restarts_used": 0, "tasks": [row("ps-0"), row("worker-0"), row("worker-1")],
    "stall": {"since": 1100.0, "timeout": 600.0, "tasks": []}, "isolation": {"mode": "netns"},
    "updated": 1002.0,
}


def files(record=RECORD, status=STATUS, name="mnist") -> LocalFiles:
    def encode(v):
        return v if v is None or isinstance(v, bytes | Unread) else json.dumps(v).encode()

    return LocalFiles(name, encode(record), encode(status), created=999.0)


def status_of(f: LocalFiles, alive=True, pid_alive=True, progress=None, coordinator=None):
    return state.cluster_status(
        f, backend="local", same_process=lambda pid, start: alive and (pid, start) == (99, 55),
        pid_alive=lambda pid: pid_alive, last_progress=(progress or {}).get, coordinator=lambda: coordinator)


def test_a_running_cluster_reads_as_its_supervisor_wrote_it():
    st = status_of(files())
    assert (st.name, st.mode, st.phase) == ("mnist", "between", Phase.RUNNING)
    assert st.reason == "every task is ready"
    assert (st.created, st.owner, st.detached) == (1000.0, "ada", False)
    assert str(st.log_dir) == "/home/ada/logs/mnist"
    assert [(t.name, t.phase, t.pid) for t in st.tasks] == [
        ("ps-0", "running", 104), ("worker-0", "running", 108), ("worker-1", "running", 108)]
    assert st.stall is not None and st.stall.since == 1100.0


def test_before_the_supervisor_writes_the_tasks_come_from_the_record():
    st = status_of(files(status=None))
    assert st.phase == Phase.PENDING and st.reason == ""
    assert [(t.name, t.host, t.phase) for t in st.tasks] == [
        ("ps-0", "127.0.0.1:4000", "pending"), ("worker-0", "127.0.0.1:4001", "pending"),
        ("worker-1", "127.0.0.1:4002", "pending")]


def test_a_killed_supervisor_fails_the_cluster_and_every_live_task():
    done_row = row("worker-1", "succeeded", pid=None)
    st = status_of(files(status={**STATUS, "tasks": [row("ps-0"), row("worker-0"), done_row]}), alive=False)
    assert (st.phase, st.reason) == (Phase.FAILED, state.SUPERVISOR_DIED)
    assert [(t.phase, t.reason, t.pid) for t in st.tasks] == [
        ("failed", "supervisor died", None), ("failed", "supervisor died", None), ("succeeded", "", None)]
    assert st.stall is None  # shown only while running


def test_a_finished_supervisor_is_not_asked_after():
    ended = {**STATUS, "phase": "succeeded", "reason": "the workers finished", "finished": 1200.0,
             "supervisor_done": True, "tasks": [row(n, "succeeded", pid=None) for n in RECORD["addresses"]]}
    st = status_of(files(status=ended), alive=False)
    assert (st.phase, st.reason, st.finished) == (Phase.SUCCEEDED, "the workers finished", 1200.0)
    assert state.finished(files(status=ended), lambda pid, start: True)


@pytest.mark.parametrize(("record", "status", "words"), [
    (None, STATUS, "no cluster.json (an interrupted launch, or not a cluster)"),
    (b'{"id": "0123', STATUS, "cluster.json is not valid JSON"),
    (b"\xff\xfe garbage", STATUS, "cluster.json is not a record of ours (not UTF-8"),
    (b"[" * 100 + b"]" * 100, STATUS, "cluster.json is not a record of ours (nested deeper than 32 levels)"),
    (b"null", STATUS, "cluster.json holds a JSON null, not an object"),
    ([1, 2], STATUS, "cluster.json holds a JSON array, not an object"),
    ({k: v for k, v in RECORD.items() if k != "log_dir"}, STATUS, "cluster.json lacks log_dir"),
    ({**RECORD, "addresses": {"ps-0": 4000}}, STATUS, "cluster.json has a malformed addresses"),
    ({**RECORD, "created": "yesterday", "id": 7}, STATUS, "cluster.json has a malformed created, id"),
    (Unread("cluster.json: Permission denied"), STATUS, "cluster.json: Permission denied"),
    (RECORD, {**STATUS, "id": "f" * 32}, "status.json belongs to another cluster (its id differs)"),
    (RECORD, {**STATUS, "tasks": "all of them"}, "status.json has no task list"),
    (RECORD, b'{"id": "' + CID.encode() + b'", "tasks": [', "status.json is not valid JSON"),
    (RECORD, {**STATUS, "phase": 3}, "status.json has a malformed phase or reason"),
    (RECORD, {**STATUS, "tasks": [{"phase": "running"}]}, "a task row of status.json is not an object"),
    (RECORD, Unread("status.json: it is a symlink"), "status.json: it is a symlink"),
])
def test_an_unreadable_state_is_an_unknown_status_that_says_why_and_what_to_do(record, status, words):
    st = status_of(files(record=record, status=status))
    assert st.phase == Phase.UNKNOWN and st.name == "mnist" and st.created == 999.0
    assert st.reason.startswith(f"unreadable state: {words}"), st.reason
    assert st.reason.endswith("%tfcluster delete mnist --force (tfk8s delete mnist --force) stops whatever "
                              "of it still runs and removes it.")


def test_a_task_row_from_another_writer_is_read_leniently():
    odd = {"name": "worker-0", "phase": "hibernating", "restarts": -3, "pid": "12", "exit_code": True,
           "started": float("nan"), "colour": "blue"}
    st = status_of(files(status={**STATUS, "tasks": [row("ps-0"), odd]}))
    t = st.task("worker-0")
    assert (t.phase, t.restarts, t.pid, t.exit_code, t.started) == (Phase.UNKNOWN, 0, None, None, None)


def _line(step, task, **more):
    return json.dumps({"step": step, "task": task, "time": 1050.0, **more})


def test_progress_speaks_for_the_chief_then_worker_0_then_the_furthest():
    both = {"worker-0": _line(5, "worker-0", total=10), "worker-1": _line(9, "worker-1")}
    assert status_of(files(), progress=both).progress.step == 5
    no_worker_0 = {"worker-1": _line(9, "worker-1"), "ps-0": _line(3, "ps-0")}
    assert status_of(files(), progress=no_worker_0).progress.step == 9
    with_chief = {"chief-0": _line(2, "chief-0", metrics={"loss": 0.5, "bad": "x"}), **both}
    p = status_of(files(), progress=with_chief).progress
    assert (p.step, p.task, p.metrics) == (2, "chief-0", {"loss": 0.5})
    garbled = {"worker-0": "{not json", "worker-1": _line(True, "worker-1")}
    assert status_of(files(), progress=garbled).progress is None


def test_an_in_graph_coordinator_is_told_its_connection_is_lost_after_a_ps_restart():
    ps = row("ps-0", restarts=1, started=1500.0)
    restarted = {**STATUS, "tasks": [ps, row("worker-0"), row("worker-1")]}
    f = files(record=IN_GRAPH_RECORD, status=restarted, name="ig")
    connected = json.dumps({"pid": 4242, "connected": 1400.0}).encode()
    st = status_of(f, coordinator=connected)
    assert st.reason.startswith("the coordinator's connection is lost: ps-0 restarted after it connected")
    assert status_of(f, coordinator=json.dumps({"pid": 4242, "connected": 1600.0}).encode()).reason == (
        "every task is ready")  # it reconnected since
    assert status_of(f, coordinator=connected, pid_alive=False).reason == "every task is ready"
    assert status_of(f, coordinator=b"{torn").reason == "every task is ready"
    between = status_of(files(status=restarted), coordinator=connected)
    assert between.reason == "every task is ready"  # a between-graph cluster has no coordinator


def test_finished_while_the_supervisor_runs_or_after_it_died():
    alive = lambda pid, start: True  # noqa: E731
    assert not state.finished(files(), alive)
    assert not state.finished(files(status=None), alive)  # launched, the supervisor not reported yet
    assert state.finished(files(), lambda pid, start: False)  # died: nothing more will happen
    assert state.finished(files(record=None, status=None), alive)  # deleted
    # Nothing more will be learnt from a state that cannot be read: not waited for.
    assert state.finished(files(record=b"{torn"), alive)
    assert state.finished(files(status={**STATUS, "id": "f" * 32}), alive)


def _event(**kw):
    return json.dumps({"time": 1001.0, "task": "worker-0", "reason": "Restarted", "message": "m",
                       "type": "Warning", **kw}).encode()


def test_the_event_journal_skips_what_is_no_event_and_says_so():
    journal = b"\n".join([
        _event(),
        b'{"time": 1002.0, "task": "worker-1", "reason": "Sta',  # a torn write
        json.dumps({"time": 1003.0, "task": 7, "reason": "x", "message": "m"}).encode(),  # foreign
        json.dumps([1, 2]).encode(),
        b"",
        json.dumps({"time": 1004.0, "task": "", "reason": "Started", "message": "started 3"}).encode(),
        b"",
    ])
    events = state.events_from(journal, 0, 2000.0, 1 << 20)
    assert [(e.time, e.task, e.reason, e.type) for e in events] == [
        (1001.0, "worker-0", "Restarted", "Warning"), (1004.0, "", "Started", "Normal"),
        (2000.0, "", "EventsUnreadable", "Warning")]
    assert events[-1].message == ("3 line(s) of events.jsonl are not events (a torn or damaged write) "
                                  "and were skipped")


def test_the_end_of_a_long_journal_is_read_and_the_cut_line_dropped():
    journal = b'reason": "cut in two"}\n' + _event(reason="Last") + b"\n"
    events = state.events_from(journal, 4096, 2000.0, 1 << 20)
    assert [e.reason for e in events] == ["Last", "EventsUnreadable"]
    assert events[-1].message == (f"only the last {1 << 20} bytes of events.jsonl are read (4096 earlier "
                                  "bytes not shown)")
    assert state.events_from(b"", 0, 2000.0, 1 << 20) == []
