"""The server's one view of the user's clusters, pushed to every open sidebar.

A :class:`ClusterMonitor` keeps the sidebar row of every cluster of the user on the active
backend and tells its subscribers what changed.  Two kinds of daemon thread feed it, both
through the public API only:

* one *discovery* thread lists the clusters (:func:`tfk8s_magics.list_clusters`) every
  ``discover_every`` seconds, which is how a cluster launched by a kernel, the CLI or another
  server appears, a deleted one disappears, and a stall's "for 1m05s" keeps counting;
* one *watch* thread per cluster that has not ended (:meth:`tfk8s_magics.Cluster.watch`,
  which the local backend drives from inotify and the Kubernetes backend from a watch), so a
  phase, a ready task or a progress step is pushed the moment the backend sees it.

Threading rule: ``_lock`` guards ``_rows`` and ``_watching`` only; no backend call is made
and no subscriber is called while it is held.  Subscribers are called from the monitor's
threads and must hand over to their own loop (the WebSocket handler uses
``IOLoop.add_callback``).  A subscriber that raises is logged and dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import api
from ..errors import ClusterNotFound
from .rows import cluster_row

log = logging.getLogger(__name__)

Message = dict[str, Any]
Subscriber = Callable[[Message], None]


class ClusterMonitor:
    """Rows of the user's clusters on ``backend`` (None: the active backend), kept current."""

    def __init__(self, backend: str | None = None, discover_every: float = 2.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.backend = backend
        self.discover_every = discover_every
        self._clock = clock
        self._lock = threading.Lock()
        self._rows: dict[str, Message] = {}
        self._watching: dict[str, threading.Event] = {}
        self._launched: dict[str, float] = {}  # name → when this server launched it (monotonic)
        self._subscribers: list[Subscriber] = []
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.error = ""  # the last discovery error, shown in the sidebar until it clears

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> ClusterMonitor:
        """Start discovering (idempotent)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._discover_loop, name="tfk8s-sidebar-discover",
                                                daemon=True)
                self._thread.start()
        return self

    def close(self) -> None:
        """Stop every thread of the monitor (each ends within its backend's wake-up interval)."""
        self._stop.set()
        self._wake.set()
        with self._lock:
            for ev in self._watching.values():
                ev.set()
            self._watching.clear()

    # -- readers -----------------------------------------------------------
    def snapshot(self) -> list[Message]:
        """Every row, newest cluster first."""
        with self._lock:
            rows = list(self._rows.values())
        return sorted(rows, key=lambda r: r["created"], reverse=True)

    def subscribe(self, cb: Subscriber) -> Callable[[], None]:
        """Call ``cb(message)`` at every change; returns the unsubscribe function."""
        with self._lock:
            self._subscribers.append(cb)

        def unsubscribe() -> None:
            with self._lock:
                if cb in self._subscribers:
                    self._subscribers.remove(cb)

        return unsubscribe

    def launched(self, row: Message) -> None:
        """Show a cluster this server has just launched at once, and watch it.

        A discovery pass whose listing began before the launch ended does not drop it: the
        ``POST`` that answered 201 and the ``GET`` after it agree.
        """
        with self._lock:
            self._launched[row["name"]] = time.monotonic()
        self._put(row)
        if not row.get("terminal"):
            self._ensure_watch(row["name"])
        self.refresh()

    def refresh(self) -> None:
        """Discover again now (after the sidebar launched, stopped or deleted a cluster)."""
        self._wake.set()

    def discover(self) -> None:
        """One discovery pass: list the clusters, update every row, drop the deleted ones."""
        began = time.monotonic()
        try:
            statuses = api.list_clusters(self.backend)
        except Exception as e:  # noqa: BLE001 - shown in the sidebar, retried at the next pass
            self._set_error(f"cannot list the clusters: {e}")
            return
        self._set_error("")
        now = self._clock()
        seen = set()
        for st in statuses:
            seen.add(st.name)
            self._put(cluster_row(st, now))
            if not st.terminal:
                self._ensure_watch(st.name)
        with self._lock:
            gone = [n for n in self._rows if n not in seen and self._launched.get(n, 0.0) < began]
            self._launched = {n: t for n, t in self._launched.items() if t >= began}
        for name in gone:
            self._drop(name)

    # -- threads -----------------------------------------------------------
    def _discover_loop(self) -> None:
        while not self._stop.is_set():
            self.discover()
            self._wake.wait(self.discover_every)
            self._wake.clear()

    def _ensure_watch(self, name: str) -> None:
        with self._lock:
            if name in self._watching or self._stop.is_set():
                return
            stop = self._watching[name] = threading.Event()
        threading.Thread(target=self._watch, args=(name, stop), name=f"tfk8s-sidebar-watch-{name}",
                         daemon=True).start()

    def _watch(self, name: str, stop: threading.Event) -> None:
        try:
            for st in api.get(name, self.backend).watch(stop):
                self._put(cluster_row(st, self._clock()))
        except ClusterNotFound:
            self._drop(name)
        except Exception:  # noqa: BLE001 - discovery starts a new watch at its next pass
            log.exception("tfk8s sidebar: watching cluster %s failed", name)
        finally:
            with self._lock:
                if self._watching.get(name) is stop:
                    del self._watching[name]
        if not stop.is_set():
            self._wake.set()  # its final state (or its deletion) is read at once

    # -- changes -----------------------------------------------------------
    def _put(self, row: Message) -> None:
        with self._lock:
            if self._rows.get(row["name"]) == row:
                return
            self._rows[row["name"]] = row
        self._emit({"type": "cluster", "cluster": row})

    def _drop(self, name: str) -> None:
        with self._lock:
            if self._rows.pop(name, None) is None:
                return
            ev = self._watching.pop(name, None)
        if ev is not None:
            ev.set()
        self._emit({"type": "removed", "name": name})

    def _set_error(self, error: str) -> None:
        if error == self.error:
            return
        self.error = error
        self._emit({"type": "error", "message": error})

    def _emit(self, message: Message) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for cb in subscribers:
            try:
                cb(message)
            except Exception:  # noqa: BLE001 - one broken socket must not stop the others
                log.exception("tfk8s sidebar: a subscriber failed; dropping it")
                with self._lock:
                    if cb in self._subscribers:
                        self._subscribers.remove(cb)
