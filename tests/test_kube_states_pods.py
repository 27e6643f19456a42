"""What a user is told about real pods is true (tier 2: ``scripts/kube up --pods``, a real kubelet).

Each test launches through the Kubernetes backend as the user's own ServiceAccount (the
``user`` fixture of ``tests/test_k8s_pods.py``) and reads what the notebook would show:

* a cluster that cannot start (an image no node can pull, a task no node has room for) says so
  in one stable sentence, and the waits end with it instead of waiting for ever;
* the cause of an incident is named: a worker pod deleted by hand, not the peer that lost it; an
  out-of-memory kill names the limit and ``--memory``;
* states that are true: ``stopping`` until the pods have ended; no readiness-probe warning for
  a task that is only starting; no ``running → starting → running`` at the end of a run; a
  relaunched cluster without the events of the deleted one of the same name.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.test_k8s_pods import _claims, _wait, realnode, user  # noqa: F401 - the fixtures
from tfk8s_magics.backends.base import Phase
from tfk8s_magics.spec import ClusterSpec, Resources

pytestmark = pytest.mark.k8s


class Recorder:
    """Every status the backend's watch yields for one cluster, from a thread, until stopped."""

    def __init__(self, backend, name: str):
        self.backend, self.name = backend, name
        self.seen = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            try:
                for st in self.backend.watch(self.name, self.stop):
                    self.seen.append((time.monotonic(), st))
            except Exception:  # noqa: BLE001 - deleted: the test reads what was seen
                return
            self.stop.wait(0.2)

    def close(self):
        self.stop.set()
        self.thread.join(10)
        return self.seen


def test_an_image_no_node_can_pull_says_so_at_once_and_the_wait_ends(user):  # noqa: F811 - the fixture
    from tfk8s_magics.api import Cluster
    from tfk8s_magics.errors import LaunchFailed

    backend = user.backend()
    image = "localhost/tfk8s/no-such-image:0"
    backend.launch(ClusterSpec(name="nopull", workers=1, script="print('hi')\n", image=image,
                               **_claims()), detach=True)
    t0 = time.monotonic()
    with pytest.raises(LaunchFailed) as exc:
        Cluster("nopull", backend).wait_ready(600)
    waited = time.monotonic() - t0
    sentence = str(exc.value)
    assert f"its image '{image}' cannot be pulled" in sentence and "--image" in sentence, sentence
    assert waited < 120, waited
    # the reason does not flip between ErrImagePull and ImagePullBackOff (the kubelet's back-off)
    reasons = set()
    deadline = time.monotonic() + 25
    while time.monotonic() < deadline:
        st = backend.status("nopull")
        assert st.phase == Phase.PENDING
        reasons.add((st.reason, st.task("worker-0").reason))
        time.sleep(1)
    assert len(reasons) == 1, reasons
    print(f"image pull failure said after {waited:.1f} s: {sentence}")
    backend.delete("nopull")


def test_a_task_no_node_has_room_for_says_so_after_the_grace(user, monkeypatch):  # noqa: F811 - the fixture
    from tfk8s_magics.api import Cluster
    from tfk8s_magics.backends.kubernetes import state
    from tfk8s_magics.errors import LaunchFailed

    monkeypatch.setattr(state, "SCHEDULE_GRACE", 10.0)  # 120 s in use: a test need not wait it
    backend = user.backend()
    backend.launch(ClusterSpec(name="huge", workers=1, script="print('hi')\n",
                               resources={"worker": Resources(cpu="64", memory="1Gi")}, **_claims()),
                   detach=True)
    t0 = time.monotonic()
    with pytest.raises(LaunchFailed) as exc:
        Cluster("huge", backend).wait_ready(600)
    sentence = str(exc.value)
    assert "worker-0 has fit on no node for more than 10 s" in sentence, sentence
    assert "Insufficient cpu" in sentence and "--cpu" in sentence, sentence
    assert time.monotonic() - t0 < 90
    assert backend.status("huge").cannot_start == sentence.removeprefix("cluster 'huge' ").rstrip(".")
    backend.delete("huge")


PEERS = """
import json, os, socket, time
cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"]
me = int(os.environ["TFK8S_TASK"].rsplit("-", 1)[1])
host, port = cluster[1].rsplit(":", 1)
if me == 1:  # serves its peer, as a collective's partner does
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", int(port))); s.listen(1)
    conn, _ = s.accept()
    print("peer connected", flush=True)
    while True:
        conn.sendall(b"."); time.sleep(0.5)
else:
    while True:
        try:
            c = socket.create_connection((host, int(port)), timeout=5); break
        except OSError:
            time.sleep(1)
    print("connected to worker-1", flush=True)
    c.settimeout(5)
    while True:  # the next step: a collective needs the peer (about a second to notice it gone)
        time.sleep(1)
        if not c.recv(4096):
            raise RuntimeError("lost my peer worker-1")
"""


def test_a_worker_pod_deleted_by_hand_is_named_not_the_peer_that_lost_it(user):  # noqa: F811 - the fixture
    backend = user.backend()
    backend.launch(ClusterSpec(name="blame", workers=2, script=PEERS, restart_budget=2, **_claims()),
                   detach=True)
    _wait(backend, "blame",
          lambda s: s.phase == Phase.RUNNING and all(t.phase == Phase.RUNNING for t in s.tasks))
    time.sleep(3)  # connected
    rec = Recorder(backend, "blame")
    victim = user.core.list_namespaced_pod(
        user.ns, label_selector="tfk8s.io/cluster=blame,tfk8s.io/role=worker,"
        "batch.kubernetes.io/job-completion-index=1").items[0]
    user.core.delete_namespaced_pod(victim.metadata.name, user.ns)
    _wait(backend, "blame", lambda s: s.terminal or (s.phase == Phase.RUNNING and all(
        t.restarts == 1 and t.phase == Phase.RUNNING for t in s.tasks)), timeout=300)
    seen = rec.close()
    reasons = [st.reason for _, st in seen]
    assert not [r for r in reasons if r.startswith("failing: worker-0")], reasons
    assert any(r.startswith("restarting: worker-1 failed: killed by SIGTERM: its pod was deleted")
               for r in reasons), reasons
    st = backend.status("blame")
    assert st.phase == Phase.RUNNING and all(t.restarts == 1 for t in st.tasks), st
    backend.delete("blame")


OOM = """
print("allocating", flush=True)
hog = bytearray(1536 * 2**20)
for i in range(0, len(hog), 4096):
    hog[i] = 1
print("still alive", flush=True)
"""


def test_an_out_of_memory_kill_names_the_limit_and_the_option(user):  # noqa: F811 - the fixture
    backend = user.backend()
    backend.launch(ClusterSpec(name="oom", workers=1, script=OOM, restart_budget=0,
                               resources={"worker": Resources(cpu="500m", memory="768Mi")}, **_claims()),
                   detach=True)
    st = _wait(backend, "oom", lambda s: s.terminal, timeout=400)
    assert st.phase == Phase.FAILED, st
    task = st.task("worker-0")
    assert task.reason.startswith("OOMKilled: the task used more than its memory limit of 768Mi"), task
    assert "--memory" in task.reason and "--memory" in st.reason, st.reason
    backend.delete("oom")


SLOW_STOP = """
import signal, sys, time
def slow(*_):  # a script that checkpoints before it ends
    print("stopping: saving", flush=True); time.sleep(8); sys.exit(143)
signal.signal(signal.SIGTERM, slow)
print("up", flush=True)
time.sleep(600)
"""


def test_stopping_until_the_pods_have_ended_then_stopped(user):  # noqa: F811 - the fixture
    backend = user.backend()
    backend.launch(ClusterSpec(name="slowstop", workers=1, script=SLOW_STOP, **_claims()), detach=True)
    _wait(backend, "slowstop", lambda s: s.phase == Phase.RUNNING)
    time.sleep(2)  # the script's handler is in place
    st = backend.stop("slowstop")
    assert st.phase == Phase.STOPPING and st.reason.startswith("stopping: waiting for worker-0"), st
    sel = "tfk8s.io/cluster=slowstop"
    t0 = time.monotonic()
    while True:
        st = backend.status("slowstop")
        pods = [p for p in user.core.list_namespaced_pod(user.ns, label_selector=sel).items
                if p.status.phase in ("Pending", "Running")]
        if st.phase == Phase.STOPPED:
            break
        assert st.phase == Phase.STOPPING, st
        assert time.monotonic() - t0 < 120
        time.sleep(0.5)
    assert not pods, [p.metadata.name for p in pods]  # stopped: nothing of it runs any more
    assert time.monotonic() - t0 > 3, "stopped at once although the script took 8 s to end"
    backend.delete("slowstop")


SHORT = "import time\nprint('training', flush=True)\ntime.sleep(4)\nprint('done', flush=True)\n"


def test_a_run_starts_ends_and_relaunches_without_false_states(user):  # noqa: F811 - the fixture
    backend = user.backend()
    rec = None
    backend.launch(ClusterSpec(name="calm", workers=2, script=SHORT, **_claims()), detach=True)
    rec = Recorder(backend, "calm")
    st = _wait(backend, "calm", lambda s: s.terminal, timeout=400)
    seen = rec.close()
    assert st.phase == Phase.SUCCEEDED, st
    phases = [s.phase for _, s in seen]
    first_running = phases.index(Phase.RUNNING)
    assert Phase.STARTING not in phases[first_running:], phases  # no running → starting → running
    events = backend.events("calm")
    assert not [e for e in events if e.reason == "Unhealthy"], [(e.task, e.message) for e in events]
    # the same name again: its events start with it, none of the deleted cluster's
    backend.delete("calm")
    backend.launch(ClusterSpec(name="calm", workers=2, script=SHORT, **_claims()), detach=True)
    born = backend.status("calm").created
    fresh = backend.events("calm")
    old = [(e.time, e.reason, e.message) for e in fresh if e.time < born]
    assert not old, old
    _wait(backend, "calm", lambda s: s.terminal, timeout=400)
    backend.delete("calm")
