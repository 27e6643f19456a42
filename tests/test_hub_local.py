"""The one-machine profile: its config in a real JupyterHub, and the cleanup of user processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from jupyterhub.app import JupyterHub

from tests.browserlab import lab_env
from tests.conftest import wait_for

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
    # The login page says how to log in (JupyterHub's announcement_login template variable).
    assert "log in with any user name" in c.JupyterHub.template_vars["announcement_login"]


def test_local_config_takes_the_three_ports_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TFK8S_LAB_DIR", str(tmp_path))
    monkeypatch.setenv("TFK8S_LAB_PORT", "8123")
    monkeypatch.setenv("TFK8S_LAB_HUB_PORT", "8124")
    monkeypatch.setenv("TFK8S_LAB_PROXY_API_PORT", "8125")
    app = JupyterHub()
    app.load_config_file(str(REPO / "hub_config" / "jupyterhub_config_local.py"))
    assert app.config.JupyterHub.hub_bind_url == "http://127.0.0.1:8124"
    assert app.config.ConfigurableHTTPProxy.api_url == "http://127.0.0.1:8125"


def test_user_environment_and_profile(tmp_path):
    env = local_environment(LabSettings(), tmp_path, "demo")
    assert env["TFK8S_BACKEND"] == "local"
    assert env["TFK8S_STATE_DIR"] == str(tmp_path / "users" / "demo" / "tfk8s")
    dirs = prepare_user(tmp_path, "demo")
    config = (dirs["ipython"] / "profile_default" / "ipython_config.py").read_text()
    assert "_tfk8s_magics.load_ipython_extension(get_ipython())" in config
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


# -- scripts/lab and scripts/bootstrap -----------------------------------------------------
LAB = REPO / "scripts" / "lab"


def _proxies_on(port: str) -> list:
    """configurable-http-proxy processes serving ``port`` (what a failed start used to orphan)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if any("configurable-http-proxy" in c for c in cmd) and port in cmd:
            found.append(proc)
    return found


def _listener():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_lab_refuses_a_port_in_use_in_one_sentence_and_starts_nothing(tmp_path):
    """Regression: with the hub's port taken, scripts/lab died with a traceback and left an
    orphan configurable-http-proxy listening.  Now: one sentence naming the variable, nothing started."""
    with _listener() as taken:
        port = taken.getsockname()[1]
        env = lab_env(tmp_path / "lab", TFK8S_LAB_HUB_PORT=port)
        done = subprocess.run([str(LAB)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"port {port} on 127.0.0.1" in err and "TFK8S_LAB_HUB_PORT=" in err, err
    assert not (tmp_path / "lab").exists()
    assert not _proxies_on(env["TFK8S_LAB_PORT"])


def test_lab_settings_are_checked_before_anything_starts(tmp_path):
    env = lab_env(tmp_path / "lab", TFK8S_LAB_PROXY_API_PORT="80x")
    done = subprocess.run([str(LAB)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "scripts/lab: TFK8S_LAB_PROXY_API_PORT='80x' is not a port number (the proxy's API port); "
        "give 1-65535, e.g. TFK8S_LAB_PROXY_API_PORT=8001."
    )
    env = lab_env(tmp_path / "lab", TFK8S_LAB_PASSWORD="short")
    done = subprocess.run([str(LAB)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "at least 8" in done.stderr, done.stderr
    same = lab_env(tmp_path / "lab")
    same["TFK8S_LAB_HUB_PORT"] = same["TFK8S_LAB_PORT"]
    done = subprocess.run([str(LAB)], env=same, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "three different ports" in done.stderr, done.stderr
    assert not (tmp_path / "lab").exists()


@pytest.mark.slow
def test_lab_that_fails_after_starting_its_proxy_stops_the_proxy(tmp_path):
    """The port check cannot see everything (a port taken a moment later, a hub bug): when the
    hub dies after it started configurable-http-proxy, scripts/lab stops the proxy too."""
    with _listener() as taken:
        env = lab_env(tmp_path / "lab")
        # The hub binds a port the check was not told about, so it fails after the proxy is up.
        bind = f"--JupyterHub.hub_bind_url=http://127.0.0.1:{taken.getsockname()[1]}"
        done = subprocess.run([str(LAB), bind], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "Proxy API at" in done.stdout + done.stderr  # the proxy had started
    assert done.stderr.strip().splitlines()[-1] == (
        f"scripts/lab: the hub exited with code {done.returncode} (its log is above); "
        "its proxy has been stopped too."
    )
    assert not _proxies_on(env["TFK8S_LAB_PORT"])


@pytest.mark.slow
def test_lab_serves_a_login_page_with_the_hint_and_stops_cleanly(tmp_path):
    """A real lab from scripts/lab: the login page says how to log in and links to the manual,
    which the lab serves; SIGTERM (or Ctrl-C) stops the hub, its proxy and the manual's server."""
    import psutil
    import requests

    env = lab_env(tmp_path / "lab")
    env["TFK8S_LAB_DOCS"] = str(_docs_dir(tmp_path))
    url = f"http://127.0.0.1:{env['TFK8S_LAB_PORT']}/hub/login"
    proc = subprocess.Popen([str(LAB)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)

    def login_page():
        assert proc.poll() is None, proc.stdout.read().decode()
        try:
            r = requests.get(url, timeout=5)
        except requests.ConnectionError:
            return None
        return r if r.status_code == 200 else None

    try:
        page = wait_for(login_page, 120, "the lab's login page", interval=0.5)
        assert "log in with any user name" in page.text
        assert "the password <code>tfk8s-lab</code>" in page.text
        assert '<a href="/services/docs/">' in page.text
        manual = wait_for(lambda: (r := requests.get(url.replace("/hub/login", "/services/docs/"),
                                                     timeout=5)).status_code == 200 and r,
                          60, "the manual through the lab's proxy", interval=0.5)
        assert manual.text == "<h1>the manual</h1>"
        assert _proxies_on(env["TFK8S_LAB_PORT"])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert not _proxies_on(env["TFK8S_LAB_PORT"])
    docs_servers = [p for p in psutil.process_iter(["cmdline"])
                    if "tfk8s_hub.docs" in " ".join(p.info["cmdline"] or []) and env["TFK8S_LAB_DOCS"]
                    in " ".join(p.info["cmdline"] or [])]
    assert not docs_servers, "the manual's server outlived the lab"


def test_login_hint_never_shows_a_custom_password():
    from tfk8s_hub.local import login_hint

    assert "<code>tfk8s-lab</code>" in login_hint({})
    custom = login_hint({"TFK8S_LAB_PASSWORD": "s3cret-<b>pass"})
    assert "s3cret" not in custom and "TFK8S_LAB_PASSWORD" in custom


def test_bootstrap_says_what_it_is_doing():
    """Regression: scripts/bootstrap was silent for minutes.  Every step says what it checked."""
    done = subprocess.run([str(REPO / "scripts" / "bootstrap"), "python"], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "TFK8S_SKIP_APT": "1"})
    assert done.returncode == 0, done.stderr
    lines = [x for x in done.stderr.splitlines() if x.startswith("bootstrap: ")]
    assert any("Python packages" in x for x in lines), done.stderr
    assert lines[-1].startswith("bootstrap: done in "), done.stderr


def _docs_dir(tmp_path: Path) -> Path:
    docs = tmp_path / "html"
    (docs / "users").mkdir(parents=True)
    (docs / "index.html").write_text("<h1>the manual</h1>")
    (docs / "users" / "index.html").write_text("<h1>users</h1>")
    return docs


def test_the_local_lab_serves_the_built_manual_and_links_to_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TFK8S_LAB_DIR", str(tmp_path / "lab"))
    monkeypatch.setenv("TFK8S_LAB_DOCS", str(_docs_dir(tmp_path)))
    app = JupyterHub()
    app.load_config_file(str(REPO / "hub_config" / "jupyterhub_config_local.py"))
    c = app.config
    (docs,) = [s for s in c.JupyterHub.services if s["name"] == "docs"]
    assert docs["url"].startswith("http://127.0.0.1:")
    assert docs["command"][-1] == str(tmp_path / "html")
    assert '<a href="/services/docs/">' in c.JupyterHub.template_vars["announcement_login"]
    assert "log in with any user name" in c.JupyterHub.template_vars["announcement_login"]


def test_the_local_lab_without_a_built_manual_has_no_docs_service(tmp_path, monkeypatch):
    monkeypatch.setenv("TFK8S_LAB_DIR", str(tmp_path / "lab"))
    monkeypatch.setenv("TFK8S_LAB_DOCS", str(tmp_path / "not-built"))
    app = JupyterHub()
    app.load_config_file(str(REPO / "hub_config" / "jupyterhub_config_local.py"))
    services = app.config.JupyterHub.get("services", [])
    assert not [s for s in services if s["name"] == "docs"]
    assert "/services/docs/" not in app.config.JupyterHub.template_vars["announcement_login"]


def test_the_docs_service_serves_its_directory_under_its_prefix_on_loopback_only(tmp_path):
    import urllib.error
    import urllib.request

    import psutil
    from tfk8s_hub.docs import docs_service

    from tfk8s_magics.ports import free_port

    port = free_port()
    service = docs_service(_docs_dir(tmp_path), port)
    env = {**os.environ, **service["environment"], "JUPYTERHUB_SERVICE_URL": service["url"],
           "JUPYTERHUB_SERVICE_PREFIX": "/services/docs/"}
    (tmp_path / "secret.txt").write_text("not the manual")
    proc = subprocess.Popen(service["command"], env=env)
    try:
        base = f"http://127.0.0.1:{port}"

        def get(path: str) -> tuple[int, str]:
            try:
                with urllib.request.urlopen(base + path, timeout=5) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, ""

        wait_for(lambda: proc.poll() is not None or _answers(base), timeout=60, what="the docs service")
        assert get("/services/docs/") == (200, "<h1>the manual</h1>")
        assert get("/services/docs/users") == (200, "<h1>users</h1>")  # redirected under the prefix
        assert get("/index.html")[0] == 404  # outside the prefix
        assert get("/services/docs/../secret.txt")[0] == 404
        assert get("/services/docs/%2e%2e/secret.txt")[0] == 404
        listening = [c.laddr for c in psutil.Process(proc.pid).net_connections("inet")
                     if c.status == psutil.CONN_LISTEN]
        assert listening and all(a.ip == "127.0.0.1" for a in listening), listening
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _answers(base: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(base + "/services/docs/", timeout=2).close()
        return True
    except (urllib.error.URLError, OSError):
        return False


def test_the_docs_service_refuses_to_listen_beyond_loopback(tmp_path):
    from tfk8s_hub.docs import serve

    with pytest.raises(SystemExit, match="only 127.0.0.1"):
        serve(_docs_dir(tmp_path), "http://0.0.0.0:8000", "/services/docs/")
