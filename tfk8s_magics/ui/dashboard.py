"""The live dashboard of one cluster: tasks, progress and ETA, metric curves, logs, events.

``%tfcluster launch`` and ``%tfcluster dashboard NAME`` show it; from
Python, ``tfk8s_magics.ui.dashboard.show(tk.get("mnist"))``.

What it shows, top to bottom:

* a header: name, mode, backend, phase (with its reason), age or end
  time, owner, log dir, and the latest warning event;
* a progress bar with step / total / percent / ETA / rate and the last
  metrics, from the progress protocol (:mod:`tfk8s_magics.runtime.progress`);
* a small curve of every reported metric (inline SVG);
* the task table: task, phase, reason, restarts, exit code or signal,
  host or node, start time, duration;
* Stop, Delete (asks once) and TensorBoard buttons, and their outcome;
* tabs: one live log per task (bounded, newest line in view, the whole
  file one click away), the cluster's events, TensorBoard.

It is fed only by the cluster's :class:`~tfk8s_magics.watch.ClusterFeed`
(one per cluster, however many views).  Feed callbacks only record
what changed; one render thread per dashboard (:class:`~.live.Throttle`)
draws at most four times a second, and once a second while the cluster
runs so its age moves (task durations every 5 s).  Logs reach the browser through
``Output.append_stdout`` from that thread.  When the cluster has ended and
its watcher is done — or the cluster is deleted — the dashboard draws its
final state, unsubscribes and its thread ends; where it is in that life
is one :class:`~.live.ViewEnd`.  The pieces live beside it: the HTML of
every part in :mod:`.render` (shared with the cluster list and the
fallbacks), Stop/Delete in :mod:`.actions` (shared with the list), the
task log tabs in :mod:`.logtabs`.

Every name, log line and message is shown as text, never as HTML.  Where
ipywidgets cannot be shown (plain IPython, nbconvert), the same status is
rendered by ``_repr_html_`` / ``__repr__``.
"""

from __future__ import annotations

import collections
import html
import operator
import threading
import time

from ..backends import ClusterStatus, Event
from ..errors import ClusterNotFound
from ..watch import ClusterFeed, watch_deletion
from . import live
from .actions import ActionBar
from .live import ViewEnd
from .logtabs import TaskLogTabs
from .logview import widgets_available
from .plot import curves_html, history_of
from .render import (
    bar_style,
    dashboard_html,
    default_log_task,
    events_html,
    events_text,
    header_html,
    last_warning,
    logs_gone,
    outcome_html,
    progress_html,
    status_text,
    tasks_html,
)
from .serving import serving_text
from .tensorboard import tensorboard_html

#: Log lines each task's tab holds (the log file keeps every line).
DEFAULT_MAX_LINES = 300
#: Seconds between redraws at most (coalescing), and between clock ticks while running.
RENDER_INTERVAL = 0.25
TICK_INTERVAL = 1.0
TABLE_TICK_INTERVAL = 5.0
#: Seconds between event refreshes while the cluster runs (sooner after a status change).
EVENTS_INTERVAL = 10.0
EVENTS_MIN_INTERVAL = 2.0

_e = html.escape

#: CSS of the dashboard (an HTML widget's <style> applies to the page; every rule is scoped).
STYLE = """<style>
.tfk8s-dashboard table { border-collapse: collapse; }
.tfk8s-dashboard th { text-align: left; padding: 2px 10px 2px 0; font-weight: 600; }
.tfk8s-dashboard td { padding: 1px 10px 1px 0; vertical-align: top; }
.tfk8s-dashboard .tfk8s-tasks tbody tr:nth-child(odd) { background: var(--jp-layout-color2, #f5f5f5); }
/* The log is a column-reverse scroller: it opens at its newest line and stays there. */
.tfk8s-dashboard .tfk8s-log > .jp-OutputArea { flex: 0 0 auto; }
.tfk8s-dashboard .tfk8s-log .jp-OutputArea-output pre { white-space: pre-wrap; }
</style>"""

_task_of = operator.attrgetter("task")


class Dashboard:
    """A live ipywidgets dashboard of one cluster (see the module docstring).

    ``cluster`` is a :class:`tfk8s_magics.api.Cluster`.  ``widgets`` forces
    (True) or disables (False) the widget view; by default it is used when
    this process is a Jupyter kernel with ipywidgets.  Call :meth:`show`
    to display it, or :meth:`start` to feed it without displaying.
    """

    def __init__(
        self,
        cluster,
        *,
        max_lines: int = DEFAULT_MAX_LINES,
        widgets: bool | None = None,
        interval: float = RENDER_INTERVAL,
        tick: float = TICK_INTERVAL,
    ) -> None:
        self.cluster = cluster
        self.backend = cluster.backend
        self.name = cluster.name
        self.max_lines = max(10, int(max_lines))
        self.use_widgets = widgets_available() if widgets is None else bool(widgets)
        self.interval = interval
        self.tick = tick
        #: What the view shows (also for tests and the fallback).
        self.status: ClusterStatus | None = None
        self.events: list[Event] = []
        self.outcome = ""
        #: Where the view is in its life; ``finished`` is set once its final state is drawn.
        self.end = ViewEnd.LIVE
        self.finished = threading.Event()
        self.lines: dict[str, collections.deque[str]] = {}
        self.line_counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()  # guards status, lines, line_counts, _pending
        self._draw_lock = threading.RLock()  # held by whoever changes a widget
        self._pending: dict[str, collections.deque[str]] = {}
        self._status_dirty = False
        self._events_at = 0.0
        self._table_at = 0.0
        self._curve_version = -1
        self._end_checked = 0.0
        self._feed: ClusterFeed | None = None
        self._deletion = None  # unsubscribes from the DeletionWatch once the view has ended
        self._unsubscribe = None
        self._history = None
        self._throttle: live.Throttle | None = None
        self._display_handle = None
        #: The launch cell's static record once the cluster has ended (:mod:`.summary`): the
        #: HTML/text alternatives of this view, what a notebook saved without widget state shows.
        self.record = None
        self.widget = None
        #: Set (under the draw lock) when the widgets are freed: no draw may make new ones then.
        self._destroyed = False
        if self.use_widgets:
            self._build()
        else:
            self.actions = self._action_bar(widgets=False)

    @property
    def deleted(self) -> bool:
        """Whether the cluster is known to be deleted."""
        return self.end is ViewEnd.DELETED

    def _end_as(self, new: ViewEnd) -> None:
        self.end = self.end.then(new)

    # -- widgets ---------------------------------------------------------------
    def _build(self) -> None:
        import ipywidgets as w

        self.header = w.HTML(header_html(None, self.name))
        self.progress = w.IntProgress(value=0, min=0, max=1, layout=w.Layout(width="50%"))
        self.progress.add_class("tfk8s-progress")
        self.progress_label = w.HTML(progress_html(None))
        self.curves = w.HTML(curves_html({}))
        self.tasks = w.HTML(tasks_html(None))
        self.tensorboard_button = w.Button(
            description="TensorBoard", icon="line-chart",
            tooltip="start or reuse TensorBoard on the cluster's log dir",
        )
        self.tensorboard_button.add_class("tfk8s-tb")
        self.tensorboard_button.on_click(lambda _b: self._on_tensorboard())
        self.serve_button = w.Button(
            description="Serve", icon="server",
            tooltip="serve the newest exported model (TensorFlow Serving's REST + gRPC APIs)",
        )
        self.serve_button.add_class("tfk8s-serve")
        self.serve_button.on_click(lambda _b: self._on_serve())
        self.outcome_label = w.HTML("")
        self.outcome_label.add_class("tfk8s-outcome")
        self.actions = self._action_bar(extra=(self.tensorboard_button, self.serve_button,
                                               self.outcome_label))
        # Set on the bar's own Layout: a replaced Layout is a widget nobody closes (soak: one per view).
        self.actions.widget.layout.align_items = "center"
        self.actions.widget.layout.flex_flow = "row wrap"
        self.events_view = w.HTML(events_html([]))
        self.tensorboard_view = w.HTML(
            '<div style="color:#888">press <b>TensorBoard</b> to start (or reuse) it on the log dir</div>'
        )
        self.tabs = w.Tab(children=[self.events_view, self.tensorboard_view])
        self.tabs.titles = ("Events", "TensorBoard")
        self.log_tabs = TaskLogTabs(self.tabs, self.name, self.max_lines, self._draw_lock,
                                    read_log=self._read_log, newest=self._newest_lines)
        self._task_pages = self.log_tabs.pages
        self.widget = w.VBox([
            w.HTML(STYLE),
            self.header,
            w.HBox([self.progress, self.progress_label], layout=w.Layout(align_items="center")),
            self.curves,
            self.tasks,
            self.actions.widget,
            self.tabs,
        ])
        self.widget.add_class("tfk8s-dashboard")

    def _action_bar(self, widgets: bool = True, extra: tuple = ()) -> ActionBar:
        return ActionBar(self.cluster, self._draw_lock, on_outcome=self._set_outcome,
                         on_stopped=self._on_status, on_deleted=self._on_deleted,
                         widgets=widgets, extra=extra)

    def _read_log(self, task: str) -> list[str]:
        return [ln.text for ln in self.backend.read_logs(self.name, task)]

    def _newest_lines(self, task: str) -> list[str]:
        with self._lock:
            return list(self.lines.get(task, ()))

    # -- life cycle --------------------------------------------------------------
    def start(self) -> Dashboard:
        """Subscribe to the cluster's feed and start drawing."""
        if self._throttle is not None:
            return self
        self._feed = ClusterFeed.of(self.backend, self.name)
        self._history = history_of(self._feed)
        self._throttle = live.Throttle(
            self._render if self.use_widgets else self._render_fallback,
            name=f"tfk8s-dashboard-{self.name}",
            interval=self.interval if self.use_widgets else max(1.0, self.interval),
            tick=self.tick,
            finished=self.finished.is_set,
        )
        self._unsubscribe = self._feed.subscribe(on_status=self._on_status, on_logs=self._on_logs)
        self._throttle.start()
        self._throttle.poke()
        return self

    def show(self) -> Dashboard:
        """Display the dashboard under the current cell and start feeding it."""
        from IPython.display import display

        live.supersede(self)
        if live.in_kernel():
            # With a display id, so the final record can replace this view's fallbacks in place.
            self._display_handle = display(self, display_id=True)
        elif self.use_widgets:
            display(self)
        else:
            display(self)
            return self  # a terminal: one snapshot, no thread
        return self.start()

    def close(self, destroy: bool = False) -> None:
        """Stop updating (and with ``destroy``, free the widgets)."""
        self._end_as(ViewEnd.CLOSED)
        self._forget_deletion()
        if self._unsubscribe:
            self._unsubscribe()
        if self._throttle:
            self._throttle.close()
        self.finished.set()
        if destroy and self.widget is not None:
            # Under the draw lock: a draw under way ends first, and any later one sees the flag
            # (it would make a new task's page outside the freed tree, alive for good).
            with self._draw_lock:
                self._destroyed = True
                live.close_tree(self.widget)

    def wait(self, timeout: float) -> bool:
        """Wait until the dashboard has drawn its final state; whether it did in time."""
        return self.finished.wait(timeout)

    @property
    def running(self) -> bool:
        """Whether its render thread is alive."""
        return self._throttle is not None and self._throttle.alive

    def refresh(self) -> None:
        """Redraw now (on the calling thread)."""
        (self._render if self.use_widgets else self._render_fallback)()

    # -- feed callbacks (feed threads: record and poke, never draw) --------------
    def _on_status(self, st: ClusterStatus) -> None:
        with self._lock:
            self.status = st
            self._status_dirty = True
        if self._throttle:
            self._throttle.poke()

    def _on_logs(self, batch) -> None:
        newest, counts = _newest_per_task(batch, self.max_lines)
        with self._lock:
            for task, texts in newest.items():
                q = self.lines.get(task)
                if q is None:
                    q = self.lines[task] = collections.deque(maxlen=self.max_lines)
                q.extend(texts)
                # The text view empties _pending at each draw: a known task may be missing from it.
                pending = self._pending.get(task)
                if pending is None:
                    pending = self._pending[task] = collections.deque(maxlen=self.max_lines)
                pending.extend(texts)
            self.line_counts.update(counts)
        if self._throttle:
            self._throttle.poke()

    def _on_deleted(self) -> None:
        """The cluster is gone (its Delete button, another cell, another process)."""
        self._end_as(ViewEnd.DELETED)
        self._forget_deletion()
        if self._throttle is None:
            return
        if self._throttle.alive:
            self._throttle.poke()
        elif self.use_widgets:
            # The view had drawn its final state and stopped: one more draw, on a render thread.
            live.Throttle(self._render, name=f"tfk8s-dashboard-{self.name}",
                          finished=lambda: True).start().poke()

    def _forget_deletion(self) -> None:
        stop, self._deletion = self._deletion, None
        if stop is not None:
            stop()

    # -- drawing (the render thread) ------------------------------------------------
    def _feed_ended(self) -> bool:
        """Whether every feed callback has been delivered (or the cluster is gone)."""
        f = self._feed
        if f is None or self.deleted:
            return True
        if not f.running:
            return True
        if f.status_done.is_set() and time.monotonic() - self._end_checked > 2.0:
            # The status thread ended but logs still follow: is the cluster gone?
            self._end_checked = time.monotonic()
            return self._gone()
        return False

    def _gone(self) -> bool:
        try:
            now = self.backend.status(self.name)
        except ClusterNotFound:
            return True
        except Exception:  # noqa: BLE001 - an unreachable backend is not a deleted cluster
            return False
        st = self.status
        return st is not None and st.created != now.created  # deleted and launched again

    def _take(self):
        with self._lock:
            st, dirty = self.status, self._status_dirty
            self._status_dirty = False
            pending = {t: list(q) for t, q in self._pending.items() if q}
            for q in self._pending.values():
                q.clear()
            counts = dict(self.line_counts)
        return st, dirty, pending, counts

    def _refresh_events(self, st: ClusterStatus | None, dirty: bool, final: bool) -> bool:
        now = time.monotonic()
        due = (
            final
            or (dirty and now - self._events_at >= EVENTS_MIN_INTERVAL)
            or (st is not None and not st.terminal and now - self._events_at >= EVENTS_INTERVAL)
        )
        if not due or self.deleted:
            return False
        self._events_at = now
        try:
            events = self.backend.events(self.name)
        except ClusterNotFound:
            return False
        except Exception as e:  # noqa: BLE001 - show why, keep drawing the rest
            events = [Event(time.time(), "", "EventsUnavailable", f"cannot read events: {e}", "Warning")]
        changed = events != self.events
        self.events = events
        return changed

    def _check_end(self) -> bool:
        """Whether the view has seen the end (reads the backend: call with no lock held)."""
        ended = self._feed_ended()
        if ended and not self.deleted and self._gone():
            self._end_as(ViewEnd.DELETED)
        return ended

    def _render(self) -> None:
        ended = self._check_end()  # before draining, so nothing delivered after it is missed
        st, dirty, pending, counts = self._take()
        events_changed = self._refresh_events(st, dirty, ended)
        gone_logs = self.deleted and st is not None and logs_gone(st.log_dir)  # I/O: before the lock
        with self._draw_lock:
            if self._destroyed:
                return
            if st is not None:
                for t in st.tasks:
                    self.log_tabs.page(t.name)
                self.log_tabs.prefer(default_log_task(st))
            # The table before the header (each is its own message to the page): a header that
            # says "stopped" never shows above a row that still says "running".
            # Between status changes only running durations move: redraw them every few seconds.
            now = time.monotonic()
            if dirty or ended or now - self._table_at >= TABLE_TICK_INTERVAL:
                self._table_at = now
                self.tasks.value = tasks_html(st, deleted=self.deleted)
                self._draw_progress(st)
            self.header.value = header_html(st, self.name, deleted=self.deleted,
                                            warning=last_warning(self.events), gone_logs=gone_logs)
            if self._history is not None and (self._history.version != self._curve_version or ended):
                self._curve_version = self._history.version
                self.curves.value = curves_html(self._history.points(), ended=ended)
            if events_changed:
                self._draw_events()
            for task, lines in pending.items():
                self.log_tabs.append(task, lines, counts.get(task, 0))
            self._draw_actions(st)
        if ended:
            self._finish()

    def _draw_progress(self, st: ClusterStatus | None) -> None:
        p = st.progress if st is not None else None
        if p is not None:
            top = p.total if p.total else max(p.step, 1)
            # Widen before raising the value (and lower after), so the value always fits.
            if top >= self.progress.value:
                self.progress.max = top
                self.progress.value = min(p.step, top)
            else:
                self.progress.value = min(p.step, top)
                self.progress.max = top
        self.progress.bar_style = bar_style(st.phase if st is not None else None)
        self.progress_label.value = progress_html(st)

    def _draw_events(self) -> None:
        warnings = sum(1 for ev in self.events if ev.type == "Warning")
        self.events_view.value = events_html(self.events)
        titles = list(self.tabs.titles)
        titles[len(self._task_pages)] = f"Events ({len(self.events)})" + (
            f" ⚠{warnings}" if warnings else ""
        )
        self.tabs.titles = tuple(titles)

    def _draw_actions(self, st: ClusterStatus | None) -> None:
        self.actions.draw(st, self.deleted)
        self.tensorboard_button.disabled = self.deleted
        self.serve_button.disabled = self.deleted
        self.outcome_label.value = outcome_html(self.outcome)

    def _finish(self) -> None:
        """The final state is drawn: nothing more will be — unless the cluster is deleted later."""
        self._end_as(ViewEnd.ENDED)
        if self._unsubscribe:
            self._unsubscribe()
        st = self.status
        if self.end is ViewEnd.ENDED and self._deletion is None and st is not None:
            self._deletion = watch_deletion(self.backend, self.name, st.created, self._on_deleted)
        self.finished.set()

    def _render_fallback(self) -> None:
        ended = self._check_end()
        with self._lock:
            self._pending.clear()
        self._refresh_events(self.status, True, ended)
        if self._display_handle is not None:
            self._display_handle.update(self)
        if ended:
            self._finish()

    # -- actions --------------------------------------------------------------------
    def _set_outcome(self, text: str) -> None:
        self.outcome = text
        if self.use_widgets:
            with self._draw_lock:
                if not self._destroyed:
                    self._draw_actions(self.status)
        if self._throttle:
            self._throttle.poke()

    def _on_tensorboard(self) -> None:
        def tensorboard() -> str:
            info = self.cluster.tensorboard()
            with self._draw_lock:
                self.tensorboard_view.value = tensorboard_html(info.url, info.logdir, info.reused)
                self.tabs.selected_index = len(self._task_pages) + 1
            return f"TensorBoard on {info.url}"

        self.actions.run("starting TensorBoard", tensorboard)

    def _on_serve(self) -> None:
        # The outcome line then shows the endpoint and the model version being served.
        self.actions.run("serving the model", lambda: serving_text(self.cluster.serve()))

    # -- rich display and fallback --------------------------------------------------
    def _snapshot(self) -> ClusterStatus | None:
        if self.status is not None:
            return self.status
        try:
            return self.backend.status(self.name)
        except Exception:  # noqa: BLE001 - a repr must not raise
            return None

    def _repr_mimebundle_(self, **kwargs) -> dict:
        record = self.record
        if record is not None:  # the cluster ended: its record is the alternative to the live view
            data = {"text/plain": repr(record), "text/html": record._repr_html_()}
        else:
            data = {"text/plain": repr(self), "text/html": self._repr_html_()}
        if self.widget is not None and not self._destroyed:  # closed widgets have no model id
            plain = data["text/plain"]
            data.update(self.widget._repr_mimebundle_(**kwargs) or {})
            data["text/plain"] = plain
        return data

    def show_record(self, record) -> None:
        """Make ``record`` (the cluster's final state) this view's HTML/text alternative.

        The front end keeps showing the live widget view; a notebook saved without widget
        state, nbconvert and a text front end show the record instead — one copy, not two.
        """
        self.record = record
        # A view freed by a re-run of its cell has no output left to update (and its widgets,
        # closed, cannot describe themselves any more).
        if self._display_handle is not None and not self._destroyed:
            self._display_handle.update(self)

    def catch_up(self, st: ClusterStatus | None, deleted: bool = False) -> None:
        """Draw ``st`` (the status the record was made of) now, on the calling thread.

        Called where the record is drawn — ``wait``, ``stop``, ``delete`` in a cell, or the
        watcher's summary thread — so the widgets' final values go out while that cell runs:
        what nbclient saves as the widget state (and nbconvert then embeds) is the final state,
        not the one of the render thread's last draw before the notebook ended.  Reads the
        backend: call it with no lock held.
        """
        if deleted:  # this kernel deleted it: no need to wait for the deletion watch
            self._end_as(ViewEnd.DELETED)
            self._forget_deletion()
        with self._lock:
            behind = st is not None and (self.status is None or not self.status.terminal)
        if behind:  # never an older status over one that has already seen the end
            self._on_status(st)
        if self.use_widgets and self._throttle is not None:
            self.refresh()

    def _repr_html_(self) -> str:
        st = self._snapshot()
        if st is None:
            return f"<div>cluster <b>{_e(self.name)}</b>: {'deleted' if self.deleted else 'no status'}</div>"
        points = self._history.points() if self._history is not None else {}
        with self._lock:
            tails = {t: list(q)[-10:] for t, q in self.lines.items()}
        return dashboard_html(st, deleted=self.deleted, curves=curves_html(points, ended=st.terminal),
                              events=self.events, log_tails=tails,
                              gone_logs=self.deleted and logs_gone(st.log_dir))

    def __repr__(self) -> str:
        st = self._snapshot()
        if st is None:
            return f"cluster {self.name}: {'deleted' if self.deleted else 'no status'}"
        gone_logs = self.deleted and logs_gone(st.log_dir)
        text = status_text(st, gone_logs) + (" (deleted)" if self.deleted else "")
        return text + ("\n" + events_text(self.events) if self.events else "")


def _newest_per_task(batch, max_lines: int) -> tuple[dict[str, list[str]], collections.Counter]:
    """The newest ``max_lines`` texts of each task in ``batch``, and every task's line count.

    A flooding task hands over 10k+ lines a batch: count them in C, and
    touch in Python only the newest lines of each task (all a tab can show).
    """
    counts = collections.Counter(map(_task_of, batch))
    if len(counts) == 1:
        (task,) = counts
        return {task: [ln.text for ln in batch[-max_lines:]]}, counts
    newest: dict[str, list[str]] = {}
    full = 0
    for ln in reversed(batch):
        texts = newest.setdefault(ln.task, [])
        if len(texts) < max_lines:
            texts.append(ln.text)
            if len(texts) == max_lines:
                full += 1
                if full == len(counts):
                    break
    return {t: v[::-1] for t, v in newest.items()}, counts


def show(cluster, max_lines: int = DEFAULT_MAX_LINES, widgets: bool | None = None) -> Dashboard:
    """Display a live dashboard of ``cluster`` (a :class:`tfk8s_magics.api.Cluster`); return it."""
    return Dashboard(cluster, max_lines=max_lines, widgets=widgets).show()
