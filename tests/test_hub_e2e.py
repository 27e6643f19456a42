"""A real JupyterHub (the one-machine profile) end to end.

Start the hub on free 127.0.0.1 ports in a temporary lab dir, create a user
through the REST API, log in through the login form, spawn the user's
server, run a notebook on it through the server's kernels API (websocket),
stop the server and check that nothing is left running.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat
import psutil
import pytest
import requests
import websocket

from tests.conftest import wait_for
from tfk8s_magics.ports import free_ports

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "hub_config" / "jupyterhub_config_local.py"
CHP = REPO / "node_modules" / ".bin" / "configurable-http-proxy"
PASSWORD = "e2e-shared-password"



@pytest.fixture(autouse=True)
def _proxy_installed():
    # scripts/test installs it: a missing proxy is a broken set-up, not a reason to skip.
    if not CHP.exists():
        pytest.fail("configurable-http-proxy is not installed: run scripts/bootstrap node")


def _processes_under(lab_dir: Path) -> list[psutil.Process]:
    """Processes whose environment or command line points into ``lab_dir``."""
    found = []
    prefix = str(lab_dir)
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            env = proc.environ()
            cmd = " ".join(proc.info["cmdline"] or [])
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if any(str(v).startswith(prefix) for v in env.values()) or prefix in cmd:
            found.append(proc)
    return found


def _user_processes(hub: Hub) -> list[psutil.Process]:
    """The hub's descendants other than its proxy, and anything running for a user's state dir."""
    procs = {p.pid: p for p in _processes_under(hub.lab_dir / "users")}
    try:
        for child in psutil.Process(hub.proc.pid).children(recursive=True):
            if "configurable-http-proxy" not in " ".join(child.cmdline()):
                procs[child.pid] = child
    except psutil.NoSuchProcess:
        pass
    return list(procs.values())


class Hub:
    """A running hub and what a test needs to talk to it."""

    def __init__(self, url: str, token: str, lab_dir: Path, proc: subprocess.Popen, log: Path):
        self.url, self.token, self.lab_dir, self.proc, self.log = url, token, lab_dir, proc, log

    def api(self, method: str, path: str, **kw) -> requests.Response:
        headers = {"Authorization": f"token {self.token}"}
        return requests.request(
            method, f"{self.url}/hub/api{path}", headers=headers, timeout=30, **kw
        )

    def user_model(self, name: str) -> dict:
        r = self.api("GET", f"/users/{name}")
        r.raise_for_status()
        return r.json()


@pytest.fixture
def hub(tmp_path, request):
    """The local profile's hub (or the config file given by indirect parametrization)."""
    config = getattr(request, "param", CONFIG)
    port, hub_port, api_port = free_ports(3)
    lab_dir = tmp_path / "lab"
    token = secrets.token_hex(16)
    env = {
        **os.environ,
        "TFK8S_LAB_DIR": str(lab_dir),
        "TFK8S_LAB_PORT": str(port),
        "TFK8S_LAB_HUB_PORT": str(hub_port),
        "TFK8S_LAB_PROXY_API_PORT": str(api_port),
        "TFK8S_LAB_PASSWORD": PASSWORD,
        "TFK8S_LAB_ADMIN_TOKEN": token,
    }
    log = tmp_path / "hub.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("jupyterhub")), "-f", str(config)],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    h = Hub(f"http://127.0.0.1:{port}", token, lab_dir, proc, log)

    def up():
        if proc.poll() is not None:
            raise AssertionError(f"the hub exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            return h.api("GET", "/").status_code == 200
        except requests.ConnectionError:
            return False

    try:
        wait_for(up, 60, "the hub to answer")
        yield h
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        left = _processes_under(lab_dir)
        for p in left:
            p.kill()
        assert not left, f"left running after the hub stopped: {[p.cmdline() for p in left]}"


def login(hub: Hub, name: str, password: str) -> requests.Session:
    """Log in through the hub's login form, as a browser does (xsrf cookie included)."""
    s = requests.Session()
    r = s.get(f"{hub.url}/hub/login", timeout=30)
    r.raise_for_status()
    xsrf = s.cookies.get("_xsrf", path="/hub/")
    r = s.post(
        f"{hub.url}/hub/login",
        data={"username": name, "password": password, "_xsrf": xsrf},
        allow_redirects=False,
        timeout=30,
    )
    assert r.status_code == 302, f"login of {name} failed: {r.status_code}"
    return s


class KernelClient:
    """Run code in a kernel of a single-user server through its REST and websocket API."""

    def __init__(self, server_url: str, token: str):
        self.server_url, self.token = server_url, token
        self.headers = {"Authorization": f"token {token}"}
        r = requests.post(
            f"{server_url}api/kernels", json={"name": "python3"}, headers=self.headers, timeout=60
        )
        r.raise_for_status()
        self.kernel_id = r.json()["id"]
        ws_url = server_url.replace("http://", "ws://") + f"api/kernels/{self.kernel_id}/channels"
        self.ws = websocket.create_connection(
            ws_url, header=[f"Authorization: token {token}"], timeout=300
        )

    def execute(self, code: str, timeout: float = 300) -> tuple[list[dict], dict]:
        """Run ``code``; return its outputs (nbformat dicts) and the execute_reply content."""
        msg_id = uuid.uuid4().hex
        self.ws.send(
            json.dumps(
                {
                    "header": {
                        "msg_id": msg_id,
                        "username": "test",
                        "session": uuid.uuid4().hex,
                        "msg_type": "execute_request",
                        "version": "5.3",
                    },
                    "parent_header": {},
                    "metadata": {},
                    "content": {"code": code, "silent": False, "store_history": True},
                    "channel": "shell",
                }
            )
        )
        outputs: list[dict] = []
        reply: dict | None = None
        idle = False
        deadline = time.monotonic() + timeout
        while not (idle and reply is not None):
            if time.monotonic() > deadline:
                raise AssertionError(f"code did not finish in {timeout}s: {code[:200]}")
            msg = json.loads(self.ws.recv())
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "execute_reply":
                reply = content
            elif kind == "status" and content["execution_state"] == "idle":
                idle = True
            elif kind == "stream":
                outputs.append(
                    {"output_type": "stream", "name": content["name"], "text": content["text"]}
                )
            elif kind in ("execute_result", "display_data"):
                outputs.append({"output_type": kind, "data": content["data"]})
            elif kind == "error":
                outputs.append(
                    {"output_type": "error", "ename": content["ename"], "evalue": content["evalue"]}
                )
        return outputs, reply

    def run_notebook(self, nb) -> None:
        """Execute every code cell in order, filling in outputs; raise on the first error."""
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            outputs, reply = self.execute(cell.source)
            cell.outputs = [nbformat.from_dict(o) for o in outputs]
            if reply["status"] != "ok":
                raise AssertionError(
                    f"cell failed: {reply.get('ename')}: {reply.get('evalue')}\n{cell.source}"
                )

    def close(self) -> None:
        self.ws.close()
        requests.delete(
            f"{self.server_url}api/kernels/{self.kernel_id}", headers=self.headers, timeout=30
        )


def _text(nb) -> str:
    # One print may arrive as several stream messages: join their texts with nothing between.
    return "".join(
        o.get("text", "") + (json.dumps(o["data"]) if "data" in o else "")
        for cell in nb.cells
        if cell.cell_type == "code"
        for o in cell.outputs
    )


def start_server(hub: Hub, name: str) -> str:
    r = hub.api("POST", f"/users/{name}/server")
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: hub.user_model(name)["servers"].get("", {}).get("ready"), 90, f"{name}'s server")
    return f"{hub.url}/user/{name}/"


def stop_server(hub: Hub, name: str) -> None:
    r = hub.api("DELETE", f"/users/{name}/server")
    assert r.status_code in (202, 204), r.text
    wait_for(lambda: not hub.user_model(name)["servers"], 60, f"{name}'s server to stop")


def user_token(hub: Hub, name: str) -> str:
    r = hub.api("POST", f"/users/{name}/tokens", json={"note": "e2e", "expires_in": 3600})
    r.raise_for_status()
    return r.json()["token"]


def test_login_spawn_run_notebook_stop(hub):
    name = "demo"
    assert hub.api("POST", f"/users/{name}").status_code == 201

    # a wrong password is refused; the shared one logs in
    s = requests.Session()
    s.get(f"{hub.url}/hub/login", timeout=30)
    bad = s.post(
        f"{hub.url}/hub/login",
        data={
            "username": name,
            "password": "wrong-password",
            "_xsrf": s.cookies.get("_xsrf", path="/hub/"),
        },
        allow_redirects=False,
        timeout=30,
    )
    assert bad.status_code == 403
    browser = login(hub, name, PASSWORD)

    server = start_server(hub, name)
    # the logged-in browser reaches JupyterLab through the proxy (hub OAuth included)
    lab = browser.get(f"{server}lab", timeout=60)
    assert lab.status_code == 200 and "JupyterLab" in lab.text

    kernel = KernelClient(server, user_token(hub, name))
    try:
        nb = nbformat.v4.new_notebook(
            cells=[
                nbformat.v4.new_code_cell(
                    "import os\nprint('backend', os.environ['TFK8S_BACKEND'])"
                ),
                nbformat.v4.new_code_cell("print('state', os.environ['TFK8S_STATE_DIR'])"),
                nbformat.v4.new_code_cell(
                    "print('magic', 'tfcluster' in get_ipython().magics_manager.magics['line'])"
                ),
                nbformat.v4.new_code_cell("print(os.environ['TENSORBOARD_PROXY_URL'])"),
            ]
        )
        kernel.run_notebook(nb)
    finally:
        kernel.close()
    out = _text(nb)
    assert "backend local" in out
    assert f"state {hub.lab_dir / 'users' / name / 'tfk8s'}" in out
    assert "magic True" in out, out
    assert f"/user/{name}/proxy/%PORT%/" in out

    stop_server(hub, name)
    left = _user_processes(hub)
    assert not left, [p.cmdline() for p in left]


HELLO = """\
%%tfcluster launch hello --mode between --workers 1 --ps 0 --no-follow
import json, os
import tensorflow as tf
task = json.loads(os.environ["TF_CONFIG"])["task"]
print("hello from", task["type"], task["index"], "tf", tf.__version__)
"""

SLEEPER = """\
%%tfcluster launch sleeper --mode between --workers 1 --ps 0 --no-follow --detach
import time
print("sleeping", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_notebook_launches_a_tf_cluster_and_stopping_the_server_stops_its_clusters(hub):
    """A 1-worker between-graph cluster runs and its logs come back; a detached one left
    running is stopped with the server (the post-stop hook)."""
    name = "ada"
    assert hub.api("POST", f"/users/{name}").status_code == 201
    server = start_server(hub, name)
    kernel = KernelClient(server, user_token(hub, name))
    try:
        nb = nbformat.v4.new_notebook(
            cells=[
                nbformat.v4.new_code_cell(HELLO),
                nbformat.v4.new_code_cell(
                    "from tfk8s_magics import api\nprint('phase', api.get('hello').wait(300).phase)"
                ),
                nbformat.v4.new_code_cell("%tfcluster logs hello"),
                nbformat.v4.new_code_cell(SLEEPER),
                nbformat.v4.new_code_cell(
                    "import time\n"
                    "c = api.get('sleeper')\n"
                    "deadline = time.monotonic() + 120\n"
                    "while 'sleeping' not in c.logs() and time.monotonic() < deadline:\n"
                    "    time.sleep(1)\n"
                    "print('sleeper', c.status().phase)"
                ),
            ]
        )
        kernel.run_notebook(nb)
    finally:
        kernel.close()
    out = _text(nb)
    assert "phase succeeded" in out, out
    assert "hello from worker 0 tf" in out, out
    assert "sleeper running" in out, out

    state = hub.lab_dir / "users" / name / "tfk8s"
    stop_server(hub, name)
    left = _user_processes(hub)
    assert not left, [p.cmdline() for p in left]

    from tfk8s_magics.backends.local import LocalBackend

    assert LocalBackend(state_dir=state).status("sleeper").phase == "stopped"


@pytest.mark.browser
def test_tensorboard_fonts_load_through_the_hub_proxy(hub, tmp_path):
    """Regression: TensorBoard behind the hub asked for /hub/font-roboto/*.woff2 (404).

    Its index.html names the fonts at the site root (``url(/font-roboto/…)``);
    under ``/user/NAME/proxy/PORT/`` the root is the hub.  A real Chromium,
    logged in through the form, opens the TensorBoard the lab starts (the
    local backend's runner, ``tfk8s_magics.runtime.tensorboard``) through
    jupyter-server-proxy: every font it asks for loads from TensorBoard itself.
    """
    from playwright.sync_api import sync_playwright

    from tests.browserlab import CHROMIUM, CHROMIUM_ARGS

    name = "fonts"
    assert hub.api("POST", f"/users/{name}").status_code == 201
    server = start_server(hub, name)
    (logdir := tmp_path / "tb").mkdir()
    port = free_ports(1)[0]
    tb = subprocess.Popen(
        [sys.executable, "-m", "tfk8s_magics.runtime.tensorboard", str(os.getpid()),
         "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        wait_for(lambda: _answers(f"http://127.0.0.1:{port}/data/logdir"), 60, "TensorBoard")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.goto(f"{hub.url}/hub/login")
                page.fill("#username_input", name)
                page.fill("#password_input", PASSWORD)
                page.click("#login_submit")
                page.wait_for_url(f"{server}**", timeout=90_000)
                fonts: list[tuple[int, str]] = []
                page.on("response", lambda r: fonts.append((r.status, r.url)) if ".woff" in r.url
                        else None)
                page.goto(f"{server}proxy/{port}/")
                wait_for(lambda: fonts, 60, "TensorBoard to ask for its fonts")
                page.wait_for_load_state("networkidle")
                assert page.evaluate("document.fonts.check('16px Roboto')")
            finally:
                browser.close()
    finally:
        tb.terminate()
        tb.wait(30)
    assert all(status == 200 for status, _ in fonts), fonts
    assert all(url.startswith(f"{server}proxy/{port}/font-roboto/") for _, url in fonts), fonts
    stop_server(hub, name)


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=5).status_code == 200
    except requests.ConnectionError:
        return False


CULLER_CONFIG = REPO / "tests" / "jupyterhub_config_culler.py"


@pytest.mark.parametrize("hub", [CULLER_CONFIG], indirect=True)
def test_the_idle_culler_stops_an_idle_server_and_the_stop_hook_runs(hub):
    """The chart's culler service (tfk8s_hub.hub.culler_service), for real, with a 2 s timeout."""
    r = hub.api("POST", "/users/carol")
    assert r.status_code == 201, r.text
    r = hub.api("POST", "/users/carol/server")
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: "Culling server carol" in hub.log.read_text(), 180,
             "the culler to cull carol's server once it is up and idle")
    wait_for(lambda: not hub.user_model("carol")["servers"], 60, "carol's server to stop")
    log = hub.log.read_text()
    # stopped like any other server: the spawner's post_stop_hook ran (it stops clusters)
    assert "tfk8s: stopped nothing of carol" in log, log[-3000:]
