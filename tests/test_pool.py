"""The warm pool (tfk8s_magics.backends.local.pool): same task as a cold one, never leaks.

The rules without TensorFlow first (which environments may use a pooled
process); then real tasks: a pooled and a cold task given the same script
and environment see the same environment, the same TensorFlow/Keras
configuration and compute the same results; an import-time variable that
differs from the pool's makes the task start cold; exit codes and restarts
are the cold ones; the pool and its tasks die with their owner and with the
supervisor.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import tfk8s_magics as tk
from tests.conftest import wait_for
from tfk8s_magics.backends import Phase
from tfk8s_magics.backends.local import pool
from tfk8s_magics.lifeline import pid_alive

# -- which environments a pooled process can serve (no TensorFlow) -------------------------
BASE = {"PATH": "/usr/bin", "TF_CPP_MIN_LOG_LEVEL": "2", "TF_USE_LEGACY_KERAS": "1",
        "PYTHONUNBUFFERED": "1", "LD_PRELOAD": "/x/shim.so"}


@pytest.mark.parametrize("change, cold_because", [
    ({}, ""),
    ({"TF_CONFIG": "{}", "TFK8S_TASK": "worker-0", "TFK8S_SCRIPT": "/s.py"}, ""),  # per task, read late
    ({"EPOCHS": "3", "MY_SETTING": "x"}, ""),  # the user's own variables, read by the script
    ({"TF_CPP_MIN_LOG_LEVEL": "0"}, "TF_CPP_MIN_LOG_LEVEL is '0' for the task but '2' in the pool"),
    ({"TF_USE_LEGACY_KERAS": None}, "TF_USE_LEGACY_KERAS is unset for the task"),
    ({"OMP_NUM_THREADS": "1"}, "OMP_NUM_THREADS is set for the task and may be read at start-up"),
    ({"TF_NUM_INTEROP_THREADS": "1"}, "TF_NUM_INTEROP_THREADS is set for the task"),
    ({"CUDA_VISIBLE_DEVICES": ""}, "CUDA_VISIBLE_DEVICES is set for the task"),
    ({"PYTHONHASHSEED": "0"}, "PYTHONHASHSEED is set for the task"),
    ({"LD_PRELOAD": ""}, "LD_PRELOAD is '' for the task"),
])
def test_import_time_variables_must_match_the_pool(change, cold_because):
    task = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    why = pool.mismatch(BASE, task)
    assert (why == "") if not cold_because else why.startswith(cold_because), why


SHIM = "/x/shim.so"


@pytest.mark.parametrize("pool_preload, task_preload, cold_because, off", [
    (SHIM, SHIM, "", False),  # behind the shim (in-graph, TFK8S_ISOLATION=loopback): as preloaded
    (SHIM, None, "", True),  # in a private network namespace: no shim, so it is switched off
    (f"{SHIM} /other.so", "/other.so", "", True),  # the kernel's own preload stays
    (f"{SHIM} /other.so", f"{SHIM} /other.so", "", False),
    (SHIM, "", "LD_PRELOAD is '' for the task", True),
    (f"{SHIM} /other.so", "/third.so", "LD_PRELOAD is '/third.so' for the task", True),
    (f"{SHIM} /other.so", None, "LD_PRELOAD is unset for the task", True),
    (SHIM, f"/other.so {SHIM}", "LD_PRELOAD is '/other.so /x/shim.so' for the task", False),
])
def test_a_task_without_the_pools_loopback_shim_runs_with_it_switched_off(
        pool_preload, task_preload, cold_because, off):
    pooled = {**BASE, "LD_PRELOAD": pool_preload}
    task = {k: v for k, v in {**BASE, "LD_PRELOAD": task_preload}.items() if v is not None}
    why = pool.mismatch(pooled, task, SHIM)
    assert (why == "") if not cold_because else why.startswith(cold_because), why
    assert pool.shim_off(pooled, task, SHIM) == off
    if off:  # without knowing which entry is the shim, the pool cannot serve such a task
        assert pool.mismatch(pooled, task).startswith("LD_PRELOAD is")


def test_the_pool_size_is_an_option_with_a_checked_env_var(monkeypatch):
    from tfk8s_magics import options
    from tfk8s_magics.errors import SpecError

    monkeypatch.setenv("TFK8S_POOL_SIZE", "3")
    pool.configure(None)
    assert pool.pool_size() == 3
    monkeypatch.setenv("TFK8S_POOL_SIZE", "0")
    assert pool.pool_size() == 0 and pool.ensure() is None  # size 0: today's cold start
    with pytest.raises(SpecError, match="out of range"):
        pool.configure(-1)
    assert options.OPTIONS["pool_size"].trait == "pool_size"


def test_the_cli_explains_that_a_pool_belongs_to_a_kernel():
    out = subprocess.run([sys.executable, "-m", "tfk8s_magics.cli", "pool", "--size", "2"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "belongs to the process that launches" in out.stderr


def test_an_expired_claim_is_answered_at_once_and_the_daemon_does_not_spin(tmp_path):
    # The daemon's loop sleeps until the first waiting claim's deadline.  serve_pending used to
    # release expired claims from the end of the queue only: an older claim past its deadline
    # behind a newer live one stayed, so the loop's timeout was 0 (a busy spin) until the newer
    # one expired too, up to CLAIM_TIMEOUT later.  Two claims wait for two processes "still
    # importing" (sleep, in sessions of their own): the first is past its deadline.
    pool_dir = tmp_path / "pool"
    pool_dir.mkdir()
    (pool_dir / "config.json").write_text(json.dumps(
        {"env": {}, "cwd": str(tmp_path), "size": 0, "owner": os.getpid()}))
    daemon = pool.Daemon(pool_dir)
    sleepers = [subprocess.Popen(["sleep", "120"], start_new_session=True) for _ in range(2)]
    claimers = []
    for p in sleepers:  # as Daemon.spawn registers a pooled process
        w = pool.daemon._Worker(p, socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET), os.pidfd_open(p.pid))
        daemon.workers[p.pid] = w
        daemon.sel.register(w.pidfd, selectors.EVENT_READ, ("exit", w))
    now = time.monotonic()
    for deadline in (now - 1, now + 60):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(3)]  # log, ready and status pipes
        daemon.wait_for(pool.daemon._Claim(theirs, {"ns": None, "peer": os.getpid(), "wait": True}, fds,
                                           deadline))
        claimers.append(mine)
    calls = []
    select = daemon.sel.select
    daemon.sel.select = lambda timeout=None: calls.append(timeout) or select(timeout)
    ready_r, ready_w = os.pipe()
    loop = threading.Thread(target=daemon.run, args=(ready_w,), daemon=True)
    try:
        loop.start()
        assert os.read(ready_r, 32).startswith(b"ok ")  # "ok PID": it listens
        claimers[0].settimeout(5)
        assert json.loads(claimers[0].recv(4096)) == {"cold": "no warm process became free in time"}
        time.sleep(1.0)
        assert len(calls) < 20, f"{len(calls)} select() calls in 1 s, timeouts {calls[:5]}..."
        assert [c.deadline for c in daemon.pending] == [now + 60]  # the live claim still waits
        assert 55 < daemon.next_timeout(None) <= 60
        # ends the sleepers, answers the claim
        pool.protocol._request(str(pool_dir / "sock"), {"op": "close"})
        claimers[1].settimeout(5)
        assert json.loads(claimers[1].recv(4096)) == {"cold": "no warm process became free in time"}
        loop.join(10)
        assert not loop.is_alive() and not pool_dir.exists()
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
        for c in claimers:
            c.close()
        os.close(ready_r)


@contextlib.contextmanager
def _daemon_with_an_importing_process(tmp_path):
    """A pool daemon (size 0) whose one process is "still importing" (a ``sleep``), and a waiting
    claim for it: (daemon, that process, the claimer's end of the connection, the claim)."""
    pool_dir = tmp_path / "pool"
    pool_dir.mkdir()
    (pool_dir / "config.json").write_text(json.dumps(
        {"env": {}, "cwd": str(tmp_path), "size": 0, "owner": os.getpid()}))
    daemon = pool.Daemon(pool_dir)
    sleeper = subprocess.Popen(["sleep", "120"], start_new_session=True)
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    worker_sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(3)]  # log, ready and status pipes
    try:
        daemon.workers[sleeper.pid] = pool.daemon._Worker(sleeper, worker_sock, os.pidfd_open(sleeper.pid))
        claim = pool.daemon._Claim(theirs, {"ns": None, "peer": os.getpid(), "wait": True, "env": {}}, fds,
                            time.monotonic() + 60)
        yield daemon, sleeper, mine, claim
    finally:
        sleeper.kill()
        sleeper.wait()
        for s in (mine, theirs, worker_sock):
            s.close()
        for fd in fds:
            with contextlib.suppress(OSError):  # the daemon may have closed them
                os.close(fd)


def test_a_claim_that_waits_for_a_refill_raises_its_priority(tmp_path):
    # A refill imports at autogroup nice REFILL_NICE; a launch that then waits for it (a claim
    # with wait) would wait longer than a cold start (stop and delete of that cluster too), so
    # the pool sets the importing processes that may serve the claim back to 0 at once.
    if pool.autogroup_nice() is None:
        pytest.skip("no autogroup on this kernel")
    with _daemon_with_an_importing_process(tmp_path) as (daemon, sleeper, _, claim):
        assert pool.priority._autogroup_nice(pool.REFILL_NICE, sleeper.pid)
        assert pool.autogroup_nice(sleeper.pid) == pool.REFILL_NICE
        daemon.claim(claim)
        assert len(daemon.pending) == 1  # it waits for the importing process ...
        assert pool.autogroup_nice(sleeper.pid) == 0  # ... which now imports at normal priority


def test_a_claimer_that_hangs_up_while_waiting_is_dropped_not_served(tmp_path):
    # A stop while the supervisor waits for a refill closes its claim's connection: the daemon
    # must drop that claim (its descriptors closed, its watch removed), not hand it a process.
    with _daemon_with_an_importing_process(tmp_path) as (daemon, _, mine, claim):
        theirs, fds = claim.conn, claim.fds
        daemon.claim(claim)
        assert daemon.pending == [claim] and daemon.describe(False)["waiting"] == 1
        assert any(k.fileobj is theirs for k in daemon.sel.get_map().values())  # its hang-up wakes the loop
        daemon.serve_pending()
        assert daemon.pending == [claim]  # still waiting: nothing happened to it
        mine.close()  # the claimer gives up
        assert [k.data[0] for k, _ in daemon.sel.select(5)] == ["claim"]
        daemon.serve_pending()
        assert daemon.pending == [] and daemon.describe(False)["waiting"] == 0
        assert not any(k.fileobj is theirs for k in daemon.sel.get_map().values())
        for fd in fds:
            with pytest.raises(OSError):
                os.fstat(fd)  # the claim's log, ready and status descriptors are closed
        assert theirs.fileno() == -1


def test_a_claim_that_waits_ends_when_an_interrupt_descriptor_becomes_readable(tmp_path):
    # The supervisor passes its signal wakeup pipe and its owner's pidfd: a stop ends the wait.
    path = str(tmp_path / "sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(1)  # a pool that never answers (its process is still importing)
    stop_r, stop_w = os.pipe()
    log_fd, ready_fd = os.open(os.devnull, os.O_WRONLY), os.open(os.devnull, os.O_WRONLY)
    try:
        # SIGTERM's number, the byte set_wakeup_fd writes
        threading.Timer(0.2, os.write, (stop_w, b"\x0f")).start()
        proc, why = pool.claim(path, {}, str(tmp_path), log_fd, ready_fd, wait=True, interrupt=[stop_r])
        assert (proc, why) == (None, pool.INTERRUPTED)
        assert os.read(stop_r, 8) == b"\x0f"  # not consumed: the supervisor's loop reads it
        conn, _ = listener.accept()
        conn.recv(65536)
        assert conn.recv(65536) == b""  # the claim's connection is closed: the daemon drops it
        conn.close()
    finally:
        listener.close()
        for fd in (stop_r, stop_w, log_fd, ready_fd):
            os.close(fd)


@pytest.mark.slow
def test_a_stop_while_tasks_wait_for_importing_pooled_processes_starts_nothing(local, workdir, warm):
    # The pool's processes held mid-import (SIGSTOP): the launch's claims wait for them.  A stop
    # then ends the wait at once: no task was started (warm or cold), the pool handed out
    # nothing, and it serves the next launch (the adopted namespace's processes are retired with
    # it on release: a namespace never serves two clusters; the refill takes their place).
    sock = pool.ensure(pool.NS)
    found = pool.info(sock)
    starting = [p["pid"] for p in found["processes"] if p["state"] == "starting"]
    if not starting:
        pytest.skip("the pool's processes finished importing before they could be held")
    for pid in starting:
        os.kill(pid, signal.SIGSTOP)
    try:
        cluster = tk.launch("held", workers=2, ps=0, script="print('ran', flush=True)\n", backend=local)
        wait_for(lambda: pool.info(sock)["waiting"] >= 1, 60, "the launch to wait for the pool")
        st = cluster.stop()
        assert st.phase == Phase.STOPPED
        assert [(t.phase, t.pid) for t in st.tasks] == [(Phase.STOPPED, None)] * 2
        assert not [e for e in cluster.events() if e.reason == "StartedCold"]
        assert "ran" not in cluster.logs()
        # The daemon drops the hung-up claim on its next wake-up (an info request may come first).
        after = wait_for(lambda: (i := pool.info(sock)) and i["waiting"] == 0 and i, 30, "the claim dropped")
        assert after["claimed"] == 0
    finally:
        for pid in starting:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    _wait_idle(2)
    again = tk.launch("after", workers=1, ps=0, script="print('ran', flush=True)\n", backend=local)
    assert again.wait(timeout=180).phase == Phase.SUCCEEDED
    assert pool.info(sock)["claimed"] == 1
    cluster.delete()
    again.delete()


@pytest.mark.parametrize("uid", [0, 65534])
def test_a_spare_namespace_is_joined_before_import_by_root_and_by_another_user(uid):
    # The pool's hooks (isolation.make_namespace / join_namespace) for both kinds of owner:
    # root gets a network namespace, another user a user+network one (identity maps).  A forked
    # single-threaded child joins it (as a pooled process does before exec), keeps its uid,
    # listens on its own loopback, and that port is not the host's.
    from tests import test_local_isolation as iso

    if os.geteuid() != 0 or not shutil.which("setpriv") or not Path(iso.SYSTEM_PYTHON).exists():
        pytest.skip("needs root, setpriv and /usr/bin/python3 to run as another uid")
    script = textwrap.dedent(f"""
        import importlib.util, json, os, socket
        spec = importlib.util.spec_from_file_location("iso", {str(iso.ISOLATION_PY)!r})
        iso = importlib.util.module_from_spec(spec); spec.loader.exec_module(iso)
        host = os.readlink("/proc/self/ns/net")
        mode, fds = iso.make_namespace()
        r, w = os.pipe()  # child -> parent
        r2, w2 = os.pipe()  # parent -> child: it may end
        pid = os.fork()
        if pid == 0:
            joined = iso.join_namespace(fds)
            s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
            os.write(w, json.dumps([joined, os.getuid(), os.readlink("/proc/self/ns/net") != host,
                                    s.getsockname()[1]]).encode())
            os.read(r2, 1); os._exit(0)
        joined, uid, moved, port = json.loads(os.read(r, 4096))
        with socket.socket() as c:
            reached = c.connect_ex(("127.0.0.1", port)) == 0
        os.write(w2, b"x"); os.waitpid(pid, 0)
        print(json.dumps({{"mode": mode, "fds": len(fds), "joined": joined, "uid": uid, "moved": moved,
                          "host_reaches_it": reached}}))
    """)
    cmd = [iso.SYSTEM_PYTHON, "-c", script]
    if uid:
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    mode = "netns" if uid == 0 else "userns+netns"
    assert json.loads(done.stdout) == {"mode": mode, "fds": 1 if uid == 0 else 2, "joined": mode, "uid": uid,
                                       "moved": True, "host_reaches_it": False}


# -- real tasks ------------------------------------------------------------------------
# What a task can observe about itself before and while running user code.
PROBE = textwrap.dedent('''
    import json, os, signal, socket, sys, locale
    import tensorflow as tf

    def _bound(family, wildcard):  # a pooled process preloads the loopback shim: is it off?
        with socket.socket(family) as s:
            s.bind((wildcard, 0))
            return s.getsockname()[0]

    tf.keras.utils.set_random_seed(7)  # python, numpy and TensorFlow: a deterministic run
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
    x = tf.reshape(tf.range(32, dtype=tf.float32) / 32.0, (8, 4))
    y = tf.reduce_sum(x, axis=1, keepdims=True)
    hist = model.fit(x, y, epochs=3, batch_size=4, verbose=0, shuffle=False)
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TFK8S_CLUSTER_ID")}  # per launch
    out = {
        "env": env, "cwd": os.getcwd(), "argv": sys.argv, "path": sys.path,
        "flags": repr(sys.flags), "encoding": [sys.stdout.encoding, locale.getpreferredencoding()],
        "unbuffered": [sys.stdout.write_through, sys.stdout.line_buffering],
        "netns": os.readlink("/proc/thread-self/ns/net"),
        # Every thread (TensorFlow's too) in the process's namespace, at the process's priority.
        "threads_in_one_netns": len({os.readlink(f"/proc/self/task/{t}/ns/net")
                                     for t in os.listdir("/proc/self/task")}) == 1,
        "nice": [os.getpriority(os.PRIO_PROCESS, 0), open("/proc/self/autogroup").read().split()[-1]],
        "bind": [_bound(socket.AF_INET, "0.0.0.0"), _bound(socket.AF_INET6, "::")],
        "pgid_is_pid": os.getpgid(0) == os.getpid(), "sid_is_pid": os.getsid(0) == os.getpid(),
        "umask": os.umask(0o022),
        # by name, not repr: a function's repr holds its address, which differs between processes
        "handlers": [getattr(h, "__qualname__", repr(h))
                     for h in map(signal.getsignal, (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE))],
        "tf": tf.__version__, "keras": tf.keras.__name__ + " " + getattr(tf.keras, "__version__", ""),
        "threads": [tf.config.threading.get_inter_op_parallelism_threads(),
                    tf.config.threading.get_intra_op_parallelism_threads()],
        "devices": [d.name for d in tf.config.list_physical_devices()],
        "eager": tf.executing_eagerly(), "floatx": tf.keras.backend.floatx(),
        "tf_modules": sorted(m for m in sys.modules if m.split(".")[0] in
                             ("tensorflow", "keras", "tf_keras", "numpy", "absl")),
        "loss": hist.history["loss"],
        "weights": [w.tolist() for w in model.get_weights()],
    }
    path = os.path.join(os.environ["TFK8S_LOG_DIR"], "probe.json")
    with open(path, "w") as f:
        json.dump(out, f)
    print("probe done", flush=True)
''')


@pytest.fixture
def warm(state_dir, xdg_runtime, monkeypatch):
    """A warm pool of size 2 owned by this test process, shut down (and proven gone) after."""
    monkeypatch.setenv("TFK8S_POOL_SIZE", "2")
    pool.configure(None)
    yield
    sock = pool.current()
    daemon = pool.daemon_pid()
    pool.shutdown()
    assert daemon is None or not pid_alive(daemon)
    assert sock is None or not os.path.exists(sock)


def _idle(found: dict, kind: str) -> int:
    """How many processes of ``kind`` a pool holds idle for its next launch."""
    return sum(p["state"] == "idle" and p["kind"] == kind and not p["reserved"] for p in found["processes"])


def _wait_idle(n: int, timeout: float = 180.0, kind: str = pool.NS) -> dict:
    """Start this process's pool if needed and wait until ``n`` processes of ``kind`` are idle."""
    sock = pool.ensure(kind)
    assert sock, "the pool did not start"
    return wait_for(lambda: (i := pool.info(sock)) and _idle(i, kind) >= n and i, timeout,
                    f"{n} idle pooled processes ({kind})")


def _run_probe(local, name, env=None) -> tuple[dict, list]:
    cluster = tk.launch(name, workers=1, script=PROBE, env=env or {}, backend=local)
    st = cluster.wait(timeout=180)
    assert st.phase == Phase.SUCCEEDED, cluster.logs("worker-0")
    mode = json.loads((local.clusters_dir / name / "status.json").read_text())["isolation"]["mode"]
    out = json.loads((Path(st.log_dir) / "probe.json").read_text())
    events = [(e.task, e.reason, e.message) for e in cluster.events()]
    cluster.delete()
    return {**out, "mode": mode}, events


@pytest.mark.slow
def test_a_pooled_task_is_the_same_as_a_cold_one(local, workdir, warm, monkeypatch):
    _wait_idle(2)
    pooled, events = _run_probe(local, "same")
    isolated = pooled["mode"] in ("netns", "userns+netns")
    assert not [e for e in events if e[1] == "StartedCold"], events
    assert pool.info(pool.current())["claimed"] == 1
    monkeypatch.setenv("TFK8S_POOL_SIZE", "0")
    pool.configure(None)
    cold, events = _run_probe(local, "same")
    assert pool.current() is None
    assert pooled.keys() == cold.keys()
    # Each cluster has a network namespace of its own (when the kernel allows: issue 14), and the
    # pooled task runs in its cluster's, as the cold one does.
    host = os.readlink("/proc/self/ns/net")
    assert (pooled.pop("netns") != host) == (cold.pop("netns") != host) == isolated
    assert pooled["threads_in_one_netns"] and pooled["nice"] == [0, "0"], pooled
    for key in pooled:
        assert pooled[key] == cold[key], f"{key} differs: pooled {pooled[key]!r} cold {cold[key]!r}"


SLEEPER = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"


def _thread_namespaces(pid: int) -> set[str]:
    """The network namespace of every thread of ``pid``."""
    return {os.readlink(f"/proc/{pid}/task/{t}/ns/net") for t in os.listdir(f"/proc/{pid}/task")}


def _wholly_in_own_namespace(local, cluster, host: str) -> tuple[str, list[int]]:
    """Check a running namespaced cluster started warm with every thread of every task in its
    supervisor's namespace, unreachable from the host; return that namespace and the task pids."""
    from tests import test_local_isolation as iso

    assert not [e for e in cluster.events() if e.reason == "StartedCold"], cluster.events()
    raw = json.loads((local.clusters_dir / cluster.name / "status.json").read_text())
    assert raw["isolation"]["mode"] in ("netns", "userns+netns"), raw["isolation"]
    theirs = os.readlink(f"/proc/{raw['supervisor_pid']}/ns/net")
    assert theirs != host
    pids = [t["pid"] for t in raw["tasks"]]
    for pid in pids:
        assert _thread_namespaces(pid) == {theirs}, (pid, _thread_namespaces(pid))
    ports = [int(a.rsplit(":", 1)[1]) for addrs in local.addresses(cluster.name).values() for a in addrs]
    assert iso.probe(ports, None) == {p: "refused" for p in ports}  # nothing of it on the host
    if os.geteuid() == 0 and shutil.which("setpriv") and Path(iso.SYSTEM_PYTHON).exists():
        assert all(v in (0, "refused") for v in iso.probe(ports, iso.NOBODY).values())
    return theirs, pids


@pytest.mark.slow
def test_pooled_tasks_live_wholly_in_their_clusters_own_namespace(local, workdir, warm, monkeypatch):
    # Pooled processes import TensorFlow inside the spare namespace their cluster then adopts:
    # every thread of a pooled task is in the supervisor's namespace (none left on the host's),
    # nothing is reachable from the host, the processes the cluster did not take end, and the
    # next cluster (from the refill, imported at low priority) gets a namespace of its own and
    # runs at normal priority.
    host = os.readlink("/proc/self/ns/net")
    monkeypatch.setenv("TFK8S_POOL_SIZE", "3")
    pool.configure(None)
    spares = {p["pid"] for p in _wait_idle(3)["processes"]}
    first = tk.launch("nsa", ps=1, workers=1, script=SLEEPER, backend=local, wait_ready=180)
    ns_a, _ = _wholly_in_own_namespace(local, first, host)
    held = os.open(f"/proc/{_supervisor(local, 'nsa')}/ns/net", os.O_RDONLY)  # its number stays its own
    try:
        found = wait_for(lambda: (i := pool.info(pool.current())) and not any(
            p["reserved"] and p["state"] != "busy" for p in i["processes"]) and i, 30,
            "the unclaimed process in its namespace to end")
        busy = {p["pid"] for p in found["processes"] if p["state"] == "busy"}
        assert found["claimed"] == 2 and len(busy) == 2 and busy <= spares
        assert not (spares - busy) & {p["pid"] for p in found["processes"]}  # the third ended
        first.delete()
        found = _wait_idle(2)
        refilled = [p["pid"] for p in found["processes"] if p["state"] == "idle"]
        assert all(pool.autogroup_nice(p) in (pool.REFILL_NICE, None) for p in refilled)
        second = tk.launch("nsb", ps=1, workers=1, script=SLEEPER, backend=local, wait_ready=180)
        ns_b, pids = _wholly_in_own_namespace(local, second, host)
        assert ns_b != ns_a
        for pid in pids:  # the refill's low priority is gone before the task runs
            assert {os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir(f"/proc/{pid}/task")} == {0}
            assert pool.autogroup_nice(pid) in (0, None)
        second.delete()
    finally:
        os.close(held)


def _supervisor(local, name: str) -> int:
    return json.loads((local.clusters_dir / name / "status.json").read_text())["supervisor_pid"]


def _listening(ports: set[int]) -> set[tuple[str, int]]:
    """(hex local address, port) of every listening TCP socket on ``ports`` in this namespace."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, port = local.rsplit(":", 1)
            if state == "0A" and int(port, 16) in ports:
                found.add((address, int(port, 16)))
    return found


LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1, ::ffff:127.0.0.1


def _in_graph_listening(local, name: str) -> tuple[set[str], list]:
    cluster = tk.launch(name, mode="in-graph", ps=1, workers=1, backend=local, wait_ready=180)
    ports = {int(a.rsplit(":", 1)[1]) for addrs in local.addresses(name).values() for a in addrs}
    found = _listening(ports)
    events = [(e.task, e.reason, e.message) for e in cluster.events()]
    cluster.delete()
    assert {p for _a, p in found} == ports, found
    return {a for a, _p in found}, events


@pytest.mark.slow
def test_an_in_graph_cluster_starts_warm_behind_the_loopback_shim(local, workdir, warm, monkeypatch):
    # In-graph tasks share the host's network behind the shim (LD_PRELOAD at exec): the pool
    # preloads it, so they start warm, and listen on loopback only, as cold ones do.
    _wait_idle(2, kind=pool.HOST)
    pooled, events = _in_graph_listening(local, "igwarm")
    assert not [e for e in events if e[1] == "StartedCold"], events
    assert pool.info(pool.current())["claimed"] == 2
    monkeypatch.setenv("TFK8S_POOL_SIZE", "0")
    pool.configure(None)
    cold, events = _in_graph_listening(local, "igcold")
    assert pooled == cold and pooled <= LOOPBACK, (pooled, cold)


@pytest.mark.slow
def test_a_different_import_time_variable_starts_cold(local, workdir, warm):
    _wait_idle(2)
    out, events = _run_probe(local, "mismatch", env={"TF_NUM_INTEROP_THREADS": "1"})
    cold = [m for _t, r, m in events if r == "StartedCold"]
    assert cold and "TF_NUM_INTEROP_THREADS" in cold[0], events
    assert out["env"]["TF_NUM_INTEROP_THREADS"] == "1"
    assert pool.info(pool.current())["claimed"] == 0  # the pooled processes were not touched


@pytest.mark.slow
def test_exit_codes_signals_and_restarts_are_the_cold_ones(local, workdir, warm):
    _wait_idle(2)
    # First run: killed by SIGKILL (retried); the restart exits 7 (a user error: failed).
    script = textwrap.dedent('''
        import os, signal
        marker = os.path.join(os.environ["TFK8S_LOG_DIR"], "ran-once")
        if not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        raise SystemExit(7)
    ''')
    cluster = tk.launch("codes", workers=1, restart_budget=1, script=script, backend=local)
    *_, st = cluster.watch()
    task = st.task("worker-0")
    assert st.phase == Phase.FAILED and task.exit_code == 7 and task.restarts == 1, st
    reasons = [e.message for e in cluster.events() if e.reason == "Restarted"]
    assert reasons and "SIGKILL" in reasons[0], reasons
    assert "restart 1 of worker-0" in cluster.logs("worker-0")
    assert pool.info(pool.current())["claimed"] >= 1


@pytest.mark.slow
def test_a_pooled_task_dies_with_its_supervisor(local, workdir, warm):
    _wait_idle(1)
    cluster = tk.launch("orphan", workers=1, script="import time\nprint('up', flush=True)\ntime.sleep(600)\n",
                        backend=local)
    st = wait_for(lambda: (s := cluster.status()).task("worker-0").phase == Phase.RUNNING and s,
                  120, "the task running")
    pid = st.task("worker-0").pid
    sup = json.loads((local.clusters_dir / "orphan" / "status.json").read_text())["supervisor_pid"]
    os.kill(sup, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid), 30, "the pooled task to die with its supervisor")


#: A task that leaves a daemon behind: a new session, a double fork, no exec (the daemon is a copy
#: of the pooled process, with its environment).
DAEMONIZER = textwrap.dedent('''
    import os, sys, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(os.path.join(os.environ["TFK8S_LOG_DIR"], "daemon.pid"), "w") as f:
                f.write(str(os.getpid()))
            time.sleep(3600)
        os._exit(0)
    os.wait()
    while not os.path.exists(os.path.join(os.environ["TFK8S_LOG_DIR"], "daemon.pid")):
        time.sleep(0.05)
    print("daemon started", flush=True)
''')


@pytest.mark.slow
def test_a_daemon_double_forked_by_a_pooled_task_dies_with_its_cluster(local, workdir, warm):
    """A pooled process's own environment (``/proc/PID/environ``, which a forked daemon copies)
    carries its cluster's mark, as a cold task's does: the orphan sweep finds the daemon."""
    _wait_idle(1)
    cluster = tk.launch("e", script=DAEMONIZER, workers=1, backend=local)
    st = cluster.wait(timeout=180)
    assert st.phase == Phase.SUCCEEDED, cluster.logs("worker-0")
    assert not [e for e in cluster.events() if e.reason == "StartedCold"], cluster.events()
    daemon = int((Path(st.log_dir) / "daemon.pid").read_text())
    try:
        cluster.delete()
        wait_for(lambda: not pid_alive(daemon), 20, "the task's daemon to die with its cluster")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon, signal.SIGKILL)


@pytest.mark.slow
def test_the_pool_dies_with_its_owner_and_leaves_nothing(tmp_path, xdg_runtime):
    owner = textwrap.dedent('''
        import json, os, sys, time
        os.environ["TFK8S_POOL_SIZE"] = "1"
        from tfk8s_magics.backends.local import pool
        sock = pool.ensure()
        while not any(p["state"] == "idle" for p in pool.info(sock)["processes"]):
            time.sleep(0.05)
        i = pool.info(sock)
        print(json.dumps({"daemon": i["pid"], "procs": [p["pid"] for p in i["processes"]],
                          "dir": i["dir"], "sock": sock, "kind": i["processes"][0]["kind"]}), flush=True)
        time.sleep(600)
    ''')
    proc = subprocess.Popen([sys.executable, "-c", owner], stdout=subprocess.PIPE, text=True,
                            cwd=tmp_path, env={**os.environ, "TFK8S_POOL_SIZE": "1"})
    held = None
    try:
        seen = json.loads(proc.stdout.readline())
        assert all(pid_alive(p) for p in [seen["daemon"], *seen["procs"]])
        # Our own hold on the spare namespace keeps its number from being reused while we look.
        held = os.open(f"/proc/{seen['procs'][0]}/ns/net", os.O_RDONLY)
        spare = os.readlink(f"/proc/self/fd/{held}")
        assert (spare != os.readlink("/proc/self/ns/net")) == (seen["kind"] == pool.NS)
    finally:
        proc.kill()  # SIGKILL: nothing of the owner runs any clean-up
        proc.wait()
    try:
        for pid in [seen["daemon"], *seen["procs"]]:
            wait_for(lambda pid=pid: not pid_alive(pid), 30, f"pool process {pid} to end with its owner")
        wait_for(lambda: not os.path.exists(seen["dir"]), 10, "the pool's directory to be removed")
        assert not os.path.exists(seen["sock"])
        if seen["kind"] == pool.NS:  # nothing is in the spare namespace or holds it but us
            assert _holders(spare) == [f"{os.getpid()}/fd/{held}"]
    finally:
        os.close(held)


def _holders(ns: str) -> list[str]:
    """Every process in namespace ``ns`` ("PID") or holding it open ("PID/fd/N")."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(f"{d}/task/{t}/ns/net") == ns for t in os.listdir(d / "task")):
                found.append(d.name)
            for fd in os.listdir(d / "fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"{d}/fd/{fd}") == ns:
                        found.append(f"{d.name}/fd/{fd}")
    return found


@pytest.mark.slow
def test_pool_command_shows_size_and_idle_memory(warm):
    info = _wait_idle(1)
    text = pool.describe(info)
    assert "size 2" in text and "idle memory:" in text and "MiB PSS" in text
    idle = [p for p in info["processes"] if p["state"] == "idle"]
    assert all(p["pss"] > 50 * 2**20 for p in idle)  # TensorFlow is in there
    assert pool.status_text().startswith("warm pool of this user (daemon")
    assert any(p["pid"] == info["pid"] for p in pool.pools())


@pytest.mark.slow
def test_an_in_graph_launch_imports_tensorflow_while_the_cluster_starts(tmp_path):
    # A fresh process (a new kernel): the launch starts the import; connect waits for it, not anew.
    kernel = textwrap.dedent('''
        import json, sys
        import tfk8s_magics as tk
        from tfk8s_magics import ingraph
        from tfk8s_magics.backends.local import LocalBackend
        assert "tensorflow" not in sys.modules
        be = LocalBackend(sys.argv[1])
        cluster = tk.launch("pre", mode="in-graph", ps=1, workers=1, backend=be)
        started = ingraph._preimport is not None and ingraph._preimport.name
        cluster.wait_ready(300)
        strategy = tk.connect("pre", backend=be)
        print(json.dumps({"threads": started, "strategy": type(strategy).__name__}), flush=True)
        cluster.delete()
    ''')
    done = subprocess.run([sys.executable, "-c", kernel, str(tmp_path / "state")], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path, env={**os.environ, "TFK8S_POOL_SIZE": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["threads"] == "tfk8s-import-tensorflow"
    assert out["strategy"].startswith("ParameterServerStrategy")


@pytest.mark.slow
@pytest.mark.parametrize("warm_kernel", ["1", "0"])
def test_a_kernel_with_a_warm_pool_imports_tensorflow_in_the_background(tmp_path, xdg_runtime, warm_kernel):
    # The owner is the client of its in-graph clusters: with a warm pool it is warm too, so a
    # sub-second warm launch is not followed by seconds of connect importing TensorFlow.
    kernel = textwrap.dedent('''
        import json, sys
        from tfk8s_magics import ingraph
        from tfk8s_magics.backends.local import pool
        assert "tensorflow" not in sys.modules
        sock = pool.ensure()
        thread = ingraph._preimport and ingraph._preimport.name
        imported = ingraph.preimported(300)
        pool.shutdown()
        print(json.dumps({"sock": bool(sock), "thread": thread, "imported": imported,
                          "tf": "tensorflow" in sys.modules}), flush=True)
    ''')
    done = subprocess.run([sys.executable, "-c", kernel], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env={**os.environ, "TFK8S_POOL_SIZE": "1",
                                             "TFK8S_WARM_KERNEL": warm_kernel})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    on = warm_kernel == "1"
    assert out == {"sock": True, "thread": "tfk8s-import-tensorflow" if on else None,
                   "imported": on, "tf": on}, out


@pytest.mark.slow
def test_a_kernel_that_exits_during_its_background_import_finishes_it_first(tmp_path, xdg_runtime):
    """A process that used the lab and exits while its warm kernel still imports TensorFlow (a
    sequence faster than the import) tore the interpreter down under that import: a segfault at
    exit (139) in some runs.  No lab thread may be inside TensorFlow's import when the interpreter
    finalizes: by the last exit handler, the import has finished."""
    kernel = textwrap.dedent('''
        import atexit, sys, threading
        def last():  # registered first: runs after every other exit handler
            alive = [t.name for t in threading.enumerate() if t.name.startswith("tfk8s-")]
            print("ALIVE AT EXIT", alive, "tensorflow" in sys.modules, flush=True)
        atexit.register(last)
        from tfk8s_magics.backends.local import pool
        assert pool.ensure()
        pool.shutdown()
    ''')
    for _ in range(2):
        done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", kernel], capture_output=True,
                              text=True, timeout=600, cwd=tmp_path,
                              env={**os.environ, "TFK8S_POOL_SIZE": "1", "TFK8S_WARM_KERNEL": "1"})
        assert done.returncode == 0, done.stderr[-3000:]
        assert "ALIVE AT EXIT [] True" in done.stdout, done.stdout + done.stderr[-3000:]


def test_tfcluster_list_shows_what_the_warm_pools_of_this_user_hold(warm, capsys):
    """Issue 27 item 10: two warm TensorFlow processes per kernel were shown nowhere."""
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython() or get_ipython()
    shell.run_line_magic("load_ext", "tfk8s_magics")
    found = _wait_idle(2)
    capsys.readouterr()
    shell.run_line_magic("tfcluster", "list")
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("warm pool of this user:"))
    assert re.search(r"\d+ TensorFlow process(es)? waiting, \d+ MiB PSS, shared by 1 kernel "
                     r"\(this kernel's included\)", line), line
    mine = sum(p["pss"] for p in pool.info(found["socket"])["processes"]) / 2**20
    assert int(re.search(r"waiting, (\d+) MiB PSS", line)[1]) == pytest.approx(mine, rel=0.25, abs=20)
    assert int(re.search(r"waiting, (\d+) MiB PSS", line)[1]) > 100  # TensorFlow imported: hundreds of MiB


def test_every_variable_the_supervisor_gives_a_task_is_read_late_or_the_pools():
    """A variable the supervisor sets for every task that the pool does not list as read late
    made every task start cold (TFK8S_SCRIPT_IS_CELL did)."""
    import inspect

    from tfk8s_magics.backends.local import taskproc

    src = inspect.getsource(taskproc.TaskProcesses.env)
    for name in re.findall(r'reserved\["(TFK8S_[A-Z_]+)"\]', src) + re.findall(r'"(TFK8S_[A-Z_]+)":', src):
        assert name in pool.LATE, name
