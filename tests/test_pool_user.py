"""One warm pool per user (issue 27, "bounded resources"), with real processes.

Every kernel of a user joins the same pool daemon (its processes import the
real TensorFlow); the pool keeps its configured size whatever the number of
kernels, empties itself after its idle time and refills at the next launch,
ends with its last owner (processes, socket and folders gone), and answers no
other user.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

import pytest

import tfk8s_magics as tk
from tests.conftest import wait_for
from tfk8s_magics.backends import Phase
from tfk8s_magics.backends.local import pool
from tfk8s_magics.lifeline import pid_alive

#: A kernel: joins (or starts) this user's pool, says which, then lives until killed.
KERNEL = textwrap.dedent('''
    import json, os, sys, time
    from tfk8s_magics.backends.local import pool
    sock = pool.ensure()
    print(json.dumps({"sock": sock, "daemon": pool.daemon_pid(), "pid": os.getpid()}), flush=True)
    time.sleep(600)
''')


def _kernel(cwd: Path) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([sys.executable, "-c", KERNEL], stdout=subprocess.PIPE, text=True, cwd=cwd,
                            env={**os.environ, "TFK8S_WARM_KERNEL": "0"})
    line = proc.stdout.readline()
    assert line, f"the kernel exited ({proc.wait()})"
    return proc, json.loads(line)


def _idle_pids(found: dict) -> set[int]:
    return {p["pid"] for p in found["processes"] if p["state"] == "idle"}


@pytest.mark.slow
def test_two_kernels_share_one_pool_of_its_size_that_ends_with_the_last_of_them(
        tmp_path, xdg_runtime, monkeypatch):
    monkeypatch.setenv("TFK8S_POOL_SIZE", "2")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()  # kernels of notebooks in different folders share it too
    kernels = []
    try:
        a, seen_a = _kernel(tmp_path / "a")
        kernels.append(a)
        b, seen_b = _kernel(tmp_path / "b")
        kernels.append(b)
        assert seen_a["sock"] == seen_b["sock"] and seen_a["daemon"] == seen_b["daemon"]
        daemon = seen_a["daemon"]
        found = wait_for(lambda: (i := pool.info(seen_a["sock"])) and len(_idle_pids(i)) >= 2 and i, 300,
                         "two idle pooled processes")
        assert found["owners"] == sorted([a.pid, b.pid])
        assert len(found["processes"]) == 2  # the size, not two per kernel
        assert all(p["pss"] > 50 * 2**20 for p in found["processes"])  # each imported TensorFlow
        procs = _idle_pids(found)
        assert _ppid(daemon) not in (a.pid, b.pid)  # no kernel's child: no zombie under a kernel
        assert [f["pid"] for f in pool.pools()] == [daemon]  # one pool for this user
        # The first kernel (the one that started the daemon) ends: the pool serves the other.
        a.kill()
        a.wait()
        found = wait_for(lambda: (i := pool.info(seen_a["sock"])) and i["owners"] == [b.pid] and i, 30,
                         "the pool to drop the dead kernel")
        assert _idle_pids(found) == procs and pid_alive(daemon)
        # The last owner ends (SIGKILL: no clean-up of its own): the pool ends, leaving nothing.
        b.kill()
        b.wait()
        for pid in [daemon, *procs]:
            wait_for(lambda pid=pid: not pid_alive(pid), 30, f"pool process {pid} to end with its last owner")
        assert not os.path.exists(seen_a["sock"]) and not os.path.exists(found["dir"])
    finally:
        for k in kernels:
            k.kill()
            k.wait()


def _ppid(pid: int) -> int:
    """A process's parent pid (``/proc/PID/stat``)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.fixture
def idle_pool(state_dir, xdg_runtime, monkeypatch):
    """This process's pool: size 1, empties after 4 s unused; shut down (and proven gone) after."""
    monkeypatch.setenv("TFK8S_POOL_SIZE", "1")
    monkeypatch.setenv("TFK8S_POOL_IDLE", "4")
    pool.configure(None)
    yield
    daemon = pool.daemon_pid()
    pool.shutdown()
    assert daemon is None or wait_for(lambda: not pid_alive(daemon), 15, "the daemon to end")


@pytest.mark.slow
def test_an_unused_pool_empties_after_its_idle_time_and_the_next_launch_refills_it(local, workdir, idle_pool):
    sock = pool.ensure()
    first = wait_for(lambda: (i := pool.info(sock)) and _idle_pids(i) and i, 300, "an idle pooled process")
    assert first["idle_timeout"] == 4 and not first["shrunk"]
    # Unused for 4 s (no launch, no claim): its process ends, the daemon stays for its owner.
    emptied = wait_for(lambda: (i := pool.info(sock)) and i["shrunk"] and not i["processes"] and i, 60,
                       "the pool to empty itself")
    assert all(not pid_alive(p) for p in _idle_pids(first))
    assert emptied["pid"] == first["pid"] and "emptied (unused)" in pool.describe(emptied)
    assert "0 TensorFlow processes waiting" in pool.memory_line()
    # The next launch refills it, and its task runs in the refilled (warm) process, not cold.
    cluster = tk.launch("again", workers=1, script="print('ran', flush=True)\n", backend=local)
    st = cluster.wait(timeout=300)
    assert st.phase == Phase.SUCCEEDED, cluster.logs("worker-0")
    events = [(e.reason, e.message) for e in cluster.events()]
    assert not [e for e in events if e[0] == "StartedCold"], events
    after = pool.info(sock)
    assert after["claimed"] == 1 and not after["shrunk"], after
    assert "ran" in cluster.logs("worker-0")
    cluster.delete()


@pytest.mark.slow
def test_the_pool_takes_a_new_size_for_every_kernel_sharing_it(xdg_runtime, monkeypatch):
    monkeypatch.setenv("TFK8S_POOL_SIZE", "1")
    pool.configure(None)
    try:
        sock = pool.ensure(pool.HOST)
        wait_for(lambda: len(_idle_pids(pool.info(sock))) == 1, 300, "one idle pooled process")
        pool.resize(3)
        found = wait_for(lambda: (i := pool.info(sock)) and len(_idle_pids(i)) == 3 and i, 600,
                         "three idle pooled processes")
        assert found["size"] == 3 and len(found["processes"]) == 3
        pool.resize(1)
        found = wait_for(lambda: (i := pool.info(sock)) and len(i["processes"]) == 1 and i, 30,
                         "the pool to keep one process")
        assert found["size"] == 1
    finally:
        daemon = pool.daemon_pid()
        pool.shutdown()
        assert daemon is None or wait_for(lambda: not pid_alive(daemon), 15, "the daemon to end")


#: Another user's process: connect to the socket, ask to claim (with three descriptors) and to join.
INTRUDER = textwrap.dedent('''
    import json, os, socket, sys
    out = {"uid": os.getuid()}
    for name, path in (("private", sys.argv[1]), ("linked", sys.argv[2])):
        try:
            answers = []
            for op in ("claim", "attach", "info"):
                with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
                    s.settimeout(10)
                    s.connect(path)
                    fds = [os.open(os.devnull, os.O_WRONLY) for _ in range(3)] if op == "claim" else []
                    socket.send_fds(s, [json.dumps({"op": op, "env": {}, "wait": False}).encode()], fds)
                    answers.append(json.loads(s.recv(65536)))
            out[name] = answers
        except OSError as e:
            out[name] = e.__class__.__name__
    print(json.dumps(out))
''')


def test_another_user_can_neither_reach_nor_use_the_pool(tmp_path, xdg_runtime):
    if os.geteuid() != 0 or not shutil.which("setpriv") or not Path("/usr/bin/python3").exists():
        pytest.skip("needs root, setpriv and /usr/bin/python3 to run as another uid")
    sock = pool.socket_path("intrudertest0000")
    pool_dir = Path(tempfile.mkdtemp(prefix="pool-intruder-", dir=pool.runtime_dir()))
    (pool_dir / "config.json").write_text(json.dumps(
        {"env": {}, "size": 0, "owner": os.getpid(), "socket": sock, "idle": 0}))
    daemon = pool.Daemon(pool_dir)
    ready_r, ready_w = os.pipe()
    loop = threading.Thread(target=daemon.run, args=(ready_w,), daemon=True)
    loop.start()
    # The first guard is the private folder; the second the daemon's check of the peer's uid.
    # To reach the second, the socket is also linked into a folder anyone may enter, and opened
    # to everyone (as if the first guard had failed).
    public = Path(tempfile.mkdtemp(prefix="tfk8s-public-", dir="/tmp"))
    try:
        assert os.read(ready_r, 32).startswith(b"ok ")
        public.chmod(0o755)
        os.link(sock, public / "sock")
        os.chmod(public / "sock", 0o666)
        done = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                               "/usr/bin/python3", "-c", INTRUDER, sock, str(public / "sock")],
                              capture_output=True, text=True, timeout=60, cwd="/")
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert out["uid"] == 65534
        assert out["private"] == "PermissionError"  # the 0700 folder of this user
        refused = {"cold": "the request came from another user"}
        assert out["linked"] == [refused, refused, refused]  # no claim, no joining, not even its state
        state = daemon.describe(False)
        assert state["owners"] == [os.getpid()] and state["claimed"] == 0
    finally:
        (public / "sock").unlink(missing_ok=True)
        shutil.rmtree(public, ignore_errors=True)
        pool.protocol._request(sock, {"op": "close"})
        loop.join(10)
        os.close(ready_r)
    assert not loop.is_alive() and not pool_dir.exists() and not os.path.exists(sock)


def test_a_start_sweeps_what_killed_pools_left_and_nothing_else(xdg_runtime):
    """What a SIGKILLed daemon leaves (a socket nobody listens on, its folder) goes at the next
    start; a live pool's socket, a folder of a live daemon and an older per-kernel pool's folder
    whose owner lives are kept."""
    root = pool.runtime_dir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale_sock = root / "pool-00000000000000aa.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.bind(str(stale_sock))  # bound, then closed: nobody listens
    live = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    live.bind(str(root / "pool-00000000000000bb.sock"))
    live.listen(1)
    folders = {}
    for name, pid in (("pool-00000000000000aa-x", dead.pid), ("pool-00000000000000bb-x", os.getpid()),
                      (f"pool-{dead.pid}-x", None), (f"pool-{os.getpid()}-x", None)):
        (root / name).mkdir()
        if pid is not None:
            (root / name / "daemon.pid").write_text(str(pid))
        folders[name] = root / name
    (root / "pool-00000000000000cc-x").mkdir()  # a start that failed before its daemon ran
    try:
        with pool.owner._start_lock() as locked:
            assert locked == root
            pool.owner._sweep(locked)
        assert sorted(p.name for p in root.iterdir()) == sorted([
            "pool-00000000000000bb.sock", "pool-00000000000000bb-x", f"pool-{os.getpid()}-x"])
    finally:
        live.close()
        for p in root.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        root.rmdir()  # as the last pool's daemon does
