"""Pure rules of the first hour: strategy/cluster fit, the tasks' import path, task
environments, start-up noise, stalls, strategy options (no TensorFlow cluster)."""

import os
import sys

import pytest

from tfk8s_magics import scriptcheck, stall, taskenv
from tfk8s_magics.errors import SpecError
from tfk8s_magics.spec import ClusterSpec


@pytest.mark.parametrize("source, found", [
    ("import tensorflow as tf\ns = tf.distribute.MultiWorkerMirroredStrategy()\n",
     ["MultiWorkerMirroredStrategy"]),
    ("import tensorflow as tf\ns = tf.distribute.experimental.MultiWorkerMirroredStrategy()\n",
     ["MultiWorkerMirroredStrategy"]),
    ("from tensorflow.distribute import MultiWorkerMirroredStrategy as M\ns = M()\n",
     ["MultiWorkerMirroredStrategy"]),
    ("import tensorflow as tf\ns = tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy()\n",
     ["MultiWorkerMirroredStrategy"]),
    ("from tensorflow.python.distribute import collective_all_reduce_strategy as c\n"
     "s = c.CollectiveAllReduceStrategy()\n", ["CollectiveAllReduceStrategy"]),
    ("import tensorflow as tf\n# MultiWorkerMirroredStrategy is not used here\n"
     "s = tf.distribute.ParameterServerStrategy\nprint('MultiWorkerMirroredStrategy')\n", []),
])
def test_collective_strategies_are_found_in_the_source_not_in_comments_or_strings(source, found):
    assert scriptcheck.collective_strategies(source) == found


def test_a_collective_strategy_with_parameter_servers_is_refused_in_one_sentence():
    mwms = "import tensorflow as tf\nstrategy = tf.distribute.MultiWorkerMirroredStrategy()\n"
    with pytest.raises(SpecError) as e:
        ClusterSpec(name="m", workers=2, ps=1, script=mwms)
    text = str(e.value)
    assert "waits forever when the cluster has parameter servers (--ps 1)" in text
    assert "launch it with --ps 0" in text and "ParameterServerStrategy" in text
    assert text.count(". ") == 0  # one sentence
    # The same script fits a cluster without parameter servers; PS scripts fit PS clusters.
    assert ClusterSpec(name="m", workers=2, ps=0, script=mwms).ps == 0
    ps_script = "import tensorflow as tf\ns = tf.compat.v1.train.replica_device_setter(ps_tasks=1)\n"
    assert ClusterSpec(name="m", workers=2, ps=1, script=ps_script).ps == 1


def test_the_import_check_searches_the_script_folder_then_pythonpath(tmp_path, monkeypatch):
    folder, extra = tmp_path / "proj", tmp_path / "extra"
    folder.mkdir()
    extra.mkdir()
    (folder / "helper.py").write_text("X = 1\n")
    (extra / "shared_lib.py").write_text("Y = 2\n")
    source = "import json\nimport helper\nimport shared_lib\nimport nowhere_to_be_found\n"
    pythonpath = scriptcheck.task_pythonpath({"PYTHONPATH": str(extra)}, {"PYTHONPATH": "/inherited"})
    assert pythonpath == os.pathsep.join([str(extra), "/inherited"])  # --env extends, in front
    path = scriptcheck.task_import_path(str(folder), pythonpath)
    assert path[:3] == [str(folder), str(extra), "/inherited"]
    assert os.getcwd() not in path  # as `python path/script.py`: not the caller's folder
    assert scriptcheck.missing_imports(source, str(folder), pythonpath) == ["nowhere_to_be_found"]
    # Installed packages, editable installs included (tfk8s_magics is one here), are found.
    assert scriptcheck.missing_imports("import tfk8s_magics\nimport numpy\n", str(folder), None) == []
    # Not the caller's folder: a module only there is missing for the tasks.
    (tmp_path / "only_in_cwd.py").write_text("")
    monkeypatch.chdir(tmp_path)
    assert scriptcheck.missing_imports("import only_in_cwd\n", str(folder), None) == ["only_in_cwd"]
    with pytest.raises(SpecError) as e:
        scriptcheck.check_imports(source, str(folder), pythonpath)
    assert f"found neither in {folder}, {extra}, /inherited nor in the library paths of" in str(e.value)
    assert "pip install" not in str(e.value)


def test_sibling_modules_must_travel_with_the_script_to_kubernetes(tmp_path):
    (tmp_path / "helper.py").write_text("X = 1\n")
    source = "import helper\nimport json\n"
    with pytest.raises(SpecError, match=f"add --file {tmp_path / 'helper.py'}"):
        scriptcheck.check_files_travel(source, str(tmp_path), [])
    scriptcheck.check_files_travel(source, str(tmp_path), [str(tmp_path / "helper.py")])


def test_a_task_environment_is_an_allow_list_where_flags_win():
    inherited = {
        "PATH": "/bin", "HOME": "/home/u", "LC_ALL": "C.UTF-8", "PYTHONPATH": "/site",
        "TF_USE_LEGACY_KERAS": "1",  # as the hub exports it
        "JUPYTER_TOKEN": "secret", "KUBERNETES_SERVICE_HOST": "10.0.0.1", "RANDOM_THING": "x",
    }
    env = taskenv.build(inherited, {"PYTHONPATH": "/mine", "MY_FLAG": "on"},
                        {"TF_CONFIG": "{}", "TFK8S_TASK": "worker-0"}, legacy_keras=False)
    assert "TF_USE_LEGACY_KERAS" not in env  # --no-legacy-keras wins over the inherited 1
    assert not {"JUPYTER_TOKEN", "KUBERNETES_SERVICE_HOST", "RANDOM_THING"} & set(env)
    assert env["PATH"] == "/bin" and env["LC_ALL"] == "C.UTF-8" and env["MY_FLAG"] == "on"
    assert env["PYTHONPATH"] == os.pathsep.join(["/mine", "/site"])
    assert env["TF_CONFIG"] == "{}" and env["TF_CPP_MIN_LOG_LEVEL"] == "2"
    legacy = taskenv.build(inherited, {}, {}, legacy_keras=True)
    assert legacy["TF_USE_LEGACY_KERAS"] == "1"
    loud = taskenv.build({**inherited, "TFK8S_QUIET": "0"}, {}, {}, legacy_keras=True)
    assert "TF_CPP_MIN_LOG_LEVEL" not in loud  # one setting brings TensorFlow's lines back
    chosen = taskenv.build(inherited, {"TF_CPP_MIN_LOG_LEVEL": "0"}, {}, legacy_keras=True)
    assert chosen["TF_CPP_MIN_LOG_LEVEL"] == "0"  # the user's --env wins over quiet


@pytest.mark.parametrize("line, noise", [
    ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR", True),
    ("I0000 00:00:1795409683.513348    8130 cudart_stub.cc:31] Could not find cuda drivers on your "
     "machine, GPU will not be used.", True),
    ("E0000 00:00:1795409712.183075    8130 cuda_platform.cc:52] failed call to cuInit: INTERNAL: "
     "CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)", True),
    ("W0000 00:00:1795409712.1 8130 cpu_feature_guard.cc:1] oneDNN custom operations are on.", True),
    ("E0000 00:00:1795409712.1 8130 grpc_server_lib.cc:618] UNKNOWN: Could not start gRPC server", False),
    ("Traceback (most recent call last):", False),
    ("I am the user's own line", False),
])
def test_only_start_up_noise_is_hidden(line, noise):
    assert taskenv.is_noise(line) is noise


def test_a_stall_needs_every_task_running_and_the_full_timeout():
    acts = [stall.TaskActivity("worker-0", 100.0, "epoch 1"), stall.TaskActivity("ps-0", 90.0, "")]
    assert stall.detect(True, acts, [50.0], now=219.0, timeout=120) is None
    found = stall.detect(True, acts, [50.0], now=221.0, timeout=120)
    assert found is not None and found.since == 100.0
    text = found.describe(now=230.0)
    assert text.startswith("stalled: no log line, progress or task exit for 2m 10s")
    assert "worker-0: 'epoch 1'" in text and "ps-0: no output" in text
    assert stall.detect(False, acts, [], now=1000.0, timeout=120) is None  # not all running
    assert stall.detect(True, acts, [200.0], now=221.0, timeout=120) is None  # progress counts
    assert stall.detect(True, acts, [], now=1000.0, timeout=0) is None  # 0 turns it off
    assert stall.Stall.from_dict(found.to_dict()) == found
    assert stall.Stall.from_dict({"since": "x"}) is None  # read leniently


def test_strategy_options_compare_by_settings_not_identity():
    from tfk8s_magics.ingraph import options_key

    class Fixed:
        def __init__(self, n):
            self.n = n

    assert options_key({"variable_partitioner": Fixed(2)}) == options_key({"variable_partitioner": Fixed(2)})
    assert options_key({"variable_partitioner": Fixed(2)}) != options_key({"variable_partitioner": Fixed(3)})
    assert options_key({}) != options_key({"variable_partitioner": Fixed(2)})


def test_interpreter_path_is_what_a_fresh_interpreter_sees():
    path = scriptcheck.interpreter_path()
    assert any("site-packages" in p for p in path)
    assert os.getcwd() not in path and "" not in path
    assert sys.executable
