"""Only the owner can reach a cluster's servers (issue 14, item 1): another uid gets nothing.

The attacker is a real process running as uid 65534 (``setpriv``), using the system Python
(the project's interpreter lives under root's home, which uid 65534 cannot read).  It speaks
the first bytes of HTTP/2 (what any gRPC client sends first) to every address it can find and
records what came back: a TensorFlow server answers a connection with its own SETTINGS frame,
so "zero bytes, then closed" means the server never saw the connection.  The same probe run
as the owner is the control that shows the probe can succeed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
ISOLATION_PY = Path(__file__).resolve().parent.parent / "tfk8s_magics/isolation/netns.py"

pytestmark = [
    pytest.mark.faults,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a probe as another uid (setpriv)"),
    pytest.mark.skipif(not (shutil.which("setpriv") and Path(SYSTEM_PYTHON).exists()),
                       reason="needs setpriv and /usr/bin/python3"),
]

#: Connects to each port, sends what a gRPC client sends first, prints what happened as JSON.
PROBE = textwrap.dedent("""
    import json, socket, sys
    HELLO = b"PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
    out = {}
    for port in map(int, sys.argv[1:]):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
        except ConnectionRefusedError:
            out[port] = "refused"
            continue
        got = b""
        try:
            s.sendall(HELLO)
            s.settimeout(5)
            got = s.recv(4096)
        except (ConnectionResetError, BrokenPipeError):
            pass
        except socket.timeout:
            got = b"(timeout)"
        out[port] = len(got)
        s.close()
    print(json.dumps(out))
""")


def probe(ports: list[int], uid: int | None) -> dict[int, object]:
    """Run :data:`PROBE` as ``uid`` (None: as this process's user); return port → outcome."""
    cmd = [SYSTEM_PYTHON, "-c", PROBE, *map(str, ports)]
    if uid is not None:
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True, cwd="/")
    return {int(k): v for k, v in json.loads(done.stdout).items()}


def _ports(addresses: dict[str, list[str]]) -> list[int]:
    return [int(a.rsplit(":", 1)[1]) for hosts in addresses.values() for a in hosts]


def test_a_private_network_namespace_for_another_user_keeps_its_uid(tmp_path):
    """What a non-root owner gets: uid 65534 enters a user+network namespace of its own (identity
    maps: still uid 65534), with loopback up; a server in it is unreachable from the host."""
    script = textwrap.dedent(f"""
        import importlib.util, os, socket, sys, threading
        spec = importlib.util.spec_from_file_location("iso", {str(ISOLATION_PY)!r})
        iso = importlib.util.module_from_spec(spec); spec.loader.exec_module(iso)
        host_ns = os.readlink("/proc/self/ns/net")
        mode = iso.enter_private_network()
        srv = socket.socket(); srv.bind(("0.0.0.0", 0)); srv.listen()
        port = srv.getsockname()[1]
        inside = socket.create_connection(("127.0.0.1", port), timeout=5)  # loopback is up inside
        print(mode, os.getuid(), os.getgid(), host_ns != os.readlink("/proc/self/ns/net"), port, flush=True)
        sys.stdin.readline()  # keep listening until the host side has tried
    """)
    proc = subprocess.Popen(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", SYSTEM_PYTHON, "-c", script],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
    )
    try:
        mode, uid, gid, moved, port = proc.stdout.readline().split()
        got = (mode, uid, gid, moved)
        assert got == ("userns+netns", str(NOBODY), str(NOBODY), "True"), proc.stderr.read()
        # From the host, as root even: nothing listens there.
        assert probe([int(port)], None) == {int(port): "refused"}
    finally:
        proc.communicate("\n", timeout=10)


def test_a_multithreaded_process_of_another_user_cannot_join_a_cluster_namespace():
    """The rule a pre-started task must obey: the error, never a silent run outside."""
    script = textwrap.dedent(f"""
        import importlib.util, os, threading, time
        spec = importlib.util.spec_from_file_location("iso", {str(ISOLATION_PY)!r})
        iso = importlib.util.module_from_spec(spec); spec.loader.exec_module(iso)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            iso.enter_private_network(); os.write(w, b"x"); time.sleep(30); os._exit(0)
        os.read(r, 1)
        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()
        try:
            iso.join_cluster_netns(f"/proc/{{pid}}/ns/net")
            print("joined")
        except iso.IsolationError as e:
            print("refused", e.strerror)
        os.kill(pid, 9); os.waitpid(pid, 0)
    """)
    done = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", SYSTEM_PYTHON, "-c", script],
        capture_output=True, text=True, timeout=60, cwd="/",
    )
    assert done.stdout.split()[:1] == ["refused"], done.stdout + done.stderr


def test_socket_owner_reads_the_uid_of_the_connecting_socket():
    spec = importlib.util.spec_from_file_location("iso", ISOLATION_PY)
    iso = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(iso)
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    client = socket.create_connection(srv.getsockname())
    conn, peer = srv.accept()
    tables = [os.open(f"/proc/self/net/{t}", os.O_RDONLY) for t in ("tcp", "tcp6")]
    try:
        assert iso.socket_owner(tables, peer[1], srv.getsockname()[1]) == os.geteuid()
        assert iso.socket_owner(tables, 1, 2) is None
    finally:
        for fd in tables:
            os.close(fd)
        for s in (client, conn, srv):
            s.close()


@pytest.mark.slow
def test_another_uid_gets_nothing_from_a_cluster_while_its_own_namespace_does(local):
    """As uid 65534: a between-graph cluster's parameter server answers nothing on the host (its
    server is in the supervisor's private namespace), while the same probe run inside that
    namespace gets the server's reply (the control that shows the probe can succeed)."""
    import tfk8s_magics as tk

    cluster = tk.launch("iso", ps=1, workers=1, script="import time\ntime.sleep(120)\n",
                        backend=local, wait_ready=240)
    raw = json.loads((local.clusters_dir / "iso" / "status.json").read_text())
    assert raw["isolation"]["mode"] == "netns", raw["isolation"]
    ps = _ports({"ps": local.addresses("iso")["ps"]})
    assert all(v in (0, "refused") for v in probe(ps, NOBODY).values())
    inside = subprocess.run(["nsenter", f"--net={raw['isolation']['netns']}", SYSTEM_PYTHON, "-c", PROBE,
                             *map(str, ps)], capture_output=True, text=True, timeout=60, check=True, cwd="/")
    assert all(isinstance(v, int) and v > 0 for v in json.loads(inside.stdout).values()), inside.stdout
    cluster.delete()


@pytest.mark.slow
def test_an_in_graph_cluster_shares_the_hosts_loopback_behind_the_shim(local):
    """Not isolated from other local users (docs/admins/threat-model.md, "On one machine"): an
    in-graph cluster's servers dial the kernel's chief, and the kernel's process-wide gRPC threads
    cannot follow a cluster into a namespace, so its tasks stay on the host's loopback behind the
    shim, and status.json says why."""
    import psutil

    import tfk8s_magics as tk
    from tfk8s_magics.isolation.plan import IN_GRAPH_NO_NETNS

    tk.launch("ig", mode="in-graph", ps=1, workers=1, backend=local, wait_ready=240)
    raw = json.loads((local.clusters_dir / "ig" / "status.json").read_text())
    assert raw["isolation"] == {"mode": "loopback-shim", "reason": IN_GRAPH_NO_NETNS, "netns": None}
    ports = set(_ports(local.addresses("ig")))
    listening = [c.laddr for c in psutil.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port in ports]
    loopback = ("127.0.0.1", "::ffff:127.0.0.1", "::1")
    assert sorted(a.port for a in listening) == sorted(ports), listening
    assert all(a.ip in loopback for a in listening), listening
    tk.get("ig", backend=local).delete()


@pytest.mark.slow
def test_tensorboard_answers_its_owner_only(local, workdir):
    """TensorBoard serves anyone who connects: as uid 65534 its port gives nothing back, while
    the owner (as jupyter-server-proxy does, same uid) gets its pages."""
    import urllib.request

    import tfk8s_magics as tk

    cluster = tk.launch("tbiso", workers=1, script="print(1)\n", backend=local)
    tb = cluster.tensorboard()
    assert probe([tb.port], NOBODY) == {tb.port: 0}
    answered = probe([tb.port], None)[tb.port]  # the control: the same bytes from the owner get a reply
    assert isinstance(answered, int) and answered > 0
    with urllib.request.urlopen(f"http://127.0.0.1:{tb.port}/data/logdir", timeout=10) as r:
        assert r.status == 200 and b"logdir" in r.read()
    cluster.delete()


@pytest.mark.slow
def test_the_model_server_answers_its_owner_only(local, workdir):
    """The local model server (REST + gRPC) runs behind the same guard as TensorBoard: as uid
    65534 both ports give nothing back, the owner predicts; stopping it leaves no process."""
    import urllib.request

    import psutil
    import tensorflow as tf

    import tfk8s_magics as tk

    cluster = tk.launch("srviso", workers=1, script="print(1)\n", backend=local)

    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
        def serve(self, x):
            return {"y": 2.0 * x}

    m = M()
    tf.saved_model.save(m, str(Path(cluster.status().log_dir.path) / "models" / "srviso" / "1"),
                        signatures={"serving_default": m.serve})
    info = cluster.serve()
    rest = int(info.rest_local.rstrip("/").rsplit(":", 1)[1])
    grpc_port = int(info.grpc_address.rsplit(":", 1)[1])
    assert probe([rest, grpc_port], NOBODY) == {rest: 0, grpc_port: 0}
    answered = probe([grpc_port], None)[grpc_port]  # the control: gRPC's SETTINGS to the owner
    assert isinstance(answered, int) and answered > 0
    req = urllib.request.Request(info.predict_url(), data=b'{"instances": [[1.5]]}')
    with urllib.request.urlopen(req, timeout=30) as r:
        assert json.loads(r.read())["predictions"] == [[3.0]]
    server = psutil.Process(info.pid)
    assert os.readlink(f"/proc/{info.pid}/ns/net") != os.readlink("/proc/self/ns/net")
    relay = [p for p in server.children() if "tfk8s_magics.isolation.relay" in " ".join(p.cmdline())]
    assert len(relay) == 1, server.children()
    assert cluster.serve(stop=True) is True
    psutil.wait_procs([server, *relay], timeout=10)
    assert not server.is_running() and not relay[0].is_running()
    cluster.delete()


@pytest.mark.slow
def test_tasks_run_in_the_namespace_and_the_shim_is_the_fallback(local, workdir, monkeypatch):
    """Between-graph tasks are in the supervisor's namespace (nothing of theirs on the host); with
    ``TFK8S_ISOLATION=loopback`` they run on the host's loopback with the shim, said in the status."""
    import tfk8s_magics as tk

    script = "import time\ntime.sleep(60)\n"
    cluster = tk.launch("ns", workers=1, ps=0, script=script, backend=local, wait_ready=240)
    raw = json.loads((local.clusters_dir / "ns" / "status.json").read_text())
    task = cluster.status().tasks[0]
    own = os.readlink("/proc/self/ns/net")
    theirs = os.readlink(f"/proc/{raw['supervisor_pid']}/ns/net")
    assert os.readlink(f"/proc/{task.pid}/ns/net") == theirs != own
    assert probe(_ports(local.addresses("ns")), None) == {p: "refused" for p in _ports(local.addresses("ns"))}
    cluster.delete()

    monkeypatch.setenv("TFK8S_ISOLATION", "loopback")
    cluster = tk.launch("shim", workers=1, ps=0, script=script, backend=local, wait_ready=240)
    raw = json.loads((local.clusters_dir / "shim" / "status.json").read_text())
    assert raw["isolation"] == {"mode": "loopback-shim", "reason": "TFK8S_ISOLATION=loopback", "netns": None}
    task = cluster.status().tasks[0]
    assert os.readlink(f"/proc/{task.pid}/ns/net") == own
    assert "libtfk8s_loopback_bind" in Path(f"/proc/{task.pid}/environ").read_text()
    cluster.delete()


if __name__ == "__main__":  # pragma: no cover - run by hand: python tests/test_local_isolation.py
    sys.exit(pytest.main([__file__, "-q"]))
