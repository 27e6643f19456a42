"""The one-machine profile: its config in a real JupyterHub, and the cleanup of user processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from jupyterhub.app import JupyterHub

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "hub_config"))

from tfk8s_hub.local import local_environment, prepare_user, stop_local_clusters  # noqa: E402
from tfk8s_hub.settings import LabSettings  # noqa: E402


def test_local_config_binds_loopback_only(tmp_path, monkeypatch):
    monkeypatch.setenv("TFK8S_LAB_DIR", str(tmp_path))
    monkeypatch.setenv("TFK8S_LAB_PORT", "8123")
    monkeypatch.setenv("TFK8S_LAB_PASSWORD", "a-long-password")
    app = JupyterHub()
    app.load_config_file(str(REPO / "hub_config" / "jupyterhub_config_local.py"))
    c = app.config
    assert c.JupyterHub.bind_url == "http://127.0.0.1:8123"
    assert c.JupyterHub.hub_bind_url.startswith("http://127.0.0.1:")
    assert c.ConfigurableHTTPProxy.api_url.startswith("http://127.0.0.1:")
    assert c.Spawner.ip == "127.0.0.1"
    assert c.JupyterHub.spawner_class == "simple"
    assert c.JupyterHub.authenticator_class == "shared-password"
    assert c.SharedPasswordAuthenticator.user_password == "a-long-password"
    assert c.Authenticator.allow_all is True
    assert (
        Path(c.ConfigurableHTTPProxy.command[0])
        == REPO / "node_modules" / ".bin" / "configurable-http-proxy"
    )
    assert c.JupyterHub.db_url == f"sqlite:///{tmp_path / 'jupyterhub.sqlite'}"


def test_user_environment_and_profile(tmp_path):
    env = local_environment(LabSettings(), tmp_path, "demo")
    assert env["TFK8S_BACKEND"] == "local"
    assert env["TFK8S_STATE_DIR"] == str(tmp_path / "users" / "demo" / "tfk8s")
    dirs = prepare_user(tmp_path, "demo")
    config = (dirs["ipython"] / "profile_default" / "ipython_config.py").read_text()
    assert 'extensions = ["tfk8s_magics"]' in config
    # A new user finds the example notebooks; a user's own edits are never overwritten.
    examples = dirs["home"] / "examples"
    assert {p.name for p in examples.glob("*.ipynb")} >= {
        "in_graph_walkthrough.ipynb", "between_graph_walkthrough.ipynb", "dashboard_tour.ipynb"}
    (examples / "dashboard_tour.ipynb").write_text("mine")
    prepare_user(tmp_path, "demo")
    assert (examples / "dashboard_tour.ipynb").read_text() == "mine"


def test_stop_ends_leftover_processes_of_that_user_only(tmp_path):
    mine, other = tmp_path / "alice" / "tfk8s", tmp_path / "bob" / "tfk8s"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"],
            env={**os.environ, "TFK8S_STATE_DIR": str(state)},
        )
        for state in (mine, other)
    ]
    try:
        time.sleep(0.2)
        stopped = stop_local_clusters(mine, grace=5)
        assert stopped == [f"pid {procs[0].pid}"]
        assert procs[0].wait(5) is not None
        assert procs[1].poll() is None
    finally:
        for p in procs:
            p.kill()
            p.wait()
