"""Nothing lingers (issue 27, "bounded resources"): no zombies under a kernel, nothing in the
temp dir after the lab stops.

A kernel's supervisors, TensorBoards and the pool daemon used to stay as
zombies under the kernel once they ended (nothing waited for them); the lab
left the users' Jupyter runtime folders and the pool's folder in ``/tmp``.
Real processes, a real TensorBoard, and the real ``scripts/lab`` with two real
kernels that launch clusters from the shared warm pool.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tfk8s_magics.lifeline import children_of, pid_alive, process_state

#: A kernel: launches a cluster, opens its TensorBoard, deletes it (which stops TensorBoard), waits.
KERNEL = textwrap.dedent('''
    import json, os, sys, time
    import tfk8s_magics as tk
    from tfk8s_magics.backends.local import LocalBackend
    be = LocalBackend(sys.argv[1])
    seen = []
    for name in ("z1", "z2"):
        c = tk.launch(name, workers=1, script="print('hi', flush=True)\\n", backend=be)
        assert c.wait(timeout=300).phase == "succeeded", c.logs("worker-0")
        tb = c.tensorboard()
        seen.append(tb.pid)
        c.delete()
    print(json.dumps({"pid": os.getpid(), "tensorboards": seen}), flush=True)
    time.sleep(600)
''')


def _zombies_under(pid: int) -> list[int]:
    return [c for c in children_of(pid) if process_state(c) == "Z"]


@pytest.mark.slow
def test_a_kernel_keeps_no_zombie_of_its_ended_supervisors_and_tensorboards(state_dir, workdir):
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL, str(state_dir)], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "TFK8S_POOL_SIZE": "0"})
    try:
        line = kernel.stdout.readline()
        assert line, f"the kernel failed ({kernel.wait()})"
        seen = json.loads(line)
        assert all(not pid_alive(p) for p in seen["tensorboards"])
        # The supervisors and TensorBoards ended: none is left under the kernel, not even as a zombie.
        wait_for(lambda: not children_of(kernel.pid), 30, "the kernel's ended children to be reaped")
        assert _zombies_under(kernel.pid) == []
    finally:
        kernel.kill()
        kernel.wait()


# -- the real lab --------------------------------------------------------------------------
def _execute(base: str, token: str, kernel_id: str, code: str, timeout: float = 600) -> str:
    """Run ``code`` in a kernel of the lab through its websocket; its stdout, or raise its error."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    async def run() -> str:
        url = base.replace("http", "ws", 1) + f"/user/demo/api/kernels/{kernel_id}/channels"
        conn = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {token}"}))
        msg_id = uuid.uuid4().hex
        conn.write_message(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "demo",
                       "session": uuid.uuid4().hex, "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True}}))
        out, error = [], None
        while True:
            raw = await asyncio.wait_for(conn.read_message(), timeout)
            assert raw is not None, "the kernel's websocket closed"
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["header"]["msg_type"], msg["content"]
            if kind == "stream" and content.get("name") == "stdout":
                out.append(content["text"])
            elif kind == "error":
                error = "\n".join(content.get("traceback", []))
            elif kind == "status" and content.get("execution_state") == "idle":
                conn.close()
                if error:
                    raise AssertionError(error)
                return "".join(out)

    return asyncio.run(run())


LAUNCH = textwrap.dedent('''
    import json, os
    os.environ.update({{"TFK8S_POOL_SIZE": "1", "TFK8S_WARM_KERNEL": "0"}})
    import tfk8s_magics as tk
    from tfk8s_magics.backends.local import pool
    import time
    sock, deadline = pool.ensure(), time.monotonic() + 300  # joins (or starts) the user's pool
    while not any(p["state"] == "idle" and not p["reserved"]
                  for p in pool.info(sock, with_memory=False)["processes"]):
        assert time.monotonic() < deadline, "the pool did not fill"
        time.sleep(0.2)
    c = tk.launch("{name}", workers=1, script="print('ran', flush=True)\\n", backend="local")
    st = c.wait(timeout=600)
    cold = [e.message for e in c.events() if e.reason == "StartedCold"]
    found = pool.info(pool.current(), with_memory=False)
    c.delete()
    print(json.dumps({{"phase": st.phase, "cold": cold, "pid": os.getpid(), "sock": pool.current(),
                      "daemon": found["pid"], "owners": found["owners"], "dir": found["dir"],
                      "processes": [p["pid"] for p in found["processes"]]}}))
''')


@pytest.mark.slow
def test_the_lab_keeps_no_zombies_and_leaves_nothing_in_the_temp_dir(tmp_path, request):
    """The real lab with its own ``TMPDIR``: two kernels of one user launch from one shared pool;
    nothing under the kernels is a zombie; after SIGTERM of the lab the temp dir is empty (the
    users' runtime folders, the pool's socket and folder: all gone) and no process is left."""
    import requests

    from tests.browserlab import lab_env
    from tests.test_hub_local import LAB

    tmp = Path(tempfile.mkdtemp(prefix="lt-", dir="/tmp"))  # short: sockets' paths live in it
    request.addfinalizer(lambda: shutil.rmtree(tmp, ignore_errors=True))  # whatever happens below
    token = os.urandom(16).hex()
    env = {**lab_env(tmp_path / "lab"), "TFK8S_LAB_ADMIN_TOKEN": token, "TMPDIR": str(tmp)}
    base = f"http://127.0.0.1:{env['TFK8S_LAB_PORT']}"
    auth = {"Authorization": f"token {token}"}
    proc = subprocess.Popen([str(LAB)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)

    def get(path: str):
        assert proc.poll() is None, proc.stdout.read().decode()
        try:
            r = requests.get(base + path, headers=auth, timeout=10)
        except requests.ConnectionError:
            return None
        return r.json() if r.status_code == 200 else None

    seen = []
    try:
        wait_for(lambda: get("/hub/api/"), 120, "the hub's API", interval=0.5)
        assert requests.post(f"{base}/hub/api/users/demo", headers=auth, timeout=10).status_code == 201
        spawn = requests.post(f"{base}/hub/api/users/demo/server", headers=auth, timeout=60)
        assert spawn.status_code in (201, 202), spawn.text
        wait_for(lambda: (get("/hub/api/users/demo") or {}).get("servers", {}).get("", {}).get("ready"), 180,
                 "demo's server", interval=0.5)
        kernels = []
        for _ in range(2):
            r = requests.post(f"{base}/user/demo/api/kernels", json={"name": "python3"}, headers=auth,
                              timeout=120)
            assert r.status_code == 201, r.text
            kernels.append(r.json()["id"])
        for i, kernel_id in enumerate(kernels):
            out = _execute(base, token, kernel_id, LAUNCH.format(name=f"lab{i}"))
            seen.append(json.loads(out.strip().splitlines()[-1]))
        assert [s["phase"] for s in seen] == ["succeeded", "succeeded"], seen
        assert seen[0]["sock"] == seen[1]["sock"] and seen[0]["daemon"] == seen[1]["daemon"]  # one pool
        assert seen[1]["owners"] == sorted(s["pid"] for s in seen)
        assert seen[1]["cold"] == [], seen  # the second kernel's task came from the shared pool
        assert str(seen[0]["sock"]).startswith(str(tmp))
        pids = {s["pid"] for s in seen}
        wait_for(lambda: not any(_zombies_under(p) for p in pids), 30, "no zombie under the kernels")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:  # a failure above: stop the lab as its user would (its servers are
            proc.send_signal(signal.SIGTERM)  # in sessions of their own: SIGKILL would miss them)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    for pid in [p for s in seen for p in (s["pid"], s["daemon"], *s["processes"])]:
        wait_for(lambda pid=pid: not pid_alive(pid), 30, f"process {pid} to end with the lab")
    deadline = time.monotonic() + 30
    while (left := sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*"))) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], f"left in the lab's temp dir: {left}"
