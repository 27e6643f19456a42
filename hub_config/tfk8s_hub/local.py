"""The one-machine profile: a real JupyterHub on 127.0.0.1, no Kubernetes.

Users' servers are local processes (``SimpleLocalProcessSpawner``), each
with its own home and extension state under the lab directory::

    <lab_dir>/users/<name>/home      HOME and notebook directory
    <lab_dir>/users/<name>/tfk8s     TFK8S_STATE_DIR: the user's local clusters
    <lab_dir>/users/<name>/ipython   IPYTHONDIR: loads the extension in every kernel

The extension runs on its ``local`` backend.  When a server stops, the
post-stop hook stops the user's clusters through the extension's public
backend API, then ends any process still carrying the user's state dir in
its environment (a detached TensorBoard, a task whose supervisor was killed).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tfk8s_magics.backends.local import LocalBackend

from .settings import LabSettings

#: The IPython profile every local kernel gets (loads ``tfk8s_magics``).
IPYTHON_PROFILE = Path(__file__).resolve().parent.parent / "ipython" / "profile_default"
#: The lab's Jupyter files: ``kernels/python3`` (the sandboxed kernel, :mod:`tfk8s_magics.kernel.sandbox`,
#: shadowing the plain one) and ``jupyter_server_config.json`` (kernels' channels on unix sockets).
JUPYTER_DIR = Path(__file__).resolve().parent.parent / "jupyter"
#: The example notebooks a new user finds in their home (``notebooks/`` of the repository).
EXAMPLES = Path(__file__).resolve().parent.parent.parent / "notebooks"
#: The shared password when ``TFK8S_LAB_PASSWORD`` is not set (the README names it too).
DEFAULT_PASSWORD = "tfk8s-lab"
#: The lab's ports: environment variable, default, and what listens there.
LAB_PORTS = (
    ("TFK8S_LAB_PORT", 8000, "the lab's URL (the proxy)"),
    ("TFK8S_LAB_HUB_PORT", 8081, "the hub's internal port"),
    ("TFK8S_LAB_PROXY_API_PORT", 8001, "the proxy's API port"),
)


class LabSetupError(ValueError):
    """A lab setting that cannot work; the message is one sentence saying what to do."""


def lab_ports(environ: dict[str, str]) -> dict[str, int]:
    """The lab's three ports from ``environ`` (defaults 8000, 8081, 8001), validated."""
    ports: dict[str, int] = {}
    for var, default, what in LAB_PORTS:
        raw = environ.get(var) or str(default)
        try:
            port = int(raw)
        except ValueError:
            port = 0
        if not 0 < port < 65536:
            raise LabSetupError(
                f"{var}={raw!r} is not a port number ({what}); give 1-65535, e.g. {var}={default}."
            )
        ports[var] = port
    seen: dict[int, str] = {}
    for var, port in ports.items():
        if port in seen:
            raise LabSetupError(
                f"{seen[port]} and {var} are both {port}; the lab needs three different ports."
            )
        seen[port] = var
    return ports


def lab_password(environ: dict[str, str]) -> str:
    """The shared password (``TFK8S_LAB_PASSWORD`` or the default), at least 8 characters."""
    password = environ.get("TFK8S_LAB_PASSWORD") or DEFAULT_PASSWORD
    if len(password) < 8:
        raise LabSetupError(
            f"TFK8S_LAB_PASSWORD has {len(password)} characters; the shared password needs at least 8."
        )
    return password


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something already listens on ``host:port`` (so binding it would fail)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def check_lab(environ: dict[str, str]) -> None:
    """Check the lab's settings and ports before anything starts; raise :class:`LabSetupError`.

    ``scripts/lab`` runs this first, so a port in use is one sentence and
    nothing (no hub, no orphan proxy) is left behind.
    """
    ports = lab_ports(environ)
    lab_password(environ)
    for var, _default, what in LAB_PORTS:
        port = ports[var]
        if port_in_use(port):
            taken = set(ports.values())
            free = next(p for p in range(port + 10, 65536) if p not in taken and not port_in_use(p))
            raise LabSetupError(
                f"port {port} on 127.0.0.1 ({what}, {var}) is already in use: stop what listens "
                f"there or choose another port, e.g. {var}={free} scripts/lab."
            )


def login_hint(environ: dict[str, str]) -> str:
    """The line the login page shows (HTML): any user name, and which password."""
    import html

    if (environ.get("TFK8S_LAB_PASSWORD") or DEFAULT_PASSWORD) == DEFAULT_PASSWORD:
        which = f"the password <code>{html.escape(DEFAULT_PASSWORD)}</code>"
    else:  # a password of the administrator's choosing is never shown
        which = "the shared password given in <code>TFK8S_LAB_PASSWORD</code> when the lab was started"
    return (
        '<span class="tfk8s-login-hint">Local lab: log in with any user name (e.g. '
        f"<code>demo</code>) and {which}.</span>"
    )


def user_dirs(lab_dir: Path, username: str) -> dict[str, Path]:
    """The per-user directories of the local profile."""
    root = lab_dir / "users" / username
    return {"home": root / "home", "state": root / "tfk8s", "ipython": root / "ipython"}


def runtime_dir(lab_dir: Path, username: str) -> Path:
    """A short private dir for a user's Jupyter runtime files (connection files, the kernels'
    unix sockets): ``$TMPDIR/tfk8s-lab-UID/HASH``, made 0700 and checked to be ours.

    Short, because a unix socket's path has at most 107 bytes and the kernels' sockets are
    named ``kernel-<uuid>-ipc-N`` in it; a lab dir's own path may already be long.
    """
    import stat

    path = _runtime_path(lab_dir, username)
    for d in (path.parent, path):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            pass
        info = d.lstat()  # never through a symlink someone else planted
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise LabSetupError(f"{d} is not a private directory of this user; remove it and start again.")
    return path


def _runtime_path(lab_dir: Path, username: str) -> Path:
    """Where :func:`runtime_dir` is (nothing is made or checked)."""
    import hashlib
    import tempfile

    top = Path(tempfile.gettempdir()) / f"tfk8s-lab-{os.geteuid()}"
    return top / hashlib.sha256(str(lab_dir / "users" / username).encode()).hexdigest()[:12]


def local_environment(settings: LabSettings, lab_dir: Path, username: str) -> dict[str, str]:
    """Environment of a user's local server: the extension on the local backend, preloaded, and
    kernels started sandboxed with their channels on unix sockets (see :data:`JUPYTER_DIR`)."""
    dirs = user_dirs(lab_dir, username)
    env = settings.extension_environment()
    env.update(
        {
            "TFK8S_BACKEND": "local",
            "TFK8S_STATE_DIR": str(dirs["state"]),
            "IPYTHONDIR": str(dirs["ipython"]),
            **jupyter_environment(runtime_dir(lab_dir, username)),
        }
    )
    return env


def jupyter_environment(runtime: Path) -> dict[str, str]:
    """What makes a Jupyter server start the lab's kernels: the sandboxed ``python3`` kernelspec
    first on the data path, ``transport: ipc`` from the config path, sockets in ``runtime``."""
    def first(var: str) -> str:
        return os.pathsep.join(p for p in (str(JUPYTER_DIR), os.environ.get(var, "")) if p)

    return {"JUPYTER_PATH": first("JUPYTER_PATH"), "JUPYTER_CONFIG_PATH": first("JUPYTER_CONFIG_PATH"),
            "JUPYTER_RUNTIME_DIR": str(runtime)}


def lab_kernel_metadata() -> dict[str, Any]:
    """The notebook metadata the lab's ``python3`` kernel gives a notebook it runs: its
    kernelspec (:data:`JUPYTER_DIR`) and the language info its kernel reports (ipykernel's, this
    interpreter — the kernels run the lab's own Python)."""
    from ipykernel.ipkernel import IPythonKernel

    spec = json.loads((JUPYTER_DIR / "kernels" / "python3" / "kernel.json").read_text(encoding="utf-8"))
    return {"kernelspec": {"display_name": spec["display_name"], "language": spec["language"],
                           "name": "python3"},
            "language_info": dict(IPythonKernel.language_info)}


def for_lab_kernel(notebook: str) -> str:
    """An example notebook (its JSON) with the metadata the lab's kernel would write into it.

    JupyterLab rewrites a notebook's ``kernelspec`` and ``language_info`` when its kernel
    starts, so a copy with other values opened already "modified" (asking to be saved).
    """
    nb = json.loads(notebook)
    nb.setdefault("metadata", {}).update(lab_kernel_metadata())
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def prepare_user(lab_dir: Path, username: str, examples: Path = EXAMPLES) -> dict[str, Path]:
    """Create the user's directories, install the IPython profile that loads the extension,
    and give a new user the example notebooks (never overwriting their copies)."""
    dirs = user_dirs(lab_dir, username)
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    target = dirs["home"] / "examples"
    if examples.is_dir() and not target.exists():
        target.mkdir()
        for nb in sorted(examples.glob("*.ipynb")):
            (target / nb.name).write_text(for_lab_kernel(nb.read_text(encoding="utf-8")), encoding="utf-8")
    profile = dirs["ipython"] / "profile_default"
    profile.mkdir(exist_ok=True)
    shutil.copyfile(IPYTHON_PROFILE / "ipython_config.py", profile / "ipython_config.py")
    return dirs


def main(argv: list[str] | None = None) -> int:
    """``python -m tfk8s_hub.local check``: :func:`check_lab` for ``scripts/lab`` (exit 2 on a problem)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if args != ["check"]:
        print("usage: python -m tfk8s_hub.local check", file=sys.stderr)
        return 2
    try:
        check_lab(dict(os.environ))
    except LabSetupError as e:
        print(f"scripts/lab: {e}", file=sys.stderr)
        return 2
    return 0


def _processes_of(state_dir: Path) -> list[Any]:
    import psutil

    wanted = str(state_dir)
    me = os.getpid()
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            if proc.environ().get("TFK8S_STATE_DIR") == wanted:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def stop_local_clusters(state_dir: Path, grace: float = 5.0) -> list[str]:
    """Stop every cluster under ``state_dir``, then end leftover processes; return what was stopped.

    The extension already stops non-detached clusters when their kernel
    exits; this also catches detached clusters and their TensorBoards.
    """
    import psutil

    stopped = []
    if (state_dir / "clusters").is_dir():
        backend = LocalBackend(state_dir=state_dir)
        for status in backend.list_clusters():
            if not status.terminal:
                backend.stop(status.name)
                stopped.append(status.name)
    leftovers = _processes_of(state_dir)
    for proc in leftovers:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(leftovers, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    stopped.extend(f"pid {p.pid}" for p in leftovers)
    return stopped


def make_pre_spawn_hook(settings: LabSettings, lab_dir: Path) -> Callable[[Any], None]:
    """A ``Spawner.pre_spawn_hook``: per-user directories, home and environment."""

    def prepare(spawner: Any) -> None:
        name = spawner.user.name
        dirs = prepare_user(lab_dir, name)
        spawner.home_dir = str(dirs["home"])
        spawner.notebook_dir = str(dirs["home"])
        # a new dict: the configured one may be shared by every spawner
        spawner.environment = {**spawner.environment, **local_environment(settings, lab_dir, name)}

    return prepare


def remove_runtime_dir(lab_dir: Path, username: str) -> None:
    """Remove a user's Jupyter runtime folder (:func:`runtime_dir`: connection files, the
    kernels' sockets) once the user's server has stopped, and the lab's folder of them once
    empty: a stopped lab leaves nothing in the temp dir."""
    path = _runtime_path(lab_dir, username)
    if path.is_symlink() or not path.is_dir() or path.lstat().st_uid != os.geteuid():
        return  # not ours (runtime_dir refuses it at the next start): never removed through
    shutil.rmtree(path, ignore_errors=True)
    try:
        path.parent.rmdir()
    except OSError:
        pass  # another user's server (or another lab of this user) still has its folder there


def make_post_stop_hook(settings: LabSettings, lab_dir: Path) -> Callable[[Any], Any]:
    """A ``Spawner.post_stop_hook``: stop the user's local clusters (if configured), then remove
    the user's runtime folder."""

    async def stop_user_clusters(spawner: Any) -> None:
        try:
            await _stop_user_clusters(spawner)
        finally:
            remove_runtime_dir(lab_dir, spawner.user.name)

    async def _stop_user_clusters(spawner: Any) -> None:
        if not settings.stop_clusters_on_stop:
            return
        import asyncio

        state = user_dirs(lab_dir, spawner.user.name)["state"]
        t0 = time.monotonic()
        stopped = await asyncio.to_thread(stop_local_clusters, state)
        spawner.log.info(
            "tfk8s: stopped %s of %s in %.1fs",
            ", ".join(stopped) or "nothing",
            spawner.user.name,
            time.monotonic() - t0,
        )

    return stop_user_clusters


if __name__ == "__main__":
    raise SystemExit(main())
