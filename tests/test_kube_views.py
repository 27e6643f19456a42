"""The live views of a user's first hour on the REAL node (tier 2, ``scripts/kube up --pods``).

* A kubelet SIGKILLed for 20 s while a task trains: the dashboard's log and progress went on
  until then, then froze for good (the restarted kubelet answered the re-opened log 404 until it
  knew the pod again, which the follower took for a deleted pod). Now the dashboard says once that
  the log cannot be read for now, and goes on from the last line read, none lost or twice; the
  test prints the time from the kubelet's return to the first new line in the dashboard.
* The README's headline run, Keras's default progress bar and all: the dashboard, ``status`` and
  the logs end at "step 8/8" with no raw progress record and no backspace in any line.
* TensorBoard of that run: shown only once it answers, with the scalars the dashboard draws, and
  refused (401) to a request without its token, which the same TensorBoard without the token
  answers (the attack first succeeds with the defence removed). A screenshot of it is saved.

The pods run ``TFK8S_NODE_TASK_IMAGE`` (default: the task image ``scripts/kube up`` imported); the
code that runs inside them (the progress callback's scalars, TensorBoard's guard) is that image's.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

import tests.test_k8s_pods as pods_tests
from devcluster import node
from tests.realkube import wait_for
from tests.test_k8s_pods import BOUND, _claims, _wait
from tests.test_tensorboard_scalars import headline_script

realnode, user = pods_tests.realnode, pods_tests.user

pytestmark = pytest.mark.k8s

LINES = 120
PERIOD = 0.5  # the run lasts a minute; the kubelet is away for 20 s of it
DOWN_FOR = 20.0
#: Where the screenshot of TensorBoard on Kubernetes is kept beside the test artifacts.
SCREENSHOT_DIR = Path(os.environ.get("TFK8S_SCREENSHOT_DIR", Path(__file__).resolve().parent.parent
                                     / "test-artifacts"))


def _node_ready(kube) -> bool:
    from devcluster import node

    n = kube.core.read_node(node.NODE_NAME, _request_timeout=10)
    return {c.type: c.status for c in n.status.conditions or []}.get("Ready") == "True"


@pytest.fixture
def node_procs(realnode):
    """The first real node's processes; whatever the test stopped runs again, and the node is Ready."""
    from devcluster.cluster import Cluster

    (first,) = [n for n in node.layouts(Cluster()) if n.name == node.NODE_NAME]
    procs = first.procs
    yield procs
    if not procs.alive("kubelet"):
        procs.restart("kubelet")
    wait_for(lambda: _node_ready(realnode), BOUND, 1, "the node Ready after the test")


def _dashboard(backend, name: str):
    from tfk8s_magics.api import Cluster
    from tfk8s_magics.ui.dashboard import Dashboard

    return Dashboard(Cluster(name, backend), widgets=True, max_lines=2000).start()


def _lines(dash, task: str) -> list[str]:
    with dash._lock:
        return list(dash.lines.get(task, ()))


def test_the_dashboard_goes_on_across_a_kubelet_restart(user, node_procs, realnode):
    from tfk8s_magics.spec import ClusterSpec

    script = (
        "import time\n"
        "from tfk8s_magics import report_progress\n"
        f"for i in range({LINES}):\n"
        "    print(f'line {i:03d}', flush=True)\n"
        f"    report_progress(i + 1, total={LINES})\n"
        f"    time.sleep({PERIOD})\n"
    )
    backend = user.backend(request_timeout=10.0)
    dash = None
    try:
        on_first = {"worker": (f"kubernetes.io/hostname={node.NODE_NAME}",)}  # the node whose kubelet stops
        backend.launch(ClusterSpec(name="kubeletrun", workers=1, script=script, node_affinity=on_first,
                                   **_claims()), detach=True)
        dash = _dashboard(backend, "kubeletrun")

        def numbered() -> list[str]:
            return [t for t in _lines(dash, "worker-0") if re.fullmatch(r"line \d{3}", t)]

        wait_for(lambda: "line 010" in numbered(), BOUND, 0.2, "the first lines in the dashboard")
        node_procs.stop("kubelet", grace=5, sig=signal.SIGKILL)  # as a crash: no clean-up
        assert not node_procs.alive("kubelet")
        shown_at_kill = len(numbered())
        time.sleep(DOWN_FOR)
        assert len(numbered()) <= shown_at_kill + 2, "lines arrived with no kubelet to serve them"
        rec = node_procs._record("kubelet")
        node_procs.start("kubelet", rec["argv"], env=rec.get("env"))
        back = time.monotonic()
        shown_at_return = len(numbered())
        wait_for(lambda: len(numbered()) > shown_at_return, 120, 0.05, "a new line after the return")
        first_new = time.monotonic() - back
        print(f"kubelet back -> first new line in the dashboard: {first_new:.1f} s "
              f"(away {DOWN_FOR:g} s; {shown_at_return} lines shown before)")
        status = _wait(backend, "kubeletrun", lambda s: s.terminal)
        assert status.phase == "succeeded", status
        last = f"line {LINES - 1:03d}"
        wait_for(lambda: last in numbered(), 60, 0.2, f"{last!r} in the dashboard")
        got = numbered()
        assert got == [f"line {i:03d}" for i in range(LINES)], (
            f"lost: {sorted({f'line {i:03d}' for i in range(LINES)} - set(got))}; "
            f"twice: {sorted({t for t in got if got.count(t) > 1})}")
        texts = _lines(dash, "worker-0")
        notices = [t for t in texts if t.startswith("[tfk8s:")]
        assert any("cannot be read for now" in t for t in notices), texts[-20:]
        assert any("is read again" in t for t in notices), notices
        wait_for(lambda: dash.status is not None and dash.status.progress is not None
                 and dash.status.progress.step == LINES, 60, 0.2, "the dashboard's progress at its end")
        assert dash.status.progress.total == LINES
        wait_for(lambda: _node_ready(realnode), BOUND, 1, "the node Ready again")
        backend.delete("kubeletrun")
    finally:
        if dash is not None:
            dash.close()
        backend.close()


@pytest.fixture(scope="module")
def headline(realnode, tmp_path_factory):
    """The README's headline cell launched as written on the real node, run to its end, with a
    dashboard following it from the start."""
    from tfk8s_magics.spec import ClusterSpec

    u = pods_tests.User(realnode, tmp_path_factory.mktemp("pv"))
    backend = u.backend(request_timeout=10.0)
    dash = None
    try:
        backend.launch(ClusterSpec(name="mnist", workers=2, script=headline_script(), **_claims()),
                       detach=True)
        dash = _dashboard(backend, "mnist")
        status = _wait(backend, "mnist", lambda s: s.terminal)
        yield u, backend, dash, status
    finally:
        if dash is not None:
            dash.close()
        u.close()


def test_the_readme_run_ends_at_its_last_step_with_clean_logs(headline):
    _, backend, dash, status = headline
    assert status.phase == "succeeded", backend.read_logs("mnist")[-20:]
    st = backend.status("mnist")
    assert st.progress is not None and (st.progress.step, st.progress.total) == (8, 8), st.progress
    wait_for(lambda: dash.status is not None and dash.status.progress is not None
             and dash.status.progress.step == 8, 60, 0.2, "the dashboard at step 8/8")
    logged = [line.text for line in backend.read_logs("mnist")]  # %tfcluster logs, the sidebar's tab
    shown = _lines(dash, "worker-0") + _lines(dash, "worker-1")
    for texts in (logged, shown):
        assert not [t for t in texts if "@tfk8s-progress" in t or "\b" in t], texts
        assert "Epoch 2/2" in texts
    assert any(t.startswith("4/4 [") and "loss:" in t for t in logged), logged


GET = """
import base64, json, sys, urllib.error, urllib.request
url, token = sys.argv[1], sys.stdin.read()  # the token on stdin: no secret on a command line
request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
try:
    with urllib.request.urlopen(request, timeout=10) as r:
        code, body = r.status, r.read()
except urllib.error.HTTPError as e:
    code, body = e.code, e.read()
except OSError as e:  # refused or unreachable: no answer
    code, body = 0, str(e).encode()
print(json.dumps({"code": code, "body": base64.b64encode(body).decode()}))
"""


def _owners_pod(u, away_from: str) -> Path:
    """The network namespace of a pod in the owner's namespace labelled as their notebook server,
    on the real node other than ``away_from`` (TensorBoard's): the place the owner's requests come
    from (the notebook server's proxy adds the token). The namespace's NetworkPolicy lets its own
    pods in, so what answers a request from there is TensorBoard's guard. This machine itself is no
    node (it has no route to the Services' range); from a node's own namespace kube-proxy would
    masquerade the request to the pod bridge's address, which the policy drops."""
    from devcluster.cluster import Cluster
    from tests.test_k8s_pods import TASK_IMAGE, _restricted_pod
    from tests.test_kube_netpol import _container_pid
    from tests.test_kube_nodes import _on, _real_nodes, _running

    other = next(n for n in _real_nodes(u.kube) if n != away_from)
    u.core.create_namespaced_pod(u.ns, _on(_restricted_pod("owner", TASK_IMAGE, ["sleep", "3600"]), other))
    pod = _running(u.core, u.ns, "owner")
    (there,) = [n for n in node.layouts(Cluster()) if n.name == other]
    return Path(f"/proc/{_container_pid(there, pod)}/ns/net")


def _get(netns: Path, url: str, token: str | None = None) -> tuple[int, bytes]:
    """GET ``url`` from inside the network namespace ``netns`` (a pod's: the node's kube-proxy
    translates the Services' addresses)."""
    import base64
    import json
    import subprocess
    import sys

    r = subprocess.run(["nsenter", f"--net={netns}", "--", sys.executable, "-c", GET, url],
                       input=token or "", capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    return out["code"], base64.b64decode(out["body"])


def test_tensorboard_shows_the_readme_runs_scalars_and_answers_only_its_owner(
        headline, tmp_path, monkeypatch):
    import json

    from tfk8s_magics import tbtokens
    from tfk8s_magics.backends.kubernetes import manifests as m
    from tfk8s_magics.runtime import summaries

    u, backend, dash, status = headline
    assert status.phase == "succeeded"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "home-data"))  # the owner's home
    t0 = time.monotonic()
    info = backend.tensorboard("mnist")
    print(f"tensorboard() returned, ready, in {time.monotonic() - t0:.1f} s")
    host = f"mnist-tensorboard.{u.ns}.svc"
    assert info.url.endswith(f"/tfk8s/tensorboard/{host}:6006/"), info.url
    secret, token = tbtokens.load(host)
    ip = u.core.read_namespaced_service("mnist-tensorboard", u.ns).spec.cluster_ip
    base = f"http://{ip}:6006"
    tensorboard = "tfk8s.io/cluster=mnist,tfk8s.io/component=tensorboard"
    (tb_pod,) = u.core.list_namespaced_pod(u.ns, label_selector=tensorboard).items
    at = _owners_pod(u, away_from=tb_pod.spec.node_name)  # across nodes, as the owner's notebook
    # Shown only once ready: the very first request after tensorboard() returned is answered.
    code, body = _get(at, f"{base}/data/runs", token)
    assert code == 200, (code, body[:300])
    # The scalars the dashboard draws: the run "progress", loss by step, to the last step.
    url = f"{base}/data/plugin/scalars/scalars?run={summaries.RUN}&tag=loss"
    points = wait_for(lambda: (lambda r: r[0] == 200 and json.loads(r[1]))(_get(at, url, token)), 120, 1,
                      "the loss in TensorBoard")
    assert [int(s) for _, s, _ in points][-1] == 8, points
    assert points[-1][2] == pytest.approx(backend.status("mnist").progress.metrics["loss"], rel=1e-4)
    # A request without the token (another user's, straight to the Service, on a cluster whose
    # network lets it through: here from inside the owner's namespace): refused.
    code, body = _get(at, f"{base}/data/runs")
    assert code == 401 and b"only through its owner's notebook server" in body, (code, body)
    assert _get(at, f"{base}/data/runs", "someone-elses")[0] == 401
    # The same attack on the same TensorBoard without its token (the defence removed) succeeds.
    open_dep = m.tensorboard_deployment(backend._spec_of(backend._require_root("mnist")), backend.settings)
    open_dep["metadata"]["name"] = "open-tensorboard"
    labels = {"tfk8s.io/cluster": "mnist", "tfk8s.io/component": "open-tensorboard"}
    open_dep["spec"]["selector"] = {"matchLabels": labels}
    open_dep["spec"]["template"]["metadata"]["labels"] = labels
    container = open_dep["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [e for e in container["env"] if e["name"] != m.TENSORBOARD_TOKEN_ENV]
    container["readinessProbe"]["httpGet"]["path"] = "/"  # no guard: no readiness path either
    from kubernetes import client

    apps = client.AppsV1Api(u.admin)
    apps.create_namespaced_deployment(u.ns, open_dep)
    svc = u.core.create_namespaced_service(u.ns, {
        "metadata": {"name": "open-tensorboard"},
        "spec": {"selector": labels, "ports": [{"port": 6006, "targetPort": 6006}]}})
    open_base = f"http://{svc.spec.cluster_ip}:6006"
    wait_for(lambda: _get(at, f"{open_base}/data/runs")[0] == 200, BOUND, 1, "the unguarded TensorBoard")
    code, body = _get(at, f"{open_base}/data/runs")
    assert code == 200 and b"progress" in body, (code, body[:300])
    _screenshot(at, base, token)
    backend.delete("mnist")


SHOT = """
import sys, time
from pathlib import Path
from tests.browserlab import chromium
base, path, token = sys.argv[1], Path(sys.argv[2]), sys.stdin.read()
with chromium(path.parent / ".tb-profile") as page:
    page.context.set_extra_http_headers({"Authorization": f"Bearer {token}"})
    page.goto(f"{base}/?darkMode=false&forceSVG=true#timeseries", wait_until="networkidle", timeout=120_000)
    page.get_by_text("loss").first.wait_for(timeout=60_000)
    time.sleep(3)  # the chart's lines are drawn just after its card
    page.screenshot(path=str(path))
"""


def _screenshot(netns: Path, base: str, token: str) -> None:
    """TensorBoard's time series of the run, as its owner's browser gets it (the token added), by a
    Chromium in the network namespace ``netns`` (the owner's pod: see :func:`_owners_pod`)."""
    import subprocess
    import sys

    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOT_DIR / "kube-tensorboard-headline.png"
    repo = Path(__file__).resolve().parent.parent
    r = subprocess.run(["nsenter", f"--net={netns}", "--", sys.executable, "-c", SHOT, base, str(path)],
                       input=token, capture_output=True, text=True, timeout=300, cwd=repo,
                       env={**os.environ, "PYTHONPATH": str(repo)})
    assert r.returncode == 0, r.stderr[-3000:]
    print(f"TensorBoard on Kubernetes: {path}")
