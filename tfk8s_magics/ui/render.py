"""Pure renderings of cluster status as HTML and text: every view draws with these.

The dashboard (:mod:`.dashboard`), the cluster list (:mod:`.cluster_list`)
and the plain fallbacks where ipywidgets is not available (plain IPython,
nbconvert: :class:`StatusView`, :class:`ListView`) all use the functions
here, so a phase, a progress line or a task row reads the same in every
view.  They take values and return strings: no widgets, no I/O, no clock
unless ``now`` is left out.  Every value is escaped.
"""

from __future__ import annotations

import collections
import html
import os
import time

from ..backends import ClusterStatus, Event, Phase, Progress
from ..spec import BETWEEN, IN_GRAPH

_e = html.escape

#: Events shown in an events table (the newest).
MAX_EVENTS = 200

_PHASE_COLOURS = {
    Phase.PENDING: "#888",
    Phase.STARTING: "#b58900",
    Phase.RUNNING: "#268bd2",
    "stalled": "#cb4b16",
    Phase.SUCCEEDED: "#2aa198",
    Phase.FAILED: "#dc322f",
    Phase.STOPPING: "#6c71c4",
    Phase.STOPPED: "#6c71c4",
}
#: The ipywidgets progress-bar style of a cluster in each phase.
_BAR_STYLES = {Phase.SUCCEEDED: "success", Phase.FAILED: "danger", Phase.STOPPED: "warning"}


# -- values ----------------------------------------------------------------------------
def fmt_duration(seconds: float | None) -> str:
    """``75`` → ``1m15s``; None → ``-``."""
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


def clock(t: float | None) -> str:
    """A wall-clock time as ``HH:MM:SS`` (local time), or ``-``."""
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "-"


def exit_text(code: int | None, sig: str | None) -> str:
    """How a task ended: its signal, else its exit code, else nothing."""
    if sig:
        return str(sig)
    return "" if code is None else str(code)


def fmt_progress(p: Progress | None, ended: bool = False) -> str:
    """``step 120/1000 (12.0%) · ETA 1m05s · 5 steps/s · loss 0.31``, or ``-``.

    Once the cluster has ``ended``, the ETA and the rate are left out.
    """
    if p is None:
        return "-"
    parts = [f"step {p.step}" + (f"/{p.total}" if p.total else "")]
    if p.percent is not None:
        parts[0] += f" ({p.percent:.1f}%)"
    running = not ended and (p.total is None or p.step < p.total)
    if p.eta is not None and running:
        parts.append(f"ETA {fmt_duration(p.eta)}")
    if p.rate and running:
        parts.append(f"{p.rate:.3g} steps/s")
    parts += [f"{k} {v:.4g}" for k, v in sorted(p.metrics.items())]
    return " · ".join(parts)


def bar_style(phase: str | None) -> str:
    """The progress-bar style of a cluster in ``phase`` (empty while it runs)."""
    return _BAR_STYLES.get(phase or "", "")


def tasks_running(st: ClusterStatus) -> str:
    """``running/all`` tasks, e.g. ``3/4``; once the cluster has ended, how its tasks ended
    (``1 succeeded``): "0/1" read as "nothing ran" on a cluster that succeeded."""
    if st.phase in Phase.TERMINAL:
        ended = collections.Counter(t.phase for t in st.tasks)
        return ", ".join(f"{n} {phase}" for phase, n in sorted(ended.items())) or "-"
    running = sum(1 for t in st.tasks if t.phase == Phase.RUNNING)
    return f"{running}/{len(st.tasks)}"


def last_warning(events: list[Event]) -> Event | None:
    """The newest Warning event, if any."""
    for ev in reversed(events):
        if ev.type == "Warning":
            return ev
    return None


# -- HTML pieces -------------------------------------------------------------------------
def phase_badge(phase: str) -> str:
    """A coloured phase label (escaped)."""
    colour = _PHASE_COLOURS.get(phase, "#888")
    return (
        f'<span class="tfk8s-phase tfk8s-phase-{_e(phase)}" '
        f'style="color:{colour};font-weight:bold">{_e(phase)}</span>'
    )


def _when(st: ClusterStatus, ended: bool, now: float) -> str:
    if ended:
        when = f"ended {clock(st.finished)}" if st.finished else "ended"
        if st.finished and st.created:
            when += f" after {fmt_duration(st.finished - st.created)}"
        return when
    return f"age {fmt_duration(now - st.created)}" if st.created else ""


#: What a deleted cluster's view says where its log dir was, once that dir is gone.
LOGS_GONE = "deleted with the cluster"


def logs_gone(location) -> bool:
    """Whether a (deleted) cluster's log dir is gone from this machine — not kept, not the user's.

    Reads the file system: call it outside any lock a drawing thread waits on.  Logs on a
    Kubernetes volume are not visible here: not known to be gone (False).
    """
    if location is None or getattr(location, "volume", None) is not None:
        return False
    path = getattr(location, "path", str(location))
    return bool(path) and not os.path.isdir(path)


def logs_html(st: ClusterStatus, gone: bool = False) -> str:
    """Where the logs are — or that they were deleted with the cluster."""
    return LOGS_GONE if gone else f"<code>{_e(str(st.log_dir))}</code>"


def header_html(
    st: ClusterStatus | None,
    name: str,
    *,
    deleted: bool = False,
    warning: Event | None = None,
    now: float | None = None,
    gone_logs: bool = False,
) -> str:
    """A dashboard's first lines: who, what, which phase and why.

    ``gone_logs``: the cluster was deleted and its log dir with it (:func:`logs_gone`), so the
    path is not shown as if it were still there.
    """
    now = time.time() if now is None else now
    if st is None:
        return (
            f'<div class="tfk8s-header"><b class="tfk8s-name">{_e(name)}</b> '
            '<span style="color:#888">waiting for the first status…</span></div>'
        )
    # "stalled" (a running cluster in which nothing happens) comes from the stall detector;
    # read leniently so a status from before it (or from another backend) still renders.
    phase = "deleted" if deleted else getattr(st, "shown_phase", st.phase)
    bits = [
        "between-graph" if st.mode == BETWEEN else _e(st.mode),
        _e(st.backend),
        _when(st, st.terminal or deleted, now),
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
    if phase == "stalled" and callable(getattr(st, "stall_text", None)):
        warn += (
            '<div class="tfk8s-stall" style="color:#b58900;white-space:pre-wrap">'
            f"⚠ {_e(st.stall_text(now))}</div>"
        )
    reason = f' <span class="tfk8s-reason">{_e(st.reason)}</span>' if st.reason and not deleted else ""
    return (
        f'<div class="tfk8s-header" data-phase="{_e(phase, quote=True)}">'
        f'<b class="tfk8s-name" style="font-size:1.15em">{_e(st.name)}</b> '
        f"{phase_badge(phase)}{reason}"
        f'<div style="color:#666">{" · ".join(b for b in bits if b)} · '
        f"logs {logs_html(st, deleted and gone_logs)}</div>"
        f"{warn}</div>"
    )


def tasks_html(st: ClusterStatus | None, now: float | None = None, deleted: bool = False) -> str:
    """The task table: one row per task, every cell escaped.

    ``deleted``: the cluster is gone, so a task last seen running is shown
    as deleted (never "running" in a table of a cluster that no longer exists).
    """
    if st is None or not st.tasks:
        return '<div class="tfk8s-tasks" style="color:#888">no tasks yet</div>'
    now = time.time() if now is None else now
    rows = []
    for t in st.tasks:
        gone = deleted and t.phase not in Phase.TERMINAL
        phase, reason = ("deleted", "the cluster was deleted") if gone else (t.phase, t.reason)
        end = t.finished or (st.finished if gone else None) or now
        duration = None if t.started is None else end - t.started
        rows.append(
            f'<tr data-task="{_e(t.name, quote=True)}" data-phase="{_e(phase, quote=True)}">'
            f"<td><code>{_e(t.name)}</code></td><td>{phase_badge(phase)}</td>"
            f'<td class="tfk8s-reason">{_e(reason)}</td>'
            f'<td style="text-align:right">{int(t.restarts)}</td>'
            f"<td>{_e(exit_text(t.exit_code, t.signal))}</td><td>{_e(t.host)}</td>"
            f"<td>{_e(clock(t.started))}</td>"
            f'<td style="text-align:right">{_e(fmt_duration(duration))}</td></tr>'
        )
    return (
        '<table class="tfk8s-tasks" style="border-collapse:collapse;width:100%">'
        "<thead><tr><th>task</th><th>phase</th><th>reason</th><th>restarts</th><th>exit</th>"
        "<th>host / node</th><th>started</th><th>duration</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def default_log_task(st: ClusterStatus | None) -> str | None:
    """The log a dashboard opens on: the first task that failed, else the chief, else worker 0.

    Never a parameter server (its log is a banner and "serving") unless it is the one that
    failed or the only task there is.
    """
    if st is None or not st.tasks:
        return None
    failed = [t for t in st.tasks if t.phase == Phase.FAILED]
    if failed:
        return min(failed, key=lambda t: t.finished or float("inf")).name
    names = [t.name for t in st.tasks]
    for preferred in ("chief-0", "worker-0"):
        if preferred in names:
            return preferred
    return next((n for n in names if not n.startswith("ps-")), names[0])


def report_hint(st: ClusterStatus | None) -> str:
    """Where the user calls ``report_progress`` (HTML): the script, or — in-graph — the kernel."""
    call = "<code>tfk8s_magics.report_progress(step, total, loss=...)</code>"
    if st is not None and st.mode == IN_GRAPH:
        # In-graph there is no script: the training loop runs in the notebook that connected.
        return (f"call {call} in this notebook's training loop (the kernel is the client once "
                f"<code>%tfcluster connect {_e(st.name)}</code> returned)")
    return f"call {call} in the training script (the cell body every worker runs)"


def progress_html(st: ClusterStatus | None) -> str:
    """The progress line of a dashboard (escaped HTML), or how to report progress."""
    p = st.progress if st is not None else None
    if p is None:
        if st is not None and st.terminal:
            return '<span class="tfk8s-progress-text" style="color:#888">no progress was reported</span>'
        return (
            '<span class="tfk8s-progress-text" style="color:#888">no progress reported yet: '
            f"{report_hint(st)}</span>"
        )
    text = fmt_progress(p, ended=st is not None and st.terminal)
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
        + f"><td>{_e(clock(ev.time))}</td><td>{_e(ev.type)}</td><td>{_e(ev.task or '-')}</td>"
        f"<td>{_e(ev.reason)}</td><td>{_e(ev.message)}</td></tr>"
        for ev in events[-MAX_EVENTS:]
    )
    return (
        '<table class="tfk8s-events"><thead><tr><th>time</th><th>type</th><th>task</th>'
        f"<th>reason</th><th>message</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def events_text(events: list[Event], last: int = 5) -> str:
    """The newest ``last`` events as text lines."""
    return "\n".join(
        f"{clock(ev.time)} {ev.type:<8}{ev.task or '-':<12}{ev.reason:<16}{ev.message}"
        for ev in events[-last:]
    )


def outcome_html(text: str) -> str:
    """The outcome line of an action (escaped), or nothing."""
    return f'<span class="tfk8s-outcome-text">{_e(text)}</span>' if text else ""


# -- one cluster, many clusters: the fallbacks ----------------------------------------------
def status_text(st: ClusterStatus, gone_logs: bool = False) -> str:
    """A plain-text table of one cluster and its tasks (``gone_logs``: see :func:`header_html`)."""
    age = fmt_duration(time.time() - st.created) if st.created else "-"
    lines = [
        f"cluster {st.name} ({st.backend}, {st.mode}): {st.shown_phase}"
        + (f" — {st.reason}" if st.reason else ""),
        *([st.stall_text()] if st.stall else []),
        f"owner {st.owner or '-'} · age {age}" + (" · detached" if st.detached else ""),
        f"progress: {fmt_progress(st.progress, st.terminal)}",
        f"{'TASK':<14}{'PHASE':<11}{'RESTARTS':>8}  {'EXIT':<8}{'HOST':<22}{'DURATION':>9}  REASON",
    ]
    for t in st.tasks:
        lines.append(
            f"{t.name:<14}{t.phase:<11}{t.restarts:>8}  {exit_text(t.exit_code, t.signal):<8}"
            f"{t.host:<22}{fmt_duration(t.duration):>9}  {t.reason}"
        )
    lines.append(f"logs: {LOGS_GONE if gone_logs else st.log_dir}")
    return "\n".join(lines)


def status_html(st: ClusterStatus, gone_logs: bool = False) -> str:
    """An HTML summary of one cluster and its task table, every value escaped."""
    age = fmt_duration(time.time() - st.created) if st.created else "-"
    return (
        f'<div class="tfk8s-status"><b>{_e(st.name)}</b> ({_e(st.backend)}, {_e(st.mode)}) '
        f"{phase_badge(st.shown_phase)} {_e(st.reason)}<br>"
        + (f'<div class="tfk8s-stall">{_e(st.stall_text())}</div>' if st.stall else "")
        + f"owner {_e(st.owner or '-')} · age {_e(age)} · progress: "
        f"{_e(fmt_progress(st.progress, st.terminal))}"
        f"{tasks_html(st)}logs: {logs_html(st, gone_logs)}</div>"
    )


def dashboard_html(
    st: ClusterStatus,
    *,
    deleted: bool = False,
    curves: str = "",
    events: list[Event] | None = None,
    log_tails: dict[str, list[str]] | None = None,
    gone_logs: bool = False,
) -> str:
    """A dashboard as static HTML (no widgets): status, curves (already drawn), events, log tails."""
    logs = "".join(
        f"<details><summary>{_e(t)} (last {len(lines)} lines)</summary>"
        f"<pre>{_e(chr(10).join(lines))}</pre></details>"
        for t, lines in (log_tails or {}).items()
    )
    gone = ' <b style="color:#dc322f">deleted</b>' if deleted else ""
    return (
        f'<div class="tfk8s-dashboard-static">{status_html(st, deleted and gone_logs)}{gone}{curves}'
        f"{events_html(events or [])}{logs}</div>"
    )


def list_text(statuses: list[ClusterStatus]) -> str:
    """A plain-text table of clusters."""
    if not statuses:
        return "no clusters"
    lines = [f"{'NAME':<20}{'BACKEND':<12}{'MODE':<10}{'PHASE':<11}{'TASKS':>6}  {'AGE':>7}  PROGRESS"]
    for st in statuses:
        age = fmt_duration(time.time() - st.created)
        lines.append(
            f"{st.name:<20}{st.backend:<12}{st.mode:<10}{st.shown_phase:<11}{len(st.tasks):>6}  "
            f"{age:>7}  {fmt_progress(st.progress, st.terminal)}"
        )
    # A cluster whose state cannot be read says why under the table (one line each).
    lines += [f"{st.name}: {st.reason}" for st in statuses if st.phase == Phase.UNKNOWN]
    return "\n".join(lines)


def _progress_or_why(st: ClusterStatus) -> str:
    """The list's last column: the progress, or why the cluster's state cannot be read."""
    return st.reason if st.phase == Phase.UNKNOWN else fmt_progress(st.progress, st.terminal)


def list_html(statuses: list[ClusterStatus]) -> str:
    """An HTML table of clusters, every value escaped."""
    if not statuses:
        return "<i>no clusters</i>"
    rows = "".join(
        f"<tr><td>{_e(st.name)}</td><td>{_e(st.backend)}</td><td>{_e(st.mode)}</td>"
        f"<td>{phase_badge(st.shown_phase)}</td><td>{len(st.tasks)}</td>"
        f"<td>{_e(fmt_duration(time.time() - st.created))}</td>"
        f"<td>{_e(_progress_or_why(st))}</td></tr>"
        for st in statuses
    )
    return (
        '<table class="tfk8s-list"><thead><tr><th>name</th><th>backend</th><th>mode</th>'
        "<th>phase</th><th>tasks</th><th>age</th><th>progress</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


class StatusView:
    """Rich display of a status: HTML where the front end renders it, text elsewhere."""

    def __init__(self, st: ClusterStatus) -> None:
        self.st = st

    def _repr_html_(self) -> str:
        return status_html(self.st)

    def __repr__(self) -> str:
        return status_text(self.st)


class ListView:
    """Rich display of a cluster list."""

    def __init__(self, statuses: list[ClusterStatus]) -> None:
        self.statuses = statuses

    def _repr_html_(self) -> str:
        return list_html(self.statuses)

    def __repr__(self) -> str:
        return list_text(self.statuses)
