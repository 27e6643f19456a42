"""The three distributed-training patterns of TensorFlow's guides, each as a script of ours run on
the lab (real TensorFlow, local backend, tf-keras):

* multi-worker Keras ``fit`` with a helper module imported from the script's folder
  (``scripts/mwms_fit/``);
* a multi-worker custom training loop (``scripts/mwms_loop.py``);
* ``ParameterServerStrategy`` built by the user's code from ``tk.resolver`` with a variable
  partitioner, then ``fit``, a custom loop over ``ClusterCoordinator``, and evaluation
  (``scripts/ps_coordinator.py``).

Their data is made by the scripts (nothing is downloaded).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tfk8s_magics as tk
from tests.conftest import REPO
from tfk8s_magics.backends import Phase

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).parent / "scripts"


def test_multi_worker_keras_fit_with_a_helper_module_beside_the_script(local, workdir):
    cluster = tk.launch("kerasfit", workers=2, ps=0, backend=local,
                        script_path=str(SCRIPTS / "mwms_fit" / "train.py"))
    st = cluster.wait(timeout=600)
    logs = cluster.logs()
    assert st.phase == Phase.SUCCEEDED, logs[-4000:]
    for task in ("worker-0", "worker-1"):
        assert "Epoch 3/3" in cluster.logs(task), logs[-4000:]


def test_multi_worker_custom_training_loop(local, workdir):
    cluster = tk.launch("ctl", workers=2, ps=0, backend=local,
                        script_path=str(SCRIPTS / "mwms_loop.py"))
    st = cluster.wait(timeout=600)
    logs = cluster.logs()
    assert st.phase == Phase.SUCCEEDED, logs[-4000:]
    assert logs.count("Epoch: 2, accuracy:") == 2, logs[-4000:]


def test_parameter_server_training_from_a_resolver_with_fit_custom_loop_and_evaluation(state_dir, tmp_path):
    tk.launch("pstutorial", mode="in-graph", ps=2, workers=2, backend="local", wait_ready=300)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(SCRIPTS / "ps_coordinator.py")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    # The partitioner split the embedding over both parameter servers.
    assert "/job:ps/replica:0/task:0" in proc.stdout and "/job:ps/replica:0/task:1" in proc.stdout
    assert "Epoch 5/5" in out  # Model.fit
    assert "Finished epoch 3, accuracy is" in proc.stdout and "Final loss is" in proc.stdout
    assert proc.stdout.count("Evaluation accuracy:") == 2  # inline and distributed
