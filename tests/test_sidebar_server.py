"""The sidebar's server side without a browser: rows and the launch form as pure functions
(against literal dicts), the monitor on a real local backend, and the REST + WebSocket API of
a real jupyter_server with its own authentication and XSRF rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tfk8s_magics import api, options
from tfk8s_magics.backends import ClusterStatus, Event, Progress, TaskStatus
from tfk8s_magics.errors import SpecError
from tfk8s_magics.sidebar.form import form_argv, form_fields, parse_form
from tfk8s_magics.sidebar.monitor import ClusterMonitor
from tfk8s_magics.sidebar.rows import cluster_row, event_row
from tfk8s_magics.stall import Stall

REPO = Path(__file__).resolve().parent.parent


# -- rows ---------------------------------------------------------------------------------------


def test_row_of_a_running_cluster_with_progress():
    st = ClusterStatus(
        name="mnist", backend="local", mode="between", phase="running", created=100.0, owner="ann",
        detached=True,
        tasks=[TaskStatus("ps-0", "running"), TaskStatus("worker-0", "running"),
               TaskStatus("worker-1", "starting")],
        progress=Progress(step=120, total=1000, rate=5.0, metrics={"loss": 0.5}, time=110.0),
    )
    assert cluster_row(st, now=111.0) == {
        "name": "mnist", "backend": "local", "mode": "between", "phase": "running", "terminal": False,
        "reason": "", "stall": "", "created": 100.0, "finished": None, "detached": True, "owner": "ann",
        "log_dir": "", "ready": 2, "total": 3,
        "tasks": [
            {"name": "ps-0", "phase": "running", "reason": "", "restarts": 0, "exit_code": None},
            {"name": "worker-0", "phase": "running", "reason": "", "restarts": 0, "exit_code": None},
            {"name": "worker-1", "phase": "starting", "reason": "", "restarts": 0, "exit_code": None},
        ],
        "failed_task": None,
        "progress": {"step": 120, "total": 1000, "percent": 12.0, "eta": 176.0, "rate": 5.0,
                     "metrics": {"loss": 0.5}, "time": 110.0},
    }


def test_row_of_a_failed_cluster_names_its_first_failed_task_and_drops_the_eta():
    st = ClusterStatus(
        name="bad", backend="local", mode="between", phase="failed", reason="restart budget spent",
        tasks=[TaskStatus("worker-0", "succeeded", exit_code=0),
               TaskStatus("worker-1", "failed", reason="exit code 1", exit_code=1, restarts=2),
               TaskStatus("worker-2", "failed", reason="exit code 1", exit_code=1)],
        progress=Progress(step=10, total=100, rate=2.0),
    )
    row = cluster_row(st, now=0.0)
    assert (row["phase"], row["terminal"], row["failed_task"], row["ready"]) == (
        "failed", True, "worker-1", 1)
    assert row["progress"]["eta"] is None and row["progress"]["rate"] is None
    assert row["progress"]["percent"] == 10.0


def test_row_of_a_stalled_cluster_says_so():
    st = ClusterStatus(name="s", backend="local", mode="between", phase="running",
                       tasks=[TaskStatus("worker-0", "running")], stall=Stall(since=100.0, timeout=60.0))
    row = cluster_row(st, now=165.0)
    assert row["phase"] == "stalled"
    assert row["stall"] == "stalled: no log line, progress or task exit for 1m 05s"


def test_event_row():
    e = Event(time=5.0, task="worker-1", reason="Restarted", message="exit code 1", type="Warning")
    assert event_row(e) == {"time": 5.0, "task": "worker-1", "reason": "Restarted",
                            "message": "exit code 1", "type": "Warning"}


# -- the launch form ----------------------------------------------------------------------------


def test_form_fields_are_the_registrys_launch_options():
    fields = {f["name"]: f for f in form_fields({})}
    launch = [o.name for o in options.for_command("launch")
              if o.name not in ("name", "script_path", "detach", "show_dashboard")]
    assert list(fields) == launch
    assert fields["workers"] == {"name": "workers", "flag": "--workers", "kind": "int", "default": 2,
                                 "help": "worker tasks", "metavar": "N"}
    assert fields["ps_grace_period"]["kind"] == "float"
    assert fields["legacy_keras"] == {
        "name": "legacy_keras", "flag": "--no-legacy-keras", "kind": "bool", "default": True,
        "help": options.OPTIONS["legacy_keras"].help, "metavar": ""}
    assert fields["env"]["kind"] == "list" and fields["mode"]["default"] == "between"


def test_form_argv_is_the_magics_command_line():
    assert form_argv("m", "/r/t.py", {"workers": "3", "ps": "", "legacy_keras": False, "data_sync": False,
                                       "env": ["A=1", "B=2"], "replace": True}) == [
        "launch", "m", "--script", "/r/t.py", "--workers", "3", "--env", "A=1", "--env", "B=2",
        "--no-legacy-keras", "--replace"]
    args = parse_form("m", "/r/t.py", {"workers": "3", "mode": "in-graph", "ps": "1"})
    assert (args.name, args.workers, args.ps, args.mode, args.script_path) == (
        "m", 3, 1, "in-graph", "/r/t.py")


@pytest.mark.parametrize(("values", "magic_line"), [
    ({"workers": "x"}, "launch m --script /r/t.py --workers x"),
    ({"ps_grace_period": "soon"}, "launch m --script /r/t.py --ps-grace soon"),
])
def test_a_type_mistake_is_the_magics_sentence(values, magic_line):
    from IPython.core.error import UsageError

    from tfk8s_magics.magics import TFClusterMagics

    with pytest.raises(SpecError) as form_error:
        parse_form("m", "/r/t.py", values)
    parser = TFClusterMagics(shell=None)._parser()
    with pytest.raises(UsageError) as magic_error:
        parser.parse_args(magic_line.split())
    assert str(form_error.value) == str(magic_error.value)


def test_a_check_mistake_is_the_apis_sentence(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("print(1)\n")
    args = parse_form("m", str(script), {"workers": "300"})
    with pytest.raises(SpecError) as e:
        api.make_spec(args.name, **{o.name: getattr(args, o.name) for o in options.spec_options()})
    assert str(e.value) == "--workers 300 is out of range: give a count from 0 to 256."


def test_launch_prepares_the_client_only_when_asked(monkeypatch):
    """api.launch(prepare_client=False): the server's form launch imports no TensorFlow."""
    from tfk8s_magics import ingraph
    from tfk8s_magics.errors import ClusterNotFound

    imported, launched = [], []
    monkeypatch.setattr(ingraph, "preimport", lambda legacy: imported.append(legacy))

    class Recorder:
        name = "recorder"

        def launch(self, spec, detach=False):
            launched.append((spec.name, spec.mode, detach))

        def status(self, name):  # api.launch asks whether an ended cluster of that name exists
            raise ClusterNotFound(name)

        def attach_previous(self, name, kept):  # no earlier run was kept
            pass

    monkeypatch.setattr(api, "resolve_backend", lambda backend=None: Recorder())
    api.launch("ig", mode="in-graph", ps=1, workers=1, detach=True, prepare_client=False)
    assert (launched, imported) == ([("ig", "in-graph", True)], [])
    api.launch("ig2", mode="in-graph", ps=1, workers=1)
    assert imported == [True]
    api.launch("bg", workers=1, script="print(1)")
    assert imported == [True] and len(launched) == 3


def test_form_refuses_unknown_options_and_non_booleans():
    with pytest.raises(SpecError, match="the launch form has no option 'nope'"):
        form_argv("m", "t.py", {"nope": 1})
    with pytest.raises(SpecError, match="--replace is a yes/no option, got 'yes'"):
        form_argv("m", "t.py", {"replace": "yes"})
    with pytest.raises(SpecError, match="the cluster has no name"):
        parse_form(" ", "t.py", {})


# -- the monitor on a real local backend ---------------------------------------------------------

COUNT = textwrap.dedent("""\
    import sys, time
    import tfk8s_magics as tk
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    for i in range(n):
        print(f"line {i}", flush=True)
        tk.report_progress(i + 1, total=n, loss=1.0 / (i + 1))
        time.sleep(0.25)
""")


@pytest.mark.slow
def test_monitor_pushes_rows_of_clusters_launched_anywhere(state_dir, tmp_path):
    script = tmp_path / "count.py"
    script.write_text(COUNT)
    seen: list[dict] = []
    lock = threading.Lock()

    def on(msg):
        with lock:
            seen.append(msg)

    def phases(name):
        with lock:
            return [m["cluster"]["phase"] for m in seen
                    if m["type"] == "cluster" and m["cluster"]["name"] == name]

    mon = ClusterMonitor(discover_every=0.5).start()
    mon.subscribe(on)
    try:
        api.launch("here", workers=1, script_path=str(script), detach=True)
        # Launched by another process (the CLI): found by discovery, then watched.
        env = dict(os.environ)
        subprocess.run([str(Path(sys.executable).parent / "tfk8s"), "submit", "there", "--workers", "1",
                        "--script", str(script)], env=env, check=True, capture_output=True, timeout=120)
        wait_for(lambda: "succeeded" in phases("here") and "succeeded" in phases("there"), 120,
                 "both clusters to be pushed as succeeded")
        for name in ("here", "there"):
            got = phases(name)
            assert got.index("running") < got.index("succeeded"), got
        steps = [m["cluster"]["progress"]["step"] for m in seen
                 if m["type"] == "cluster" and m["cluster"]["name"] == "here" and m["cluster"]["progress"]]
        assert steps[-1] == 12 and len(set(steps)) > 3, steps  # progress pushed step by step
        assert {r["name"] for r in mon.snapshot()} == {"here", "there"}
        api.get("there").delete()
        wait_for(lambda: any(m == {"type": "removed", "name": "there"} for m in list(seen)), 30,
                 "the deleted cluster's removal")
        assert [r["name"] for r in mon.snapshot()] == ["here"]
    finally:
        mon.close()


def test_a_cluster_the_server_launched_stays_listed_through_a_discovery_that_began_before(monkeypatch):
    """The sidebar's ``POST`` answered 201 while a discovery pass, whose listing was taken before
    the launch, dropped the new row: the ``GET`` after it listed no cluster at all."""
    listing_taken, launch_done = threading.Event(), threading.Event()

    def list_before_the_launch(backend=None):  # noqa: ARG001 - list_clusters's signature
        listing_taken.set()
        launch_done.wait(10)
        return []  # listed before the launch ended

    monkeypatch.setattr(api, "list_clusters", list_before_the_launch)
    mon = ClusterMonitor()
    row = cluster_row(ClusterStatus(name="new", backend="local", mode="between", phase="succeeded",
                                    created=100.0), now=101.0)
    discovery = threading.Thread(target=mon.discover)
    discovery.start()
    assert listing_taken.wait(10)
    mon.launched(row)
    launch_done.set()
    discovery.join(10)
    assert [r["name"] for r in mon.snapshot()] == ["new"]
    mon.discover()  # a pass that began after the launch and does not list it: it was deleted since
    assert mon.snapshot() == []
    mon.close()


# -- the real server: REST, WebSocket, authentication, XSRF --------------------------------------


@pytest.fixture
def lab(tmp_path, state_dir):
    from tests.browserlab import Lab

    root = tmp_path / "root"
    root.mkdir()
    (root / "count.py").write_text(COUNT)
    server = Lab(tmp_path, state_dir, root)
    server.start()
    try:
        yield server
    finally:
        server.close()


def test_the_server_refuses_requests_without_login(lab):
    status, _ = lab.request("GET", "/tfk8s/clusters", token=False)
    assert status == 403
    status, _ = lab.request("POST", "/tfk8s/clusters", {"name": "x", "script": "count.py"}, token=False)
    assert status == 403
    import websocket

    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        websocket.create_connection(f"ws://127.0.0.1:{lab.port}/tfk8s/stream", timeout=10)
    assert e.value.status_code == 403
    assert not api.list_clusters()


def test_a_cookie_login_needs_the_xsrf_token_to_change_anything(lab):
    import http.cookiejar

    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(f"{lab.base}/lab?token={lab.token}", timeout=60).close()  # logs in: sets the cookies
    xsrf = next(c.value for c in jar if c.name == "_xsrf")

    def post(headers):
        req = urllib.request.Request(f"{lab.base}/tfk8s/clusters", method="POST", headers=headers,
                                     data=json.dumps({"name": "c", "script": "count.py",
                                                      "options": {"workers": "x"}}).encode())
        try:
            with opener.open(req, timeout=60) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    status, text = post({})
    assert status == 403 and "xsrf" in text.lower()
    status, text = post({"X-XSRFToken": xsrf})
    assert status == 400, text  # past XSRF: the form's own sentence
    assert json.loads(text)["message"] == (
        "%tfcluster launch: argument --workers: 'x' is not a whole number "
        "(%tfcluster launch --help shows how)")
    with opener.open(f"{lab.base}/tfk8s/clusters", timeout=60) as r:
        assert json.loads(r.read())["clusters"] == []


def test_launch_refuses_a_script_outside_the_root_and_creates_nothing(lab, tmp_path):
    outside = tmp_path / "outside.py"
    outside.write_text("print('no')\n")
    status, body = lab.request("POST", "/tfk8s/clusters", {"name": "c", "script": "../outside.py"})
    assert status == 400
    assert body["message"].startswith("the script '../outside.py' is outside the server's root")
    status, body = lab.request("POST", "/tfk8s/clusters", {"name": "c", "script": ""})
    assert (status, body["message"]) == (
        400, "no training script chosen: pick a .py file in the file browser.")
    assert not api.list_clusters()


@pytest.mark.slow
def test_rest_and_stream_launch_follow_stop_delete(lab):
    import websocket

    ws = websocket.create_connection(f"ws://127.0.0.1:{lab.port}/tfk8s/stream?token={lab.token}", timeout=60)
    try:
        first = json.loads(ws.recv())
        assert (first["type"], first["backend"], first["clusters"]) == ("snapshot", "local", [])
        status, body = lab.request("POST", "/tfk8s/clusters", {"name": "c1", "script": "count.py",
                                                                "options": {"workers": "1"}})
        assert status == 201, body
        assert body["cluster"]["name"] == "c1" and body["cluster"]["detached"] is True
        ws.send(json.dumps({"type": "follow", "id": "7", "name": "c1"}))
        lines, phases = [], []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            m = json.loads(ws.recv())
            if m["type"] == "logs":
                assert m["id"] == "7"
                lines += [text for task, text, _ in m["lines"] if task == "worker-0"]
            elif m["type"] == "cluster" and m["cluster"]["name"] == "c1":
                phases.append(m["cluster"]["phase"])
            elif m["type"] == "logs_end":
                break
        assert lines == [f"line {i}" for i in range(12)]
        wait_for(lambda: lab.request("GET", "/tfk8s/clusters")[1]["clusters"][0]["phase"] == "succeeded", 30,
                 "c1 to be listed as succeeded")
        status, body = lab.request("GET", "/tfk8s/clusters/c1/events")
        assert status == 200 and isinstance(body["events"], list)
        status, body = lab.request("DELETE", "/tfk8s/clusters/c1")
        assert status == 204
        assert not api.list_clusters()
        status, body = lab.request("POST", "/tfk8s/clusters/c1/stop")
        assert status == 404 and "c1" in body["message"]
    finally:
        ws.close()


@pytest.mark.slow
def test_a_stopped_tensorboards_link_says_what_happened_and_how_to_start_it_again(lab):
    """Issue 27 item 7: the link of a TensorBoard whose server was stopped (its cluster deleted)
    gave jupyter-server-proxy's bare "500 : Internal Server Error"."""
    status, body = lab.request("POST", "/tfk8s/clusters", {"name": "tb", "script": "count.py",
                                                            "options": {"workers": "1"}})
    assert status == 201, body
    wait_for(lambda: lab.request("GET", "/tfk8s/clusters")[1]["clusters"][0]["phase"] == "succeeded", 120,
             "tb to succeed")
    status, tb = lab.request("POST", "/tfk8s/clusters/tb/tensorboard")
    assert status == 200, tb

    def get(path):
        req = urllib.request.Request(f"{lab.base}{path}", headers={"Authorization": f"token {lab.token}"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    status, page = get(f"/proxy/{tb['port']}/")
    assert status == 200 and "<title>TensorBoard</title>" in page, (status, page[:300])
    assert lab.request("DELETE", "/tfk8s/clusters/tb")[0] == 204  # stops its TensorBoard too
    for path, where in ((f"/proxy/{tb['port']}/", tb["port"]),
                        (f"/proxy/127.0.0.1:{tb['port']}/", tb["port"]),
                        (f"/proxy/localhost:{tb['port']}/", f"localhost:{tb['port']}")):
        status, page = get(path)
        assert status == 502, (path, status, page[:500])
        assert f"This server has stopped: nothing answers on port {where} any more." in page, page
        assert "%tfcluster tensorboard NAME" in page and "Internal Server Error" not in page


# -- packaging: a plain pip install enables both halves -------------------------------------------


@pytest.mark.slow
def test_the_wheel_ships_the_prebuilt_sidebar_and_enables_it(tmp_path):
    assert (REPO / "tfk8s_magics" / "sidebar" / "labextension" / "package.json").exists(), (
        "the sidebar is not built: run scripts/bootstrap lab")
    wheels, prefix = tmp_path / "wheels", tmp_path / "prefix"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(REPO), "-w", str(wheels)],
                   check=True, capture_output=True, timeout=600, cwd=tmp_path)
    wheel = next(wheels.glob("tfk8s_magics-*.whl"))
    # Installed as an installer lays a wheel out under a prefix (by hand: pip would also see, and
    # replace, this checkout's editable install in the test's own environment).
    import zipfile

    site = prefix / "lib" / "site-packages"
    with zipfile.ZipFile(wheel) as z:
        for member in z.namelist():
            head, _, rest = member.partition(".data/data/")
            target = prefix / rest if rest and "/" not in head else site / member
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(member))
    # Where Jupyter looks under sys.prefix (this checkout's .venv has its own copies: read the files).
    conf = json.loads((prefix / "etc/jupyter/jupyter_server_config.d/tfk8s_magics.json").read_text())
    assert conf == {"ServerApp": {"jpserver_extensions": {"tfk8s_magics.sidebar": True}}}
    ext = prefix / "share/jupyter/labextensions/tfk8s-sidebar"
    meta = json.loads((ext / "package.json").read_text())
    assert meta["name"] == "tfk8s-sidebar" and (ext / meta["jupyterlab"]["_build"]["load"]).is_file()
    # A prefix of its own, read as Jupyter reads sys.prefix: nothing of this checkout on the path.
    env = dict(os.environ, PYTHONPATH=str(site), JUPYTER_PATH=str(prefix / "share" / "jupyter"),
               JUPYTER_CONFIG_PATH=str(prefix / "etc" / "jupyter"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"), JUPYTER_DATA_DIR=str(tmp_path / "data"))
    jupyter = str(Path(sys.executable).parent / "jupyter")
    servers = subprocess.run([jupyter, "server", "extension", "list"], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
    text = servers.stdout + servers.stderr
    assert "tfk8s_magics.sidebar" in text and str(site) in subprocess.run(
        [sys.executable, "-c", "import tfk8s_magics.sidebar as s; print(s.__file__)"], env=env, cwd=tmp_path,
        capture_output=True, text=True, timeout=60).stdout
    plain = " ".join(text.replace("\x1b[32m", "").replace("\x1b[0m", "").split())
    assert "tfk8s_magics.sidebar enabled" in plain
    labs = subprocess.run([jupyter, "labextension", "list"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    listed = " ".join((labs.stdout + labs.stderr).replace("\x1b[32m", "").replace("\x1b[0m", "").split())
    assert f"{prefix / 'share' / 'jupyter' / 'labextensions'}" in listed
    assert "tfk8s-sidebar v0.1.0 enabled OK" in listed
