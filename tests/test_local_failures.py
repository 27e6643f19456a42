"""Failures half-way: a launch that fails rolls back; a killed supervisor takes its tasks along."""

import os
import signal
import subprocess
import sys
import time

import pytest

import tfk8s_magics as tk
from tests.conftest import processes_of, snapshot
from tfk8s_magics.backends import Phase
from tfk8s_magics.backends.local import backend as local_backend
from tfk8s_magics.lifeline import pid_alive

SLEEPER = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"


def test_a_launch_failing_half_way_rolls_back(local, state_dir, workdir, tmp_path, monkeypatch):
    monkeypatch.setattr(local_backend, "SUPERVISOR_START_TIMEOUT", 0.0)
    user_logs = tmp_path / "fresh" / "logs"
    before = snapshot(state_dir)
    with pytest.raises(tk.LaunchFailed, match="did not start within"):
        tk.launch("half", workers=2, ps=1, script=SLEEPER, log_dir=str(user_logs), backend=local)
    assert snapshot(state_dir) - before <= {"clusters"}
    assert not (tmp_path / "fresh").exists(), "a dir the launch created must go with it"
    assert processes_of(state_dir) == []
    with pytest.raises(tk.ClusterNotFound):
        local.status("half")


@pytest.mark.slow
def test_killing_the_supervisor_kills_its_tasks(local, workdir):
    cluster = tk.launch("orphan", workers=2, ps=1, script=SLEEPER, backend=local)
    st = cluster.wait_ready(timeout=180)
    pids = [t.pid for t in st.tasks]
    from tfk8s_magics.backends.local.layout import read_json

    sup = read_json(local._dir("orphan").status)["supervisor_pid"]
    os.kill(sup, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in pids)
    st = cluster.status()
    assert st.phase == Phase.FAILED and "supervisor process died" in st.reason


@pytest.mark.slow
def test_cli_submit_is_detached_and_logs_follow(state_dir, workdir):
    env = {**os.environ, "TFK8S_STATE_DIR": str(state_dir)}
    script = workdir / "train.py"
    script.write_text("for i in range(3):\n    print('cli line', i, flush=True)\n")

    def tfk8s(*args):
        return subprocess.run([sys.executable, "-m", "tfk8s_magics.cli", *args], env=env,
                              capture_output=True, text=True, timeout=240, cwd=workdir)

    r = tfk8s("submit", "fromcli", "--script", str(script), "--workers", "1", "--ps", "0")
    assert r.returncode == 0, r.stderr
    # The submitting process has exited, yet the cluster ran to the end (it is detached).
    r = tfk8s("logs", "fromcli", "-f")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[worker-0] cli line 2" in r.stdout and "fromcli: succeeded" in r.stdout
    r = tfk8s("get", "fromcli")
    assert "succeeded" in r.stdout
    r = tfk8s("submit", "Bad_Name", "--script", str(script))
    assert r.returncode == 2 and "is not valid" in r.stderr
    assert tfk8s("delete", "fromcli").returncode == 0
    assert "no clusters" in tfk8s("list").stdout


def test_loopback_shim_is_built_once_and_can_be_turned_off(tmp_path, monkeypatch):
    from tfk8s_magics.isolation import shim as isolation

    lib = isolation.shim_path(tmp_path)
    assert lib is not None and lib.exists() and lib.parent == tmp_path
    mtime = lib.stat().st_mtime_ns
    assert isolation.shim_path(tmp_path) == lib and lib.stat().st_mtime_ns == mtime
    env = {"LD_PRELOAD": "/other.so"}
    isolation.preload_env(env, str(lib))
    assert env["LD_PRELOAD"] == f"{lib} /other.so"
    monkeypatch.setenv("TFK8S_LOOPBACK_ONLY", "0")
    assert isolation.shim_path(tmp_path) is None


def test_what_the_local_backend_cannot_do_is_said_before_anything_starts(local, state_dir):
    from tfk8s_magics.errors import SpecError
    from tfk8s_magics.spec import ClusterSpec

    spec = ClusterSpec(name="ttl", workers=1, script="print(1)\n", ttl_after_finished=60)
    with pytest.raises(SpecError, match="enforced on Kubernetes only"):
        local.launch(spec)
    with pytest.raises(SpecError, match="the local backend has nothing to render"):
        local.render(spec)
    assert not (state_dir / "clusters" / "ttl").exists()  # nothing left behind
