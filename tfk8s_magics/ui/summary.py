"""The launch cell's record of how a cluster ended: static HTML that a saved notebook keeps.

The live dashboard is made of widgets.  A notebook executed by nbclient or
nbconvert, or saved after the browser closed, keeps only the snapshot the
dashboard had when it was first shown ("starting") and partial logs.  So
once the cluster ends, a :class:`FinalSummary` — final phase, task table,
progress, the last lines of each task's log — is drawn where no live view
is, and only there:

* under a live dashboard it becomes the dashboard output's ``text/html`` /
  ``text/plain`` alternatives (the same display id): JupyterLab keeps
  showing the widget view, while a notebook saved without widget state,
  nbconvert and text front ends show the record — never a second copy
  under the live view;
* with no dashboard (``--no-dashboard``, no ipywidgets) it is an output of
  its own, empty while the cluster runs.

Who writes it:

* the cluster's watcher (a thread), the moment the status turns terminal;
* ``%tfcluster wait`` when it returns, and ``stop`` / ``delete`` from this
  kernel, on the kernel's main thread — so the update belongs to a cell
  that is executing, which is what nbclient records (it applies an
  ``update_display_data`` to every cell showing that display id).

The summary is plain HTML and text (no widget, no script), every value
escaped.  Threading (the rule in :mod:`tfk8s_magics.ui`): the feed's
callback only starts a short thread that reads the log tails (I/O) and
draws; ``_lock`` guards a summary's state, never held during I/O.
"""

from __future__ import annotations

import html
import threading
from typing import Any

from ..backends import ClusterStatus
from ..watch import ClusterFeed
from . import live
from .render import logs_gone, status_html, status_text

#: Lines of each task's log kept in the summary.
TAIL_LINES = 8

_e = html.escape


def summary_html(st: ClusterStatus, tails: dict[str, list[str]], deleted: bool = False,
                 gone_logs: bool = False) -> str:
    """The static summary: final phase, task table, progress, the last lines of each log."""
    phase = "deleted" if deleted else st.phase
    logs = "".join(
        f'<details class="tfk8s-summary-log" data-task="{_e(task, quote=True)}">'
        f"<summary>{_e(task)}: last {len(lines)} lines</summary>"
        f"<pre>{_e(chr(10).join(lines))}</pre></details>"
        for task, lines in tails.items()
    )
    after = (
        f" (then deleted; it had ended <b>{_e(st.phase)}</b>)" if deleted and st.terminal
        else " (then deleted)" if deleted else ""
    )
    return (
        f'<div class="tfk8s-summary" data-phase="{_e(phase, quote=True)}" '
        'style="border-left:3px solid #ccc;padding-left:8px;margin-top:4px">'
        f"<div><b>final state of {_e(st.name)}</b>{after}</div>"
        f"{status_html(st, deleted and gone_logs)}{logs}</div>"
    )


def summary_text(st: ClusterStatus, tails: dict[str, list[str]], deleted: bool = False,
                 gone_logs: bool = False) -> str:
    """The same summary as plain text (what a terminal or a text export shows)."""
    head = f"final state of {st.name}" + (" (then deleted)" if deleted else "")
    parts = [head, status_text(st, deleted and gone_logs)]
    for task, lines in tails.items():
        parts.append(f"--- {task}: last {len(lines)} lines")
        parts.extend(lines)
    return "\n".join(parts)


class _Static:
    """A display-able pair of renderings (HTML for notebooks, text elsewhere)."""

    def __init__(self, html_text: str, plain: str) -> None:
        self.html_text, self.plain = html_text, plain

    def _repr_html_(self) -> str:
        return self.html_text

    def __repr__(self) -> str:
        return self.plain


_EMPTY = _Static("", "")


class FinalSummary:
    """The launch cell's static summary of one cluster (see the module docstring)."""

    _registry: dict[tuple[str, int, str], list[FinalSummary]] = {}
    _registry_lock = threading.Lock()

    def __init__(self, cluster, tail: int = TAIL_LINES, view=None) -> None:
        self.cluster = cluster
        #: The live view whose alternatives the record becomes (``show_record(record)``), if any.
        self.view = view
        self.backend = cluster.backend
        self.name = cluster.name
        self.tail = tail
        #: What the summary shows now: None until the cluster has ended.
        self.status: ClusterStatus | None = None
        self.deleted = False
        self.tails: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self._handle = None
        self._unsubscribe = None

    @property
    def _key(self) -> tuple[str, int, str]:
        return (self.backend.name, id(self.backend), self.name)

    def show(self) -> FinalSummary:
        """Display the (empty) placeholder under the current cell — unless the record goes into a
        live view's alternatives — and follow the cluster."""
        from IPython.display import display

        if self.view is None:
            self._handle = display(_EMPTY, display_id=True)
        with self._registry_lock:
            self._registry.setdefault(self._key, []).append(self)
        self._unsubscribe = ClusterFeed.of(self.backend, self.name).subscribe(
            on_status=self._on_status
        )
        return self

    def _on_status(self, st: ClusterStatus) -> None:
        if st.terminal and self.status is None:
            # Off the watcher's thread: reading the log tails is file (or API) I/O.
            threading.Thread(
                target=self.finish, args=(st,), name=f"tfk8s-summary-{self.name}", daemon=True
            ).start()

    def finish(self, st: ClusterStatus | None = None, deleted: bool = False, final: bool = False) -> bool:
        """Draw the final state (``st``, or the backend's now); whether anything changed.

        A status is recorded once it is terminal, or with ``final`` (the cluster is about to
        be deleted: this is the last look at it).  ``deleted`` marks the record deleted.
        """
        st = st if st is not None else self._status_now()
        record = st is not None and (st.terminal or final or deleted)
        tails = self._read_tails(st) if record and not deleted else None
        gone_logs = self._logs_gone(st if record else self.status, deleted)
        with self._lock:
            status = st if record else self.status
            now_deleted = deleted or self.deleted
            if status is None or (
                (status, now_deleted) == (self.status, self.deleted) and tails in (None, self.tails)
            ):
                return False
            self.status, self.deleted = status, now_deleted
            if tails is not None:
                self.tails = tails
            self._draw(_Static(summary_html(status, self.tails, now_deleted, gone_logs),
                               summary_text(status, self.tails, now_deleted, gone_logs)))
        if self.view is not None:
            self.view.catch_up(None if now_deleted else status, deleted)  # backend reads: no lock held
        if now_deleted or status.terminal:
            self._stop_following()
        return True

    def _logs_gone(self, known: ClusterStatus | None, deleted: bool) -> bool:
        """Whether a deleted cluster's log dir is gone (file system I/O: read with no lock held)."""
        return (deleted or self.deleted) and known is not None and logs_gone(known.log_dir)

    def _status_now(self) -> ClusterStatus | None:
        try:
            return self.backend.status(self.name)
        except Exception:  # noqa: BLE001 - gone (or unreachable): keep what was recorded
            return None

    def _draw(self, record: _Static) -> None:
        """Show ``record``: as the live view's alternative, else in this summary's own output."""
        if self.view is not None:
            self.view.show_record(record)
        elif self._handle is not None:
            self._handle.update(record)

    def _read_tails(self, st: ClusterStatus) -> dict[str, list[str]]:
        tails = {}
        for task in st.tasks:
            try:
                text = self.cluster.logs(task.name, self.tail)
            except Exception:  # noqa: BLE001 - a log that cannot be read is shown as such
                text = "(the log could not be read)"
            tails[task.name] = [line for line in text.splitlines() if line.strip()][-self.tail :]
        return tails

    def _stop_following(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None


def summaries_of(backend, name: str) -> list[FinalSummary]:
    """The summaries shown in this kernel for cluster ``name`` on ``backend``."""
    with FinalSummary._registry_lock:
        return list(FinalSummary._registry.get((backend.name, id(backend), name), ()))


def finish_all(
    backend, name: str, st: ClusterStatus | None = None, deleted: bool = False, final: bool = False
) -> None:
    """Bring every summary of ``name`` to its final state (``wait``, ``stop``, ``delete``)."""
    for s in summaries_of(backend, name):
        s.finish(st, deleted=deleted, final=final)
    if deleted:
        with FinalSummary._registry_lock:
            FinalSummary._registry.pop((backend.name, id(backend), name), None)


def show(cluster: Any, tail: int = TAIL_LINES, view: Any = None) -> FinalSummary | None:
    """Follow ``cluster`` and record its end, in a Jupyter kernel only (else None).

    With ``view`` (a live view with ``show_record``, e.g. the dashboard) the record becomes
    that view's alternatives; without, it is a placeholder output of its own.
    """
    if not live.in_kernel():
        return None
    return FinalSummary(cluster, tail, view=view).show()
