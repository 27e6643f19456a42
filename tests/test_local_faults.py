"""Faults injected from outside into real TensorFlow clusters (issue 14, items 6, 9 and 12).

Each test kills or stops a task the way an operator, the OOM killer or a debugger would (a
signal from another process, at a moment chosen by watching the cluster's progress) and
checks the cluster ends in a clear state: one incident costs one restart and names the task
that failed first; a stopped worker shows as stalled; an in-graph kernel whose servers were
restarted is told its connection is lost.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

import tfk8s_magics as tk
from tests.conftest import wait_for
from tfk8s_magics.backends import Phase

pytestmark = [pytest.mark.slow, pytest.mark.faults]

#: Three workers all-reduce in lock step, reporting progress each step; a restarted group
#: starts from step 0 again (it is the budget and the reasons under test, not resuming).
MWMS_STEPS = """
import time
import tensorflow as tf
import tfk8s_magics
strategy = tf.distribute.MultiWorkerMirroredStrategy()

@tf.function
def step():
    return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("sum", 1.0))

for i in range(60):
    total = step()
    tfk8s_magics.report_progress(i + 1, total=60)
    time.sleep(0.05)
print(f"all-reduced 60 steps: {float(total)}", flush=True)
"""


def _progress_at_least(cluster, step: int):
    def check():
        st = cluster.status()
        if st.terminal:
            raise AssertionError(f"the cluster ended early: {st.phase}: {st.reason}")
        return st.progress is not None and st.progress.step >= step
    return check


def _restarts_used(local, name: str) -> int:
    return json.loads((local.clusters_dir / name / "status.json").read_text())["restarts_used"]


def test_one_killed_worker_of_three_costs_one_restart_and_is_named(local, workdir):
    """The issue's case: 3 MWMS workers, the default budget of 2, one SIGKILL from outside."""
    cluster = tk.launch("three", workers=3, script=MWMS_STEPS, backend=local)
    wait_for(_progress_at_least(cluster, 5), 240, "training to start")
    victim = cluster.status().task("worker-1")
    os.kill(victim.pid, signal.SIGKILL)
    st = cluster.wait(timeout=300)
    assert st.phase == Phase.SUCCEEDED, (st.reason, cluster.logs(tail=10))
    assert _restarts_used(local, "three") == 1
    assert [st.task(f"worker-{i}").restarts for i in range(3)] == [1, 1, 1]
    restarted = [e for e in cluster.events() if e.reason == "Restarted"]
    # The first restart (the one that paid) names the killed task and why; the peers name it too.
    assert restarted[0].task == "worker-1" and "killed by SIGKILL; restart 1 of 2" in restarted[0].message
    assert all("worker-1: killed by SIGKILL" in e.message for e in restarted[1:]), restarted
    assert all(cluster.logs(f"worker-{i}").count("all-reduced 60 steps: 3.0") == 1 for i in range(3))


TF1_PS_STEPS = """
import json, os, time
import tensorflow as tf
import tfk8s_magics
tf.compat.v1.disable_eager_execution()
config = json.loads(os.environ["TF_CONFIG"])
index = config["task"]["index"]
cluster = tf.train.ClusterSpec(config["cluster"])
server = tf.distribute.Server(cluster, job_name="worker", task_index=index)
setter = tf.compat.v1.train.replica_device_setter(worker_device=f"/job:worker/task:{index}", cluster=cluster)
with tf.compat.v1.device(setter):
    global_step = tf.compat.v1.train.get_or_create_global_step()
    bump = global_step.assign_add(1)
with tf.compat.v1.Session(server.target) as sess:
    if index == 0:
        sess.run(tf.compat.v1.global_variables_initializer())
    while len(sess.run(tf.compat.v1.report_uninitialized_variables())):
        time.sleep(0.1)
    for i in range(60):
        sess.run(bump)
        tfk8s_magics.report_progress(i + 1, total=60)
        time.sleep(0.05)
print("done", flush=True)
"""


def test_a_killed_parameter_server_is_named_not_the_worker_that_lost_it(local, workdir):
    """TF1 replica_device_setter: the PS is SIGKILLed; the workers lose it (a consequence).
    The restart that paid names ps-0; the workers restart with it, once each, naming its
    incident (they noticed the loss 0.2 s and 7 s apart: the first, restarted alone, lost the
    second and cost a second restart in 1 run of 4)."""
    cluster = tk.launch("tf1kill", workers=2, ps=1, ps_grace_period=0, script=TF1_PS_STEPS, backend=local)
    wait_for(_progress_at_least(cluster, 5), 240, "training to start")
    os.kill(cluster.status().task("ps-0").pid, signal.SIGKILL)
    st = cluster.wait(timeout=300)
    assert st.phase == Phase.SUCCEEDED, (st.reason, cluster.logs(tail=10))
    assert _restarts_used(local, "tf1kill") == 1, [(e.task, e.reason, e.message) for e in cluster.events()]
    restarted = [e for e in cluster.events() if e.reason == "Restarted"]
    first = restarted[0]
    assert first.task == "ps-0" and "killed by SIGKILL; restart 1 of 2" in first.message, restarted
    assert all("ps-0: killed by SIGKILL" in e.message for e in restarted[1:]), restarted
    assert {e.task for e in restarted} == {"ps-0", "worker-0", "worker-1"}
    assert [st.task(t).restarts for t in ("ps-0", "worker-0", "worker-1")] == [1, 1, 1], restarted


#: Two workers in lock step, printing every step: a stopped peer freezes the other at the collective.
MWMS_FOREVER = """
import time
import tensorflow as tf
import tfk8s_magics
strategy = tf.distribute.MultiWorkerMirroredStrategy()

@tf.function
def step():
    return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("sum", 1.0))

for i in range(100000):
    step()
    tfk8s_magics.report_progress(i + 1, total=100000)
    print(f"step {i + 1}", flush=True)
    time.sleep(0.05)
"""


def test_a_sigstopped_worker_shows_stalled_within_the_stall_timeout(local, workdir, monkeypatch):
    monkeypatch.setenv("TFK8S_STALL_TIMEOUT", "4")
    cluster = tk.launch("hang", workers=2, script=MWMS_FOREVER, backend=local)
    wait_for(_progress_at_least(cluster, 3), 240, "training to start")
    worker = cluster.status().task("worker-1")
    os.kill(worker.pid, signal.SIGSTOP)
    stopped = time.time()
    try:
        st = cluster.status()
        for st in cluster.watch():
            if st.shown_phase == "stalled" or st.terminal:
                break
        seen = time.time()
        assert st.shown_phase == "stalled", (st.phase, st.reason)
        # Within the timeout (4 s) of the last sign of life, which came at most a step before the stop.
        assert st.stall.since <= stopped + 0.5 and seen - stopped < 4.0 + 3.0, (stopped, st.stall.since, seen)
        assert any(e.reason == "Stalled" for e in cluster.events())
        assert "worker-0" in st.stall_text()
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    wait_for(lambda: cluster.status().stall is None, 30, "the stall to clear after SIGCONT")
    assert any(e.reason == "Resumed" for e in cluster.events())
    cluster.delete()


def test_a_sigstopped_mwms_worker_is_named_when_tensorflow_gives_up_on_it(local, workdir):
    """The probe's item 1: with the default stall timeout (120 s) TensorFlow's coordination service
    declares a frozen worker unhealthy first and worker-0 exits 75.  The incident is spent on the
    frozen worker-1 and says so; worker-0 is the one that lost it."""
    cluster = tk.launch("frozen", workers=2, script=MWMS_FOREVER, backend=local)
    wait_for(_progress_at_least(cluster, 3), 240, "training to start")
    frozen = cluster.status().task("worker-1")
    os.kill(frozen.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        culprit = wait_for(lambda: next((e for e in cluster.events() if e.reason == "Culprit"), None), 90,
                           "the frozen worker to be named")
        named = time.monotonic() - stopped
    finally:
        try:
            os.kill(frozen.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    print(f"\nfault-time: SIGSTOPped MWMS worker named {named:.1f} s after the stop (TensorFlow's "
          "heartbeat timeout + the supervisor's reaction)")
    assert culprit.task == "worker-1" and culprit.message.startswith("worker-1 was stopped (SIGSTOP"), culprit
    assert "worker-0 lost it" in culprit.message
    wait_for(lambda: cluster.status().task("worker-1").restarts == 1, 60, "worker-1 to restart")
    events = [(e.task, e.message) for e in cluster.events() if e.reason == "Restarted"]
    assert ("worker-0", "lost worker-1 (lost a peer (exit code 75)); restart 1 of 2") in events, events
    assert any(t == "worker-1" and m.startswith("worker-1 was stopped") for t, m in events), events
    assert _restarts_used(local, "frozen") == 1
    wait_for(_progress_at_least(cluster, 3), 240, "training to go on after the restart")
    cluster.delete()


def test_in_graph_after_a_parameter_server_restart_reconnects_and_restores(local, workdir):
    """The issue's item 9: a PS SIGKILLed under a connected coordinator is restarted; the status
    says the coordinator's connection is lost (not "every task is ready"); connect() builds a
    fresh strategy, which restores the last checkpoint and trains on; the status is ready again."""
    import tensorflow as tf

    cluster = tk.launch("igloss", mode="in-graph", ps=1, workers=1, backend=local, wait_ready=240)

    def train(strategy, steps: int):
        with strategy.scope():
            counter = tf.Variable(0.0)
        checkpoint = tf.train.Checkpoint(counter=counter)
        latest = tf.train.latest_checkpoint(str(workdir / "ckpt"))
        if latest:
            checkpoint.restore(latest)
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

        @tf.function
        def step():
            counter.assign_add(1.0)
            return tf.constant(1)

        for _ in range(steps):
            coordinator.schedule(step)
        coordinator.join()
        checkpoint.save(str(workdir / "ckpt" / "ckpt"))
        return counter.numpy()

    first = cluster.connect()
    assert train(first, 5) == 5.0
    assert cluster.status().reason == "every task is ready"
    os.kill(cluster.status().task("ps-0").pid, signal.SIGKILL)
    wait_for(lambda: (st := cluster.status()).task("ps-0").restarts == 1 and st.ready, 120, "ps-0 to restart")
    st = cluster.status()
    lost = "the coordinator's connection is lost: ps-0 restarted"
    assert st.phase == Phase.RUNNING and lost in st.reason, st.reason
    second = cluster.connect()
    assert second is not first
    assert train(second, 3) == 8.0  # 5 restored from the checkpoint + 3 new steps
    assert cluster.status().reason == "every task is ready"
    assert cluster.connect() is second
    cluster.delete()


def _ps_training(workdir, steps: int, kill=None):
    """The documented recovery pattern's train(): connect, variables, restore, schedule, save;
    ``kill`` (a callable) runs after the third step's checkpoint."""
    import tensorflow as tf

    strategy = tk.connect("igten")
    with strategy.scope():
        counter = tf.Variable(0.0)
    ckpt = tf.train.Checkpoint(counter=counter)
    if latest := tf.train.latest_checkpoint(str(workdir / "ckpt")):
        ckpt.restore(latest)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    @tf.function
    def step():
        counter.assign_add(1.0)
        return tf.constant(1)

    for i in range(steps):
        coordinator.schedule(step)
        if kill is not None and i == 2:
            coordinator.join()
            ckpt.save(str(workdir / "ckpt" / "ckpt"))
            kill()
    coordinator.join()
    ckpt.save(str(workdir / "ckpt" / "ckpt"))
    return float(counter.numpy())


def test_the_recovery_pattern_works_ten_times_in_a_row(local, workdir, monkeypatch):
    """The probe's item 2: SIGKILL ps-0 under a running coordinator loop, wait until the status says
    the connection is lost (the moment the probe's connect() failed 8 of 10 times), then the
    documented pattern: connect() again once and resume from the checkpoint — 10 of 10 runs."""
    import tensorflow as tf

    monkeypatch.setenv("TFK8S_STATE_DIR", str(local.state_dir))
    cluster = tk.launch("igten", mode="in-graph", ps=1, workers=2, restart_budget=20, backend=local,
                        wait_ready=240)
    lost = "the coordinator's connection is lost"

    def kill():
        os.kill(cluster.status().task("ps-0").pid, signal.SIGKILL)

    expected, times = 0.0, []
    for run in range(10):
        with pytest.raises((tf.errors.UnavailableError, tf.errors.AbortedError)):
            _ps_training(workdir, 1000, kill)
        expected += 3.0  # three steps were checkpointed before the kill
        wait_for(lambda: lost in cluster.status().reason, 120, f"run {run}: the status to say the loss")
        began = time.monotonic()
        assert _ps_training(workdir, 5) == expected + 5.0, f"run {run}"
        times.append(time.monotonic() - began)
        expected += 5.0
        assert cluster.status().reason == "every task is ready", cluster.status().reason
    print(f"\nfault-time: PS killed under a coordinator, reconnect + 5 steps: 10 of 10 runs, "
          f"{min(times):.1f}-{max(times):.1f} s each")
    cluster.delete()


def test_a_connect_that_cannot_reach_every_worker_is_one_sentence_and_the_loss_stays(
        local, workdir, monkeypatch):
    """connect() returns only a strategy that ran a step: with a worker stopped after a PS restart it
    says so in one sentence (TensorFlow would wait for it without end), and the status still says
    the connection is lost until a connect() has run its step."""
    from tfk8s_magics import ingraph
    from tfk8s_magics.errors import BackendError
    from tfk8s_magics.lifeline import process_state

    monkeypatch.setenv("TFK8S_STATE_DIR", str(local.state_dir))
    monkeypatch.setattr(ingraph, "RECONNECT_TIMEOUT", 8.0)
    cluster = tk.launch("igten", mode="in-graph", ps=1, workers=2, backend=local, wait_ready=240)
    assert _ps_training(workdir, 3) == 3.0
    os.kill(cluster.status().task("ps-0").pid, signal.SIGKILL)
    lost = "the coordinator's connection is lost"
    wait_for(lambda: lost in cluster.status().reason, 120, "the status to say the loss")
    frozen = cluster.status().task("worker-1").pid
    os.kill(frozen, signal.SIGSTOP)
    try:
        # A process in uninterruptible sleep stops only when it leaves it.
        wait_for(lambda: process_state(frozen) == "T", 10, "worker-1 to be stopped")
        began = time.monotonic()
        with pytest.raises(BackendError) as e:
            cluster.connect()
        took = time.monotonic() - began
        assert str(e.value).startswith(
            f"connect: worker-1 of 'igten' is stopped (pid {frozen}, SIGSTOP or a debugger) and cannot "
            f"answer; continue it (kill -CONT {frozen})"), e.value
        assert took < 8.0 + 10.0, took
        assert lost in cluster.status().reason, cluster.status().reason
    finally:
        os.kill(frozen, signal.SIGCONT)
    print(f"\nfault-time: connect() with a stopped worker refused in {took:.1f} s")
    assert _ps_training(workdir, 2) == 5.0  # continued: connect() works again
    assert cluster.status().reason == "every task is ready"
    cluster.delete()


MWMS_ONCE = """
import time
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()

@tf.function
def step():
    return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("sum", 1.0))

print(f"all-reduced: {float(step())}", flush=True)
time.sleep(5)  # the peer may still be reading this all-reduce: leaving now would cut it off
"""


@pytest.mark.parametrize(("mode", "victim"), [("between", "worker-1"), ("in-graph", "ps-0")])
def test_a_port_taken_between_allocation_and_bind_is_repicked_for_every_task(
        local, workdir, monkeypatch, mode, victim):
    """Tasks on the host's loopback (in-graph; TFK8S_ISOLATION=loopback): another process takes a
    task's port right after the launch picked it.  The task moves to a new port, every task gets
    the new addresses (TF_CONFIG), and nothing is counted against the restart budget."""
    import socket

    from tfk8s_magics.backends.local import backend as local_backend
    from tfk8s_magics.spec import ClusterSpec

    monkeypatch.setenv("TFK8S_ISOLATION", "loopback")
    real, grabbed = local_backend.free_ports, []

    def picked_then_taken(n):
        ports = real(n)
        if not grabbed and n > 1:  # the launch's allocation: take the victim's port at once
            index = [t.name for t in spec.tasks()].index(victim)
            s = socket.socket()
            s.bind(("127.0.0.1", ports[index]))
            s.listen(1)
            grabbed.append(s)
        return ports

    spec = ClusterSpec(name="grab", mode=mode, workers=2 if mode == "between" else 1,
                          ps=0 if mode == "between" else 1, script=MWMS_ONCE if mode == "between" else None,
                          restart_budget=0)
    monkeypatch.setattr(local_backend, "free_ports", picked_then_taken)
    try:
        cluster = tk.launch("grab", mode=mode, workers=spec.workers, ps=spec.ps, script=spec.script,
                            restart_budget=0, backend=local)
        taken = grabbed[0].getsockname()[1]
        if mode == "between":
            st = cluster.wait(timeout=240)
            assert st.phase == Phase.SUCCEEDED, (st.reason, cluster.logs()[-3000:], cluster.events())
            assert all("all-reduced: 2.0" in cluster.logs(t) for t in ("worker-0", "worker-1"))
        else:
            st = cluster.wait_ready(timeout=240)
            record = json.loads(local._dir("grab").record.read_text())
            for t in st.tasks:  # every live task was started with the same, new addresses
                raw = Path(f"/proc/{t.pid}/environ").read_text().split("\0")
                environ = dict(v.split("=", 1) for v in raw if "=" in v)
                assert json.loads(environ["TF_CONFIG"])["cluster"] == record["cluster"]
        moved = [e.message for e in cluster.events() if e.reason == "PortTaken"]
        assert len(moved) == 1 and f"127.0.0.1:{taken} was taken" in moved[0], cluster.events()
        assert st.task(victim).host != f"127.0.0.1:{taken}"
        role, index = victim.split("-")
        assert local.addresses("grab")[role][int(index)] == st.task(victim).host
        assert _restarts_used(local, "grab") == 0
        cluster.delete()
    finally:
        for s in grabbed:
            s.close()
