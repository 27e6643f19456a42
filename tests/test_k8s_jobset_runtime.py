"""A JobSet pod's container command, run for real: identity and TF_CONFIG from JobSet's naming.

The pod template the JobSet builder renders is the same for every task of a
role; each pod learns its index from ``JOB_COMPLETION_INDEX``.  Here that
exact command (``logcopy`` + the task runtime) runs as local processes with
the template's environment, addresses pointed at 127.0.0.1 instead of the
pods' DNS names (the only change), and real TensorFlow all-reduces across
the two workers — so the derivation, the per-task log copy and the exit
codes are proven end to end without a cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tfk8s_magics.backends.kubernetes import jobset as j
from tfk8s_magics.backends.kubernetes.settings import K8sSettings
from tfk8s_magics.lifecycle import LifecyclePolicy
from tfk8s_magics.ports import free_ports
from tfk8s_magics.spec import ClusterSpec

SCRIPT = """
import json, os
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
value = strategy.run(lambda: tf.constant(1.0))
total = strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)
print("task", os.environ["TFK8S_TASK"], "index", json.loads(os.environ["TF_CONFIG"])["task"],
      "sum", float(total), flush=True)
"""


def _template_env(js: dict, role: str) -> dict[str, str]:
    rjob = next(r for r in js["spec"]["replicatedJobs"] if r["name"] == role)
    container = rjob["template"]["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"]}, container["command"]


@pytest.mark.slow
def test_two_workers_from_one_template_all_reduce(tmp_path):
    spec = ClusterSpec(name="mw", workers=2, script=SCRIPT, legacy_keras=False)
    js = j.jobset(spec, K8sSettings(namespace="ns", image="x", user="u"), LifecyclePolicy.of(spec))
    env, command = _template_env(js, "worker")
    ports = free_ports(2)
    # The only change from the pod: where the names resolve.
    cluster = json.loads(env["TFK8S_CLUSTER_DEF"])
    assert cluster == {"worker": ["mw-worker-0-0.mw.ns.svc:2222", "mw-worker-0-1.mw.ns.svc:2222"]}
    env["TFK8S_CLUSTER_DEF"] = json.dumps({"worker": [f"127.0.0.1:{p}" for p in ports]})
    (tmp_path / "script.py").write_text(SCRIPT)
    env.update(TFK8S_SCRIPT=str(tmp_path / "script.py"), TFK8S_LOG_DIR=str(tmp_path / "log"),
               TFK8S_READY_FILE=str(tmp_path / "ready"), HOME=str(tmp_path))
    argv = [sys.executable if a == "python" else a for a in command]
    argv[argv.index("/log/tasks/{task}.log")] = str(tmp_path / "log/tasks/{task}.log")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "TFK8S_"))}
    procs = [
        subprocess.Popen(argv, env={**base, **env, "JOB_COMPLETION_INDEX": str(i)},
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         cwd=tmp_path)
        for i in range(2)
    ]
    try:
        outs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    for i, out in enumerate(outs):
        assert f"task worker-{i} index {{'index': {i}, 'type': 'worker'}} sum 2.0" in out, out
        # logcopy filled in "{task}" from the same identity.
        copy = (tmp_path / "log" / "tasks" / f"worker-{i}.log").read_text()
        assert f"task worker-{i} index" in copy


def test_a_pod_without_identity_fails_with_a_clear_exit(tmp_path):
    """No TF_CONFIG and no JOB_COMPLETION_INDEX: a broken template, not a hang or a retry."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "TFK8S_"))}
    out = subprocess.run(
        [sys.executable, "-m", "tfk8s_magics.runtime.task"],
        env={**base, "TFK8S_ROLE": "worker"}, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 3  # EXIT_SCRIPT_BROKEN: a restart cannot fix it
    assert "cannot tell which task it is" in out.stderr and "JOB_COMPLETION_INDEX" in out.stderr
