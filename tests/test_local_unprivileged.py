"""A whole cluster owned by an unprivileged user (issue 14, item 1): launched, isolated, deleted.

The lab's usual tests run as root, whose clusters get a network namespace without a user
namespace.  Here the CLI itself runs as uid 65534 (``setpriv``), so the supervisor takes the
other path: a user namespace of its own (identity maps) with a network namespace in it.  The
only privilege kept is ``CAP_DAC_READ_SEARCH`` (ambient), because the project's interpreter
lives under root's 0700 home on these machines; it lets the process read files, nothing more —
no network, no namespace, no signal rights.  What is checked: the cluster trains (a 2-worker
MultiWorkerMirroredStrategy all-reduce), its tasks run as uid 65534 in a namespace that is not
the host's, another uid (65533) and the owner itself on the host get "refused" on every task
port while a probe inside the namespace gets the gRPC server's reply, and ``delete`` leaves no
process of the owner behind.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from tests.test_local_isolation import PROBE, SYSTEM_PYTHON, probe

OWNER = 65534
OTHER = 65533
REPO = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.faults,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the lab as another uid (setpriv)"),
    pytest.mark.skipif(not (shutil.which("setpriv") and shutil.which("nsenter")
                            and Path(SYSTEM_PYTHON).exists()),
                       reason="needs setpriv, nsenter and /usr/bin/python3"),
]

SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    total = strategy.reduce(tf.distribute.ReduceOp.SUM,
                            strategy.run(lambda: tf.constant(1.0)), axis=None)
    print("ALLREDUCE", float(total), "UID", os.getuid(), flush=True)
    time.sleep(float(os.environ.get("HOLD", "0")))
""")


#: As root in a fresh mount namespace: open the way to the interpreter, then become the owner.
OPEN_INTERPRETER = textwrap.dedent("""
    import os, subprocess, sys
    prefix, argv = sys.argv[1], sys.argv[2:]
    top = "/" + prefix.strip("/").split("/")[0]               # /root
    inner = prefix[len(top):].strip("/").split("/")[0]        # .pyenv
    def run(*cmd):
        subprocess.run(cmd, check=True)
    run("mount", "--bind", os.path.join(top, inner), "/mnt")
    run("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", top)
    os.mkdir(os.path.join(top, inner))
    run("mount", "--bind", "/mnt", os.path.join(top, inner))
    os.execvp(argv[0], argv)
""")


def _as_owner() -> list[str]:
    owner = ["setpriv", f"--reuid={OWNER}", f"--regid={OWNER}", "--clear-groups"]
    prefix = sys.base_prefix
    blocked = any(not os.stat(p).st_mode & 0o001 for p in [*Path(prefix).parents][:-1])
    if not blocked:
        return owner
    return ["unshare", "--mount", "--propagation", "private", "--",
            SYSTEM_PYTHON, "-c", OPEN_INTERPRETER, prefix, *owner]


def _cli(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "PYTHONPATH": str(REPO), "TFK8S_BACKEND": "local", "TFK8S_POOL_SIZE": "0",
           "TF_CPP_MIN_LOG_LEVEL": "2", "LANG": "C.UTF-8"}
    return subprocess.run([*_as_owner(), sys.executable, "-m", "tfk8s_magics.cli", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=home, env=env)


def _owned_pids(home: Path) -> list[int]:
    """Processes of the owner started by this test: uid 65534 with this test's HOME."""
    mark = f"HOME={home}".encode()
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if p.stat().st_uid == OWNER and mark in (p / "environ").read_bytes().split(b"\0"):
                    pids.append(int(p.name))
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                pass
    return pids


@pytest.fixture
def home():
    """The owner's home, outside pytest's 0700 temp root (the owner must reach it)."""
    d = Path(tempfile.mkdtemp(prefix="tfk8s-nobody-", dir="/tmp"))
    (d / "train.py").write_text(SCRIPT)
    for p in (d, d / "train.py"):
        os.chown(p, OWNER, OWNER)
    yield d
    for pid in _owned_pids(d):  # only on failure: the test asserts there are none
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    shutil.rmtree(d, ignore_errors=True)


def test_an_unprivileged_owners_cluster_trains_in_its_own_user_namespace_and_nobody_else_reaches_it(home):
    done = _cli(home, "launch", "un", "--workers", "2", "--script", "train.py", "--env", "HOLD=120",
                "--detach", "--no-dashboard", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    status_file = home / ".local/share/tfk8s/clusters/un/status.json"
    log = home / ".local/share/tfk8s/clusters/un"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        logs = _cli(home, "logs", "un")
        if logs.stdout.count("ALLREDUCE 2.0") == 2:
            break
        time.sleep(1)
    assert logs.stdout.count(f"ALLREDUCE 2.0 UID {OWNER}") == 2, logs.stdout + logs.stderr

    raw = json.loads(status_file.read_text())
    assert raw["isolation"]["mode"] == "userns+netns", raw["isolation"]
    sup = raw["supervisor_pid"]
    assert Path(f"/proc/{sup}").stat().st_uid == OWNER
    host_net = os.readlink("/proc/self/ns/net")
    assert os.readlink(f"/proc/{sup}/ns/net") != host_net
    assert os.readlink(f"/proc/{sup}/ns/user") != os.readlink("/proc/self/ns/user")
    ports = [int(t["host"].rsplit(":", 1)[1]) for t in raw["tasks"]]
    assert len(ports) == 2, raw["tasks"]
    for pid in (t["pid"] for t in raw["tasks"]):
        assert Path(f"/proc/{pid}").stat().st_uid == OWNER
        assert os.readlink(f"/proc/{pid}/ns/net") == os.readlink(f"/proc/{sup}/ns/net")

    assert probe(ports, OTHER) == {p: "refused" for p in ports}
    assert probe(ports, OWNER) == {p: "refused" for p in ports}  # even the owner, from the host
    inside = subprocess.run(["nsenter", f"--net=/proc/{sup}/ns/net", SYSTEM_PYTHON, "-c", PROBE,
                             *map(str, ports)],
                            capture_output=True, text=True, timeout=60, check=True, cwd="/")
    assert all(isinstance(v, int) and v > 0 for v in json.loads(inside.stdout).values()), inside.stdout

    task_pids = {t["pid"] for t in raw["tasks"]}
    assert {sup, *task_pids} <= set(_owned_pids(home))  # the leak check below sees them while they run
    gone = _cli(home, "delete", "un")
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert _owned_pids(home) == []
    assert not log.exists()
