"""The follower's rule for a refused follow request (``logs._Reader._follow_pod``), table-driven.

The real cases are on the real node (``tests/test_kube_node_faults.py``: a restarted kube-apiserver
answers the first re-open 403 until its RBAC caches are filled). Here each answer is scripted so
every branch of the rule is pinned: a refusal of the very first request is said at once; a
401/403 after the stream was open, or a 429/5xx, is retried and the lines continue, none twice;
a refusal that outlasts the window is said once.
"""

from __future__ import annotations

import queue
import threading
from types import SimpleNamespace

import pytest
from kubernetes.client.rest import ApiException

from tfk8s_magics.backends.kubernetes import logs

RUNNING = {"status": {"phase": "Running", "containerStatuses": [{"state": {"running": {}}}]}}
DONE = {"status": {"phase": "Running", "containerStatuses": [{"state": {"terminated": {}}}]}}


class Stream:
    def __init__(self, lines: list[str]):
        self.lines = lines

    def stream(self, *_a, **_k):
        for line in self.lines:
            yield line.encode() + b"\n"

    def release_conn(self):
        pass


class Script:
    """The API's answers, one per follow request: a list of lines (a stream), or a status.

    After the last scripted answer the container has ended and a request gets an empty stream."""

    def __init__(self, answers: list, pod_after: dict):
        self.answers = list(answers)
        self.calls = 0
        self.pod = RUNNING
        self.pod_after = pod_after

    def follow_log(self, pod, since=None, tail=None):
        self.calls += 1
        answer = self.answers.pop(0) if self.answers else []  # after the script: the log is complete
        if not self.answers:
            self.pod = self.pod_after  # the last scripted answer: the container ends after it
        if isinstance(answer, int):
            raise ApiException(status=answer, reason=f"status {answer}")
        return Stream(answer)


def _follow(answers: list, pod_after: dict = DONE) -> tuple[list[str], Script]:
    api = Script(answers, pod_after)
    watcher = SimpleNamespace(
        api=api, deleted=False, pod_named=lambda name: api.pod, spec=SimpleNamespace(name="c")
    )
    out: queue.Queue = queue.Queue()
    reader = logs._Reader(watcher, "worker-0", out, threading.Event(), from_start=True)
    reader._follow_pod("c-worker-0")
    texts = []
    while not out.empty():
        texts.append(out.get().text)
    return texts, api


S = "2026-11-26T04:00:0{}.000000001Z line {}"


@pytest.mark.parametrize(
    ("answers", "expected", "calls"),
    [
        # refused at the first request: a real lack of rights, said at once, not retried
        ([403], ["[tfk8s: cannot read the log of c-worker-0: status 403]"], 1),
        ([401], ["[tfk8s: cannot read the log of c-worker-0: status 401]"], 1),
        # the stream was open, then the server forbade for a moment (restarted): lines continue
        # (the last call: one more read after the container ended, for its last lines)
        ([[S.format(0, 0)], 403, 403, [S.format(0, 0), S.format(1, 1)]], ["line 0", "line 1"], 5),
        # overloaded or starting: retried even before any stream
        ([503, 429, [S.format(0, 0)]], ["line 0"], 4),
        # a kubelet that does not know the pod yet (it restarted) while the pod runs: retried
        ([[S.format(0, 0)], 404, [S.format(0, 0), S.format(1, 1)]], ["line 0", "line 1"], 4),
        # a status that is neither: said at once
        ([[S.format(0, 0)], 422], ["line 0", "[tfk8s: cannot read the log of c-worker-0: status 422]"], 2),
    ],
)
def test_a_refused_follow_request_is_retried_only_when_it_may_pass_a_moment_later(answers, expected, calls):
    texts, api = _follow(answers)
    assert texts == expected
    assert api.calls == calls


def test_a_refusal_that_outlasts_the_window_after_the_container_ended_is_said_once(monkeypatch):
    monkeypatch.setattr(logs, "REFUSAL_WINDOW", 0.5)
    monkeypatch.setattr(logs, "MAX_BACKOFF", 0.2)
    texts, api = _follow_ended([503] * 50)
    assert texts == ["[tfk8s: cannot read the rest of the log of c-worker-0: status 503]"]
    assert 2 < api.calls < 50  # retried with backoff, then given up


def _follow_ended(answers: list) -> tuple[list[str], Script]:
    """As :func:`_follow`, for a pod whose container has already ended."""
    api = Script(answers, DONE)
    api.pod = DONE
    watcher = SimpleNamespace(
        api=api, deleted=False, pod_named=lambda name: api.pod, spec=SimpleNamespace(name="c")
    )
    out: queue.Queue = queue.Queue()
    logs._Reader(watcher, "worker-0", out, threading.Event(), from_start=True)._follow_pod("c-worker-0")
    return [out.get().text for _ in range(out.qsize())], api


def test_a_node_that_does_not_answer_is_said_once_and_the_log_resumes_where_it_stopped(monkeypatch):
    """A kubelet away (SIGKILLed, restarting): the API server answers 5xx, then the restarted
    kubelet 404 until it knows the pod again, while the container goes on writing. The follow
    used to take the 404 for a deleted pod and stop for good; now it says once that the log
    cannot be read for now, keeps trying, and goes on from the last line read."""
    monkeypatch.setattr(logs, "NOTICE_AFTER", 0.3)
    texts, api = _follow([[S.format(0, 0)], 503, 502, 404, 404, [S.format(0, 0), S.format(1, 1)]])
    assert texts[0] == "line 0"
    assert texts[1].startswith("[tfk8s: the log of c-worker-0 cannot be read for now (status "), texts
    assert texts[2:] == ["[tfk8s: the log of c-worker-0 is read again]", "line 1"], texts
