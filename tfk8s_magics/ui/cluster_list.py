"""``%tfcluster list``: a live table of the user's clusters with their phase, progress and actions.

Each row shows a cluster's name, backend, mode, phase (and why), how many
tasks run, a progress bar with step / ETA, its age, and three actions:
Dashboard (opens the cluster's dashboard under the table), Stop, and
Delete (asks once) — the same :class:`~.actions.ActionBar` as the
dashboard's.  Rows of clusters still running are fed by their
:class:`~tfk8s_magics.watch.ClusterFeed` — the same feed as every other
view of that cluster — and redrawn by one coalescing thread that ends once
no listed cluster is running.  Ended clusters are not followed.  Cells are
drawn with :mod:`.render`, like every other view.

Without ipywidgets the same table is rendered as HTML or text
(:class:`~tfk8s_magics.ui.render.ListView`).
"""

from __future__ import annotations

import html
import threading
import time

from ..api import Cluster
from ..backends import ClusterStatus
from ..watch import ClusterFeed, watch_deletion
from . import live
from .actions import ActionBar
from .dashboard import Dashboard
from .live import ViewEnd
from .logview import widgets_available
from .render import (
    bar_style,
    fmt_duration,
    fmt_progress,
    list_html,
    list_text,
    outcome_html,
    phase_badge,
    tasks_running,
)

_e = html.escape
COLUMNS = (
    "minmax(6em, max-content) 4.5em 5em minmax(7em, max-content) 3em minmax(12em, 1fr) 3.5em max-content"
)
HEADINGS = ("name", "backend", "mode", "phase", "tasks", "progress", "age", "")


class _Row:
    """The widgets of one cluster's row (drawn under the list's draw lock)."""

    def __init__(self, owner: ClusterList, st: ClusterStatus) -> None:
        import ipywidgets as w

        self.owner = owner
        self.name = st.name
        self.status = st
        self.unsubscribe = None
        self.feed: ClusterFeed | None = None
        self.name_cell = w.HTML(f'<b class="tfk8s-name">{_e(st.name)}</b>')
        self.backend_cell = w.HTML(_e(st.backend))
        self.mode_cell = w.HTML(_e(st.mode))
        self.phase_cell = w.HTML()
        self.tasks_cell = w.HTML()
        self.bar = w.IntProgress(value=0, min=0, max=1, layout=w.Layout(width="5em", min_width="5em"))
        self.bar.add_class("tfk8s-progress")
        self.progress_text = w.HTML()
        self.age_cell = w.HTML()
        self.dash_button = w.Button(description="Dashboard", layout=w.Layout(width="auto"))
        self.dash_button.add_class("tfk8s-dashboard-button")
        self.dash_button.on_click(lambda _b: owner.open_dashboard(self.name))
        self.actions = ActionBar(owner.cluster(st.name), owner._draw_lock, on_outcome=owner.say,
                                 on_stopped=self.on_status, on_deleted=self.on_deleted, compact=True)
        # Deleted by another cell, kernel or the CLI: the row says so within one check.
        self._deletion = watch_deletion(owner.backend, st.name, st.created, self.actions.mark_deleted)
        self.cells = [
            self.name_cell, self.backend_cell, self.mode_cell, self.phase_cell, self.tasks_cell,
            w.HBox([self.bar, self.progress_text], layout=w.Layout(align_items="center")),
            self.age_cell,
            w.HBox([self.dash_button, self.actions.widget]),
        ]
        self.draw()

    @property
    def deleted(self) -> bool:
        """Whether this row's cluster was deleted from the list."""
        return self.actions.deleted

    @property
    def live(self) -> bool:
        """Whether the row follows its cluster's feed."""
        return self.unsubscribe is not None

    def watch(self) -> None:
        """Follow the cluster through its feed (only while it runs)."""
        self.feed = ClusterFeed.of(self.owner.backend, self.name)
        self.unsubscribe = self.feed.subscribe(on_status=self.on_status)

    def on_status(self, st: ClusterStatus) -> None:
        """A new status (feed thread, or the Stop action): record it, redraw soon."""
        self.status = st
        self.owner.poke()

    def on_deleted(self) -> None:
        """The cluster was deleted (from this row or elsewhere): stop following it, redraw."""
        self.forget()
        self.owner.poke()

    def ended(self) -> bool:
        """Whether nothing more will change in this row (its feed stopped, or it was deleted)."""
        if self.deleted:
            return True
        if self.feed is not None and not self.feed.running:
            return True
        return self.feed is None and self.status.terminal

    def unwatch(self) -> None:
        """Stop following the cluster."""
        if self.unsubscribe:
            self.unsubscribe()
        self.unsubscribe = None

    def forget(self) -> None:
        """The row is dropped (a refresh, or the list closed): stop every subscription."""
        self.unwatch()
        stop, self._deletion = self._deletion, None
        if stop is not None:
            stop()

    def draw(self, now: float | None = None) -> None:
        """Draw the row from its status (under the list's draw lock)."""
        st = self.status
        now = time.time() if now is None else now
        phase = "deleted" if self.deleted else st.shown_phase
        why = st.stall_text(now) if st.stall else st.reason
        reason = (
            "" if self.deleted or not why else f'<br><small style="color:#666">{_e(why)}</small>'
        )
        self.phase_cell.value = (
            f'<span data-phase="{_e(phase, quote=True)}">{phase_badge(phase)}{reason}</span>'
        )
        self.tasks_cell.value = _e(tasks_running(st))
        p = st.progress
        if p is not None:
            self.bar.max = max(p.total or max(p.step, 1), 1)
            self.bar.value = min(p.step, self.bar.max)
        self.bar.bar_style = bar_style(st.phase)
        self.progress_text.value = (
            f'<small class="tfk8s-progress-text">{_e(fmt_progress(p, st.terminal))}</small>'
        )
        self.age_cell.value = _e(fmt_duration(now - st.created)) if st.created else "-"
        self.dash_button.disabled = self.deleted
        self.actions.draw(st, self.deleted)


class ClusterList:
    """A live table of the clusters on a backend (see the module docstring)."""

    def __init__(self, backend, widgets: bool | None = None) -> None:
        self.backend = backend
        self.use_widgets = widgets_available() if widgets is None else bool(widgets)
        self.statuses: list[ClusterStatus] = []
        self.rows: dict[str, _Row] = {}
        self.outcome = ""
        self.dashboard = None
        self.end = ViewEnd.LIVE
        self._draw_lock = threading.RLock()
        self._throttle: live.Throttle | None = None
        self.widget = None
        if self.use_widgets:
            import ipywidgets as w

            self.refresh_button = w.Button(
                description="Refresh", icon="refresh", layout=w.Layout(width="auto")
            )
            self.refresh_button.on_click(lambda _b: self.refresh())
            self.summary = w.HTML()
            self.table = w.GridBox(
                layout=w.Layout(grid_template_columns=COLUMNS, grid_gap="2px 8px", align_items="center")
            )
            self.table.add_class("tfk8s-list")
            self.outcome_label = w.HTML()
            self.outcome_label.add_class("tfk8s-outcome")
            self.detail = w.VBox()
            self.widget = w.VBox(
                [
                    w.HBox([self.refresh_button, self.summary], layout=w.Layout(align_items="center")),
                    self.table,
                    self.outcome_label,
                    self.detail,
                ]
            )
            self.widget.add_class("tfk8s-cluster-list")
        self.refresh()

    def cluster(self, name: str):
        """A :class:`~tfk8s_magics.api.Cluster` handle for ``name`` on this list's backend."""
        return Cluster(name, self.backend)

    # -- data ---------------------------------------------------------------------
    def refresh(self) -> None:
        """List the clusters again and rebuild the table."""
        self.statuses = self.backend.list_clusters()  # the backend is read before any lock
        if not self.use_widgets:
            return
        import ipywidgets as w

        with self._draw_lock:
            for row in list(self.rows.values()):
                row.forget()
            self.rows = {}
            cells = [w.HTML(f"<b>{h}</b>") for h in HEADINGS]
            for st in self.statuses:
                row = _Row(self, st)
                self.rows[st.name] = row
                cells += row.cells
                if not st.terminal:
                    row.watch()
            self.table.children = cells
            self._draw_summary()
        if any(r.live for r in self.rows.values()):
            self.poke()

    def _draw_summary(self) -> None:
        """The line above the table, from the rows as drawn (so it never contradicts them)."""
        rows = list(self.rows.values())
        n = sum(1 for r in rows if not r.deleted)
        running = sum(1 for r in rows if not r.deleted and not r.status.terminal)
        gone = len(rows) - n
        deleted = f", {gone} deleted since listed" if gone else ""
        self.summary.value = (
            f"<span>{n} cluster{'s' if n != 1 else ''} on "
            f"<b>{_e(self.backend.name)}</b>, {running} running{deleted}</span>"
            if rows
            else f"<i>no clusters on {_e(self.backend.name)}</i>"
        )

    def poke(self) -> None:
        """Ask for a redraw soon (rows call this when their status changes or they are deleted)."""
        if self.widget is None or self.end.final:
            return
        if self._throttle is None or not self._throttle.alive:
            self._throttle = live.Throttle(
                self._render, name="tfk8s-cluster-list", tick=2.0, finished=self._all_ended
            ).start()
        self._throttle.poke()

    def _all_ended(self) -> bool:
        with self._draw_lock:
            rows = list(self.rows.values())
        return self.end.final or all(r.ended() for r in rows)

    def _render(self) -> None:
        with self._draw_lock:
            for row in list(self.rows.values()):
                if row.live and row.ended():
                    row.unwatch()
                row.draw()
            self._draw_summary()
            self.outcome_label.value = outcome_html(self.outcome)

    # -- actions ----------------------------------------------------------------------
    def say(self, text: str) -> None:
        """Show ``text`` as the outcome line under the table (any thread)."""
        self.outcome = text
        if self.widget is not None:
            with self._draw_lock:
                self.outcome_label.value = outcome_html(text)
        self.poke()

    def open_dashboard(self, name: str):
        """Show ``name``'s dashboard under the table (replacing the one shown before)."""
        old, self.dashboard = self.dashboard, Dashboard(self.cluster(name), widgets=True).start()
        with self._draw_lock:
            self.detail.children = [self.dashboard.widget]
        if old is not None:
            old.close(destroy=True)
        return self.dashboard

    def close(self, destroy: bool = False) -> None:
        """Stop updating (and with ``destroy``, free the widgets)."""
        self.end = self.end.then(ViewEnd.CLOSED)
        with self._draw_lock:
            rows = list(self.rows.values())
        for row in rows:
            row.forget()
        if self._throttle is not None:
            self._throttle.close()
        if self.dashboard is not None:
            self.dashboard.close(destroy=destroy)
        if destroy and self.widget is not None:
            live.close_tree(self.widget)

    # -- display ----------------------------------------------------------------------
    def show(self) -> ClusterList:
        """Display the table under the current cell."""
        from IPython.display import display

        live.supersede(self)
        display(self)
        return self

    def _repr_mimebundle_(self, **kwargs) -> dict:
        data = {"text/plain": list_text(self.statuses), "text/html": list_html(self.statuses)}
        if self.widget is not None:
            data.update(self.widget._repr_mimebundle_(**kwargs) or {})
            data["text/plain"] = list_text(self.statuses)
        return data

    def _repr_html_(self) -> str:
        return list_html(self.statuses)

    def __repr__(self) -> str:
        return list_text(self.statuses)


def show(backend, widgets: bool | None = None) -> ClusterList:
    """Display the live cluster list of ``backend`` and return it."""
    return ClusterList(backend, widgets=widgets).show()
