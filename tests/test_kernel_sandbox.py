"""The lab's sandboxed kernel (issue 14): in-graph clusters that no other local user can reach.

Real kernels started by jupyter_client from the lab's own kernelspec
(``hub_config/jupyter/kernels/python3``), real TensorFlow, real probes: the attacker is a process
running as uid 65534 (``setpriv``) speaking the first bytes of gRPC (tests/test_local_isolation.py's
probe); the same probe run inside the kernel's namespace (``nsenter``) is the control that shows
the probe can succeed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.test_local_isolation import NOBODY, PROBE, SYSTEM_PYTHON, probe

REPO = Path(__file__).resolve().parent.parent
JUPYTER_DIR = REPO / "hub_config" / "jupyter"

pytestmark = [
    pytest.mark.faults,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a probe as another uid (setpriv)"),
    pytest.mark.skipif(
        not (shutil.which("setpriv") and shutil.which("nsenter") and Path(SYSTEM_PYTHON).exists()),
        reason="needs setpriv, nsenter and /usr/bin/python3",
    ),
]


@pytest.fixture
def runtime(state_dir, monkeypatch):
    """A short private runtime dir (unix socket paths have at most 107 bytes) and the lab's kernelspec."""
    run = Path(tempfile.mkdtemp(prefix="tfk8s-kt-"))
    monkeypatch.setenv("JUPYTER_PATH", str(JUPYTER_DIR))
    monkeypatch.delenv("TFK8S_ISOLATION", raising=False)
    yield run
    shutil.rmtree(run, ignore_errors=True)


def start_kernel(run: Path, transport: str):
    """The lab's ``python3`` kernel with ``transport``; its stderr goes to ``run/kernel.err``."""
    from jupyter_client import KernelManager

    km = KernelManager(
        kernel_name="python3", transport=transport, connection_file=str(run / f"kernel-{uuid.uuid4()}.json")
    )
    assert km.kernel_spec.argv[:3] == ["python", "-m", "tfk8s_magics.kernel.sandbox"]
    err = open(run / "kernel.err", "wb")  # noqa: SIM115 - the kernel holds it; closed by the OS
    km.start_kernel(stderr=err)
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=240)
    return km, kc


def wait_ready(kc, proc, stderr: Path, timeout: float) -> None:
    """Wait for a kernel started without a KernelManager to answer kernel_info.

    Not ``wait_for_ready``: without a manager it judges the kernel by its heartbeat, and calls
    a kernel dead that has not beaten within its first second (a busy machine starts slower).
    """
    from queue import Empty

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the launcher exited with {proc.returncode}:\n{stderr.read_text()}")
        msg_id = kc.kernel_info()
        try:
            while kc.get_shell_msg(timeout=2)["parent_header"].get("msg_id") != msg_id:
                pass
            # IOPub is a PUB/SUB socket: what the kernel publishes before our subscription is
            # joined is lost ("slow joiner"). Ready means the kernel_info's own status arrived.
            while kc.get_iopub_msg(timeout=2)["parent_header"].get("msg_id") != msg_id:
                pass
            return
        except Empty:
            continue
    pytest.fail(f"the kernel did not answer within {timeout:.0f} s:\n{stderr.read_text()}")


def run_code(kc, code: str, timeout: float = 600) -> str:
    """Execute ``code`` in the kernel; its stdout (fails the test on an error)."""
    msg_id = kc.execute(textwrap.dedent(code))
    out = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream" and content["name"] == "stdout":
            out.append(content["text"])
        elif kind == "error":
            pytest.fail("\n".join(content["traceback"]))
        elif kind == "status" and content["execution_state"] == "idle":
            return "".join(out)


def last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def listening(pid: int) -> dict[int, str]:
    """Port → address of every listening TCP socket in ``pid``'s network namespace (its tables)."""
    found = {}
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            parts = line.split()
            if parts[3] != "0A":  # TCP_LISTEN
                continue
            addr, port = parts[1].rsplit(":", 1)
            raw = bytes.fromhex(addr)
            words = b"".join(
                raw[i : i + 4][::-1] for i in range(0, len(raw), 4)
            )  # each word is little-endian
            ip = socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, words)
            found[int(port, 16)] = ip
    return found


def host_listeners() -> set[int]:
    import psutil

    return {c.laddr.port for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN}


def reach(host: str, port: int) -> str:
    try:
        socket.create_connection((host, port), timeout=5).close()
        return "ok"
    except ConnectionRefusedError:
        return "refused"
    except OSError as e:
        return type(e).__name__


REACH = textwrap.dedent("""
    import json, os, socket
    def reach(host, port):
        try:
            socket.create_connection((host, port), timeout=5).close()
            return "ok"
        except ConnectionRefusedError:
            return "refused"
        except OSError as e:
            return type(e).__name__
""")



#: Run in a kernel: export a one-weight model into the cluster NAME's models dir, serve it,
#: predict through the REST address the kernel is given, print the ports and the server's pid.
SERVE_FROM_KERNEL = """
import json, os, urllib.request
import tensorflow as tf
import tfk8s_magics as tk
c = tk.get("NAME")
class M(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
    def serve(self, x):
        return {"y": 2.0 * x}
m = M()
tf.saved_model.save(m, os.path.join(c.status().log_dir.path, "models", "NAME", "1"),
                    signatures={"serving_default": m.serve})
info = c.serve()
req = urllib.request.Request(info.predict_url(local=True), data=json.dumps({"instances": [[1.0]]}).encode())
with urllib.request.urlopen(req, timeout=30) as r:
    inside = json.loads(r.read())["predictions"]
print(json.dumps({"rest": int(info.rest_local.rsplit(":", 1)[1].strip("/")),
                  "grpc": int(info.grpc_address.rsplit(":", 1)[1]), "pid": info.pid, "inside": inside}))
"""

def nameserver() -> str | None:
    for line in Path("/etc/resolv.conf").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver" and not parts[1].startswith(("127.", "::1")):
            return parts[1]
    return None


def dead(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def gone(procs) -> bool:
    return not any(p.is_running() and p.status() != "zombie" for p in procs)


@pytest.mark.slow
def test_an_in_graph_cluster_of_a_sandboxed_kernel_is_out_of_other_users_reach(runtime, state_dir):
    """The lab's kernel over ipc: its in-graph cluster trains through connect(); as uid 65534 the
    chief's and the tasks' ports on the host are refused, while inside the kernel's namespace
    they answer; the chief binds 127.0.0.1; TensorBoard answers its owner on the host only; the
    kernel has outbound network (slirp4netns) but not the host's loopback; its shutdown leaves
    no slirp4netns, supervisor, task or TensorBoard process."""
    import psutil

    from tfk8s_magics.isolation.plan import IN_GRAPH_KERNEL_NETNS

    ns = nameserver()
    with socket.create_server(("127.0.0.1", 0)) as host_only:
        host_port = host_only.getsockname()[1]
        km, kc = start_kernel(runtime, "ipc")
        try:
            launcher = km.provisioner.process.pid
            net = last_json(
                run_code(
                    kc,
                    REACH
                    + textwrap.dedent(f"""
                print(json.dumps({{"pid": os.getpid(), "netns": os.readlink("/proc/self/ns/net"),
                                   "preload": os.environ.get("LD_PRELOAD", ""),
                                   "dns": reach({ns!r}, 53) if {ns!r} else None,
                                   "host_loopback": reach("10.0.2.2", {host_port})}}))
            """),
                )
            )
            kernel = net["pid"]
            assert net["netns"] != os.readlink("/proc/self/ns/net")
            assert "libtfk8s_loopback_bind" in net["preload"]
            assert net["host_loopback"] != "ok"  # --disable-host-loopback
            if ns and reach(ns, 53) == "ok":  # outbound: what the host reaches, the kernel reaches
                assert net["dns"] == "ok", net
            slirp = [p for p in psutil.Process(launcher).children() if p.name() == "slirp4netns"]
            assert len(slirp) == 1, psutil.Process(launcher).children()

            got = last_json(
                run_code(
                    kc,
                    """
                import json
                import tensorflow as tf
                import tfk8s_magics as tk
                from tfk8s_magics import ingraph
                c = tk.launch("sbx", mode="in-graph", ps=1, workers=1, wait_ready=300)
                s = c.connect()
                with s.scope():
                    v = tf.Variable(0.0)
                coord = tf.distribute.coordinator.ClusterCoordinator(s)
                @tf.function
                def step():
                    v.assign_add(1.0)
                    return tf.constant(1)
                results = [coord.schedule(step) for _ in range(5)]
                coord.join()
                addresses = c.backend.addresses("sbx")
                tb = c.tensorboard()
                print(json.dumps({"v": float(v.numpy()), "steps": [int(r.fetch()) for r in results],
                                  "chief": ingraph.coordinator(c, addresses).address,
                                  "addresses": addresses, "tb": tb.port}))
            """,
                )
            )
            assert got["v"] == 5.0 and got["steps"] == [1] * 5
            raw = json.loads((state_dir / "clusters" / "sbx" / "status.json").read_text())
            assert raw["isolation"] == {
                "mode": "kernel-netns",
                "reason": IN_GRAPH_KERNEL_NETNS,
                "netns": None,
            }
            procs = [psutil.Process(launcher), *psutil.Process(launcher).children(recursive=True)]
            names = sorted(p.name() for p in procs)
            for t in raw["tasks"]:
                assert os.readlink(f"/proc/{t['pid']}/ns/net") == net["netns"], t
            assert os.readlink(f"/proc/{raw['supervisor_pid']}/ns/net") == net["netns"]

            chief = int(got["chief"].rsplit(":", 1)[1])
            tasks = [int(a.rsplit(":", 1)[1]) for hosts in got["addresses"].values() for a in hosts]
            inside = listening(kernel)
            assert inside[chief] in ("127.0.0.1", "::ffff:127.0.0.1"), (
                inside
            )  # the shim: TensorFlow asked for [::]
            assert all(inside[p] in ("127.0.0.1", "::ffff:127.0.0.1") for p in tasks), inside
            # A port some host process happens to use too says nothing about the kernel's: left out.
            ports = [p for p in (chief, *tasks) if p not in host_listeners()]
            assert chief in ports or len(ports) >= 2, (chief, tasks)
            assert probe(ports, NOBODY) == {p: "refused" for p in ports}
            done = subprocess.run(
                ["nsenter", "-t", str(kernel), "-n", SYSTEM_PYTHON, "-c", PROBE, *map(str, ports)],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
                cwd="/",
            )
            answers = {int(k): v for k, v in json.loads(done.stdout).items()}
            assert all(isinstance(v, int) and v > 0 for v in answers.values()), answers
            enter = subprocess.run(
                [
                    "setpriv",
                    f"--reuid={NOBODY}",
                    f"--regid={NOBODY}",
                    "--clear-groups",
                    "nsenter",
                    "-t",
                    str(kernel),
                    "-n",
                    "true",
                ],
                capture_output=True,
                timeout=30,
            )
            assert enter.returncode != 0  # another uid cannot enter the kernel's namespace

            tb = got["tb"]
            with urllib.request.urlopen(f"http://127.0.0.1:{tb}/data/logdir", timeout=20) as r:
                assert r.status == 200 and b"logdir" in r.read()  # the owner, on the host
            assert probe([tb], NOBODY) == {tb: 0}  # closed unread

            # The model server started from the kernel: the notebook's code reaches it inside,
            # the owner (as jupyter-server-proxy) on the host, uid 65534 nothing on either port.
            served = last_json(run_code(kc, SERVE_FROM_KERNEL.replace("NAME", "sbx")))
            assert served["inside"] == [[2.0]], served
            rest, grpc_port = served["rest"], served["grpc"]
            with urllib.request.urlopen(f"http://127.0.0.1:{rest}/v1/models/sbx", timeout=20) as r:
                assert r.status == 200 and b"AVAILABLE" in r.read()  # the owner, on the host
            assert probe([rest, grpc_port], NOBODY) == {rest: 0, grpc_port: 0}
            assert os.readlink(f"/proc/{served['pid']}/ns/net") not in (net["netns"],
                                                                        os.readlink("/proc/self/ns/net"))
            procs += [psutil.Process(launcher), *psutil.Process(launcher).children(recursive=True)]
            assert served["pid"] in {p.pid for p in procs}
        finally:
            kc.stop_channels()
            km.shutdown_kernel()
    assert "slirp4netns" in names and len(procs) >= 6, (
        names
    )  # launcher, kernel, slirp, supervisor, 2 tasks, ...
    wait_for(lambda: gone(procs), 30, "every process of the sandboxed kernel to end", interval=0.2)


@pytest.mark.slow
def test_a_tcp_connection_file_runs_the_kernel_on_the_host_with_the_shim_and_says_why(runtime, state_dir):
    """Plain ``jupyter lab`` elsewhere (tcp): the kernel runs on the host's network, says once why
    in-graph clusters are then reachable by other local users, its clusters' status says so, and
    its chief still binds 127.0.0.1 (the shim) rather than every interface."""
    import psutil

    from tfk8s_magics.isolation import shim as isolation
    from tfk8s_magics.isolation.plan import IN_GRAPH_NO_NETNS
    from tfk8s_magics.kernel import sandbox

    km, kc = start_kernel(runtime, "tcp")
    try:
        got = last_json(
            run_code(
                kc,
                """
            import json, os
            import tfk8s_magics as tk
            from tfk8s_magics import ingraph
            c = tk.launch("fb", mode="in-graph", ps=1, workers=1, wait_ready=300)
            c.connect()
            print(json.dumps({"netns": os.readlink("/proc/self/ns/net"), "pid": os.getpid(),
                              "chief": ingraph.coordinator(c, c.backend.addresses("fb")).address}))
        """,
            )
        )
        assert got["netns"] == os.readlink("/proc/self/ns/net")
        why = (
            "its connection file asks for tcp transport, whose ports the Jupyter server must reach on the "
            "host (the lab starts kernels with transport ipc)"
        )
        note = sandbox.host_network_note(why, str(isolation.shim_path()))
        said = [
            line for line in (runtime / "kernel.err").read_text().splitlines() if line.startswith("tfk8s:")
        ]
        assert said == [f"tfk8s: {note}"]
        raw = json.loads((state_dir / "clusters" / "fb" / "status.json").read_text())
        assert raw["isolation"] == {
            "mode": "loopback-shim",
            "reason": f"{IN_GRAPH_NO_NETNS}; {note}",
            "netns": None,
        }
        chief = int(got["chief"].rsplit(":", 1)[1])
        mine = [
            c.laddr.ip
            for c in psutil.Process(got["pid"]).net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == chief
        ]
        assert mine and all(ip in ("127.0.0.1", "::ffff:127.0.0.1") for ip in mine), mine
    finally:
        kc.stop_channels()
        km.shutdown_kernel()


def test_a_kernel_that_refuses_namespaces_runs_on_the_host_and_says_why(runtime):
    """A real refusal: in a user namespace whose ``max_net_namespaces`` is 0, unshare fails
    (ENOSPC); the launcher leaves nothing behind and runs the kernel on that network instead."""
    from jupyter_client import BlockingKernelClient
    from jupyter_client.connect import write_connection_file

    if not shutil.which("unshare"):
        pytest.skip("needs unshare(1)")
    name = f"kernel-{uuid.uuid4()}"
    conn, _ = write_connection_file(
        str(runtime / f"{name}.json"), transport="ipc", ip=str(runtime / f"{name}-ipc")
    )
    wrapper = 'echo 0 > /proc/sys/user/max_net_namespaces && exec "$@"'
    with open(runtime / "kernel.err", "wb") as err:
        proc = subprocess.Popen(
            [
                "unshare",
                "--user",
                "--map-root-user",
                "sh",
                "-c",
                wrapper,
                "sh",
                sys.executable,
                "-m",
                "tfk8s_magics.kernel.sandbox",
                "-f",
                conn,
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    kc = BlockingKernelClient(connection_file=conn)
    kc.load_connection_file()
    kc.start_channels()
    try:
        wait_ready(kc, proc, runtime / "kernel.err", 240)
        got = last_json(
            run_code(
                kc,
                """
            import json, os
            print(json.dumps({"netns": os.readlink("/proc/self/ns/net"), "pid": os.getpid(),
                              "note": os.environ.get("TFK8S_KERNEL_NOTE"),
                              "preload": os.environ.get("LD_PRELOAD")}))
        """,
            )
        )
        assert got["pid"] == proc.pid  # the launcher became the kernel: no host side left over
        assert got["netns"] == os.readlink("/proc/self/ns/net")
        assert (
            "the kernel refused a private network namespace (unshare() failed: No space left on device)"
            in got["note"]
        )
        assert "libtfk8s_loopback_bind" in got["preload"]
        said = [
            line for line in (runtime / "kernel.err").read_text().splitlines() if line.startswith("tfk8s:")
        ]
        assert said == [f"tfk8s: {got['note']}"]
        assert not list(runtime.glob("*-tfk8s.sock"))
        kc.shutdown()
        assert proc.wait(60) == 0
    finally:
        kc.stop_channels()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_host_side_hands_out_loopback_listeners_only(tmp_path, monkeypatch):
    """The sandbox's socket service binds 127.0.0.1 only, passes the host's TCP tables, and turns
    away a request that is not a list of ports in one sentence."""
    import threading

    from tfk8s_magics.isolation import hostside

    path = str(tmp_path / "h.sock")
    server = hostside.make_server(path)
    assert (os.stat(path).st_mode & 0o777) == 0o600
    monkeypatch.setenv(hostside.ENV, path)

    def serve(n):
        for _ in range(n):
            hostside.serve_one(server)

    t = threading.Thread(target=serve, args=(3,), daemon=True)
    t.start()
    socks, tables = hostside.listen([0])
    try:
        assert socks[0].getsockname()[0] == "127.0.0.1" and len(tables) == 2
        client = socket.create_connection(socks[0].getsockname())
        conn, peer = socks[0].accept()
        from tfk8s_magics.isolation.netns import socket_owner

        assert socket_owner(tables, peer[1], socks[0].getsockname()[1]) == os.geteuid()
        client.close()
        conn.close()
    finally:
        for s in socks:
            s.close()
        for fd in tables:
            os.close(fd)
    with pytest.raises(hostside.HostSocketsError, match="ask for 1-16 ports"):
        hostside.listen([70000])
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(hostside.HostSocketsError, match=f"cannot listen on the host's 127.0.0.1:{port}"):
            hostside.listen([port])
    t.join(10)
    server.close()


@pytest.mark.slow
def test_the_local_lab_starts_sandboxed_kernels_over_unix_sockets(tmp_path):
    """A real lab from scripts/lab: a user's server lists the sandboxed kernel as its default,
    starts it with transport ipc in a private runtime dir, and the kernel is in a namespace of
    its own; stopping the lab ends the kernel."""
    import psutil
    import requests

    from tests.browserlab import lab_env
    from tests.test_hub_local import LAB  # puts hub_config on sys.path

    runtime_dir = sys.modules["tfk8s_hub.local"].runtime_dir

    token = os.urandom(16).hex()
    lab_dir = tmp_path / "lab"
    env = {**lab_env(lab_dir), "TFK8S_LAB_ADMIN_TOKEN": token}
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

    kernel = None
    try:
        wait_for(lambda: get("/hub/api/"), 120, "the hub's API", interval=0.5)
        assert requests.post(f"{base}/hub/api/users/demo", headers=auth, timeout=10).status_code == 201
        spawn = requests.post(f"{base}/hub/api/users/demo/server", headers=auth, timeout=60)
        assert spawn.status_code in (201, 202), spawn.text
        wait_for(lambda: (get("/hub/api/users/demo") or {}).get("servers", {}).get("", {}).get("ready"), 180,
                 "demo's server", interval=0.5)
        specs = get("/user/demo/api/kernelspecs")
        assert specs["default"] == "python3", specs
        argv = specs["kernelspecs"]["python3"]["spec"]["argv"]
        assert argv[:3] == ["python", "-m", "tfk8s_magics.kernel.sandbox"], argv
        r = requests.post(f"{base}/user/demo/api/kernels", json={"name": "python3"}, headers=auth,
                          timeout=120)
        assert r.status_code == 201, r.text
        run = runtime_dir(lab_dir, "demo")
        assert (os.stat(run).st_mode & 0o777) == 0o700
        conn = run / f"kernel-{r.json()['id']}.json"
        assert json.loads(conn.read_text())["transport"] == "ipc"

        def the_kernel():
            for p in psutil.process_iter(["cmdline"]):
                cmd = p.info["cmdline"] or []
                if "ipykernel_launcher" in cmd and str(conn) in cmd:
                    return p
            return None

        kernel = wait_for(the_kernel, 60, "the kernel process")
        assert "tfk8s_magics.kernel.sandbox" in kernel.parent().cmdline()
        wait_for(lambda: os.readlink(f"/proc/{kernel.pid}/ns/net") != os.readlink("/proc/self/ns/net"), 10,
                 "the kernel's own network namespace")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    wait_for(lambda: not kernel.is_running(), 30, "the kernel to end with the lab")
    shutil.rmtree(runtime_dir(lab_dir, "demo"), ignore_errors=True)


@pytest.mark.slow
def test_an_unprivileged_sandboxed_kernel_gets_a_user_namespace_and_its_in_graph_cluster_trains():
    """The non-root path: the launcher run as uid 65534 (tests/test_local_unprivileged.py's way
    to the interpreter) makes a user+network namespace, slirp4netns joins it, an in-graph cluster
    trains in it; the owner itself and uid 65533 get "refused" on the host; a between-graph cluster
    gets a user namespace nested in the kernel's, its TensorBoard answers the owner on the host and
    not 65533; shutdown ends all."""
    from jupyter_client import BlockingKernelClient
    from jupyter_client.connect import write_connection_file

    from tests.test_local_unprivileged import OTHER, OWNER, _as_owner, _owned_pids

    home = Path(tempfile.mkdtemp(prefix="tfk8s-nobody-", dir="/tmp"))
    os.chown(home, OWNER, OWNER)
    name = f"kernel-{uuid.uuid4()}"
    conn, _ = write_connection_file(str(home / f"{name}.json"), transport="ipc",
                                    ip=str(home / f"{name}-ipc"))
    os.chown(conn, OWNER, OWNER)
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO),
           "TFK8S_BACKEND": "local", "TFK8S_POOL_SIZE": "0", "TF_CPP_MIN_LOG_LEVEL": "2", "LANG": "C.UTF-8"}
    err = open(home / "kernel.err", "wb")  # noqa: SIM115 - closed below
    cmd = [*_as_owner(), sys.executable, "-m", "tfk8s_magics.kernel.sandbox", "-f", conn]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=home, env=env)
    kc = BlockingKernelClient(connection_file=conn)
    kc.load_connection_file()
    kc.start_channels()
    try:
        wait_ready(kc, proc, home / "kernel.err", 300)
        got = last_json(run_code(kc, '''
            import json, os
            import tensorflow as tf
            import tfk8s_magics as tk
            from tfk8s_magics import ingraph
            c = tk.launch("un", mode="in-graph", ps=1, workers=1, wait_ready=300)
            s = c.connect()
            with s.scope():
                v = tf.Variable(0.0)
            coord = tf.distribute.coordinator.ClusterCoordinator(s)
            @tf.function
            def step():
                v.assign_add(1.0)
                return tf.constant(1)
            for _ in range(5):
                coord.schedule(step)
            coord.join()
            addresses = c.backend.addresses("un")
            print(json.dumps({"v": float(v.numpy()), "pid": os.getpid(), "uid": os.getuid(),
                              "chief": ingraph.coordinator(c, addresses).address, "addresses": addresses}))
        '''))
        kernel = got["pid"]
        assert got["v"] == 5.0 and got["uid"] == OWNER
        assert Path(f"/proc/{kernel}").stat().st_uid == OWNER
        assert os.readlink(f"/proc/{kernel}/ns/user") != os.readlink("/proc/self/ns/user")
        assert os.readlink(f"/proc/{kernel}/ns/net") != os.readlink("/proc/self/ns/net")
        import psutil

        slirp = [p for p in psutil.Process(proc.pid).children() if p.name() == "slirp4netns"]
        assert len(slirp) == 1 and slirp[0].uids().real == OWNER, psutil.Process(proc.pid).children()
        raw = json.loads((home / ".local/share/tfk8s/clusters/un/status.json").read_text())
        assert raw["isolation"]["mode"] == "kernel-netns", raw["isolation"]
        addresses = [got["chief"], *(a for hosts in got["addresses"].values() for a in hosts)]
        ports = [int(a.rsplit(":", 1)[1]) for a in addresses]
        ports = [p for p in ports if p not in host_listeners()]
        assert len(ports) >= 2, got
        assert probe(ports, OTHER) == {p: "refused" for p in ports}
        assert probe(ports, OWNER) == {p: "refused" for p in ports}  # even the owner, from the host
        inside = subprocess.run(["nsenter", "-t", str(kernel), "-n", SYSTEM_PYTHON, "-c", PROBE,
                                 *map(str, ports)],
                                capture_output=True, text=True, timeout=60, check=True, cwd="/")
        assert all(isinstance(v, int) and v > 0 for v in json.loads(inside.stdout).values()), inside.stdout

        # A between-graph cluster from the same kernel: a user namespace nested in the kernel's, and
        # its TensorBoard on the host's loopback through the host side: the owner gets pages, 65533 nothing.
        bg = last_json(run_code(kc, '''
            bg = tk.launch("bg", workers=1, script="print(1)\\n")
            bg.wait()
            print(json.dumps({"tb": bg.tensorboard().port}))
        '''))
        raw_bg = json.loads((home / ".local/share/tfk8s/clusters/bg/status.json").read_text())
        assert raw_bg["isolation"]["mode"] == "userns+netns", raw_bg["isolation"]
        assert raw_bg["phase"] == "succeeded", raw_bg
        tb = bg["tb"]
        assert probe([tb], OTHER) == {tb: 0}
        answered = probe([tb], OWNER)[tb]  # the owner on the host (as jupyter-server-proxy would be)
        assert isinstance(answered, int) and answered > 0, answered
        owned = set(_owned_pids(home))
        assert {proc.pid, kernel, slirp[0].pid, raw["supervisor_pid"]} <= owned, owned
        kc.shutdown()
        assert proc.wait(60) == 0
        wait_for(lambda: not _owned_pids(home), 30, "every process of the owner's kernel to end",
                 interval=0.2)
    finally:
        kc.stop_channels()
        err.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in _owned_pids(home):  # only on failure: the test asserts there are none
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        shutil.rmtree(home, ignore_errors=True)


def test_a_sandboxed_kernel_is_interrupted_restarted_and_killed_like_any_kernel(runtime):
    """Jupyter's interrupt (SIGINT to the kernel's process group) reaches the kernel and not the
    launcher; a restart makes a new sandbox; a SIGKILLed launcher takes its kernel and slirp4netns
    with it (the kernel's parent-death signal, slirp4netns's exit fd)."""
    import psutil

    km, kc = start_kernel(runtime, "ipc")
    try:
        msg_id = kc.execute("import time\nprint('sleeping', flush=True)\ntime.sleep(120)")
        wait_for(lambda: kc.get_iopub_msg(timeout=30)["content"].get("text") == "sleeping\n", 30,
                 "the cell to start sleeping")
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=30)
        while reply["parent_header"].get("msg_id") != msg_id:  # late kernel_info replies of wait_for_ready
            reply = kc.get_shell_msg(timeout=30)
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        assert km.is_alive()
        first = json.loads(run_code(kc, "import os, json; print(json.dumps(os.getpid()))"))

        km.restart_kernel(now=True)
        kc.wait_for_ready(timeout=240)
        launcher = psutil.Process(km.provisioner.process.pid)
        kernel = json.loads(run_code(kc, "import os, json; print(json.dumps(os.getpid()))"))
        assert kernel != first
        wait_for(lambda: dead(first), 30, "the first kernel to end with the restart", interval=0.2)
        assert os.readlink(f"/proc/{kernel}/ns/net") != os.readlink("/proc/self/ns/net")
        procs = [launcher, *launcher.children(recursive=True)]
        assert sorted(p.name() for p in procs).count("slirp4netns") == 1, procs
        launcher.kill()
        wait_for(lambda: gone(procs), 30, "the kernel and slirp4netns to end with their launcher",
                 interval=0.2)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_pip_in_a_lab_kernel_is_the_kernels_own(runtime, monkeypatch):
    """Issue 27 item 9: ``!pip install x`` in a lab kernel installs where the kernel (and the local
    backend's tasks, which run the same interpreter) import from, whatever PATH the server had."""
    venv_bin = os.path.dirname(sys.executable)
    monkeypatch.setenv("PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                               if p and os.path.abspath(p) != venv_bin) or "/usr/bin:/bin")
    km, kc = start_kernel(runtime, "ipc")
    try:
        got = last_json(run_code(kc, """
            import json, os, sys
            line = get_ipython().getoutput("pip --version")[0]
            print(json.dumps({"exe": sys.executable, "pip": line,
                              "first": os.environ["PATH"].split(os.pathsep)[0]}))
        """))
    finally:
        kc.stop_channels()
        km.shutdown_kernel()
    assert got["first"] == os.path.dirname(got["exe"])
    site = os.path.dirname(os.path.dirname(__import__("pip").__file__))
    assert f"from {site}/pip " in got["pip"], got


def _tiny_wheel(folder: Path, name: str, value: str) -> Path:
    """A pure-Python wheel of one module ``name`` (``VALUE = value``), written here: no index."""
    import base64
    import hashlib
    import zipfile

    dist = f"{name}-0.1.dist-info"
    files = {
        f"{name}/__init__.py": f"VALUE = {value!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n",
        f"{dist}/WHEEL": ("Wheel-Version: 1.0\nGenerator: tfk8s-tests\nRoot-Is-Purelib: true\n"
                          "Tag: py3-none-any\n"),
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    wheel = folder / f"{name}-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel


def test_a_package_pip_installed_in_a_lab_kernel_is_importable_in_its_tasks(runtime, tmp_path,
                                                                            monkeypatch):
    """Issue 27 item 9 (docs/users/packages.md, "In the tasks, locally"): ``%pip install`` in a lab
    kernel, then a launch: the tasks import the package — also tasks handed to processes of the
    warm pool that had started before the install."""
    name = f"tfk8s_tiny_{uuid.uuid4().hex[:8]}"
    wheel = _tiny_wheel(tmp_path, name, "from the notebook's pip")
    monkeypatch.delenv("TFK8S_POOL_SIZE", raising=False)  # the lab's default: a warm pool
    km, kc = start_kernel(runtime, "ipc")
    try:
        # A first launch warms the pool: its spare processes start before the package exists.
        first = last_json(run_code(kc, """
            import json, time
            import tfk8s_magics as tk
            st = tk.launch("before", workers=1, ps=0, script="print('warm')").wait(300)
            time.sleep(1)
            print(json.dumps({"phase": st.phase}))
        """))
        assert first["phase"] == "succeeded", first
        out = run_code(kc, f"%pip install --no-index --no-deps --quiet {wheel}\n"
                           "import json, time\nprint(json.dumps({'installed': time.time()}))")
        installed = last_json(out)["installed"]
        # Each task says when its process started: before the install means a warm process.
        script = (f"import psutil, {name}\n"
                  "started = psutil.Process().create_time()\n"
                  f"print('value:', {name}.VALUE, 'process started', started)\n")
        got = last_json(run_code(kc, f"""
            import json
            import tfk8s_magics as tk
            c = tk.launch("after", workers=2, ps=0, script={script!r})
            st = c.wait(300)
            print(json.dumps({{"phase": st.phase, "logs": c.logs_by_task()}}))
        """))
    finally:
        kc.stop_channels()
        km.shutdown_kernel()
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", name], check=False)
    assert got["phase"] == "succeeded", got
    started = []
    for task in ("worker-0", "worker-1"):
        m = re.search(r"value: from the notebook's pip process started ([\d.]+)", got["logs"][task])
        assert m, got["logs"]
        started.append(float(m[1]))
    assert min(started) < installed, (started, installed)  # a warm process, older than the package
