"""Issue 23, "What a real cluster shows": each defect the review traced against the real
sources, reproduced on the API double taught the real behaviour (tests/kubeapi).

The same fixes are proven on the real cluster in tests/test_k8s_issue23_real.py (``k8s``).
"""

from __future__ import annotations

import threading
import time

import pytest

from tfk8s_magics.backends.base import Phase
from tfk8s_magics.backends.kubernetes import KubernetesBackend
from tfk8s_magics.backends.kubernetes.logs import LogCursor, container_terminated, stamp_key
from tfk8s_magics.backends.kubernetes.rbac import backend_role
from tfk8s_magics.spec import ClusterSpec

NS = "alice"
SCRIPT = "print('training')\n"
BOUND = 15.0


def spec(name="mnist", **kw) -> ClusterSpec:
    kw.setdefault("ps", 0)
    kw.setdefault("workers", 1)
    kw.setdefault("script", SCRIPT)
    return ClusterSpec(name=name, **kw)


def env(kube, **kw) -> KubernetesBackend:
    kube.create_namespace(NS)
    kube.set_role(backend_role(NS), NS, service_account="jupyter")
    return KubernetesBackend(namespace=NS, api_client=kube.api_client, user="alice",
                             storage_class="standard", **kw)


def wait_for(predicate, what, timeout=BOUND):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


# -- 1. followed logs -----------------------------------------------------------------------

def test_the_log_cursor_drops_what_a_reopened_stream_repeats_and_nothing_else():
    c = LogCursor()
    first = ["2026-01-01T00:00:01.5Z", "2026-01-01T00:00:01.700000000Z",
             "2026-01-01T00:00:01.700000000Z"]
    assert [c.fresh(s) for s in first] == [True, True, True]
    assert c.since == "2026-01-01T00:00:01.700000000Z"
    c.reopened()  # the server starts again at the second (sinceTime to the second)
    again = [*first, "2026-01-01T00:00:01.700000000Z", "2026-01-01T00:00:02Z"]
    assert [c.fresh(s) for s in again] == [False, False, False, True, True]
    assert stamp_key("2026-01-01T00:00:01.5Z") == stamp_key("2026-01-01T00:00:01.500000000Z")
    assert container_terminated({"status": {"phase": "Running", "containerStatuses": [
        {"state": {"terminated": {"exitCode": 0}}}]}})
    assert not container_terminated({"status": {"phase": "Running", "containerStatuses": [
        {"state": {"running": {}}}]}})


def _follow(backend, name):
    stop = threading.Event()
    lines: list = []
    follower = threading.Thread(target=lambda: lines.extend(
        line for line in backend.follow_logs(name, stop)), daemon=True)
    follower.start()
    return stop, lines, follower


def test_a_task_quiet_for_longer_than_the_request_timeout_is_still_followed(make_kube):
    kube = make_kube()
    backend = env(kube, request_timeout=1.0)  # a read timeout would end the stream at 1 s
    backend.launch(spec(), detach=True)
    pod = kube.jobsets.pod_name(NS, "mnist", "worker", 0)
    stop, lines, follower = _follow(backend, "mnist")
    kube.kubelet.run(NS, pod)
    kube.kubelet.log(NS, pod, "importing tensorflow")
    wait_for(lambda: [ln.text for ln in lines] == ["importing tensorflow"], "the first line")
    time.sleep(2.5)  # silence: longer than the request timeout
    kube.kubelet.log(NS, pod, "epoch 1")
    wait_for(lambda: [ln.text for ln in lines][-1:] == ["epoch 1"], "the line after the silence")
    # one stream all along: the quiet did not time it out (no read timeout on a follow)
    assert len([r for r in kube.requests if r.resource_path == "pods/log"]) == 1
    kube.kubelet.succeed(NS, pod)
    kube.jobsets.finish(NS, "mnist")
    follower.join(BOUND)
    assert not follower.is_alive()
    assert [ln.text for ln in lines] == ["importing tensorflow", "epoch 1"]
    backend.close()


def test_a_dropped_stream_is_reopened_where_it_stopped_no_line_twice_none_lost(make_kube):
    kube = make_kube()
    backend = env(kube)
    backend.launch(spec(), detach=True)
    pod = kube.jobsets.pod_name(NS, "mnist", "worker", 0)
    stop, lines, follower = _follow(backend, "mnist")
    kube.kubelet.run(NS, pod)
    for i in range(5):
        kube.kubelet.log(NS, pod, f"line {i}")
    wait_for(lambda: len(lines) == 5, "five lines")
    opened = len([r for r in kube.requests if r.resource_path == "pods/log"])
    kube.api.drop_log_streams()  # the server ends the stream; the container runs on
    wait_for(lambda: len([r for r in kube.requests if r.resource_path == "pods/log"]) > opened,
             "the stream re-opened")
    reopened = [r for r in kube.requests if r.resource_path == "pods/log"][-1]
    assert "sinceTime" in reopened.query and reopened.query.get("timestamps") == "true"
    for i in range(5, 8):
        kube.kubelet.log(NS, pod, f"line {i}")
    kube.kubelet.succeed(NS, pod)
    kube.jobsets.finish(NS, "mnist")
    follower.join(BOUND)
    assert not follower.is_alive()
    assert [ln.text for ln in lines] == [f"line {i}" for i in range(8)]
    assert all(r.allowed for r in kube.requests)
    backend.close()
