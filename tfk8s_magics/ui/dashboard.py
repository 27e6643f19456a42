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

It is fed only by the cluster's :class:`~tfk8s_magics.watch.ClusterWatcher`
(one per cluster, however many views).  Watcher callbacks only record
what changed; one render thread per dashboard (:class:`~.live.Throttle`)
draws at most four times a second, and once a second while the cluster
runs so its age moves (task durations every 5 s).  Logs reach the browser through
``Output.append_stdout`` from that thread.  When the cluster has ended and
its watcher is done — or the cluster is deleted — the dashboard draws its
final state, unsubscribes and its thread ends.

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
from typing import Any

from ..backends import ClusterStatus, Event, Phase
from ..errors import ClusterNotFound
from ..watch import ClusterWatcher
from . import live
from .logview import widgets_available
from .plot import curves_html, history_of
from .render import fmt_duration, phase_badge, status_html, status_text
from .tensorboard import tensorboard_html

#: Log lines each task's tab holds (the log file keeps every line).
DEFAULT_MAX_LINES = 300
#: Most lines the "full log" button loads into a tab.
FULL_LOG_MAX_LINES = 20_000
#: Seconds between redraws at most (coalescing), and between clock ticks while running.
RENDER_INTERVAL = 0.25
TICK_INTERVAL = 1.0
TABLE_TICK_INTERVAL = 5.0
#: Seconds between event refreshes while the cluster runs (sooner after a status change).
EVENTS_INTERVAL = 10.0
EVENTS_MIN_INTERVAL = 2.0
#: Events shown in the events tab (the newest).
MAX_EVENTS = 200


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


def _clock(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "-"


def _exit_text(code: int | None, sig: str | None) -> str:
    if sig:
        return str(sig)
    return "" if code is None else str(code)


# -- pure renderings (tested directly) -----------------------------------------
def header_html(
    st: ClusterStatus | None,
    name: str,
    *,
    deleted: bool = False,
    warning: Event | None = None,
    now: float | None = None,
) -> str:
    """The dashboard's first lines: who, what, which phase and why."""
    now = time.time() if now is None else now
    if st is None:
        return (
            f'<div class="tfk8s-header"><b class="tfk8s-name">{_e(name)}</b> '
            '<span style="color:#888">waiting for the first status…</span></div>'
        )
    phase = "deleted" if deleted else st.phase
    if st.terminal or deleted:
        when = f"ended {_clock(st.finished)}" if st.finished else "ended"
        if st.finished and st.created:
            when += f" after {fmt_duration(st.finished - st.created)}"
    else:
        when = f"age {fmt_duration(now - st.created)}" if st.created else ""
    bits = [
        f"{_e(st.mode)}-graph" if st.mode in ("between", "in") else _e(st.mode),
        _e(st.backend),
        when,
        f"owner {_e(st.owner or '-')}",
    ]
    if st.detached:
        bits.append("detached")
    warn = ""
    if warning is not None and not st.terminal and not deleted:
        warn = (
            f'<div class="tfk8s-warning" style="color:#b58900">⚠ {_e(warning.task or "cluster")}: '
            f"{_e(warning.reason)} — {_e(warning.message)}</div>"
        )
    reason = f' <span class="tfk8s-reason">{_e(st.reason)}</span>' if st.reason and not deleted else ""
    return (
        f'<div class="tfk8s-header" data-phase="{_e(phase, quote=True)}">'
        f'<b class="tfk8s-name" style="font-size:1.15em">{_e(st.name)}</b> '
        f"{phase_badge(phase)}{reason}"
        f'<div style="color:#666">{" · ".join(b for b in bits if b)} · '
        f"logs <code>{_e(st.log_dir)}</code></div>"
        f"{warn}</div>"
    )


def tasks_html(st: ClusterStatus | None, now: float | None = None) -> str:
    """The task table: one row per task, every cell escaped."""
    if st is None or not st.tasks:
        return '<div class="tfk8s-tasks" style="color:#888">no tasks yet</div>'
    now = time.time() if now is None else now
    rows = []
    for t in st.tasks:
        duration = None if t.started is None else (t.finished or now) - t.started
        rows.append(
            f'<tr data-task="{_e(t.name, quote=True)}" data-phase="{_e(t.phase, quote=True)}">'
            f"<td><code>{_e(t.name)}</code></td><td>{phase_badge(t.phase)}</td>"
            f'<td class="tfk8s-reason">{_e(t.reason)}</td>'
            f'<td style="text-align:right">{int(t.restarts)}</td>'
            f"<td>{_e(_exit_text(t.exit_code, t.signal))}</td><td>{_e(t.host)}</td>"
            f"<td>{_e(_clock(t.started))}</td>"
            f'<td style="text-align:right">{_e(fmt_duration(duration))}</td></tr>'
        )
    return (
        '<table class="tfk8s-tasks" style="border-collapse:collapse;width:100%">'
        "<thead><tr><th>task</th><th>phase</th><th>reason</th><th>restarts</th><th>exit</th>"
        "<th>host / node</th><th>started</th><th>duration</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def progress_text(st: ClusterStatus | None) -> str:
    """``step 12/30 · 40.0% · ETA 4s · 5.0 steps/s · loss 0.07`` (escaped HTML)."""
    p = st.progress if st is not None else None
    if p is None:
        if st is not None and st.terminal:
            return '<span class="tfk8s-progress-text" style="color:#888">no progress was reported</span>'
        return (
            '<span class="tfk8s-progress-text" style="color:#888">no progress reported yet '
            "(<code>tfk8s_magics.report_progress(step, total, loss=...)</code>)</span>"
        )
    ended = st is not None and st.terminal
    parts = [f"step {p.step}" + (f"/{p.total}" if p.total else "")]
    if p.percent is not None:
        parts[0] += f" ({p.percent:.1f}%)"
    if p.eta is not None and not ended:
        parts.append(f"ETA {fmt_duration(p.eta)}")
    if p.rate and not ended:
        parts.append(f"{p.rate:.3g} steps/s")
    parts += [f"{k} {v:.4g}" for k, v in sorted(p.metrics.items())]
    text = " · ".join(parts)
    if p.task:
        text += f" · from {p.task}"
    return f'<span class="tfk8s-progress-text">{_e(text)}</span>'


def events_html(events: list[Event]) -> str:
    """The events table, newest last; warnings stand out."""
    if not events:
        return '<div class="tfk8s-events" style="color:#888">no events</div>'
    rows = "".join(
        f'<tr class="tfk8s-event-{_e(ev.type.lower(), quote=True)}"'
        + (' style="color:#b58900"' if ev.type == "Warning" else "")
        + f"><td>{_e(_clock(ev.time))}</td><td>{_e(ev.type)}</td><td>{_e(ev.task or '-')}</td>"
        f"<td>{_e(ev.reason)}</td><td>{_e(ev.message)}</td></tr>"
        for ev in events[-MAX_EVENTS:]
    )
    return (
        '<table class="tfk8s-events"><thead><tr><th>time</th><th>type</th><th>task</th>'
        f"<th>reason</th><th>message</th></tr></thead><tbody>{rows}</tbody></table>"
    )


_task_of = operator.attrgetter("task")


def _last_warning(events: list[Event]) -> Event | None:
    for ev in reversed(events):
        if ev.type == "Warning":
            return ev
    return None


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
        self.deleted = False
        self.outcome = ""
        self.lines: dict[str, collections.deque[str]] = {}
        self.line_counts: collections.Counter[str] = collections.Counter()
        self.finished = threading.Event()
        self._lock = threading.Lock()
        self._draw_lock = threading.RLock()
        self._pending: dict[str, collections.deque[str]] = {}
        self._status_dirty = False
        self._events_at = 0.0
        self._table_at = 0.0
        self._events_status_seen: ClusterStatus | None = None
        self._curve_version = -1
        self._shown: collections.Counter[str] = collections.Counter()
        self._action: str | None = None
        self._action_thread: threading.Thread | None = None
        self._confirming = False
        self._end_checked = 0.0
        self._final = False
        self._closed = False
        self._watcher: ClusterWatcher | None = None
        self._unsubscribe = None
        self._history = None
        self._throttle: live.Throttle | None = None
        self._display_handle = None
        self.widget = None
        self._task_pages: dict[str, Any] = {}
        if self.use_widgets:
            self._build()

    # -- widgets ---------------------------------------------------------------
    def _build(self) -> None:
        import ipywidgets as w

        self.header = w.HTML(header_html(None, self.name))
        self.progress = w.IntProgress(value=0, min=0, max=1, layout=w.Layout(width="50%"))
        self.progress.add_class("tfk8s-progress")
        self.progress_label = w.HTML(progress_text(None))
        self.curves = w.HTML(curves_html({}))
        self.tasks = w.HTML(tasks_html(None))
        self.stop_button = w.Button(
            description="Stop",
            icon="stop",
            button_style="warning",
            tooltip="end every task; the logs are kept",
        )
        self.delete_button = w.Button(
            description="Delete",
            icon="trash",
            button_style="danger",
            tooltip="stop and remove the cluster and its logs",
        )
        self.confirm_button = w.Button(
            description="Yes, delete", button_style="danger", layout=w.Layout(display="none")
        )
        self.cancel_button = w.Button(description="Cancel", layout=w.Layout(display="none"))
        self.tensorboard_button = w.Button(
            description="TensorBoard",
            icon="line-chart",
            tooltip="start or reuse TensorBoard on the cluster's log dir",
        )
        for b, cls in (
            (self.stop_button, "tfk8s-stop"),
            (self.delete_button, "tfk8s-delete"),
            (self.confirm_button, "tfk8s-confirm"),
            (self.cancel_button, "tfk8s-cancel"),
            (self.tensorboard_button, "tfk8s-tb"),
        ):
            b.add_class(cls)
        self.stop_button.on_click(self._on_stop)
        self.delete_button.on_click(self._on_delete)
        self.confirm_button.on_click(self._on_confirm)
        self.cancel_button.on_click(self._on_cancel)
        self.tensorboard_button.on_click(self._on_tensorboard)
        self.outcome_label = w.HTML("")
        self.outcome_label.add_class("tfk8s-outcome")
        self.events_view = w.HTML(events_html([]))
        self.tensorboard_view = w.HTML(
            '<div style="color:#888">press <b>TensorBoard</b> to start (or reuse) it on the log dir</div>'
        )
        self.tabs = w.Tab(children=[self.events_view, self.tensorboard_view])
        self.tabs.titles = ("Events", "TensorBoard")
        self.widget = w.VBox(
            [
                w.HTML(STYLE),
                self.header,
                w.HBox([self.progress, self.progress_label], layout=w.Layout(align_items="center")),
                self.curves,
                self.tasks,
                w.HBox(
                    [
                        self.stop_button,
                        self.delete_button,
                        self.confirm_button,
                        self.cancel_button,
                        self.tensorboard_button,
                        self.outcome_label,
                    ],
                    layout=w.Layout(align_items="center", flex_flow="row wrap"),
                ),
                self.tabs,
            ]
        )
        self.widget.add_class("tfk8s-dashboard")

    def _task_page(self, task: str):
        """The tab of one task's log, created the first time the task is seen."""
        page = self._task_pages.get(task)
        if page is not None:
            return page
        import ipywidgets as w

        # column-reverse keeps the scroll anchored at the bottom: the newest line stays in view.
        out = w.Output(
            layout=w.Layout(
                height="20em",
                overflow="auto",
                display="flex",
                flex_flow="column-reverse",
                border="1px solid #ddd",
            )
        )
        out.add_class("tfk8s-log")
        full = w.Button(
            description="Full log",
            icon="file-text-o",
            tooltip="load the whole log of this task (up to 20,000 lines)",
        )
        full.add_class("tfk8s-full-log")
        full.on_click(lambda _b, t=task: self._load_full_log(t))
        hint = w.HTML(
            f'<span style="color:#888">the last {self.max_lines} lines · '
            f"<code>%tfcluster logs {_e(self.name)} {_e(task)}</code> prints the whole log</span>"
        )
        page = w.VBox([out, w.HBox([full, hint], layout=w.Layout(align_items="center"))])
        page.add_class("tfk8s-task-log")
        page.output = out  # type: ignore[attr-defined]
        self._task_pages[task] = page
        titles = list(self.tabs.titles)
        n = len(self._task_pages) - 1
        children = list(self.tabs.children)
        selected = self.tabs.selected_index
        self.tabs.children = children[:n] + [page] + children[n:]
        self.tabs.titles = tuple(titles[:n] + [task] + titles[n:])
        if n == 0 or selected is None:
            self.tabs.selected_index = 0
        elif selected >= n:
            self.tabs.selected_index = selected + 1
        return page

    # -- life cycle --------------------------------------------------------------
    def start(self) -> Dashboard:
        """Subscribe to the cluster's watcher and start drawing."""
        if self._throttle is not None:
            return self
        self._watcher = ClusterWatcher.of(self.backend, self.name)
        self._history = history_of(self._watcher)
        self._throttle = live.Throttle(
            self._render if self.use_widgets else self._render_fallback,
            name=f"tfk8s-dashboard-{self.name}",
            interval=self.interval if self.use_widgets else max(1.0, self.interval),
            tick=self.tick,
            finished=lambda: self._final or self._closed,
        )
        self._unsubscribe = self._watcher.subscribe(on_status=self._on_status, on_logs=self._on_logs)
        self._throttle.start()
        self._throttle.poke()
        return self

    def show(self) -> Dashboard:
        """Display the dashboard under the current cell and start feeding it."""
        from IPython.display import display

        live.supersede(self)
        if self.use_widgets:
            display(self)
        elif live.in_kernel():
            self._display_handle = display(self, display_id=True)
        else:
            display(self)
            return self  # a terminal: one snapshot, no thread
        return self.start()

    def close(self, destroy: bool = False) -> None:
        """Stop updating (and with ``destroy``, free the widgets)."""
        self._closed = True
        if self._unsubscribe:
            self._unsubscribe()
        if self._throttle:
            self._throttle.close()
        self.finished.set()
        if destroy and self.widget is not None:
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

    # -- watcher callbacks (watcher threads: record and poke, never draw) --------
    def _on_status(self, st: ClusterStatus) -> None:
        with self._lock:
            self.status = st
            self._status_dirty = True
        if self._throttle:
            self._throttle.poke()

    def _on_logs(self, batch) -> None:
        # A flooding task hands over 10k+ lines a batch: count them in C, and touch
        # in Python only the newest max_lines of each task (all a tab can show).
        counts = collections.Counter(map(_task_of, batch))
        newest: dict[str, list[str]] = {}
        if len(counts) == 1:
            (task,) = counts
            newest[task] = [ln.text for ln in batch[-self.max_lines :]]
        else:
            full = 0
            for ln in reversed(batch):
                texts = newest.setdefault(ln.task, [])
                if len(texts) < self.max_lines:
                    texts.append(ln.text)
                    if len(texts) == self.max_lines:
                        full += 1
                        if full == len(counts):
                            break
            newest = {t: v[::-1] for t, v in newest.items()}
        with self._lock:
            for task, texts in newest.items():
                q = self.lines.get(task)
                if q is None:
                    q = self.lines[task] = collections.deque(maxlen=self.max_lines)
                    self._pending[task] = collections.deque(maxlen=self.max_lines)
                q.extend(texts)
                self._pending[task].extend(texts)
            self.line_counts.update(counts)
        if self._throttle:
            self._throttle.poke()

    # -- drawing (the render thread) ------------------------------------------------
    def _watcher_ended(self) -> bool:
        """Whether every watcher callback has been delivered (or the cluster is gone)."""
        w = self._watcher
        if w is None or self.deleted:
            return True
        if not w.running:
            return True
        if w.status_done.is_set() and time.monotonic() - self._end_checked > 2.0:
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

    def _render(self) -> None:
        ended = self._watcher_ended()  # before draining, so nothing delivered after it is missed
        st, dirty, pending, counts = self._take()
        if ended and not self.deleted:
            self.deleted = self._gone()
        events_changed = self._refresh_events(st, dirty, ended)
        with self._draw_lock:
            if st is not None:
                for t in st.tasks:
                    self._task_page(t.name)
            self.header.value = header_html(
                st, self.name, deleted=self.deleted, warning=_last_warning(self.events)
            )
            # Between status changes only running durations move: redraw them every few seconds.
            now = time.monotonic()
            if dirty or ended or now - self._table_at >= TABLE_TICK_INTERVAL:
                self._table_at = now
                self.tasks.value = tasks_html(st)
                self._draw_progress(st)
            if self._history is not None and self._history.version != self._curve_version:
                self._curve_version = self._history.version
                self.curves.value = curves_html(self._history.points())
            if events_changed:
                warnings = sum(1 for ev in self.events if ev.type == "Warning")
                self.events_view.value = events_html(self.events)
                titles = list(self.tabs.titles)
                titles[len(self._task_pages)] = f"Events ({len(self.events)})" + (
                    f" ⚠{warnings}" if warnings else ""
                )
                self.tabs.titles = tuple(titles)
            for task, lines in pending.items():
                self._append_log(task, lines, counts.get(task, 0))
            self._draw_buttons(st)
        if ended:
            self._finish()

    def _draw_progress(self, st: ClusterStatus | None) -> None:
        p = st.progress if st is not None else None
        if p is not None:
            top = p.total if p.total else max(p.step, 1)
            if top >= self.progress.value:
                self.progress.max = top
                self.progress.value = min(p.step, top)
            else:
                self.progress.value = min(p.step, top)
                self.progress.max = top
        style = {Phase.SUCCEEDED: "success", Phase.FAILED: "danger", Phase.STOPPED: "warning"}
        self.progress.bar_style = style.get(st.phase, "") if st is not None else ""
        self.progress_label.value = progress_text(st)

    def _append_log(self, task: str, lines: list[str], total: int) -> None:
        out = self._task_page(task).output
        self._shown[task] += len(lines)
        if self._shown[task] > 2 * self.max_lines:
            # Re-base on the newest lines so what the widget holds (and sends) stays bounded.
            with self._lock:
                tail = list(self.lines.get(task, ()))
            dropped = max(0, total - len(tail))
            head = f"… {dropped} earlier lines: press Full log, or %tfcluster logs {self.name} {task}\n"
            out.outputs = (
                {"output_type": "stream", "name": "stdout", "text": head + "\n".join(tail) + "\n"},
            )
            self._shown[task] = len(tail)
        else:
            out.append_stdout("\n".join(lines) + "\n")

    def _draw_buttons(self, st: ClusterStatus | None) -> None:
        busy = self._action is not None
        self.stop_button.disabled = busy or self.deleted or st is None or st.terminal
        self.delete_button.disabled = busy or self.deleted or self._confirming
        self.tensorboard_button.disabled = self.deleted
        self.outcome_label.value = (
            f'<span class="tfk8s-outcome-text">{_e(self.outcome)}</span>' if self.outcome else ""
        )

    def _finish(self) -> None:
        self._final = True
        if self._unsubscribe:
            self._unsubscribe()
        self.finished.set()

    def _render_fallback(self) -> None:
        ended = self._watcher_ended()
        with self._lock:
            self._pending.clear()
        if ended and not self.deleted:
            self.deleted = self._gone()
        self._refresh_events(self.status, True, ended)
        if self._display_handle is not None:
            self._display_handle.update(self)
        if ended:
            self._finish()

    # -- actions (button callbacks run on the kernel's main thread) -------------------
    def _begin(self, action: str, target) -> bool:
        with self._lock:
            if self._action is not None or self.deleted:
                return False
            self._action = action
        self._set_outcome(f"{action}…")
        t = threading.Thread(
            target=self._run_action,
            args=(action, target),
            name=f"tfk8s-{action}-{self.name}",
            daemon=True,
        )
        self._action_thread = t
        t.start()
        return True

    def _run_action(self, action: str, target) -> None:
        try:
            outcome = target()
        except Exception as e:  # noqa: BLE001 - the outcome is shown to the user
            outcome = f"{action} failed: {e}"
        with self._lock:
            self._action = None
        self._set_outcome(outcome)

    def _set_outcome(self, text: str) -> None:
        self.outcome = text
        if self.use_widgets:
            with self._draw_lock:
                self._draw_buttons(self.status)
        if self._throttle:
            self._throttle.poke()

    def _on_stop(self, _button=None) -> None:
        def stop() -> str:
            st = self.cluster.stop()
            self._on_status(st)
            return f"stopped: the cluster is {st.phase}; logs kept in {st.log_dir}"

        self._begin("stopping", stop)

    def _on_delete(self, _button=None) -> None:
        if self.deleted or self._action is not None:
            return
        self._confirming = True
        self.confirm_button.layout.display = None
        self.cancel_button.layout.display = None
        self._set_outcome(f"delete {self.name} and its logs?")

    def _on_cancel(self, _button=None) -> None:
        self._confirming = False
        self.confirm_button.layout.display = "none"
        self.cancel_button.layout.display = "none"
        self._set_outcome("")

    def _on_confirm(self, _button=None) -> None:
        if not self._confirming:
            return
        self._confirming = False
        self.confirm_button.layout.display = "none"
        self.cancel_button.layout.display = "none"

        def delete() -> str:
            self.cluster.delete()
            self.deleted = True
            return f"deleted {self.name}"

        self._begin("deleting", delete)

    def _on_tensorboard(self, _button=None) -> None:
        def tensorboard() -> str:
            info = self.cluster.tensorboard()
            with self._draw_lock:
                self.tensorboard_view.value = tensorboard_html(info.url, info.logdir, info.reused)
                self.tabs.selected_index = len(self._task_pages) + 1
            return f"TensorBoard on {info.url}"

        self._begin("starting TensorBoard", tensorboard)

    def _load_full_log(self, task: str) -> None:
        def load() -> None:
            try:
                lines = [ln.text for ln in self.backend.read_logs(self.name, task)]
            except Exception as e:  # noqa: BLE001 - shown in place of the log
                lines, head = [], f"cannot read the log of {task}: {e}\n"
            else:
                head = ""
                if len(lines) > FULL_LOG_MAX_LINES:
                    head = f"… showing the last {FULL_LOG_MAX_LINES} of {len(lines)} lines\n"
                    lines = lines[-FULL_LOG_MAX_LINES:]
            with self._draw_lock:
                page = self._task_page(task)
                page.output.outputs = (
                    {
                        "output_type": "stream",
                        "name": "stdout",
                        "text": head + "\n".join(lines) + "\n",
                    },
                )
                # Live lines keep coming; re-basing waits until as many again have arrived.
                self._shown[task] = -len(lines)

        threading.Thread(target=load, name=f"tfk8s-fulllog-{self.name}", daemon=True).start()

    # -- rich display and fallback --------------------------------------------------
    def _snapshot(self) -> ClusterStatus | None:
        if self.status is not None:
            return self.status
        try:
            return self.backend.status(self.name)
        except Exception:  # noqa: BLE001 - a repr must not raise
            return None

    def _repr_mimebundle_(self, **kwargs) -> dict:
        data = {"text/plain": repr(self), "text/html": self._repr_html_()}
        if self.widget is not None:
            data.update(self.widget._repr_mimebundle_(**kwargs) or {})
            data["text/plain"] = repr(self)
        return data

    def _repr_html_(self) -> str:
        st = self._snapshot()
        if st is None:
            state = "deleted" if self.deleted else "no status"
            return f"<div>cluster <b>{_e(self.name)}</b>: {state}</div>"
        points = self._history.points() if self._history is not None else {}
        with self._lock:
            tails = {t: list(q)[-10:] for t, q in self.lines.items()}
        logs = "".join(
            f"<details><summary>{_e(t)} (last {len(lines)} lines)</summary>"
            f"<pre>{_e(chr(10).join(lines))}</pre></details>"
            for t, lines in tails.items()
        )
        deleted = ' <b style="color:#dc322f">deleted</b>' if self.deleted else ""
        return (
            f'<div class="tfk8s-dashboard-static">{status_html(st)}{deleted}{curves_html(points)}'
            f"{events_html(self.events)}{logs}</div>"
        )

    def __repr__(self) -> str:
        st = self._snapshot()
        if st is None:
            return f"cluster {self.name}: {'deleted' if self.deleted else 'no status'}"
        text = status_text(st) + (" (deleted)" if self.deleted else "")
        for ev in self.events[-5:]:
            text += f"\n{_clock(ev.time)} {ev.type:<8}{ev.task or '-':<12}{ev.reason:<16}{ev.message}"
        return text


def show(cluster, max_lines: int = DEFAULT_MAX_LINES, widgets: bool | None = None) -> Dashboard:
    """Display a live dashboard of ``cluster`` (a :class:`tfk8s_magics.api.Cluster`); return it."""
    return Dashboard(cluster, max_lines=max_lines, widgets=widgets).show()
