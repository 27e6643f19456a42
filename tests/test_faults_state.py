"""Fault injection against the local backend's state, processes and files (issue 14).

Each case ends in a clear, final state within 10 s, and nothing of the
cluster is left running: every process of a local cluster carries
``TFK8S_CLUSTER_ID`` in its environment, and the tests scan ``/proc`` for it.
The network-isolation and in-graph cases are in tests/test_faults_net.py.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tfk8s_magics as tk
from tests.conftest import wait_for
from tfk8s_magics.backends import Phase
from tfk8s_magics.backends.local.layout import read_json
from tfk8s_magics.backends.local.watchdog import CLUSTER_ID_ENV
from tfk8s_magics.errors import BackendError, SpecError
from tfk8s_magics.lifeline import processes_marked, same_process, start_time

pytestmark = pytest.mark.faults


@pytest.fixture(autouse=True)
def cold_tasks(monkeypatch):
    """Cold tasks only: each is the supervisor's child and carries the cluster's id from exec, which
    the /proc scans below rely on (warm-pool tasks are proven in tests/test_pool.py)."""
    monkeypatch.setenv("TFK8S_POOL_SIZE", "0")

SLEEPER = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"
#: A script whose own child (in another session, as a daemon would) must die with the cluster.
SPAWNER = (
    "import subprocess, sys, time\n"
    "p = subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
    "print('child', p.pid, flush=True)\n"
    "time.sleep(600)\n"
)


def cluster_id(local, name: str) -> str:
    return read_json(local._dir(name).record)["id"]


def marked(cid: str) -> list[int]:
    return processes_marked(CLUSTER_ID_ENV, cid)


def wait_none_marked(cid: str, timeout: float = 10.0) -> None:
    wait_for(lambda: not marked(cid), timeout, f"every process of cluster {cid} to end")


def sleeper(env: dict[str, str]) -> subprocess.Popen:
    """A process that looks like a cluster's (it carries the given environment)."""
    return subprocess.Popen(["sleep", "600"], env={**os.environ, **env})


# -- process identity ------------------------------------------------------------------------

def test_a_pid_is_trusted_only_with_its_start_time():
    p = subprocess.Popen(["sleep", "600"])
    try:
        start = start_time(p.pid)
        assert start is not None and same_process(p.pid, start)
        assert not same_process(p.pid, start + 1), "another start time is another process"
        assert not same_process(p.pid, None), "a bare pid is never trusted"
        assert not same_process(str(p.pid), start) and not same_process(True, start)
    finally:
        p.kill()
        p.wait()
    assert not same_process(p.pid, start)


def test_stale_pids_in_the_state_never_hit_another_process(local, workdir):
    cluster = tk.launch("stale", workers=1, script=SLEEPER, backend=local)
    cid = cluster_id(local, "stale")
    cdir = local._dir("stale")
    innocent = subprocess.Popen(["sleep", "600"])  # not the cluster's: no marker
    try:
        # The state claims the innocent process is the supervisor and a task (as after a reboot).
        sup = read_json(cdir.status)["supervisor_pid"]
        os.kill(sup, signal.SIGKILL)
        wait_none_marked(cid)
        raw = read_json(cdir.status)
        raw["supervisor_pid"], raw["supervisor_done"] = innocent.pid, False
        raw["tasks"][0].update(pid=innocent.pid, pid_start=12345)
        (cdir.status).write_text(json.dumps(raw))
        st = cluster.status()
        assert st.phase == Phase.FAILED and "supervisor process died" in st.reason
        cluster.stop()
        assert cluster.delete() is None
        assert innocent.poll() is None, "delete killed a process that only had a stale pid"
    finally:
        innocent.kill()
        innocent.wait()


# -- unreadable state --------------------------------------------------------------------------

@pytest.mark.parametrize("damage", ["garbled", "list", "no-spec", "status-garbled", "status-other-id"])
def test_unreadable_state_shows_on_that_cluster_only_and_force_delete_ends_it(local, workdir, damage):
    ok = tk.launch("fine", workers=1, script=SLEEPER, backend=local)
    tk.launch("hurt", workers=1, script=SLEEPER, backend=local)
    cdir = local._dir("hurt")
    cid = cluster_id(local, "hurt")
    record = read_json(cdir.record)
    target, text = {
        "garbled": (cdir.record, '{"spec": {'),
        "list": (cdir.record, "[]"),
        "no-spec": (cdir.record, json.dumps({k: v for k, v in record.items() if k != "spec"})),
        "status-garbled": (cdir.status, "\0\0garbage"),
        "status-other-id": (cdir.status, json.dumps({"id": "0" * 32, "phase": "running", "tasks": []})),
    }[damage]
    if damage.startswith("status"):  # the supervisor rewrites its status: stop it from writing first
        os.kill(read_json(cdir.status)["supervisor_pid"], signal.SIGSTOP)
    target.write_text(text)
    rows = {s.name: s for s in tk.list_clusters(local)}
    assert rows["fine"].phase in (Phase.STARTING, Phase.RUNNING)
    assert rows["hurt"].phase == Phase.UNKNOWN and rows["hurt"].reason.startswith("unreadable state: ")
    assert "delete hurt --force" in rows["hurt"].reason
    assert tk.get("hurt", local).status().phase == Phase.UNKNOWN
    if damage.startswith("status"):
        # The record still says which processes are the cluster's (its id): stop and delete work.
        tk.get("hurt", local).stop()
        assert marked(cid) == []
        tk.get("hurt", local).delete()
    else:
        with pytest.raises(BackendError, match="unreadable state"):
            tk.get("hurt", local).stop()
        with pytest.raises(BackendError, match="unreadable state"):
            tk.get("hurt", local).delete()
        assert marked(cid), "a refused delete must not have killed anything"
        tk.get("hurt", local).delete(force=True)
    assert marked(cid) == [] and not cdir.root.exists()
    assert ok.status().phase in (Phase.STARTING, Phase.RUNNING), "the other cluster is untouched"
    ok.delete()


def test_cli_list_survives_a_garbled_cluster_and_delete_force_removes_it(state_dir, workdir):
    broken = state_dir / "clusters" / "broken"
    broken.mkdir(parents=True)
    (broken / "cluster.json").write_text("{not json")
    env = {**os.environ, "TFK8S_STATE_DIR": str(state_dir)}

    def tfk8s(*args):
        return subprocess.run([sys.executable, "-m", "tfk8s_magics.cli", *args], env=env,
                              capture_output=True, text=True, timeout=120)

    r = tfk8s("list")
    assert r.returncode == 0 and "broken" in r.stdout and "unreadable state" in r.stdout, r.stdout + r.stderr
    r = tfk8s("get", "broken")
    assert "unreadable state: cluster.json is not valid JSON" in r.stdout + r.stderr
    r = tfk8s("delete", "broken")
    assert r.returncode != 0 and "--force" in r.stderr and broken.exists()
    r = tfk8s("delete", "broken", "--force")
    assert r.returncode == 0 and "broken: deleted" in r.stdout and not broken.exists()


def test_force_delete_kills_what_works_in_the_dir_even_without_an_id(local):
    cdir = local.clusters_dir / "noid"
    (cdir / "progress").mkdir(parents=True)
    (cdir / "cluster.json").write_text("garbage")
    task = sleeper({"TFK8S_PROGRESS_FILE": str(cdir / "progress" / "worker-0.jsonl")})
    try:
        assert local.status("noid").phase == Phase.UNKNOWN
        local.delete("noid", force=True)
        assert task.wait(timeout=10) == -signal.SIGKILL
        assert not cdir.exists()
    finally:
        task.kill()
        task.wait()


def test_an_empty_cluster_dir_does_not_block_its_name(local, workdir):
    stuck = local.clusters_dir / "stuck"
    stuck.mkdir(parents=True)
    old = time.time() - 3600
    os.utime(stuck, (old, old))  # an interrupted launch long ago: the name is free
    tk.launch("stuck", workers=1, script=SLEEPER, backend=local).delete()
    fresh = local.clusters_dir / "fresh"
    fresh.mkdir()  # possibly a launch in progress: shown, never silently taken
    assert local.status("fresh").phase == Phase.UNKNOWN
    with pytest.raises(tk.ClusterExists):
        tk.launch("fresh", workers=1, script=SLEEPER, backend=local)
    tk.get("fresh", local).delete(force=True)
    assert not fresh.exists()


# -- a replaced state dir ------------------------------------------------------------------------

def test_a_supervisor_whose_dir_was_replaced_stops_its_tasks_and_leaves_the_new_cluster_alone(
    local, workdir
):
    tk.launch("again", workers=1, ps=1, script=SLEEPER, backend=local)
    cdir = local._dir("again")
    old_id, old_sup = cluster_id(local, "again"), read_json(cdir.status)["supervisor_pid"]
    import shutil

    # `rm -rf` of a live dir: the running supervisor may add a file between rmtree's listing and
    # its rmdir (ENOTEMPTY), so remove again until the path is gone, as a user would.
    wait_for(lambda: shutil.rmtree(cdir.root, ignore_errors=True) or not cdir.root.exists(), 10,
             "the cluster dir removed")
    new = tk.launch("again", workers=1, ps=1, script=SLEEPER, backend=local)
    new_id = cluster_id(local, "again")
    assert new_id != old_id
    started = time.monotonic()
    wait_none_marked(old_id)  # the old supervisor noticed and killed its own tasks
    assert time.monotonic() - started < 10
    assert read_json(cdir.status)["supervisor_pid"] != old_sup
    assert "supervisor" not in " ".join(e.message for e in new.events())  # no foreign events
    assert marked(new_id), "the new cluster runs on"
    assert new.status().phase in (Phase.STARTING, Phase.RUNNING)
    new.delete()
    assert marked(new_id) == [] and marked(old_id) == []


# -- killed supervisor / kernel: nothing outlives the cluster --------------------------------------

def test_a_sigkilled_supervisor_takes_its_tasks_with_it_via_the_watchdog(local, workdir):
    tk.launch("wd", workers=2, ps=1, script=SLEEPER, backend=local)
    cid = cluster_id(local, "wd")
    raw = wait_for(lambda: (r := read_json(local._dir("wd").status)) and len(marked(cid)) >= 5 and r,
                   30, "the supervisor, its watchdog and 3 tasks")
    os.kill(raw["supervisor_pid"], signal.SIGKILL)
    wait_none_marked(cid)
    st = local.status("wd")
    assert st.phase == Phase.FAILED and "supervisor process died" in st.reason
    assert all(t.phase in Phase.TERMINAL for t in st.tasks)


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["supervisor", "task", "delete"])
def test_no_descendant_of_a_task_outlives_its_cluster(local, workdir, victim):
    cluster = tk.launch("kids", workers=1, script=SPAWNER, backend=local)
    cid = cluster_id(local, "kids")
    line = wait_for(lambda: [x for x in cluster.logs("worker-0").splitlines() if x.startswith("child ")], 180,
                    "the script's child")[0]
    child = int(line.split()[1])
    assert child in marked(cid)
    raw = read_json(local._dir("kids").status)
    if victim == "supervisor":
        os.kill(raw["supervisor_pid"], signal.SIGKILL)
    elif victim == "task":  # the task dies; its restart must not find the old child still there
        os.kill(raw["tasks"][0]["pid"], signal.SIGKILL)
    else:
        cluster.delete()
    wait_for(lambda: start_time(child) is None, 10, "the script's child to die")
    if victim != "delete":
        cluster.delete()
    assert marked(cid) == []


#: A script that starts one child in its own process group and one in a session of its own.
TWO_CHILDREN = (
    "import subprocess, time\n"
    "a = subprocess.Popen(['sleep', '600'])\n"
    "b = subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
    "print('children', a.pid, b.pid, flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.mark.slow
def test_a_pooled_task_and_its_children_die_with_a_sigkilled_supervisor(local, workdir, monkeypatch):
    """A warm-pool task is the pool daemon's child, not the supervisor's: no parent-death signal,
    and its /proc environ is the pool's (no cluster id).  SIGKILL the supervisor: the task, a child
    in its group and a child in another session must all die, as for a cold task."""
    from tfk8s_magics.backends.local import pool

    monkeypatch.setenv("TFK8S_POOL_SIZE", "1")
    pool.configure(None)
    try:
        sock = pool.ensure()
        wait_for(lambda: pool.available(sock) >= 1, 180, "an idle pooled process")
        cluster = tk.launch("pooled", workers=1, script=TWO_CHILDREN, backend=local)
        line = wait_for(lambda: [x for x in cluster.logs("worker-0").splitlines()
                                 if x.startswith("children ")], 120, "the script's children")[0]
        assert not [e for e in cluster.events() if e.reason == "StartedCold"], "the task ran cold"
        raw = read_json(local._dir("pooled").status)
        task = raw["tasks"][0]["pid"]
        assert os.getppid() != task and Path(f"/proc/{task}/stat").read_text().split()[3] != str(
            raw["supervisor_pid"])  # not the supervisor's child: the pool's
        victims = [task, *map(int, line.split()[1:])]
        os.kill(raw["supervisor_pid"], signal.SIGKILL)
        wait_for(lambda: all(start_time(p) is None for p in victims), 10,
                 "the pooled task and both children to die")
        cluster.delete()
    finally:
        pool.shutdown()


@pytest.mark.slow
def test_a_sigkilled_kernel_ends_its_cluster_and_everything_in_it(state_dir, workdir):
    code = (
        "import sys, time, tfk8s_magics as tk\n"
        f"c = tk.launch('kern', workers=1, script={SPAWNER!r})\n"
        "print(open(c.backend._dir('kern').record).read(), flush=True)\n"
        "time.sleep(600)\n"
    )
    kernel = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "TFK8S_STATE_DIR": str(state_dir)})
    try:
        cid = json.loads(kernel.stdout.readline())["id"]
        assert marked(cid)
        kernel.kill()
        kernel.wait()
        wait_none_marked(cid)
    finally:
        kernel.kill()
        kernel.wait()


# -- files -------------------------------------------------------------------------------------------

def test_state_and_logs_are_private_to_their_owner(local, workdir):
    cluster = tk.launch("private", workers=1, script=SLEEPER, backend=local)
    cdir = local._dir("private")
    wait_for(lambda: (cdir.default_log_dir / "tasks" / "worker-0.log").exists() and cdir.events.exists(), 30,
             "the task's log and the first event")
    for path in (cdir.root, cdir.default_log_dir, cdir.default_log_dir / "tasks", cdir.progress_dir):
        assert path.stat().st_mode & 0o777 == 0o700, path
    for path in (cdir.record, cdir.status, cdir.script, cdir.default_log_dir / "tasks" / "worker-0.log",
                 cdir.events, cdir.supervisor_log):
        assert path.stat().st_mode & 0o777 == 0o600, path
    cluster.delete()


def test_a_log_planted_as_a_symlink_is_not_followed(local, workdir, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    logs = tmp_path / "shared-logs"
    (logs / "tasks").mkdir(parents=True)
    (logs / "tasks" / "worker-0.log").symlink_to(secret)
    cluster = tk.launch("planted", workers=1, script=SLEEPER, log_dir=str(logs), backend=local)
    st = cluster.wait(timeout=10)
    assert st.phase == Phase.FAILED
    assert f"cannot write {logs / 'tasks' / 'worker-0.log'}: it is a symlink (not followed)" in st.reason
    assert all(t.phase in Phase.TERMINAL for t in st.tasks)
    assert secret.read_text() == "root only\n"
    cid = cluster_id(local, "planted")
    cluster.delete()
    assert marked(cid) == []


def test_a_shared_or_foreign_log_dir_is_refused(local, workdir, tmp_path):
    logs = tmp_path / "logs"
    a = tk.launch("first", workers=1, script=SLEEPER, log_dir=str(logs), backend=local)
    with pytest.raises(SpecError, match="is the log dir of cluster 'first'"):
        tk.launch("second", workers=1, script=SLEEPER, log_dir=str(logs), backend=local)
    a.delete()
    foreign = tmp_path / "etc"
    foreign.mkdir()
    (foreign / "passwd").write_text("x")
    with pytest.raises(SpecError, match="already holds other files"):
        tk.launch("third", workers=1, script=SLEEPER, log_dir=str(foreign), backend=local)
    assert sorted(os.listdir(foreign)) == ["passwd"]


def test_dirs_launch_made_outside_its_own_go_with_delete(local, workdir, tmp_path):
    logs = tmp_path / "new" / "logs"
    c = tk.launch("made", workers=1, script=SLEEPER, log_dir=str(logs), backend=local)
    c.delete()  # the task never wrote a line (killed while importing): its empty dirs go
    assert not (tmp_path / "new").exists() or any((tmp_path / "new").rglob("*.log"))


def _mount_tmpfs(path: Path, options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}): the ENOSPC/EROFS cases need one")


@pytest.fixture
def mounts():
    made: list[Path] = []
    yield lambda path, options: (_mount_tmpfs(path, options), made.append(path))
    for path in reversed(made):
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_read_only_log_dir_is_one_sentence_and_nothing_left(local, workdir, tmp_path, mounts):
    ro = tmp_path / "ro"
    mounts(ro, "ro,size=1m")
    with pytest.raises(SpecError) as e:
        tk.launch("rolog", workers=1, script=SLEEPER, log_dir=str(ro), backend=local)
    assert str(e.value) == (f"--log-dir cannot be used: cannot create {ro / 'tasks'}: Read-only file system. "
                            "Give a directory you can write.")
    assert not (local.clusters_dir / "rolog").exists()


def test_a_full_log_disk_fails_the_cluster_naming_the_path_and_cause(local, workdir, tmp_path, mounts):
    full = tmp_path / "full"
    mounts(full, "size=1m,nr_inodes=3")  # the root and tasks/ and checkpoints/: no inode for a log
    cluster = tk.launch("enospc", workers=2, script=SLEEPER, log_dir=str(full), backend=local)
    st = cluster.wait(timeout=10)
    assert st.phase == Phase.FAILED
    assert st.reason == f"cannot write {full / 'tasks' / 'worker-0.log'}: No space left on device"
    assert all(t.phase in Phase.TERMINAL and t.pid is None for t in st.tasks)
    wait_none_marked(cluster_id(local, "enospc"))
    cluster.delete()
