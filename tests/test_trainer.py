"""The Trainer base class: options, refused shapes, the generated script, and real training.

The slow tests run real TensorFlow on the local backend: synchronous
training on 2 workers (MultiWorkerMirroredStrategy) with a worker killed
mid-run that resumes from the checkpoint's step, asynchronous training
(ParameterServerStrategy, chief as coordinator), the export layout, and the
exported model served and queried.
"""

from __future__ import annotations

import json
import os
import re
import signal

import numpy as np
import pytest
import requests
import yaml

from tests.conftest import wait_for
from tfk8s_magics import api
from tfk8s_magics.errors import SpecError
from tfk8s_magics.trainer import TrainerOptions
from tfk8s_magics.trainer.launch import trainer_script

TRAINER = """
import time

import numpy as np
import tensorflow as tf

import tfk8s_magics

PAUSE = 0.0


class Tiny(tfk8s_magics.Trainer):
    def build_model(self):
        inp = tf.keras.Input((4,), name="x")
        out = tf.keras.layers.Dense(1, name="y")(inp)
        model = tf.keras.Model(inp, out)
        model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
        return model

    def dataset(self, ctx):
        rng = np.random.default_rng(ctx.input_pipeline_id)
        x = rng.normal(size=(256, 4)).astype("float32")
        y = x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32")
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(
            ctx.get_per_replica_batch_size(self.options.batch_size))
        if PAUSE:
            # Slow each batch down so a test can kill a worker mid-run.
            def pause(a, b):
                time.sleep(PAUSE)
                return a, b
            ds = ds.map(lambda a, b: tf.py_function(pause, [a, b], [tf.float32, tf.float32]))
            ds = ds.map(lambda a, b: (tf.ensure_shape(a, [None, 4]), tf.ensure_shape(b, [None, 1])))
        return ds
"""


# -- options and shapes (no TensorFlow) -------------------------------------------
@pytest.mark.parametrize("bad, sentence", [
    ({"steps": 0}, "--steps 0 is out of range: give a count from 1 to"),
    ({"steps": "ten"}, "--steps 'ten' is not a whole number"),
    ({"batch_size": 2.5}, "--batch-size 2.5 is not a whole number"),
    ({"sync": "maybe"}, "--sync 'maybe' is not valid: use 'sync'"),
    ({"checkpoint_every": -1}, "--checkpoint-every -1 is out of range"),
    ({"model_name": "My Model"}, "--model-name 'My Model' is not a valid model name"),
])
def test_bad_options_are_one_sentence(bad, sentence):
    with pytest.raises(SpecError) as err:
        TrainerOptions(**bad)
    assert str(err.value).startswith(sentence)


def test_unknown_option_names_the_known_ones():
    with pytest.raises(SpecError, match="unknown Trainer option 'stepz': use one of batch_size"):
        TrainerOptions.from_dict({"stepz": 3})


@pytest.mark.parametrize("shape, options, sentence", [
    ({"workers": 2, "ps": 1}, {}, "--sync sync (MultiWorkerMirroredStrategy) cannot use parameter servers"),
    ({"workers": 2, "ps": 1}, {"sync": "async"}, "--sync async between-graph needs a chief"),
    ({"workers": 2, "ps": 0, "chief": 1}, {"sync": "async"}, "--sync async trains with parameter servers"),
    ({"mode": "in-graph", "workers": 1, "ps": 1}, {}, "--trainer runs between-graph"),
])
def test_shapes_that_cannot_train_are_refused_at_launch(local, shape, options, sentence):
    with pytest.raises(SpecError) as err:
        api.launch("t", backend=local, script=TRAINER, trainer="Tiny", **options, **shape)
    assert str(err.value).startswith(sentence)
    assert str(err.value).count(". ") == 0  # one sentence
    assert not (local.clusters_dir / "t").exists()


def test_trainer_name_must_be_defined_by_the_cell():
    with pytest.raises(SpecError, match="the cell defines no class Tiniest .its classes: Tiny"):
        trainer_script("Tiniest", TrainerOptions(), TRAINER)


def test_script_ends_with_the_runtime_call_and_options():
    script = trainer_script("Tiny", TrainerOptions(steps=7, sync="async"), TRAINER)
    assert script.startswith(TRAINER)
    last = script.strip().splitlines()[-1]
    assert last.startswith("_tfk8s_trainer.run(Tiny, ")
    options = json.loads(re.search(r"run\(Tiny, '(.*)'\)", last).group(1))
    assert options["steps"] == 7 and options["sync"] == "async"
    compile(script, "<script>", "exec")


def test_a_class_from_a_module_is_imported_by_name():
    from tfk8s_magics.trainer import Trainer

    class Local(Trainer):
        def build_model(self):
            return None

        def dataset(self, input_context):
            return None

    Local.__module__ = "mypkg.trainers"
    assert trainer_script(Local, TrainerOptions()).startswith("from mypkg.trainers import Local\n")
    with pytest.raises(SpecError, match="is not a subclass of tfk8s_magics.Trainer"):
        trainer_script(dict, TrainerOptions())


@pytest.mark.parametrize("edit, sentence", [
    (("def dataset(self, ctx):", "def dataset(self):"),
     "Tiny.dataset(self) does not take what the platform passes it: define it as "
     "dataset(self, input_context)."),
    (("def build_model(self):", "def build_model(self, strategy):"),
     "Tiny.build_model(self, strategy) does not take what the platform passes it: define it as "
     "build_model(self)."),
    (("def dataset(self, ctx):", "def data(self, ctx):"),
     "Tiny does not override dataset(): a Trainer must define dataset(self, input_context)."),
])
def test_a_trainer_the_platform_cannot_call_is_refused_at_launch(local, edit, sentence):
    """Issue 27 item 8: checked before anything is created, not a TypeError in every task."""
    with pytest.raises(SpecError) as err:
        api.launch("t", backend=local, script=TRAINER.replace(*edit), trainer="Tiny", workers=2, ps=0)
    assert str(err.value) == sentence
    assert not (local.clusters_dir / "t").exists()


def test_a_trainer_class_is_checked_too():
    from tfk8s_magics.trainer import Trainer

    class NoData(Trainer):
        def build_model(self):
            return None

    class OldData(NoData):
        def dataset(self):
            return None

    with pytest.raises(SpecError, match=r"^NoData does not override dataset\(\)"):
        trainer_script(NoData, TrainerOptions())
    with pytest.raises(SpecError, match=r"^OldData.dataset\(self\) does not take what the platform passes"):
        trainer_script(OldData, TrainerOptions())


def test_magic_flags_are_the_registry_options(capsys, monkeypatch, tmp_path):
    """One definition per option: the flags and TrainerOptions' fields come from the registry."""
    from tfk8s_magics.magics import TFClusterMagics

    # No kubeconfig, and a backend of this test's own (the API caches one per name).
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.setattr(api, "_backends", {})

    magics = TFClusterMagics(shell=None)
    magics.tfcluster("render t --trainer Tiny --workers 2 --steps 9 --batch-size 8 --checkpoint-every 3",
                     TRAINER)
    out = capsys.readouterr().out
    # one JobSet with a single replicated Job, the 2 workers (sync MWMS: no parameter server)
    (jobset,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "JobSet"]
    assert [(r["name"], r["template"]["spec"]["completions"])
            for r in jobset["spec"]["replicatedJobs"]] == [("worker", 2)]
    assert "t-worker-0-1.t.default.svc:2222" in out and "t-ps-0" not in out
    assert '\\"steps\\": 9' in out or '"steps": 9' in out
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="cannot use parameter servers"):
        magics.tfcluster("render t --trainer Tiny --workers 2 --ps 1", TRAINER)
    with pytest.raises(UsageError, match="--sync 'later' is not valid"):
        magics.tfcluster("render t --trainer Tiny --sync later", TRAINER)


# -- real TensorFlow ------------------------------------------------------------------
def _in_process_predict(path, x):
    import tensorflow as tf

    fn = tf.saved_model.load(str(path)).signatures["serving_default"]
    return fn(x=tf.constant(x, tf.float32))["y"].numpy()


@pytest.mark.slow
def test_plain_process_run_exports_versions_and_resumes(tmp_path, monkeypatch):
    """Without TF_CONFIG the same class trains in this process; a second run resumes from the
    checkpoint (step 6, so no more steps) and exports version 2."""
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    monkeypatch.setenv("TFK8S_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TFK8S_CHECKPOINT_DIR", raising=False)
    ns: dict = {}
    exec(compile(TRAINER, "<trainer>", "exec"), ns)
    from tfk8s_magics.trainer import run

    first = run(ns["Tiny"], {"steps": 6, "checkpoint_every": 4, "model_name": "tiny"})
    assert first.resumed_from == 0
    second = run(ns["Tiny"], {"steps": 6, "model_name": "tiny"})
    assert second.resumed_from == 6
    models = tmp_path / "logs" / "models" / "tiny"
    assert sorted(p.name for p in models.iterdir()) == ["1", "2"]
    for v in ("1", "2"):
        assert (models / v / "saved_model.pb").exists() and (models / v / "variables").is_dir()
    assert list((tmp_path / "logs" / "train").glob("events.out.tfevents.*"))


@pytest.mark.slow
def test_sync_training_resumes_from_the_checkpoint_after_the_workers_are_killed(local, workdir):
    script = TRAINER.replace("PAUSE = 0.0", "PAUSE = 0.02")
    cluster = api.launch("rs", backend=local, script=script, trainer="Tiny", workers=2, ps=0,
                         restart_budget=6, steps=240, checkpoint_every=40, batch_size=16)
    log_dir = cluster.status().log_dir.path
    ckpt = os.path.join(log_dir, "checkpoints", "ckpt-40.index")
    wait_for(lambda: os.path.exists(ckpt), timeout=300, what="the first checkpoint", interval=0.1)
    # Both workers die at once (as when their node is lost): each is restarted (killed by a
    # signal: retryable) and both resume from the checkpoint.  A single worker's death makes its
    # peer fail at the next all-reduce with exit 1, which the lifecycle policy does not retry yet.
    for task in ("worker-1", "worker-0"):
        os.kill(cluster.status().task(task).pid, signal.SIGKILL)
    st = cluster.wait(timeout=600)
    assert st.phase == "succeeded", (st.reason, cluster.logs(tail=30))
    restarted = {e.task for e in cluster.events() if e.reason == "Restarted"}
    assert restarted == {"worker-0", "worker-1"}, cluster.events()
    resumed = [int(n) for n in re.findall(r"resumed from step (\d+)", cluster.logs())]
    assert len(resumed) == 2 and all(40 <= n < 240 for n in resumed), cluster.logs(tail=40)
    assert st.progress.step == 240 and st.progress.total == 240
    assert "MultiWorkerMirroredStrategy" in cluster.logs("worker-0")

    import tensorflow as tf

    assert tf.train.latest_checkpoint(os.path.join(log_dir, "checkpoints")).endswith("ckpt-240")
    models = os.path.join(log_dir, "models")
    assert os.listdir(models) == ["rs"] and os.listdir(os.path.join(models, "rs")) == ["1"]
    assert os.path.exists(os.path.join(models, "rs", "1", "saved_model.pb"))
    assert not [d for d in os.listdir(os.path.join(log_dir, "checkpoints")) if d.startswith(".scratch")]
    assert [f for f in os.listdir(os.path.join(log_dir, "train")) if f.startswith("events.out.tfevents")]

    info = cluster.serve()
    assert (info.model, info.version) == ("rs", 1)
    x = np.random.default_rng(0).normal(size=(5, 4)).astype("float32")
    r = requests.post(info.predict_url(), json={"instances": x.tolist()}, timeout=60)
    assert r.status_code == 200, r.text
    assert np.array_equal(np.asarray(r.json()["predictions"], np.float32),
                          _in_process_predict(os.path.join(models, "rs", "1"), x))
    assert cluster.serve().reused is True
    pid = info.pid
    assert cluster.serve(stop=True) is True
    from tfk8s_magics.lifeline import pid_alive

    wait_for(lambda: not pid_alive(pid), timeout=10, what="the server to exit")


@pytest.mark.slow
def test_async_training_with_a_chief_coordinating_parameter_servers(local, workdir):
    cluster = api.launch("as", backend=local, script=TRAINER, trainer="Tiny", chief=1, ps=1, workers=1,
                         ps_grace_period=0, sync="async", steps=30, checkpoint_every=10, summary_every=5)
    st = cluster.wait(timeout=600)
    assert st.phase == "succeeded", (st.reason, cluster.logs(tail=30))
    assert "ParameterServerStrategy" in cluster.logs("chief-0")
    assert "the coordinator finished training" in cluster.logs("worker-0")
    assert st.progress.step == 30 and "loss" in st.progress.metrics
    assert os.path.exists(os.path.join(st.log_dir.path, "models", "as", "1", "saved_model.pb"))


@pytest.mark.slow
def test_serving_a_cluster_that_exported_nothing_is_one_sentence_and_leaves_nothing(local, workdir):
    cluster = api.launch("none", backend=local, script="print('no model')\n", workers=1, ps=0)
    cluster.wait(timeout=300)
    root = local.clusters_dir / "none"
    before = sorted(p.name for p in root.iterdir())
    with pytest.raises(SpecError) as err:
        cluster.serve()
    assert str(err.value).startswith("cluster 'none' has exported no model yet")
    assert sorted(p.name for p in root.iterdir()) == before
    assert cluster.serve(stop=True) is False


@pytest.mark.slow
def test_sync_training_resumes_after_one_worker_is_killed(local, workdir):
    """One worker SIGKILLed: its peer's lost collective is the same incident, the group restarts
    once, and both resume from the checkpoint's step."""
    script = TRAINER.replace("PAUSE = 0.0", "PAUSE = 0.02")
    cluster = api.launch("one", backend=local, script=script, trainer="Tiny", workers=2, ps=0,
                         restart_budget=1, steps=200, checkpoint_every=40, batch_size=16)
    ckpt = os.path.join(cluster.status().log_dir.path, "checkpoints", "ckpt-40.index")
    wait_for(lambda: os.path.exists(ckpt), timeout=300, what="the first checkpoint", interval=0.1)
    os.kill(cluster.status().task("worker-1").pid, signal.SIGKILL)
    st = cluster.wait(timeout=600)
    assert st.phase == "succeeded", (st.reason, cluster.logs(tail=30))
    resumed = [int(n) for n in re.findall(r"resumed from step (\d+)", cluster.logs())]
    assert len(resumed) == 2 and all(40 <= n < 200 for n in resumed), cluster.logs(tail=40)
    assert st.progress.step == 200
