"""No state file can crash or hang the tools, and logs are read the way they are written (issue 28).

Every reader of a local cluster's state (``status.json``, ``cluster.json``, ``events.jsonl``,
progress files, the warm pool's records) is bounded in size and depth and skips or reports a bad
record; a cluster whose state is unreadable shows as ``unknown`` and ``delete --force`` removes
it.  Logs, progress and events are opened with ``O_NOFOLLOW | O_NONBLOCK`` and read only when
``fstat`` says they are a regular file of ours: a symlink is not followed, a FIFO not waited on,
a ``/dev/zero`` link not read.  Most cases need no process: they build a cluster dir by hand.
The fuzz test feeds each reader random and adversarial bytes (hypothesis).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import tracemalloc
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfk8s_magics as tk
from tfk8s_magics import records
from tfk8s_magics.backends import Phase
from tfk8s_magics.backends.local import logtail, pool
from tfk8s_magics.backends.local.layout import (
    MAX_STATE_BYTES,
    ClusterDir,
    UnreadableState,
    read_json,
    read_mapping,
    task_log_path,
    write_json_atomic,
    write_record,
)
from tfk8s_magics.backends.local.status import LocalTaskStatus
from tfk8s_magics.errors import BackendError
from tfk8s_magics.runtime.progress import parse_record
from tfk8s_magics.spec import ClusterSpec

pytestmark = pytest.mark.faults

#: Nested brackets past any recursion limit, in 3 KB (the probe's status.json).
DEEP = b"[" * 1500 + b"]" * 1500


def fake_cluster(local, name: str = "fz", tasks: int = 2) -> ClusterDir:
    """A cluster dir as a launch and a running supervisor leave it, with no process behind it."""
    spec = ClusterSpec(name=name, workers=tasks, script="print('hi')\n")
    cdir = ClusterDir(local.clusters_dir / name)
    (cdir.root / "progress").mkdir(parents=True, mode=0o700)
    log_dir = cdir.root / "logs"
    (log_dir / "tasks").mkdir(parents=True, mode=0o700)
    addresses = {t.name: f"127.0.0.1:{20000 + i}" for i, t in enumerate(spec.tasks())}
    cid = uuid.uuid4().hex
    write_record(cdir.record, {
        "id": cid, "backend": "local", "spec": spec.to_dict(), "created": time.time(), "owner_pid": 1,
        "owner": "me", "detached": True, "addresses": addresses,
        "cluster": {"worker": list(addresses.values())}, "workdir": str(cdir.root),
        "log_dir": str(log_dir), "data_dir": str(cdir.root / "data"),
    })
    write_json_atomic(cdir.status, {
        "id": cid, "phase": "running", "reason": "every task is ready", "finished": None,
        "supervisor_pid": None, "supervisor_start": None, "supervisor_done": True, "restarts_used": 0,
        "tasks": [{"name": t, "phase": "running", "started": time.time() - 5, "host": a}
                  for t, a in addresses.items()],
        "stall": None,
    })
    for t in addresses:
        task_log_path(log_dir, t).write_text(f"{t} says hello\n")
    with open(cdir.events, "w") as f:
        f.write(json.dumps({"time": time.time(), "task": "", "reason": "Started",
                            "message": "started 2 task(s)", "type": "Normal"}) + "\n")
    return cdir


def every_reader(local, name: str) -> None:
    """Run every reader a user reaches for; only the documented BackendError may come out."""
    rows = {s.name: s for s in local.list_clusters()}
    assert name in rows
    st_ = local.status(name)
    for t in st_.tasks:
        assert t.duration is None or isinstance(t.duration, float)
    st_.progress  # noqa: B018 - read, as the views do
    local.events(name)
    try:
        local.read_logs(name)
        local.read_logs(name, tail=5)
    except BackendError:
        pass


# -- the probe's state files ----------------------------------------------------------------------

@pytest.mark.parametrize("which", ["status", "record"])
def test_deeply_nested_state_shows_that_cluster_unreadable_and_delete_force_removes_it(local, which):
    fine = fake_cluster(local, "fine")
    cdir = fake_cluster(local, "deep")
    (cdir.status if which == "status" else cdir.record).write_bytes(DEEP)
    rows = {s.name: s for s in tk.list_clusters(local)}
    assert rows["deep"].phase == Phase.UNKNOWN and "nested deeper than" in rows["deep"].reason
    assert "delete deep --force" in rows["deep"].reason
    assert rows["fine"].phase == Phase.RUNNING
    assert local.status("deep").phase == Phase.UNKNOWN
    if which == "record":
        with pytest.raises(BackendError, match="unreadable state"):
            local.delete("deep")
    local.delete("deep", force=True)
    assert not cdir.root.exists() and fine.root.exists()


def test_cli_list_status_and_delete_force_survive_deep_nesting(state_dir, local):
    cdir = fake_cluster(local, "deep")
    cdir.status.write_bytes(DEEP)
    cdir.record.write_bytes(DEEP)
    env = {**os.environ, "TFK8S_STATE_DIR": str(state_dir)}

    def tfk8s(*args):
        return subprocess.run([sys.executable, "-m", "tfk8s_magics.cli", *args], env=env,
                              capture_output=True, text=True, timeout=120)

    for args in (["list"], ["get", "deep"], ["events", "deep"]):
        r = tfk8s(*args)
        assert "Traceback" not in r.stderr and "RecursionError" not in r.stdout + r.stderr, (args, r.stderr)
    r = tfk8s("delete", "deep", "--force")
    assert r.returncode == 0 and not cdir.root.exists(), r.stdout + r.stderr


@pytest.mark.parametrize(("row", "expect"), [
    ({"started": "yesterday"}, None),
    ({"finished": [1]}, None),
    ({"restarts": "many", "exit_code": "x", "pid": 1.5}, None),
    ({"phase": 7}, None),
])
def test_a_wrongly_typed_task_field_is_dropped_not_a_crash(local, row, expect):
    cdir = fake_cluster(local)
    raw = read_json(cdir.status)
    raw["tasks"][0].update(row)
    write_json_atomic(cdir.status, raw)
    st_ = local.status("fz")
    assert st_.phase == Phase.RUNNING
    t = st_.task("worker-0")
    assert t.duration is None or isinstance(t.duration, float)
    assert isinstance(t.restarts, int) and t.phase in (Phase.RUNNING, Phase.PENDING)


def test_status_null_or_a_non_list_of_tasks_is_unreadable_not_pending_or_another_cluster(local):
    cdir = fake_cluster(local)
    cdir.status.write_text("null")
    st_ = local.status("fz")
    assert st_.phase == Phase.UNKNOWN and "status.json holds a JSON null" in st_.reason, st_.reason
    cdir.status.write_text('{"tasks": "abc"}')
    st_ = local.status("fz")
    assert st_.phase == Phase.UNKNOWN and "another cluster" not in st_.reason
    assert "no task list" in st_.reason


def test_a_torn_or_garbage_line_in_events_is_skipped_and_counted(local):
    cdir = fake_cluster(local)
    with open(cdir.events, "ab") as f:
        f.write(b'{"time": 1, "task": "worker-0", "reas')  # a supervisor killed mid-write
        f.write(b"\n\x00\xff garbage\n" + DEEP + b"\n")
        f.write(json.dumps({"time": 2.0, "task": "worker-1", "reason": "Restarted", "message": "m"}).encode())
        f.write(b"\n" + json.dumps({"time": "x", "task": 1, "reason": "R", "message": "m"}).encode() + b"\n")
    events = local.events("fz")
    assert [e.reason for e in events] == ["Started", "Restarted", "EventsUnreadable"]
    assert "4 line(s) of events.jsonl are not events" in events[-1].message
    assert events[-1].type == "Warning"


def test_events_read_only_the_end_of_a_huge_file(local):
    cdir = fake_cluster(local)
    with open(cdir.events, "r+b") as f:  # 2 GiB, sparse: zeros, then one last event
        f.truncate(2 << 30)
        f.seek(0, os.SEEK_END)
        last = {"time": 3.0, "task": "", "reason": "Last", "message": "m"}
        f.write(b"\n" + json.dumps(last).encode() + b"\n")
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        events = local.events("fz")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - t0 < 10
    assert peak < 64 << 20, f"events read {peak} bytes into memory"
    assert events[0].reason == "Last" and events[-1].reason == "EventsUnreadable"
    assert "earlier bytes not shown" in events[-1].message


def test_a_huge_status_file_is_refused_without_reading_it(local):
    cdir = fake_cluster(local)
    with open(cdir.status, "r+b") as f:
        f.truncate(1 << 30)
    tracemalloc.start()
    try:
        st_ = local.status("fz")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert st_.phase == Phase.UNKNOWN
    assert peak < 4 * MAX_STATE_BYTES


def test_bad_progress_records_are_skipped(local):
    cdir = fake_cluster(local)
    cdir.progress_file("worker-0").write_text(json.dumps({"step": "x", "total": 3}) + "\n")
    cdir.progress_file("worker-1").write_bytes(DEEP[:16000] + b"\n")
    assert local.status("fz").progress is None
    cdir.progress_file("worker-0").write_text(
        json.dumps({"step": 4, "total": "many", "rate": "fast", "metrics": {"loss": "low", "acc": 0.5}})
        + "\n")
    p = local.status("fz").progress
    assert p.step == 4 and p.total is None and p.rate is None and p.metrics == {"acc": 0.5}


def test_pool_messages_and_records_are_bounded_in_depth():
    with pytest.raises(ValueError, match="nested deeper"):
        pool.protocol._message(DEEP)
    with pytest.raises(ValueError, match="not a JSON object"):
        pool.protocol._message(b"[1, 2]")
    with pytest.raises(ValueError, match="more than"):
        pool.protocol._message(b" " * (pool.MAX_MESSAGE + 1))
    assert pool.protocol._message(b'{"op": "info"}') == {"op": "info"}


# -- logs and state read like they are written ---------------------------------------------------

def _plant(path: Path, kind: str, tmp_path: Path) -> None:
    path.unlink(missing_ok=True)
    if kind == "symlink":
        secret = tmp_path / "secret"
        secret.write_text("TOP SECRET\n")
        os.symlink(secret, path)
    elif kind == "devzero":
        os.symlink("/dev/zero", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "hardlink":
        secret = tmp_path / "secret"
        secret.write_text("TOP SECRET\n")
        os.link(secret, path)


def _bounded(fn, timeout: float = 20.0):
    """Run ``fn`` in a thread; fail (not hang) when it does not return within ``timeout``."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(timeout)
    assert not th.is_alive(), f"{fn} hung (a FIFO waited on?)"
    if "error" in out:
        raise out["error"]
    return out.get("value")


@pytest.mark.parametrize("kind", ["symlink", "devzero", "fifo", "hardlink"])
def test_logs_status_list_and_events_never_follow_wait_on_or_swallow_a_planted_file(local, tmp_path, kind):
    cdir = fake_cluster(local)
    log = task_log_path(read_json(cdir.record)["log_dir"], "worker-1")
    _plant(log, kind, tmp_path)
    _plant(cdir.progress_file("worker-0"), kind, tmp_path)
    for tail in (None, 3):
        lines = _bounded(lambda tail=tail: local.read_logs("fz", tail=tail))
        by_task = {}
        for line in lines:
            by_task.setdefault(line.task, []).append(line.text)
        assert by_task["worker-0"] == ["worker-0 says hello"]
        assert len(by_task["worker-1"]) == 1 and "was not read" in by_task["worker-1"][0], by_task
        assert "TOP SECRET" not in "".join(by_task["worker-1"])
    stop = threading.Event()
    follow = local.follow_logs("fz", stop)
    first = _bounded(lambda: [next(follow), next(follow)])
    stop.set()
    assert {line.task for line in first} == {"worker-0", "worker-1"}
    assert all("TOP SECRET" not in line.text for line in first)
    assert _bounded(lambda: local.status("fz")).phase == Phase.RUNNING
    assert _bounded(lambda: local.list_clusters())[0].phase == Phase.RUNNING
    _plant(cdir.events, kind, tmp_path)
    events = _bounded(lambda: local.events("fz"))
    assert len(events) == 1 and events[0].reason == "EventsUnreadable"
    _plant(cdir.status, kind, tmp_path)
    st_ = _bounded(lambda: local.status("fz"))
    assert st_.phase == Phase.UNKNOWN
    _bounded(lambda: local.delete("fz", force=True))
    assert not cdir.root.exists()


def test_logs_without_tail_are_bounded(local, monkeypatch):
    cdir = fake_cluster(local)
    log = task_log_path(read_json(cdir.record)["log_dir"], "worker-0")
    with open(log, "r+b") as f:
        f.truncate(1 << 30)  # 1 GiB, sparse
        f.seek(0, os.SEEK_END)
        f.write(b"\nlast line\n")
    tracemalloc.start()
    try:
        lines = local.read_logs("fz", task="worker-0")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert lines[-1].text == "last line"
    assert "earlier bytes not shown (logs read at most" in lines[0].text
    assert peak < 4 * logtail.MAX_READ_BYTES


# -- fuzz: every reader, random and adversarial bytes ------------------------------------------------

ADVERSARIAL = st.sampled_from([
    DEEP, b"{" * 3000, b'{"a":' * 2000, b"null", b"[]", b'"x"', b"1e999", b"NaN", b"\x00" * 64,
    b'{"tasks": "abc"}', b'{"id": 5, "tasks": [1, null, "x", {"name": 3}]}',
    b'{"spec": {"name": 1}, "addresses": [], "cluster": 1, "log_dir": 2, "created": "x"}',
    b'{"time": 1e999, "task": "", "reason": "", "message": ""}', b"\xff\xfe\xfd", b'{"step": true}',
    b'{"step": 1, "metrics": {"a": [1]}, "total": 1e400}',
])
FUZZ_BYTES = st.one_of(st.binary(max_size=4096), ADVERSARIAL,
                       st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(),
                                    lambda c: st.lists(c) | st.dictionaries(st.text(), c), max_leaves=40)
                       .map(lambda v: json.dumps(v).encode()))


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(target=st.sampled_from(["status", "record", "events", "progress", "tensorboard", "coordinator"]),
       data=FUZZ_BYTES, valid_prefix=st.booleans())
def test_fuzz_no_state_file_crashes_a_reader(local, target, data, valid_prefix):
    name = "fz"
    cdir = local.clusters_dir / name
    if not cdir.exists():
        fake_cluster(local, name)
    cdir = ClusterDir(cdir)
    path = {"status": cdir.status, "record": cdir.record, "events": cdir.events,
            "progress": cdir.progress_file("worker-0"), "tensorboard": cdir.tensorboard,
            "coordinator": cdir.coordinator}[target]
    original = path.read_bytes() if path.exists() else None
    try:
        appended = valid_prefix and target in ("events", "progress")
        path.write_bytes((original or b"") + data if appended else data)
        every_reader(local, name)
    finally:
        if original is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(original)


@settings(max_examples=300, deadline=None, database=None)
@given(data=FUZZ_BYTES)
def test_fuzz_the_record_parsers_raise_only_value_error(data):
    for parse in (lambda d: records.loads(d, 1 << 20), pool.protocol._message):
        try:
            value = parse(data)
        except ValueError:
            continue
        assert records.depth(value) <= records.MAX_DEPTH
    parse_record(data.decode("utf-8", "replace"))
    try:
        row = json.loads(data)
    except (ValueError, RecursionError):
        return
    try:
        t = LocalTaskStatus.from_record(row)
    except ValueError:
        return
    assert t.duration is None or isinstance(t.duration, float)


def test_read_mapping_tells_absent_from_null(tmp_path):
    assert read_mapping(tmp_path / "none.json") is None
    (tmp_path / "null.json").write_text("null")
    with pytest.raises(UnreadableState, match="holds a JSON null"):
        read_mapping(tmp_path / "null.json")
