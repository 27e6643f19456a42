"""Faults of the platform on the REAL node (tier 2, ``scripts/kube up --pods``): a followed log.

``tests/test_kube_platform_faults.py`` restarts the control plane under kwok pods, which write no
log. Here a real task pod prints numbered lines while kube-apiserver is stopped and started again:
the log stream the notebook follows (through the API server, from the kubelet) breaks, and the
backend must re-open it so that every line arrives exactly once, in order.
"""

from __future__ import annotations

import re
import threading

import pytest

import tests.test_k8s_pods as pods_tests
from tests.realkube import wait_for
from tests.test_k8s_pods import _claims, _wait
from tests.test_kube_platform_faults import _ready

# the real node's fixtures: a user namespace under restricted, hostPath claims, the task image
realnode, user = pods_tests.realnode, pods_tests.user

pytestmark = pytest.mark.k8s

LINES = 80
PERIOD = 0.5  # seconds between two lines: the run lasts 40 s, the restart happens in its middle


@pytest.fixture
def devcluster():
    from devcluster.cluster import Cluster

    c = Cluster()
    yield c
    if not c.procs.alive("kube-apiserver"):  # whatever the test stopped runs again for the next one
        c.procs.restart("kube-apiserver")
    wait_for(lambda: _ready(c), 120, message="the API server after the test")


def test_a_followed_log_resumes_across_an_apiserver_restart_without_a_duplicated_or_lost_line(
    user, devcluster
):
    from tfk8s_magics.spec import ClusterSpec

    script = (
        "import time\n"
        f"for i in range({LINES}):\n"
        "    print(f'line {i:03d}', flush=True)\n"
        f"    time.sleep({PERIOD})\n"
    )
    backend = user.backend(request_timeout=10.0)
    stop = threading.Event()
    seen: list[str] = []

    def follow():
        for line in backend.follow_logs("chatty", stop):
            seen.append(line.text)

    follower = threading.Thread(target=follow, daemon=True)
    try:
        backend.launch(ClusterSpec(name="chatty", workers=1, script=script, **_claims()), detach=True)
        follower.start()
        wait_for(lambda: "line 010" in seen, 600, 0.2, "the first lines to be followed")
        devcluster.procs.restart("kube-apiserver", down_for=3)
        wait_for(lambda: _ready(devcluster), 120, 0.5, "the API server back")
        status = _wait(backend, "chatty", lambda s: s.terminal)
        assert status.phase == "succeeded", status
        last = f"line {LINES - 1:03d}"
        wait_for(lambda: last in seen, 60, 0.5, f"{last!r} to arrive after the restart")
        numbered = [t for t in seen if re.fullmatch(r"line \d{3}", t)]
        assert numbered == [f"line {i:03d}" for i in range(LINES)], (
            f"lost: {sorted(set(f'line {i:03d}' for i in range(LINES)) - set(numbered))}; "
            f"twice: {sorted({t for t in numbered if numbered.count(t) > 1})}"
        )
        # The restarted API server refuses the user's first requests (403: its RBAC caches are
        # still empty): the log re-opens and the namespace feed's re-lists alike. Each refusal
        # was retried: the same request answered later, and the log re-opens resumed where the
        # stream stopped (sinceTime) — which the exact line sequence above proves.
        requests = user.ns_obj.requests()
        denied = [(i, r) for i, r in enumerate(requests) if r.code == 403]
        for i, r in denied:
            path = r.uri.split("?")[0]
            assert any(
                later.verb == r.verb and later.uri.split("?")[0] == path and later.code < 400
                for later in requests[i + 1:]
            ), f"{r.verb} {r.uri} was refused after the restart and never answered on a retry"
            if r.subresource == "log":
                assert "sinceTime=" in r.uri, r
        user.expect_denied.update(r.uri.split("?")[0] for _, r in denied)
        stop.set()
        follower.join(30)
        backend.delete("chatty")
    finally:
        stop.set()
        backend.close()
