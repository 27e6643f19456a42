"""Lifecycle on the local backend: readiness, PS recycling, crashes and restarts, stop, logs, progress."""

import os
import re
import socket
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

import tfk8s_magics as tk
from tfk8s_magics.backends import Phase
from tfk8s_magics.errors import BackendError
from tfk8s_magics.lifeline import pid_alive

pytestmark = pytest.mark.slow

SLEEPER = "import time\nprint('started', flush=True)\ntime.sleep(600)\n"


def test_ps_recycled_after_the_grace_period(local, workdir):
    cluster = tk.launch("grace", workers=1, ps=1, ps_grace_period=3, script="print('done')\n",
                        backend=local)
    st = cluster.wait(timeout=120)
    assert st.phase == Phase.SUCCEEDED
    # Still alive during the grace period (it may not have finished importing TF yet).
    assert st.task("ps-0").phase in (Phase.STARTING, Phase.RUNNING)
    ps_pid = st.task("ps-0").pid
    assert pid_alive(ps_pid)
    *_, final = cluster.watch()
    assert final.task("ps-0").phase == Phase.SUCCEEDED
    assert final.task("ps-0").reason == "recycled after the workers finished"
    assert not pid_alive(ps_pid)
    events = {e.reason: e.time for e in cluster.events()}
    waited = events["Recycled"] - events["WorkersFinished"]
    assert 3.0 <= waited < 8.0, waited


def test_grace_zero_stops_ps_at_once(local, workdir):
    cluster = tk.launch("nograce", workers=1, ps=1, ps_grace_period=0, script="print('x')\n",
                        backend=local)
    cluster.wait(timeout=120)
    *_, final = cluster.watch()
    events = {e.reason: e.time for e in cluster.events()}
    assert events["Recycled"] - events["WorkersFinished"] < 3.0
    assert final.task("ps-0").phase == Phase.SUCCEEDED


def test_killed_worker_is_restarted_then_the_cluster_fails(local, workdir):
    # A kill by a signal is retried (the lifecycle policy); the budget is the cluster's.
    script = "import os\nprint('crashing', flush=True)\nos.kill(os.getpid(), 9)\n"
    cluster = tk.launch("crash", workers=2, ps=1, restart_budget=2, script=script, backend=local)
    *_, st = cluster.watch()
    assert st.phase == Phase.FAILED
    assert "killed by SIGKILL" in st.reason and "restart budget 2 used up" in st.reason
    restarts = [e.message for e in cluster.events() if e.reason == "Restarted"]
    # Two incidents were paid for; a peer's end inside an incident restarts without paying again.
    assert sum("restart 1 of 2" in m or "restart 2 of 2" in m for m in restarts) == 2, restarts
    assert all(" of 2" in m or "same incident" in m or "with its group" in m for m in restarts), restarts
    assert sum(t.restarts for t in st.tasks) == len(restarts)
    failed = [t for t in st.tasks if t.phase == Phase.FAILED]
    assert failed and failed[0].signal == "SIGKILL"
    # The rest of the cluster was stopped at once, and nothing is left running.
    assert st.task("ps-0").phase == Phase.STOPPED
    assert all(t.pid is None or not pid_alive(t.pid) for t in st.tasks)
    # Each attempt is in the kept log.
    assert cluster.logs(failed[0].name).count("crashing") >= 1


def test_an_exit_code_the_script_chose_is_not_restarted(local, workdir):
    # Exit 1..127 is the user's outcome: rerunning the same code would end the same way.
    script = "import sys\nprint('giving up', flush=True)\nsys.exit(7)\n"
    cluster = tk.launch("chosen", workers=1, ps=1, restart_budget=3, script=script,
                        ps_grace_period=60, backend=local)
    st = cluster.wait(timeout=120)
    assert st.phase == Phase.FAILED and st.reason == "worker-0 failed: exit code 7"
    assert st.task("worker-0").restarts == 0
    # The parameter server is stopped at once, not after its 60 s grace period.
    *_, st = cluster.watch()
    assert st.task("ps-0").phase == Phase.STOPPED


def test_script_failing_on_import_is_not_restarted(local, workdir):
    script = "import importlib\nimportlib.import_module('no_such_module_at_runtime')\n"
    cluster = tk.launch("broken", workers=1, restart_budget=3, script=script, backend=local)
    *_, st = cluster.watch()
    assert st.phase == Phase.FAILED
    assert "failed on an import" in st.reason
    assert st.task("worker-0").restarts == 0
    assert "No module named 'no_such_module_at_runtime'" in cluster.logs("worker-0")


def test_a_scripts_own_exit_3_is_its_exit_code_not_a_broken_script(local, workdir):
    """sys.exit(3) from user code collides with the runtime's "cannot run" code; only the runtime's
    termination file makes exit 3 "broken", so the user's 3 is reported as what it is."""
    cluster = tk.launch("exit3", workers=1, restart_budget=3, script="import sys\nsys.exit(3)\n",
                        backend=local)
    *_, st = cluster.watch()
    assert st.phase == Phase.FAILED
    assert st.task("worker-0").exit_code == 3
    assert st.task("worker-0").reason == "exit code 3"
    assert "import" not in st.reason and "cannot run" not in st.reason
    assert st.task("worker-0").restarts == 0


def test_stop_ends_tasks_and_keeps_logs(local, workdir):
    cluster = tk.launch("stopme", workers=2, ps=1, script=SLEEPER, backend=local)
    st = cluster.wait_ready(timeout=120)
    pids = [t.pid for t in st.tasks]
    assert all(pid_alive(p) for p in pids)
    st = cluster.stop()
    assert st.phase == Phase.STOPPED
    assert all(t.phase == Phase.STOPPED for t in st.tasks)
    assert not any(pid_alive(p) for p in pids)
    # The logs outlive the tasks and the record stays listable.
    deadline = time.monotonic() + 10
    while "started" not in cluster.logs("worker-1") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "started" in cluster.logs("worker-1")
    assert [s.name for s in tk.list_clusters(local)] == ["stopme"]


def test_delete_removes_everything_unless_logs_are_kept(local, workdir, state_dir):
    a = tk.launch("gone", workers=1, script="print('bye')\n", backend=local)
    a.wait(timeout=120)
    assert a.delete() is None
    assert not (state_dir / "clusters" / "gone").exists()
    b = tk.launch("kept", workers=1, script="print('keep me')\n", backend=local)
    b.wait(timeout=120)
    kept = b.delete(keep_logs=True)
    assert kept.volume is None  # a directory on this machine: Path() takes it
    assert "keep me" in (Path(kept) / "tasks" / "worker-0.log").read_text()
    with pytest.raises(tk.ClusterNotFound):
        tk.get("kept", local)


def test_delete_tries_again_when_a_late_writer_keeps_a_folder_and_says_so_if_it_never_goes(
        local, workdir, state_dir, monkeypatch):
    """A dir left behind keeps the name taken (a re-run would be refused as if another launch had
    it): delete tries again, and when the dir cannot go it says so instead of returning."""
    import errno
    import shutil

    from tfk8s_magics.backends.local import backend as local_backend

    real, calls = shutil.rmtree, []

    def late_writer_once(path, *a, **kw):  # the first pass meets a folder a late writer refilled
        calls.append(path)
        if len(calls) == 1:
            raise OSError(errno.ENOTEMPTY, "Directory not empty", str(path) + "/progress")
        return real(path, *a, **kw)

    tk.launch("late", workers=1, script="print('x')\n", backend=local).wait(timeout=120)
    monkeypatch.setattr(local_backend.shutil, "rmtree", late_writer_once)
    tk.get("late", local).delete()
    assert len(calls) == 2 and not (state_dir / "clusters" / "late").exists()
    again = tk.launch("late", workers=1, script="print('x')\n", backend=local)
    assert again.wait(timeout=120).phase == Phase.SUCCEEDED

    def never(path, *a, **kw):
        raise OSError(errno.EBUSY, "Device or resource busy", str(path) + "/logs")

    monkeypatch.setattr(local_backend.shutil, "rmtree", never)
    with pytest.raises(BackendError, match=r"'late' was stopped but its dir .* could not be removed "
                       r"\(.*/logs: Device or resource busy\): remove it by hand, then launch again\."):
        again.delete()
    monkeypatch.setattr(local_backend.shutil, "rmtree", real)
    again.delete()


def test_user_named_log_dir_survives_delete(local, workdir, tmp_path):
    logs = tmp_path / "mylogs"
    c = tk.launch("own", workers=1, script="print('mine')\n", log_dir=str(logs), backend=local)
    c.wait(timeout=120)
    c.delete()
    assert "mine" in (logs / "tasks" / "worker-0.log").read_text()


def test_progress_gives_step_total_percent_and_eta(local, workdir):
    script = (
        "import time, tfk8s_magics\n"
        "for step in range(1, 41):\n"
        "    tfk8s_magics.report_progress(step, total=100, loss=1.0 / step)\n"
        "    time.sleep(0.05)\n"
        "time.sleep(600)\n"
    )
    cluster = tk.launch("prog", workers=1, script=script, backend=local)
    deadline = time.monotonic() + 120
    st = cluster.status()
    while (st.progress is None or st.progress.step < 40) and time.monotonic() < deadline:
        time.sleep(0.2)
        st = cluster.status()
    p = st.progress
    assert (p.step, p.total, p.percent) == (40, 100, 40.0)
    assert 10 < p.rate < 25  # about 20 steps/s
    assert 60 / 25 < p.eta < 60 / 10
    assert p.metrics["loss"] == pytest.approx(1 / 40)
    cluster.stop()


def test_logs_stream_while_the_cluster_runs(local, workdir):
    script = (
        "import time\n"
        "for i in range(5):\n"
        "    print(f'tick {i} {time.time()}', flush=True)\n"
        "    time.sleep(0.5)\n"
        "time.sleep(600)\n"
    )
    cluster = tk.launch("stream", workers=1, script=script, backend=local)
    stop = threading.Event()
    got = []
    for line in cluster.follow(stop):
        if line.text.startswith("tick"):
            got.append((line, time.time()))
            if len(got) == 5:
                break
    stop.set()
    assert cluster.status().phase == Phase.RUNNING  # the lines came while it ran
    lags = [recv - float(line.text.split()[2]) for line, recv in got]
    assert max(lags) < 1.0, lags
    assert all(line.task == "worker-0" for line, _ in got)
    cluster.stop()


def test_tensorboard_binds_loopback_is_reused_and_ends_with_delete(local, workdir):
    cluster = tk.launch("tb", workers=1, script="print(1)\n", backend=local)
    first = cluster.tensorboard()
    assert not first.reused
    again = cluster.tensorboard()
    assert again.reused and again.port == first.port
    with urllib.request.urlopen(f"http://127.0.0.1:{first.port}/data/logdir", timeout=10) as r:
        assert r.status == 200
    # Its fonts are asked for relative to the page, so they load under a proxy prefix too
    # (TensorBoard's own index.html says url(/font-roboto/...): 404 behind JupyterHub).
    with urllib.request.urlopen(f"http://127.0.0.1:{first.port}/", timeout=10) as r:
        index = r.read().decode()
    assert "url(/font-roboto/" not in index
    font = re.search(r"url\((font-roboto/[^)]+\.woff2)\)", index)
    assert font, index[:2000]
    with urllib.request.urlopen(f"http://127.0.0.1:{first.port}/{font[1]}", timeout=10) as r:
        assert r.status == 200 and len(r.read()) > 1000
    # On the host only the owner-only relay (TensorBoard's child) listens, on loopback; TensorBoard
    # itself is in a network namespace of its own (tests/test_local_isolation.py: others get nothing).
    listening = [c for c in psutil.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == first.port]
    assert [c.laddr.ip for c in listening] == ["127.0.0.1"], listening
    assert listening[0].pid in {p.pid for p in psutil.Process(first.pid).children()}
    assert os.readlink(f"/proc/{first.pid}/ns/net") != os.readlink("/proc/self/ns/net")
    cluster.delete()
    deadline = time.monotonic() + 10
    while pid_alive(first.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(first.pid)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", first.port), timeout=1).close()


def test_stop_during_the_grace_period_is_prompt(local, workdir):
    cluster = tk.launch("gracestop", workers=1, ps=1, ps_grace_period=60, script="print(1)\n",
                        backend=local)
    st = cluster.wait(timeout=120)
    assert st.phase == Phase.SUCCEEDED and st.task("ps-0").phase not in Phase.TERMINAL
    started = time.monotonic()
    st = cluster.stop()
    assert time.monotonic() - started < 8.0
    assert st.task("ps-0").phase == Phase.STOPPED
    # The supervisor ended on its own (not killed after the stop timeout).
    *_, final = cluster.watch()
    assert final.task("ps-0").phase == Phase.STOPPED


def test_a_flood_of_output_is_bounded_in_the_live_stream(local, workdir):
    # ~4 MB in one burst: the live stream skips to the newest part; the file keeps it all.
    script = (
        "import sys\n"
        "sys.stdout.write(''.join(f'flood line {i:07d} ' + 'x' * 40 + '\\n' for i in range(70000)))\n"
        "sys.stdout.flush()\n"
        "print('the end', flush=True)\n"
    )
    cluster = tk.launch("flood", workers=1, script=script, backend=local)
    cluster.wait(timeout=120)
    got = [line.text for line in cluster.follow()]
    assert got[-1] == "the end"
    notes = [t for t in got if "bytes of fast output skipped here" in t]
    assert len(notes) == 1
    assert len(got) < 70000 // 10  # bounded...
    assert "flood line 0069999" in got[-2]  # ...yet the newest lines are all there
    assert cluster.logs("worker-0").count("flood line") == 70000  # and nothing is lost on disk
