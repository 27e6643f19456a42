"""Admin settings: traitlets with help, validation, and the chart's JSON values file."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from traitlets import TraitError
from traitlets.config import Config

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "hub_config"))

from tfk8s_hub.settings import LabSettings, load_values_file  # noqa: E402


def test_every_setting_has_help():
    for name, trait in LabSettings.class_traits(config=True).items():
        assert trait.help and len(trait.help) > 20, name


def test_defaults():
    s = LabSettings()
    assert s.storage_class == "glusterfs"
    assert s.default_backend == "kubernetes"
    assert s.stop_clusters_on_stop is True
    assert s.extension_environment() == {
        "TFK8S_BACKEND": "kubernetes",
        "TFK8S_IMAGE": "tfk8s/tensorflow-task:0.1.0",
        "TFK8S_GPU_IMAGE": "tfk8s/tensorflow-task-gpu:0.1.0",
        "TFK8S_STORAGE_CLASS": "glusterfs",
        "TFK8S_RESTARTS": "2",
        "TFK8S_PS_GRACE": "30",
        "TFK8S_DETACHED_TTL": "86400",  # finished detached runs end (no TFK8S_TTL: none set)
        "TFK8S_LEGACY_KERAS": "1",
        "TFK8S_DATA_SIZE": "10Gi",
        "TFK8S_LOG_SIZE": "10Gi",
        "TF_USE_LEGACY_KERAS": "1",
    }
    # culling or deleting a user keeps the home; a fresh node has minutes to pull the image
    assert (s.delete_pvc, s.start_timeout) == (False, 300)
    assert (s.image_pull_secrets, s.copy_secrets, s.service_account_annotations) == ([], [], {})
    assert s.queue is None


def test_hub_namespace_from_pod_namespace(monkeypatch):
    monkeypatch.setenv("POD_NAMESPACE", "lab")
    assert LabSettings().hub_namespace == "lab"


def test_set_the_jupyter_way():
    c = Config()
    c.LabSettings.storage_class = "kadalu.gluster"
    c.LabSettings.legacy_keras = False
    s = LabSettings(config=c)
    assert s.storage_class == "kadalu.gluster"
    env = s.extension_environment()
    assert "TF_USE_LEGACY_KERAS" not in env and env["TFK8S_LEGACY_KERAS"] == "0"


def test_what_the_hub_sets_reaches_the_extension(monkeypatch):
    """Each admin choice arrives in a notebook's launch as the same value (no drift)."""
    import tfk8s_magics as tk
    from tfk8s_magics.magics import TFClusterMagics

    c = Config()
    c.LabSettings.legacy_keras = False
    c.LabSettings.restart_budget = 5
    c.LabSettings.ps_grace_period = 0
    c.LabSettings.task_image = "registry.example/task:9"
    for key, value in LabSettings(config=c).extension_environment().items():
        monkeypatch.setenv(key, value)
    spec = tk.make_spec("x", script="print(1)")
    assert (spec.legacy_keras, spec.restart_budget, spec.ps_grace_period) == (False, 5, 0.0)
    magics = TFClusterMagics(shell=None)
    assert (magics.legacy_keras, magics.restart_budget, magics.ps_grace_period) == (False, 5, 0.0)
    from tfk8s_magics.backends.kubernetes.settings import settings_from_env

    assert settings_from_env(namespace="ns").image == "registry.example/task:9"


def test_the_docs_name_exactly_the_variables_the_hub_sets(tmp_path):
    from tfk8s_hub.local import local_environment

    page = (Path(__file__).resolve().parent.parent / "docs" / "users" / "magics.md").read_text()
    sentence = page.split("<!-- hub-env -->")[1]
    named = set(re.findall(r"`([A-Z0-9_]+)`", sentence))
    s = LabSettings()
    emitted = set(s.extension_environment()) | set(local_environment(s, tmp_path, "u"))
    assert named == emitted - {"IPYTHONDIR"}


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"quota": {"requests.cpu": "lots"}}, ["quota", "'lots'", "quantity"]),
        ({"default_limits": {"memory": "4 GB"}}, ["default_limits", "4 GB"]),
        ({"service_account": "Not_Valid"}, ["service_account", "Not_Valid", "lowercase"]),
        ({"default_backend": "slurm"}, ["default_backend"]),
    ],
)
def test_bad_values_are_refused_with_the_value_named(kwargs, words):
    with pytest.raises(TraitError) as err:
        LabSettings(**kwargs)
    for word in words:
        assert word in str(err.value)


def test_values_file(tmp_path):
    path = tmp_path / "values.json"
    path.write_text(
        json.dumps({"lab": {"storage_class": "cephfs", "quota": {"pods": "5"}}, "hub": {}})
    )
    c = Config()
    assert load_values_file(c, path)["hub"] == {}
    s = LabSettings(config=c)
    assert (s.storage_class, s.quota) == ("cephfs", {"pods": "5"})


def test_values_file_missing_is_not_an_error(tmp_path, monkeypatch):
    monkeypatch.delenv("TFK8S_HUB_VALUES", raising=False)
    assert load_values_file(Config()) == {}
    assert load_values_file(Config(), tmp_path / "nope.json") == {}


def test_values_file_unknown_key_is_named(tmp_path):
    path = tmp_path / "values.json"
    path.write_text(json.dumps({"lab": {"storage_clas": "x"}}))
    with pytest.raises(ValueError, match="storage_clas"):
        load_values_file(Config(), path)
