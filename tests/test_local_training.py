"""Real TensorFlow clusters on the local backend: between-graph (TF2 and TF1) and in-graph."""

import os
import re
from pathlib import Path

import psutil
import pytest

import tfk8s_magics as tk
from tfk8s_magics.backends import Phase

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).parent / "scripts"


def test_mwms_workers_all_reduce_across_processes_and_fit(local, workdir):
    cluster = tk.launch("mwms", workers=2, ps=0, script_path=str(SCRIPTS / "mwms_keras.py"),
                        backend=local)
    st = cluster.wait(timeout=240)
    logs = cluster.logs()
    assert st.phase == Phase.SUCCEEDED, logs[-3000:]
    # 1 + 2: each worker contributed its own value and got the sum of both.
    assert logs.count("ALLREDUCE 3.0") == 2, logs[-3000:]
    assert "[worker-0] KERAS tf_keras" in logs and "[worker-1] KERAS tf_keras" in logs
    # The Keras callback reported progress up to epochs * steps.
    assert st.progress is not None and (st.progress.step, st.progress.total) == (8, 8)
    assert st.progress.percent == 100.0
    assert "loss" in st.progress.metrics  # the final record keeps the last batch's metrics


#: Two workers all-reduce once; then worker-0 (the coordination service's leader) works on for
#: longer than TensorFlow's heartbeat timeout (10 s), as a chief's final save or evaluation does.
CHIEF_LINGERS = (
    "import json, os, time\n"
    "import tensorflow as tf\n"
    "strategy = tf.distribute.MultiWorkerMirroredStrategy()\n"
    "with strategy.scope():\n"
    "    v = tf.Variable(1.0)\n"
    "print('sum', strategy.reduce('SUM', strategy.run(lambda: v * 2.0), axis=None).numpy(), flush=True)\n"
    "if json.loads(os.environ['TF_CONFIG'])['task']['index'] == 0:\n"
    "    time.sleep(15)\n"
    "print('done', flush=True)\n"
)


def test_a_succeeded_run_whose_chief_ends_last_has_no_crash_message_in_its_logs(local, workdir):
    """Without a common end, worker-1's exit stops its heartbeats and worker-0, still running 10 s
    later, logs ``StartAbort … stopped sending heartbeats … The tasks have crashed``."""
    cluster = tk.launch("lingers", workers=2, ps=0, script=CHIEF_LINGERS, backend=local)
    st = cluster.wait(timeout=240)
    logs = cluster.logs()
    assert st.phase == Phase.SUCCEEDED, logs[-3000:]
    assert logs.count("sum 4.0") == 2 and logs.count("done") == 2, logs[-3000:]
    for crash in ("StartAbort", "stopped sending heartbeats", "The tasks have crashed"):
        assert crash not in logs, logs[-3000:]


def test_tf1_parameter_servers_hold_the_variables(local, workdir):
    cluster = tk.launch("tf1", workers=2, ps=2, ps_grace_period=0,
                        script_path=str(SCRIPTS / "tf1_ps.py"), backend=local)
    st = cluster.wait(timeout=240)
    logs = cluster.logs()
    assert st.phase == Phase.SUCCEEDED, logs[-3000:]
    devices = dict(re.findall(r"\[worker-0\] DEVICE (\S+) (\S+)", logs))
    assert set(devices) == {"global_step", "w", "b"}
    # replica_device_setter spreads variables round-robin over both PS tasks.
    assert {d.split("/task:")[1][0] for d in devices.values()} == {"0", "1"}
    assert all(d.startswith("/job:ps/task:") for d in devices.values())
    # Both workers trained the same shared variables: 2 x 20 steps.
    assert logs.count("GLOBAL_STEP 40") == 2, logs[-3000:]
    *_, final = cluster.watch()  # the watch ends once the supervisor is done
    assert all(t.phase == Phase.SUCCEEDED for t in final.tasks)
    assert final.task("ps-1").reason == "recycled after the workers finished"


def test_in_graph_cluster_driven_from_this_process(local):
    import tensorflow as tf

    cluster = tk.launch("ig", mode="in-graph", ps=2, workers=2, backend=local, wait_ready=240)
    strategy = cluster.connect()
    assert isinstance(strategy, tf.distribute.ParameterServerStrategy)
    assert strategy is tk.connect("ig", local)  # connecting again reuses the connection
    with strategy.scope():
        counter = tf.Variable(0.0)
        weights = tf.Variable(tf.zeros([4]))
    assert "/job:ps/" in counter.device and "/job:ps/" in weights.device
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    @tf.function
    def step():
        counter.assign_add(1.0)
        weights.assign_add(tf.ones([4]))
        return tf.constant(1)

    results = [coordinator.schedule(step) for _ in range(12)]
    coordinator.join()
    assert [r.fetch() for r in results] == [1] * 12
    assert counter.numpy() == 12.0
    assert weights.numpy().tolist() == [12.0] * 4
    st = cluster.status()
    assert st.phase == Phase.RUNNING and all(t.phase == Phase.RUNNING for t in st.tasks)
    # TensorFlow listens on every interface; an in-graph cluster's servers share the host's
    # loopback with the kernel (they dial its chief), and the loopback shim keeps them there.
    own = os.readlink("/proc/self/ns/net")
    for t in st.tasks:
        assert os.readlink(f"/proc/{t.pid}/ns/net") == own, t.name
    ports = {int(a.rsplit(":", 1)[1]) for hosts in local.addresses("ig").values() for a in hosts}
    host = [c.laddr for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port in ports]
    assert sorted(a.port for a in host) == sorted(ports), host
    assert all(a.ip in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for a in host), host
    # The coordinator's own progress reports speak for the cluster.
    tk.report_progress(12, total=12, loss=0.5)
    p = cluster.status().progress
    assert (p.step, p.total, p.task, p.metrics) == (12, 12, "chief-0", {"loss": 0.5})
    cluster.delete()
