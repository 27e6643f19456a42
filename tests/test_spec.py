"""The cluster spec and TF_CONFIG generation: pure code, literal expectations."""

import json

import pytest

from tfk8s_magics.errors import SpecError, TaskNotFound
from tfk8s_magics.spec import ClusterSpec, Resources, Task
from tfk8s_magics.tfconfig import cluster_def, coordinator_cluster_def, tf_config

SCRIPT = "print('hi')\n"


def test_tasks_are_listed_chief_ps_worker_evaluator():
    spec = ClusterSpec(name="m", workers=2, ps=2, chief=1, evaluator=1, script=SCRIPT)
    assert [t.name for t in spec.tasks()] == [
        "chief-0", "ps-0", "ps-1", "worker-0", "worker-1", "evaluator-0",
    ]
    assert spec.replicas() == {"chief": 1, "ps": 2, "worker": 2, "evaluator": 1}


def test_tf_config_for_every_task_is_generated():
    spec = ClusterSpec(name="m", workers=2, ps=1, script=SCRIPT)
    ports = {"ps-0": 1000, "worker-0": 1001, "worker-1": 1002}
    cluster = cluster_def(spec, lambda t: f"127.0.0.1:{ports[t.name]}")
    assert cluster == {"ps": ["127.0.0.1:1000"], "worker": ["127.0.0.1:1001", "127.0.0.1:1002"]}
    assert json.loads(tf_config(cluster, Task("worker", 1))) == {
        "cluster": {"ps": ["127.0.0.1:1000"], "worker": ["127.0.0.1:1001", "127.0.0.1:1002"]},
        "task": {"type": "worker", "index": 1},
    }


def test_coordinator_sees_itself_as_chief():
    spec = ClusterSpec(name="ig", mode="in-graph", workers=1, ps=1)
    cluster = {"ps": ["a:1"], "worker": ["b:2"]}
    assert coordinator_cluster_def(spec, cluster, "c:3") == {
        "chief": ["c:3"], "ps": ["a:1"], "worker": ["b:2"],
    }


@pytest.mark.parametrize("mode", ["in-graph", "ingraph", "IN_GRAPH", "in_graph"])
def test_mode_spellings_normalise(mode):
    assert ClusterSpec(name="ig", mode=mode, workers=1, ps=1).mode == "in-graph"


def test_spec_round_trips_through_dict():
    spec = ClusterSpec(
        name="m", workers=2, ps=1, script=SCRIPT, env={"A": "1"},
        resources={"worker": Resources(cpu="2", memory="4Gi", gpus=1)},
        tolerations=({"key": "gpu", "operator": "Exists"},), node_selector={"pool": "gpu"},
    )
    again = ClusterSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec
    assert again.resources_for("worker") == Resources(cpu="2", memory="4Gi", gpus=1)
    assert again.resources_for("ps") == Resources()


def test_a_record_is_read_leniently_and_not_validated_again():
    record = ClusterSpec(name="m", workers=3, script=SCRIPT).to_dict()
    assert record["schema_version"] == 1
    # a newer writer: unknown keys are ignored
    newer = {**record, "schema_version": 2, "shards": 4, "gang": {"queue": "q"}}
    assert ClusterSpec.from_dict(newer).workers == 3
    # an older writer: missing keys take their defaults
    older = {k: v for k, v in record.items() if k not in ("legacy_keras", "schema_version", "queue")}
    assert ClusterSpec.from_dict(older).legacy_keras is True
    # the script is not compiled again on a read (it was when the spec was made)
    assert ClusterSpec.from_dict({**record, "script": "def broken(:"}).script == "def broken(:"


def test_an_unreadable_record_is_one_sentence():
    record = ClusterSpec(name="m", script=SCRIPT).to_dict()
    with pytest.raises(SpecError, match=r"record of cluster 'm' cannot be read \('workers' is str, not int"):
        ClusterSpec.from_dict({**record, "workers": "two"})
    with pytest.raises(SpecError, match="it has no name"):
        ClusterSpec.from_dict({k: v for k, v in record.items() if k != "name"})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"name": "Bad_Name"}, "is not valid"),
        ({"name": "-x"}, "is not valid"),
        ({"name": "a" * 41}, "at most 40"),
        ({"name": ""}, "needs a name"),
        ({"mode": "sideways"}, "unknown mode 'sideways'"),
        ({"workers": 0}, "needs at least 1 worker"),
        ({"workers": -1}, "--workers -1 is out of range"),
        ({"ps": -2}, "--ps -2 is out of range"),
        ({"workers": "two"}, "'two' is not a whole number"),
        ({"chief": 2}, "--chief 2 is out of range"),
        ({"script": None}, "needs a training script"),
        ({"script": "   "}, "needs a training script"),
        ({"script": "def f(:\n"}, "does not compile"),
        ({"env": {"TF_CONFIG": "x"}}, "cannot be overridden"),
        ({"env": {"1BAD": "x"}}, "is not valid"),
        ({"ps_grace_period": -1}, "--ps-grace -1"),
        ({"restart_budget": -1}, "--restarts -1 is out of range"),
        ({"resources": {"boss": {}}}, "unknown role 'boss'"),
        ({"resources": {"worker": {"cpu": "lots"}}}, "not a Kubernetes quantity"),
    ],
)
def test_invalid_between_specs_say_what_is_wrong(kwargs, message):
    base = {"name": "ok", "workers": 1, "script": SCRIPT}
    base.update(kwargs)
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ClusterSpec(**base)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"script": SCRIPT}, "takes no cell body"),
        ({"ps": 0}, "needs at least 1 ps and 1 worker"),
        ({"workers": 0}, "needs at least 1 ps and 1 worker"),
        ({"chief": 1}, "has no chief or evaluator"),
    ],
)
def test_invalid_in_graph_specs_say_what_is_wrong(kwargs, message):
    base = {"name": "ig", "mode": "in-graph", "workers": 1, "ps": 1}
    base.update(kwargs)
    with pytest.raises(SpecError, match=message):
        ClusterSpec(**base)


def test_task_names_parse_and_unknown_tasks_are_named():
    assert Task.parse("worker-12") == Task("worker", 12)
    with pytest.raises(SpecError, match="not a task name"):
        Task.parse("boss-1")
    spec = ClusterSpec(name="m", workers=2, script=SCRIPT)
    with pytest.raises(TaskNotFound, match="its tasks are worker-0, worker-1"):
        spec.task("worker-7")


def test_the_local_record_is_versioned(tmp_path):
    from tfk8s_magics.backends.local.layout import RECORD_SCHEMA_VERSION, read_json, write_record

    write_record(tmp_path / "cluster.json", {"spec": ClusterSpec(name="m", script=SCRIPT).to_dict()})
    record = read_json(tmp_path / "cluster.json")
    assert record["schema_version"] == RECORD_SCHEMA_VERSION == 1
    assert ClusterSpec.from_dict(record["spec"]).name == "m"
