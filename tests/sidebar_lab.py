"""A real JupyterLab for the sidebar's tests: 127.0.0.1, a token, the lab's sandboxed kernels,
the test's own state dir; restartable on the same port (a server restart under an open page)."""

from __future__ import annotations

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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "hub_config"))
from tfk8s_hub.local import jupyter_environment  # noqa: E402


def free_port() -> int:
    from tfk8s_magics.ports import free_port as fp

    return fp()


class Lab:
    """One JupyterLab server process (``start``/``stop``/``restart``) serving ``root``."""

    def __init__(self, tmp_path: Path, state_dir: Path, root: Path, settings: dict | None = None) -> None:
        self.tmp = tmp_path
        self.root = root
        self.port = free_port()
        self.token = os.urandom(16).hex()
        self.base = f"http://127.0.0.1:{self.port}"
        self.runtime = Path(tempfile.mkdtemp(prefix="tfk8s-jr-"))
        self.log_path = tmp_path / "jupyterlab.log"
        self.proc: subprocess.Popen | None = None
        lab_settings = tmp_path / "lab-settings"
        for plugin, values in {
            "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
            "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
            **(settings or {}),
        }.items():
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
        # The lab's IPython profile: every kernel loads tfk8s_magics (%tfcluster), as in the lab.
        profile = tmp_path / "ipython" / "profile_default"
        profile.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / "hub_config" / "ipython" / "profile_default" / "ipython_config.py",
                        profile / "ipython_config.py")

    def start(self, timeout: float = 120) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child holds it; closed at once here
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
             "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
             "--TFClusterSidebar.discover_every=1"]
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

