"""Task logs from the API: followed per pod, with progress records taken out.

:func:`follow` starts one reader per task.  A reader waits (on the
cluster's :class:`~.watch.ClusterWatch`, not by polling the API) until the
task's pod has started, streams its log with ``follow=true``, and moves on
to the next attempt's pod after a restart.  Lines go through one queue to
the caller's iterator; ``@tfk8s-progress`` lines update the watch's
progress instead of being shown.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

from kubernetes.client.rest import ApiException

from ...runtime.progress import STDOUT_MARKER, parse_record
from ..base import LogLine, Phase, Progress, overwritten
from .client import abort
from .watch import ClusterWatch

#: Pod phases whose log can be read.
_STARTED = ("Running", "Succeeded", "Failed")
#: Answers to a follow request that a moment later may be different: the API server overloaded
#: or starting. A restarted kube-apiserver also answers 401/403 until its authenticator's and
#: RBAC authorizer's caches are filled (seen on the real cluster: ``cannot get resource
#: "pods/log"`` for a second after ``/readyz``), so those are retried too once the same stream
#: was open before. Either is retried with backoff for :data:`REFUSAL_WINDOW` seconds at most.
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
AUTH_STATUSES = frozenset({401, 403})
REFUSAL_WINDOW = 30.0
#: Answers while the node's kubelet is away: the API server cannot reach it (5xx), or a kubelet
#: just restarted does not know the pod yet (404 for a pod the API still shows running). Retried
#: for as long as the pod runs, with a notice line after :data:`NOTICE_AFTER` seconds.
NODE_STATUSES = TRANSIENT_STATUSES | {404}
NOTICE_AFTER = 5.0
#: The longest wait between two attempts to re-open a log.
MAX_BACKOFF = 2.0


def container_terminated(pod: dict) -> bool:
    """Whether the pod's (first) container has terminated, or the pod has ended."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    containers = status.get("containerStatuses") or []
    return bool(containers) and "terminated" in (containers[0].get("state") or {})


def stamp_key(stamp: str) -> tuple[str, int]:
    """An RFC 3339 log stamp as a sortable key: (the time to the second, nanoseconds).

    The kubelet writes RFC3339Nano (trailing zeros trimmed), so the fraction is
    padded to nine digits; the API server sends ``sinceTime`` on to the
    kubelet to the second only, so a re-opened stream repeats that second.
    """
    head, _, frac = stamp.rstrip("Z").partition(".")
    digits = "".join(c for c in frac if c.isdigit())[:9]
    return head, int(digits.ljust(9, "0")) if digits else 0


class LogCursor:
    """Where a followed log stopped: its last stamp, and how many lines carried it.

    A re-opened stream (``sinceTime`` = the last stamp) starts at or before
    that stamp; :meth:`fresh` lets through only the lines after it, so none
    is shown twice and none is lost.
    """

    def __init__(self) -> None:
        self.since: str | None = None
        self._last: tuple[str, int] | None = None
        self._at_last = 0  # lines with the last stamp, already taken
        self._seen_at_last = 0  # lines with the last stamp, in the stream being read

    def fresh(self, stamp: str) -> bool:
        """Whether the line stamped ``stamp`` has not been taken yet (and take it)."""
        key = stamp_key(stamp)
        if self._last is not None and key < self._last:
            return False
        if key == self._last:
            self._seen_at_last += 1
            if self._seen_at_last <= self._at_last:
                return False
            self._at_last += 1
            return True
        self._last, self._at_last, self._seen_at_last = key, 1, 1
        self.since = stamp
        return True

    def reopened(self) -> None:
        """A new stream starts: count the lines of the last stamp afresh."""
        self._seen_at_last = 0


def progress_of(record: dict, task: str) -> Progress:
    """A parsed progress record as :class:`Progress` (``task``: who sent it, if it does not say)."""
    return Progress(
        step=int(record["step"]),
        total=record.get("total"),
        rate=record.get("rate"),
        metrics=dict(record.get("metrics") or {}),
        task=record.get("task") or task,
        time=float(record.get("time") or time.time()),
    )


class LineJoiner:
    r"""A task's kubelet log lines as a terminal shows them, with progress records taken out.

    The kubelet cuts a container's output at ``\n`` only, and Keras's progress bar (``verbose=1``)
    rewrites its line with ``\b`` and ``\r`` until the epoch's end: one kubelet line then holds
    every state of an epoch's bar, and a progress record written meanwhile (by the callback's
    thread) ends that line, glued to the bar's text.  :meth:`take` finds the record anywhere in
    the line, keeps the text before it as the unfinished line (shown as an update, ``\r`` +
    its newest state, as the local backend shows one) and joins it to the next line, which
    finishes it.  Backspaces are dropped: after a ``\r`` they change nothing a terminal shows.
    """

    def __init__(self) -> None:
        self.partial = ""

    def take(self, text: str) -> tuple[str | None, dict | None]:
        """One kubelet line: (what to show, or None; the progress record in it, or None).

        What is shown is a finished line (no ``\r``) or an update (``\r`` + the newest state).
        """
        text = text.rstrip("\r")
        at = text.find(STDOUT_MARKER)
        record = parse_record(text[at:]) if at >= 0 else None
        if record is None:
            whole, self.partial = self.partial + text, ""
            return overwritten(whole.replace("\b", "")), None
        self.partial += text[:at]
        if len(self.partial) > MAX_PARTIAL:  # one endless bar: keep its newest states only
            self.partial = "\r" + self.partial[-MAX_PARTIAL:].partition("\r")[2]
        state = overwritten(self.partial.replace("\b", ""))
        return ("\r" + state if state else None), record


#: The longest unfinished line kept between two kubelet lines (an epoch's bar states, in chars).
MAX_PARTIAL = 64 * 1024


def split_progress(watcher: ClusterWatch, task: str, text: str,
                   joiner: LineJoiner | None = None) -> LogLine | None:
    """A user-visible line, or ``None``; a progress record in ``text`` is recorded on the watch."""
    shown, record = (joiner or LineJoiner()).take(text)
    if record is not None:
        watcher.record_progress(progress_of(record, task))
    return None if shown is None else LogLine(task, shown, time.time())


def read(watcher: ClusterWatch, tasks: list[str], tail: int | None) -> list[LogLine]:
    """The current log of each task's newest pod (its last ``tail`` lines), task by task."""
    latest = watcher.latest_pods()
    out: list[LogLine] = []
    for task in tasks:
        pod = latest.get(task)
        if pod is None or (pod.get("status") or {}).get("phase") not in _STARTED:
            continue
        # Progress records are in the stream too: read more, keep ``tail`` shown lines.
        fetch = None if tail is None else tail * 4 + 100
        try:
            text = watcher.api.pod_log(pod["metadata"]["name"], tail=fetch)
        except ApiException as e:
            if e.status in (400, 404):  # not started yet, or already deleted
                continue
            raise
        joiner = LineJoiner()
        lines = [split_progress(watcher, task, t, joiner) for t in text.split("\n")]
        if lines and lines[-1] is not None and not lines[-1].text:
            lines.pop()  # the text ended with a newline
        # A ``read`` shows finished lines: an update is replaced by the line that finishes it.
        shown = [line for line in lines if line is not None and "\r" not in line.text]
        out += shown if tail is None else (shown[-tail:] if tail else [])
    return out


def refresh_progress(watcher: ClusterWatch, tail: int = 50) -> None:
    """Read the newest progress record from the lead task's log tail (one request)."""
    spec = watcher.spec
    lead = next((t.name for t in spec.tasks() if spec.runs_script(t)), None)
    if lead is not None:
        try:
            read(watcher, [lead], tail)
        except ApiException:
            pass  # progress is best effort; status must not fail for it


def follow(
    watcher: ClusterWatch,
    stop: threading.Event,
    tasks: list[str],
    from_start: bool = True,
    idle_timeout: float = 0.2,
) -> Iterator[LogLine]:
    """Yield log lines of ``tasks`` as they are printed, until done or ``stop`` is set."""
    lines: queue.Queue[LogLine | None] = queue.Queue()
    halt = threading.Event()
    readers = [
        _Reader(watcher, task, lines, halt, from_start) for task in tasks
    ]
    for r in readers:
        r.thread.start()
    try:
        running = len(readers)
        while running and not stop.is_set():
            try:
                item = lines.get(timeout=idle_timeout)
            except queue.Empty:
                continue
            if item is None:
                running -= 1
            else:
                yield item
    finally:
        halt.set()
        for r in readers:
            r.close()


class _Reader:
    """Follows one task's log across its pods' attempts."""

    def __init__(self, watcher: ClusterWatch, task: str, out: queue.Queue,
                 halt: threading.Event, from_start: bool) -> None:
        self.watcher = watcher
        self.task = task
        self.out = out
        self.halt = halt
        self.from_start = from_start
        self.response = None
        self.opened = False  # the last follow request got a stream
        self.refusal: tuple[int | None, str] = (None, "")
        self.joiner = LineJoiner()
        self.noticed = False  # the user was told that the log cannot be read for now
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"tfk8s-log-{watcher.spec.name}-{task}")

    def close(self) -> None:
        if self.response is not None:
            abort(self.response)

    def _next_pod(self, done: set[str]) -> dict | None:
        """Wait for a started pod of this task not read yet; ``None`` when there is none to come."""
        seen = -1
        while not self.halt.is_set():
            latest = self.watcher.latest_pods().get(self.task)
            fresh = latest is not None and latest["metadata"]["name"] not in done
            if fresh and (latest.get("status") or {}).get("phase") in _STARTED:
                return latest
            if self.watcher.deleted:
                return None
            status = self.watcher.snapshot()
            task = next((t for t in status.tasks if t.name == self.task), None)
            if status.terminal and (task is None or task.phase in Phase.TERMINAL or not fresh):
                return None
            seen = self.watcher.wait_change(seen, timeout=1.0)
        return None

    def _run(self) -> None:
        done: set[str] = set()
        try:
            while not self.halt.is_set():
                pod = self._next_pod(done)
                if pod is None:
                    return
                name = pod["metadata"]["name"]
                done.add(name)
                self._follow_pod(name)
        finally:
            self.out.put(None)

    def _ended(self, pod: str) -> bool:
        """Whether pod ``pod``'s log can grow no more: its container terminated, or it is gone."""
        current = self.watcher.pod_named(pod)
        if current is None or self.watcher.deleted:
            return True
        return container_terminated(current)

    def _follow_pod(self, pod: str) -> None:
        """Stream one pod's log until its container has terminated and every line is read.

        A stream that ends or drops while the container still runs is opened
        again from the last stamp read (``sinceTime``); the cursor skips the
        lines already shown, so none is shown twice and none is lost.
        """
        cursor = LogCursor()
        self.joiner = LineJoiner()  # a new attempt starts a new line
        tail = None if self.from_start else 0
        self.from_start = True  # later attempts are new output: read them whole
        backoff = 0.2
        opened = False  # a stream of this pod was open once: a later 401/403 is the server's restart
        refused_since: float | None = None
        self.noticed = False
        while not self.halt.is_set():
            ended_before = self._ended(pod)
            outcome = self._stream(pod, cursor, tail)
            if outcome == "refused":
                refused_since = refused_since or time.monotonic()
                if self._give_up(pod, time.monotonic() - refused_since, opened):
                    return
            else:
                refused_since = None
                opened = opened or self.opened
                if self.opened:
                    backoff = 0.0  # it answered: the next re-open is at once
            tail = None  # a re-opened stream starts at the cursor, never at the tail
            if self.halt.is_set() or outcome == "gone":
                return
            if outcome == "eof" and ended_before:
                return  # the stream of a terminated container is complete
            if outcome == "eof" and self._ended(pod):
                backoff = 0.0  # once more: the lines written just before the end
            self.halt.wait(backoff)
            backoff = min(max(backoff * 2, 0.2), MAX_BACKOFF)

    def _give_up(self, pod: str, waited: float, opened: bool) -> bool:
        """After a refused re-open (``self.refusal``), refused for ``waited`` seconds: whether to
        stop following ``pod`` (said in one line), or try again (a notice said once, maybe)."""
        status, reason = self.refusal
        if status in NODE_STATUSES:
            # The node's kubelet is away (restarting, or its node lost): the container may still
            # run and write. Say so once, and go on trying while the pod lives.
            if self._ended(pod) and waited > REFUSAL_WINDOW:
                self.out.put(LogLine(self.task, f"[tfk8s: cannot read the rest of the log of {pod}: "
                                                f"{reason}]"))
                return True
            if not self.noticed and waited > NOTICE_AFTER:
                self.noticed = True
                self.out.put(LogLine(self.task, f"[tfk8s: the log of {pod} cannot be read for now "
                                                f"({reason}); still trying]"))
            return False
        if not (status in AUTH_STATUSES and opened) or waited > REFUSAL_WINDOW:
            self.out.put(LogLine(self.task, f"[tfk8s: cannot read the log of {pod}: {reason}]"))
            return True
        return False

    def _stream(self, pod: str, cursor: LogCursor, tail: int | None) -> str:
        """One follow request: ``eof`` (the server ended it), ``dropped``, ``gone`` or ``refused``
        (an error status, kept in ``self.refusal``)."""
        cursor.reopened()
        self.opened = False
        try:
            self.response = resp = self.watcher.api.follow_log(
                pod, since=cursor.since, tail=tail)
        except ApiException as e:
            if e.status == 404 and self._ended(pod):
                return "gone"
            if e.status == 400:  # not started, or no longer readable: the pod's state decides
                return "gone" if self._ended(pod) else "dropped"
            self.refusal = (e.status, e.reason)  # _follow_pod decides: retried or said
            return "refused"
        except Exception:  # noqa: BLE001 - the connection failed: try again
            return "dropped"
        self.opened = True
        if self.noticed:
            self.noticed = False
            self.out.put(LogLine(self.task, f"[tfk8s: the log of {pod} is read again]"))
        buffer = b""
        try:
            for chunk in resp.stream(4096, decode_content=True):
                if self.halt.is_set():
                    return "dropped"
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                for raw in complete:
                    self._take(cursor, raw)
            if buffer:
                self._take(cursor, buffer)
        except Exception:  # noqa: BLE001 - the stream was closed (stop) or dropped
            return "dropped"
        finally:
            self.response = None
            resp.release_conn()
        return "eof"

    def _take(self, cursor: LogCursor, raw: bytes) -> None:
        stamp, _, text = raw.decode("utf-8", "replace").partition(" ")
        if cursor.fresh(stamp):
            self._emit(text.encode())

    def _emit(self, raw: bytes) -> None:
        line = split_progress(self.watcher, self.task, raw.decode("utf-8", "replace"), self.joiner)
        if line is not None:
            self.out.put(line)
