"""One feed per cluster, fanning its status and logs out to every view of it in this process.

A :class:`ClusterFeed` runs daemon threads — one following the cluster's
status (``Backend.watch``), one its logs (``Backend.follow_logs``), one
handing log batches out — and gives what they see to subscribers: the
live log view under a launch cell, the dashboard, the cluster list.
However many views show a cluster, the backend is read once.  Subscribers
get log lines in batches (a :class:`LogBatch`), paced by a :class:`~.backends.pacing.Pacer`:
a line after a quiet spell is handed out the moment it is read (a slow
stream is shown line by line, as printed), and only a stream faster than
one line per ``LOG_MIN_GAP`` is gathered into batches, up to
``LOG_BATCH_INTERVAL`` apart, so a chatty cluster costs one update per
batch, not one per line.  A feed only reads: it never acts on the cluster.

Feeds are kept per backend object (a weak key: a backend that is gone
takes its feeds' entries with it) and per cluster name.  The registry lock
guards only the registry: no backend call is made while it is held.
"""

from __future__ import annotations

import bisect
import collections
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator, Sequence
from itertools import repeat

from .backends import Backend, ClusterStatus, LogChunk, LogLine
from .backends.pacing import Pacer
from .errors import ClusterNotFound

StatusCallback = Callable[[ClusterStatus], None]
LogsCallback = Callable[["LogBatch"], None]

#: Longest gap between log batches handed to subscribers (reached only under load).
LOG_BATCH_INTERVAL = 0.1
#: Shortest gap between log batches: lines further apart than this go out one by one, at once.
LOG_MIN_GAP = 0.02
#: Log lines kept in memory per task, for views that subscribe late.
HISTORY_LINES = 1000


class LogBatch(Sequence[LogLine]):
    """The lines handed to subscribers at once: a read-only sequence of :class:`LogLine`,
    each made when it is looked at.

    Why not a list: a flood hands out 10k+ lines a batch, and a list would make
    them all at once.  ``LogLine`` is a tuple *subclass*, which the garbage
    collector tracks for life, so a batch alive across allocations gets promoted
    to the old generation and triggers full collections, which pause the whole
    kernel for 100-200 ms with a kernel-sized heap.  Made one at a time, a line
    that the view drops at once is freed before any collection runs; a view that
    shows only the newest lines (a slice) makes only those.
    Compares equal to a sequence of the same lines.
    """

    __slots__ = ("_chunks", "_ends")

    def __init__(self, chunks: list[LogChunk]) -> None:
        self._chunks = chunks
        self._ends: list[int] = []
        n = 0
        for chunk in chunks:
            n += len(chunk.texts)
            self._ends.append(n)

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __iter__(self) -> Iterator[LogLine]:
        for c in self._chunks:
            yield from map(tuple.__new__, repeat(LogLine), zip(repeat(c.task), c.texts, repeat(c.time)))

    def __reversed__(self) -> Iterator[LogLine]:
        for c in reversed(self._chunks):
            yield from map(tuple.__new__, repeat(LogLine),
                           zip(repeat(c.task), reversed(c.texts), repeat(c.time)))

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            return self._range(start, stop)
        n = len(self)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError("LogBatch index out of range")
        k = bisect.bisect_right(self._ends, i)
        c = self._chunks[k]
        return LogLine(c.task, c.texts[i - (self._ends[k - 1] if k else 0)], c.time)

    def _range(self, start: int, stop: int) -> list[LogLine]:
        out: list[LogLine] = []
        k = bisect.bisect_right(self._ends, start)
        while start < stop and k < len(self._chunks):
            base = self._ends[k - 1] if k else 0
            c = self._chunks[k]
            end = min(stop, self._ends[k])
            out.extend(LogLine.many(c.task, c.texts[start - base:end - base], c.time))
            start, k = end, k + 1
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # mutable-like semantics, as a list

    def __repr__(self) -> str:
        return f"<LogBatch of {len(self)} lines from {len(self._chunks)} reads>"


class ClusterFeed:
    """Feeds one cluster's status and logs to its views (module docstring); get one with :meth:`of`."""

    _registry: weakref.WeakKeyDictionary[Backend, dict[str, ClusterFeed]] = weakref.WeakKeyDictionary()
    _registry_lock = threading.Lock()

    def __init__(self, backend: Backend, name: str, pacer: Pacer | None = None) -> None:
        self.backend = backend
        self.name = name
        self.status: ClusterStatus | None = None
        #: Per task, its newest read chunks holding at most HISTORY_LINES lines (plus the
        #: count): kept as strings, made into LogLines only for a late view (:attr:`history`).
        self._recent: dict[str, tuple[collections.deque[LogChunk], list[int]]] = {}
        self._status_subs: list[StatusCallback] = []
        self._log_subs: list[LogsCallback] = []
        self._lock = threading.Lock()  # guards status, _recent, the subscriber lists, _pending
        self._stop = threading.Event()
        #: Chunks of one task's lines each, as the backend handed them over: kept as
        #: strings until handed out (see :class:`~.backends.LogChunk`).
        self._pending: list[LogChunk] = []
        self._pending_lines = 0
        #: When to hand the next batch out (injectable: tests drive it with their own clock).
        self.pacer = pacer or Pacer(LOG_MIN_GAP, LOG_BATCH_INTERVAL)
        self._threads = [
            threading.Thread(target=self._run_status, name=f"tfk8s-status-{name}", daemon=True),
            threading.Thread(target=self._run_logs, name=f"tfk8s-logs-{name}", daemon=True),
            threading.Thread(target=self._run_flush, name=f"tfk8s-flush-{name}", daemon=True),
        ]
        self._has_pending = threading.Event()
        self.logs_done = threading.Event()
        #: Why feeding stopped early (an API error, say), or None.
        self.error: str | None = None
        self.status_done = threading.Event()

    @classmethod
    def of(cls, backend: Backend, name: str) -> ClusterFeed:
        """The running feed of ``name`` on ``backend``, started if needed."""
        with cls._registry_lock:
            current = cls._registry.get(backend, {}).get(name)
        # A finished feed is reused only if it still describes the cluster now under
        # that name: finding out reads the backend, so it happens outside the lock.
        if current is not None and not current._stop.is_set():
            if not (current.logs_done.is_set() and current.status_done.is_set()) or _same_cluster(current):
                return current
        with cls._registry_lock:
            feeds = cls._registry.setdefault(backend, {})
            if feeds.get(name) is not current:  # another thread replaced it meanwhile
                return feeds[name]
            feed = feeds[name] = cls(backend, name)
        return feed.start()

    def start(self) -> ClusterFeed:
        """Start the feed's threads (:meth:`of` does; a feed made by hand needs it); return it."""
        for t in self._threads:
            t.start()
        return self

    @classmethod
    def forget(cls, backend: Backend, name: str) -> None:
        """Stop and drop the feed of a cluster (it is being deleted)."""
        with cls._registry_lock:
            feed = cls._registry.get(backend, {}).pop(name, None)
        if feed is not None:
            feed.close()

    # -- subscriptions -------------------------------------------------------
    def subscribe(
        self,
        on_status: StatusCallback | None = None,
        on_logs: LogsCallback | None = None,
        replay: bool = True,
    ) -> Callable[[], None]:
        """Register callbacks; with ``replay``, get the current status and log history first.

        Returns a function that unsubscribes.  Callbacks run on the
        feed's threads and must not block.
        """
        with self._lock:
            if on_status:
                self._status_subs.append(on_status)
            if on_logs:
                self._log_subs.append(on_logs)
            status = self.status
            history = sorted((line for q in self._history().values() for line in q), key=lambda x: x.time)
        if replay:
            if on_status and status is not None:
                on_status(status)
            if on_logs and history:
                on_logs(history)

        def unsubscribe() -> None:
            with self._lock:
                if on_status in self._status_subs:
                    self._status_subs.remove(on_status)
                if on_logs in self._log_subs:
                    self._log_subs.remove(on_logs)

        return unsubscribe

    def close(self) -> None:
        """Stop both threads (they end on their own when the cluster ends)."""
        self._stop.set()

    @property
    def running(self) -> bool:
        """Whether any of the feed's threads (status, logs, flush) is still running."""
        return any(t.is_alive() for t in self._threads)

    # -- threads -------------------------------------------------------------
    def _run_status(self) -> None:
        try:
            for st in self.backend.watch(self.name, self._stop):
                with self._lock:
                    self.status = st
                    subs = list(self._status_subs)
                for cb in subs:
                    _safe(cb, st)
        except ClusterNotFound:
            pass  # deleted under us: the views show their last state
        except Exception as e:  # noqa: BLE001 - reported to every view, not swallowed
            self._report(e, "status")
        finally:
            self.status_done.set()

    def _run_logs(self) -> None:
        try:
            for chunk in _log_chunks(self.backend, self.name, self._stop):
                if not chunk.texts:
                    continue
                with self._lock:
                    first = not self._pending
                    self._pending.append(chunk)
                    self._pending_lines += len(chunk.texts)
                if first:  # one wake-up per batch, not per line
                    self._has_pending.set()
        except ClusterNotFound:
            pass  # deleted under us
        except Exception as e:  # noqa: BLE001 - reported to every view, not swallowed
            self._report(e, "logs")
        finally:
            self.logs_done.set()
            self._has_pending.set()

    def _report(self, e: Exception, what: str) -> None:
        """Keep why feeding stopped and show it in every log view (the API's reason included)."""
        self.error = f"watching the {what} of {self.name!r} stopped: {type(e).__name__}: {e}"
        with self._lock:
            self._pending.append(LogChunk("tfk8s", [self.error], time.time()))
        self._has_pending.set()

    def _run_flush(self) -> None:
        # The first line after a quiet spell goes out at once; while lines keep
        # coming faster than the pacer's gap, they gather so views update per batch.
        while True:
            self._has_pending.wait()
            delay = self.pacer.delay(self._pending_lines)
            if delay and not self.logs_done.is_set():
                self.pacer.sleep(delay)
            self._has_pending.clear()
            if self._flush():
                self.pacer.took()
            if self.logs_done.is_set():
                self._flush()
                return

    @property
    def history(self) -> dict[str, collections.deque[LogLine]]:
        """The newest ``HISTORY_LINES`` log lines of each task (for views that subscribe late)."""
        with self._lock:
            return self._history()

    def _history(self) -> dict[str, collections.deque[LogLine]]:
        return {task: collections.deque((ln for c in chunks for ln in c.lines()), maxlen=HISTORY_LINES)
                for task, (chunks, _n) in self._recent.items()}

    def _remember(self, chunk: LogChunk) -> None:
        """Keep ``chunk``'s newest lines in the history (caller holds ``_lock``)."""
        if any("\r" in t for t in chunk.texts[-2:]):  # a bar's updates (a read's last texts) are not history
            chunk = chunk._replace(texts=[t for t in chunk.texts if "\r" not in t])
            if not chunk.texts:
                return
        chunks, count = self._recent.setdefault(chunk.task, (collections.deque(), [0]))
        kept = chunk if len(chunk.texts) <= HISTORY_LINES else chunk._replace(
            texts=chunk.texts[-HISTORY_LINES:])
        chunks.append(kept)
        count[0] += len(kept.texts)
        while count[0] - len(chunks[0].texts) >= HISTORY_LINES:
            count[0] -= len(chunks.popleft().texts)

    def _flush(self) -> bool:
        """Hand the pending lines out; whether there were any."""
        with self._lock:
            chunks, self._pending = self._pending, []
            self._pending_lines = 0
            if not chunks:
                return False
            for chunk in chunks:  # strings only: a flood must not make (GC-tracked) LogLines
                self._remember(chunk)
            subs = list(self._log_subs)
        batch = LogBatch(chunks)
        for cb in subs:
            _safe(cb, batch)
        return True


def _log_chunks(backend: Backend, name: str, stop: threading.Event) -> Iterator[LogChunk]:
    """The backend's log stream in chunks of one task's lines (a line each if it cannot batch)."""
    chunks = getattr(backend, "follow_log_batches", None)
    if chunks is not None:
        return chunks(name, stop)
    return (LogChunk(ln.task, [ln.text], ln.time) for ln in backend.follow_logs(name, stop))


def _same_cluster(feed: ClusterFeed) -> bool:
    """Whether a finished feed still describes the cluster now under that name (reads the backend)."""
    try:
        st = feed.backend.status(feed.name)
    except Exception:  # noqa: BLE001 - unreadable or gone: start a fresh feed
        return False
    return feed.status is not None and st.created == feed.status.created


def _safe(cb, arg) -> None:
    try:
        cb(arg)
    except Exception:  # noqa: BLE001 - one broken view must not stop the others
        traceback.print_exc()


#: Seconds between checks that the clusters of ended views still exist.
DELETION_INTERVAL = 2.0


class DeletionWatch:
    """Tells views when a cluster they show is deleted — from this process or any other.

    A view whose cluster has ended is no longer fed (its feed stopped with the
    cluster), yet the cluster can still be deleted: by its own Delete button,
    ``%tfcluster delete`` in another cell, another kernel or the ``tfk8s`` CLI.
    Views register here with :func:`watch_deletion`; a deletion in this
    process is announced at once (:func:`announce_deleted`, called by
    ``Cluster.delete``), and one daemon thread — running only while something
    is registered — checks the others every :data:`DELETION_INTERVAL` seconds
    (a status read per watched cluster; the backend is read with no lock held).
    """

    _lock = threading.Lock()
    _callbacks: dict[tuple[int, str], list[tuple[Backend, float | None, Callable[[], None]]]] = {}
    _thread: threading.Thread | None = None

    @classmethod
    def add(cls, backend: Backend, name: str, created: float | None, cb: Callable[[], None]):
        """Call ``cb`` once when ``name`` (launched at ``created``) is gone; return an unsubscribe."""
        entry = (backend, created, cb)
        with cls._lock:
            cls._callbacks.setdefault((id(backend), name), []).append(entry)
            if cls._thread is None or not cls._thread.is_alive():
                cls._thread = threading.Thread(target=cls._run, name="tfk8s-deletions", daemon=True)
                cls._thread.start()

        def unsubscribe() -> None:
            with cls._lock:
                entries = cls._callbacks.get((id(backend), name), [])
                if entry in entries:
                    entries.remove(entry)
                if not entries:
                    cls._callbacks.pop((id(backend), name), None)

        return unsubscribe

    @classmethod
    def announce(cls, backend: Backend, name: str) -> None:
        """``name`` was deleted: call (and forget) every callback registered for it."""
        with cls._lock:
            entries = cls._callbacks.pop((id(backend), name), [])
        for _backend, _created, cb in entries:
            _safe(lambda _none, f=cb: f(), None)

    @classmethod
    def _run(cls) -> None:
        while True:
            time.sleep(DELETION_INTERVAL)
            with cls._lock:
                watched = {key: list(entries) for key, entries in cls._callbacks.items()}
                if not watched:
                    cls._thread = None
                    return
            for (_id, name), entries in watched.items():
                backend, created, _cb = entries[0]
                try:
                    st = backend.status(name)
                except ClusterNotFound:
                    cls.announce(backend, name)
                    continue
                except Exception:  # noqa: BLE001 - an unreachable backend is not a deletion
                    continue
                if created is not None and st.created != created:  # deleted and launched again
                    cls.announce(backend, name)


def watch_deletion(backend: Backend, name: str, created: float | None, cb: Callable[[], None]):
    """See :class:`DeletionWatch`: call ``cb`` (no argument) once ``name`` is deleted."""
    return DeletionWatch.add(backend, name, created, cb)


def announce_deleted(backend: Backend, name: str) -> None:
    """Tell every view in this process that ``name`` was just deleted."""
    DeletionWatch.announce(backend, name)
