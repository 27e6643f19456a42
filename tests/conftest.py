"""Shared fixtures: a private state dir per test, a local backend on it, and leak checks.

Every test that launches clusters gets its own state dir, and afterwards
asserts that no supervisor or task process of that dir is left running:
no process outlives its cluster, and no test may leave one behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import psutil
import pytest

pytest_plugins: list[str] = []
if (Path(__file__).parent / "kubeapi" / "fixtures.py").exists():
    pytest_plugins.append("tests.kubeapi.fixtures")

REPO = Path(__file__).resolve().parent.parent

# Supervisors, tasks, pooled processes and TensorBoards are `python -m tfk8s_magics...`
# subprocesses that inherit PYTHONPATH: this checkout goes first, so they run the code under
# test even where the venv's editable install points at another checkout (a git worktree).
os.environ["PYTHONPATH"] = os.pathsep.join(
    dict.fromkeys([str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))


def processes_of(state_dir: Path) -> list[psutil.Process]:
    """Supervisors, tasks and TensorBoards that belong to clusters under ``state_dir``."""
    found = []
    marker = str(state_dir)
    for p in psutil.process_iter(["cmdline", "pid"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if "tfk8s_magics" not in cmd:
                continue
            env = p.environ()
            if marker in cmd or marker in env.get("TFK8S_LOG_DIR", "") + env.get("TFK8S_PROGRESS_FILE", ""):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def wait_gone(state_dir: Path, timeout: float = 20.0) -> list[psutil.Process]:
    """Wait until no process of ``state_dir`` is alive; return the survivors."""
    deadline = time.monotonic() + timeout
    left = processes_of(state_dir)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    return left


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    """A private TFK8S_STATE_DIR; fails the test if a cluster process outlives it."""
    d = tmp_path / "state"
    d.mkdir()
    monkeypatch.setenv("TFK8S_STATE_DIR", str(d))
    # The API keeps one backend per name and process: a test's must see this test's state dir.
    from tfk8s_magics import api

    monkeypatch.setattr(api, "_backends", {})
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    # Cold tasks unless a test asks for the warm pool (tests/test_pool.py): a pool per test
    # process would outlive the test, and each test's own working folder would replace it.
    monkeypatch.setenv("TFK8S_POOL_SIZE", "0")
    yield d
    from tfk8s_magics.backends.local import LocalBackend, sidecars

    be = LocalBackend(d)
    for st in be.list_clusters():
        if st.phase == "unknown":  # unreadable state: only a forced delete can end it
            be.delete(st.name, force=True)
            continue
        be.stop(st.name)
        sidecars.stop_tensorboard(be._dir(st.name))
    left = wait_gone(d)
    for p in left:
        p.kill()
    assert not left, f"processes outlived their cluster: {[p.cmdline() for p in left]}"


@pytest.fixture
def xdg_runtime(monkeypatch):
    """A private ``$XDG_RUNTIME_DIR`` (short: a socket path has at most 107 bytes), so this test's
    pools are its own; proven empty after (a pool leaves no file behind)."""
    d = tempfile.mkdtemp(prefix="tfk8s-run-", dir="/tmp")
    monkeypatch.setenv("XDG_RUNTIME_DIR", d)
    yield Path(d)
    try:
        assert wait_for(lambda: not os.listdir(d), 15, "the pools' runtime folder to be empty")
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def local(state_dir):
    """A LocalBackend on the test's own state dir."""
    from tfk8s_magics.backends.local import LocalBackend

    return LocalBackend(state_dir)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """Run the test (and the tasks it launches) in a fresh working directory."""
    d = tmp_path / "work"
    d.mkdir()
    monkeypatch.chdir(d)
    return d


def wait_for(cond, timeout: float = 30.0, what: str = "condition", interval: float = 0.05):
    """Return ``cond()``'s first truthy value; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def snapshot(root: Path) -> set[str]:
    """Every path under ``root`` (to prove an operation left nothing behind)."""
    return {str(p.relative_to(root)) for p in root.rglob("*")}


os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(scope="session")
def realkube():
    """The running devcluster (``scripts/kube up``) as its admin; skipped (failed in CI) when none runs."""
    import sys

    sys.path.insert(0, str(REPO / "hub_config"))
    import tests.realkube
    from tests.realkube import RealKube, find_cluster, require_or_skip

    started, failed = _wait_for_kube_up()
    if failed:  # every require_or_skip says why the start failed, not only what is missing
        tests.realkube.KUBE_UP_FAILED = started
    found = find_cluster()
    if isinstance(found, str):
        require_or_skip(found + (f"; scripts/kube up said:\n{started}" if started and not failed else ""))
    kube = RealKube(*found)
    yield kube
    kube.cleanup()


@pytest.fixture
def kube_user(realkube):
    """``kube_user(prefix="alice", user="alice", bootstrap=None, strict=True)``: a namespace on the
    real cluster bootstrapped as the hub does it, and a KubernetesBackend acting as its own
    ServiceAccount; returns ``(UserNamespace, backend)``.

    At teardown every backend is closed and, for ``strict`` ones, the audit log must show no request
    of that ServiceAccount refused (403: the shipped Role lacks it) or outside its namespace. A test
    whose point is a refusal moves ``ns.audit_offset`` past it (``realkube.audit_size()``).
    """
    from tfk8s_magics.backends.kubernetes import KubernetesBackend

    made = []

    def make(prefix: str = "alice", *, user: str = "alice", bootstrap=None, strict: bool = True, **kw):
        ns = realkube.user_namespace(prefix, bootstrap=bootstrap)
        kw.setdefault("storage_class", "standard")
        backend = KubernetesBackend(namespace=ns.name, api_client=ns.api_client, user=user, **kw)
        made.append((ns, backend, strict))
        return ns, backend

    yield make
    for ns, backend, strict in made:
        backend.close()
        if not strict:
            continue
        for r in ns.requests():
            assert r.code != 403, f"{r.verb} {r.uri} was denied to the user: the shipped Role lacks it"
            assert r.namespace in (ns.name, None), f"{r.verb} {r.uri} left the namespace {ns.name}"


def _wait_for_kube_up(timeout: float = 75 * 60) -> tuple[str, bool]:
    """scripts/test starts the cluster in the background: wait for that start (bounded) to end;
    return the last lines it printed, and whether it failed (its exit status, in ``<log>.rc``)."""
    pid = os.environ.get("TFK8S_KUBE_UP_PID")
    if not pid:
        return "", False
    deadline = time.monotonic() + timeout
    while psutil.pid_exists(int(pid)) and time.monotonic() < deadline:
        try:
            if psutil.Process(int(pid)).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(1)
    log = os.environ.get("TFK8S_KUBE_UP_LOG")
    if not log or not os.path.exists(log):
        return "", False
    try:
        failed = Path(log + ".rc").read_text().strip() not in ("", "0")
    except OSError:
        failed = False
    with open(log, errors="replace") as f:
        return "".join(f.readlines()[-40 if failed else -8 :]), failed


def pytest_collection_modifyitems(config, items):
    """Tests on the real cluster run last: the cluster starts (or builds) while the others run."""
    items.sort(key=lambda item: item.get_closest_marker("k8s") is not None)
