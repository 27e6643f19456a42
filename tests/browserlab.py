"""What every real-browser test sets up: a real JupyterLab and Debian's Chromium.

* :class:`Lab` — JupyterLab on 127.0.0.1 with a token, the lab's sandboxed kernels and
  settings (``hub_config/jupyter``), the test's own state dir; restartable on the same port (a
  server restart under an open page); the ``tfk8s`` CLI and REST calls as its user.
* :func:`chromium` — a Chromium page (a fresh profile) that records any JS dialog.
* :func:`run_cell`, :func:`wait`, :func:`shot` — a cell run by keyboard, a wait that leaves a
  screenshot when it times out, a screenshot that is an artifact (never an assertion).

Used by ``test_browser.py``, ``test_browser_first_hour.py``, ``test_browser_walk.py``,
``test_sidebar_browser.py`` and ``test_sidebar_server.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.conftest import wait_for

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "hub_config"))
from tfk8s_hub.local import jupyter_environment  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = REPO / "test-artifacts"
#: What every test lab sets beyond the lab's own settings: every cell in the DOM (no virtual
#: scrolling), so a test can find a cell far down the notebook.
TEST_SETTINGS = {"@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"}}


def free_port() -> int:
    from tfk8s_magics.ports import free_port as fp

    return fp()


class Lab:
    """One JupyterLab server process (``start``/``stop``/``restart``) serving ``root``."""

    def __init__(self, tmp_path: Path, state_dir: Path, root: Path, settings: dict | None = None,
                 profile: bool = True, args: tuple[str, ...] = ("--TFClusterSidebar.discover_every=1",)
                 ) -> None:
        """``settings``: user settings by plugin id; ``profile``: kernels load the extension at
        start, as in the lab; ``args``: more command-line options of the server."""
        self.tmp = tmp_path
        self.root = root
        self.port = free_port()
        self.token = os.urandom(16).hex()
        self.base = f"http://127.0.0.1:{self.port}"
        self.runtime = Path(tempfile.mkdtemp(prefix="tfk8s-jr-"))
        self.log_path = tmp_path / "jupyterlab.log"
        self.proc: subprocess.Popen | None = None
        lab_settings = tmp_path / "lab-settings"
        self.args = list(args)
        for plugin, values in {**TEST_SETTINGS, **(settings or {})}.items():
            path = lab_settings / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values), encoding="utf-8")
        venv_bin = str(Path(sys.executable).parent)
        self.env = dict(
            os.environ,
            PATH=venv_bin + os.pathsep + os.environ.get("PATH", ""),
            TFK8S_STATE_DIR=str(state_dir),
            TFK8S_BACKEND="local",
            JUPYTER_CONFIG_DIR=str(tmp_path / "jcfg"),
            JUPYTER_DATA_DIR=str(tmp_path / "jdata"),
            **jupyter_environment(self.runtime),
            JUPYTERLAB_SETTINGS_DIR=str(lab_settings),
            JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"),
            IPYTHONDIR=str(tmp_path / "ipython"),
            TF_CPP_MIN_LOG_LEVEL="2",
        )
        self.env.pop("TENSORBOARD_PROXY_URL", None)
        if profile:  # the lab's IPython profile: every kernel loads tfk8s_magics (%tfcluster)
            folder = tmp_path / "ipython" / "profile_default"
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO / "hub_config" / "ipython" / "profile_default" / "ipython_config.py",
                            folder / "ipython_config.py")

    def start(self, timeout: float = 120) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child holds it; closed at once here
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
             *self.args]
            + (["--allow-root"] if os.geteuid() == 0 else []),
            cwd=self.root, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"JupyterLab exited with code {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.base}/api/status?token={self.token}", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError as e:
                last = e
            time.sleep(0.25)
        raise AssertionError(f"JupyterLab did not answer within {timeout:g} s: {last}\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            req = urllib.request.Request(f"{self.base}/api/shutdown", method="POST",
                                         headers={"Authorization": f"token {self.token}"})
            urllib.request.urlopen(req, timeout=10).close()
        except OSError:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.runtime, ignore_errors=True)

    def log_tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""

    def tfk8s(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run the ``tfk8s`` CLI as the user would in a terminal (same state dir)."""
        return subprocess.run([str(Path(sys.executable).parent / "tfk8s"), *args], env=self.env,
                              cwd=self.root, capture_output=True, text=True, timeout=120, check=check)

    def request(self, method: str, path: str, body: dict | None = None, headers: dict | None = None,
                token: bool = True) -> tuple[int, dict]:
        h = {"Authorization": f"token {self.token}"} if token else {}
        h.update(headers or {})
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.base}{path}", data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                text = r.read().decode()
                return r.status, json.loads(text) if text else {}
        except urllib.error.HTTPError as e:
            text = e.read().decode()
            try:
                return e.code, json.loads(text)
            except ValueError:
                return e.code, {"message": text[:200]}



@contextlib.contextmanager
def chromium(profile_dir: Path, height: int = 1000, args: tuple[str, ...] = ()):
    """A page of Debian's Chromium (a fresh profile in ``profile_dir``); ``page.dialogs`` records
    every JS dialog (each is dismissed).  A missing browser is a failure, not a skip: CI has one.
    ``args``: more command-line switches (a host's address, a certificate to trust)."""
    import pytest

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/bootstrap (as root it apt-installs chromium "
                    "and chromium-driver) — the browser tests need Debian's Chromium.")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(profile_dir), executable_path=CHROMIUM, headless=True, args=[*CHROMIUM_ARGS, *args],
            viewport={"width": 1400, "height": height})
        try:
            page = ctx.pages[0] if ctx.pages else ctx.new_page()
            page.set_default_timeout(30_000)
            page.dialogs = []  # type: ignore[attr-defined]

            def on_dialog(d):
                page.dialogs.append(d.message)  # type: ignore[attr-defined]
                d.dismiss()

            page.on("dialog", on_dialog)
            yield page
        finally:
            ctx.close()


def shot(page, name: str, element=None, also: Path | None = None) -> None:
    """Save a screenshot to test-artifacts/ (and ``also``): an artifact, never an assertion.

    An element screenshot waits for the element to be stable; a live dashboard redraws
    several times a second, so on a loaded machine that wait can time out.  A missing
    picture is noted, not a failure: the tests' assertions are on the DOM.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for path in [ARTIFACTS / name, *([also / name] if also else [])]:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            (element or page).screenshot(path=str(path), animations="disabled", timeout=15_000)
        except PlaywrightTimeout:
            path.with_suffix(".missing.txt").write_text("the element did not hold still for 15 s\n")


def wait(cond, timeout: float, what: str, page=None, prefix: str = ""):
    """``wait_for`` every 0.2 s; on a timeout, a screenshot of ``page`` named after ``what``."""
    try:
        return wait_for(cond, timeout, what, interval=0.2)
    except AssertionError:
        if page is not None:
            shot(page, f"{prefix}timeout-{what.replace(' ', '-')[:60]}.png")
        raise


def run_cell(page, cell) -> None:
    """Make ``cell`` the notebook's active cell, then run it with Shift+Enter.

    Focus, not a click: JupyterLab activates the cell that receives focus (its
    ``focusin`` handler), with no hit-test. A click on the prompt needed the
    prompt to be on screen and uncovered at that instant; under load, with the
    dashboard's output above it still growing, it was intercepted by the status
    bar. The cell must be the active one before the keys go, or another cell runs.
    """
    cell.locator(".jp-InputArea-editor .cm-content").first.focus()
    wait(lambda: "jp-mod-active" in (cell.get_attribute("class") or "").split(), 30,
         "the cell to be the active one", page)
    page.keyboard.press("Shift+Enter")


def lab_env(lab_dir: Path, **overrides: int | str) -> dict[str, str]:
    """The environment ``scripts/lab`` runs with in a test: its state in ``lab_dir``, no bootstrap,
    free loopback ports for the proxy, the hub and the proxy's API; ``overrides`` replace any."""
    from tfk8s_magics.ports import free_ports

    port, hub_port, api_port = free_ports(3)
    env = {
        **os.environ,
        "TFK8S_LAB_SKIP_BOOTSTRAP": "1",
        "TFK8S_LAB_DIR": str(lab_dir),
        "TFK8S_LAB_PORT": str(port),
        "TFK8S_LAB_HUB_PORT": str(hub_port),
        "TFK8S_LAB_PROXY_API_PORT": str(api_port),
    }
    env.update({k: str(v) for k, v in overrides.items()})
    return env


class RealLab:
    """The one-machine lab as ``scripts/lab`` starts it (JupyterHub, the shared password, the
    users' servers with the lab's settings), on free loopback ports, its state in ``lab_dir``.

    ``admin_token`` is a hub token with the admin role (``$TFK8S_LAB_ADMIN_TOKEN``): a test
    reads and shuts down a user's kernels with it, as an administrator could.
    """

    PASSWORD = "tfk8s-lab"

    def __init__(self, lab_dir: Path) -> None:
        self.lab_dir = lab_dir
        self.admin_token = os.urandom(16).hex()
        self.env = lab_env(lab_dir, TFK8S_LAB_ADMIN_TOKEN=self.admin_token)
        for var in ("TFK8S_STATE_DIR", "TFK8S_POOL_SIZE", "JUPYTER_PATH", "JUPYTER_CONFIG_PATH"):
            self.env.pop(var, None)  # the lab sets each user's own
        self.base = f"http://127.0.0.1:{self.env['TFK8S_LAB_PORT']}"
        self.log_path = lab_dir.parent / "lab.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 180) -> RealLab:
        self.lab_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child holds it
        self.proc = subprocess.Popen([str(REPO / "scripts" / "lab")], env=self.env, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

        def login_page() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"scripts/lab exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.base}/hub/login", timeout=5) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(login_page, timeout, "the lab's login page", interval=0.5)
        return self

    def home(self, user: str) -> Path:
        return self.lab_dir / "users" / user / "home"

    def api(self, method: str, path: str) -> tuple[int, object]:
        """A call to the hub or a user's server (``/user/NAME/api/...``) as the lab's admin."""
        req = urllib.request.Request(f"{self.base}{path}", method=method,
                                     headers={"Authorization": f"token {self.admin_token}"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                text = r.read().decode()
                return r.status, json.loads(text) if text else None
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()[:300]

    def shut_down_kernels(self, user: str) -> None:
        """Shut down every kernel of ``user``'s server (its clusters end with their owner)."""
        status, kernels = self.api("GET", f"/user/{user}/api/kernels")
        assert status == 200, kernels
        for k in kernels:
            self.api("DELETE", f"/user/{user}/api/kernels/{k['id']}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # the hub stops every server, the proxy, the clusters
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def log_tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""


def log_in(page, lab: RealLab, user: str) -> str:
    """Log in through the hub's login page; the URL of the user's JupyterLab once it is open."""
    page.goto(f"{lab.base}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", lab.PASSWORD)
    page.click("#login_submit")
    page.wait_for_url(f"{lab.base}/user/{user}/lab**", timeout=120_000)
    return f"{lab.base}/user/{user}"
