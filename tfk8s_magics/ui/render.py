"""Plain renderings of cluster status: HTML (``_repr_html_``) and text.

These are the fallback where ipywidgets is not available (plain IPython,
nbconvert) and the building blocks of richer views.  Every value is
escaped.
"""

from __future__ import annotations

import html
import time

from ..backends import ClusterStatus, Progress


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


def fmt_progress(p: Progress | None) -> str:
    """``step 120/1000 (12.0%) · ETA 1m05s · loss 0.31``, or ``-``."""
    if p is None:
        return "-"
    parts = [f"step {p.step}" + (f"/{p.total}" if p.total else "")]
    if p.percent is not None:
        parts[0] += f" ({p.percent:.1f}%)"
    if p.eta is not None and (p.total is None or p.step < p.total):
        parts.append(f"ETA {fmt_duration(p.eta)}")
    parts += [f"{k} {v:.4g}" for k, v in sorted(p.metrics.items())]
    return " · ".join(parts)


def status_text(st: ClusterStatus) -> str:
    """A plain-text table of one cluster and its tasks."""
    age = fmt_duration(time.time() - st.created) if st.created else "-"
    lines = [
        f"cluster {st.name} ({st.backend}, {st.mode}): {st.phase}"
        + (f" — {st.reason}" if st.reason else ""),
        f"owner {st.owner or '-'} · age {age}" + (" · detached" if st.detached else ""),
        f"progress: {fmt_progress(st.progress)}",
        f"{'TASK':<14}{'PHASE':<11}{'RESTARTS':>8}  {'EXIT':<8}{'HOST':<22}{'DURATION':>9}  REASON",
    ]
    for t in st.tasks:
        code = t.signal or ("" if t.exit_code is None else str(t.exit_code))
        lines.append(
            f"{t.name:<14}{t.phase:<11}{t.restarts:>8}  {code:<8}{t.host:<22}"
            f"{fmt_duration(t.duration):>9}  {t.reason}"
        )
    lines.append(f"logs: {st.log_dir}")
    return "\n".join(lines)


_PHASE_COLOURS = {
    "pending": "#888",
    "starting": "#b58900",
    "running": "#268bd2",
    "succeeded": "#2aa198",
    "failed": "#dc322f",
    "stopped": "#6c71c4",
}


def phase_badge(phase: str) -> str:
    """A coloured phase label (escaped)."""
    colour = _PHASE_COLOURS.get(phase, "#888")
    return (
        f'<span class="tfk8s-phase tfk8s-phase-{html.escape(phase)}" '
        f'style="color:{colour};font-weight:bold">{html.escape(phase)}</span>'
    )


def status_html(st: ClusterStatus) -> str:
    """An HTML table of one cluster and its tasks, every value escaped."""
    e = html.escape
    rows = "".join(
        f"<tr><td>{e(t.name)}</td><td>{phase_badge(t.phase)}</td><td>{e(t.reason)}</td>"
        f"<td>{t.restarts}</td><td>{e(t.signal or ('' if t.exit_code is None else str(t.exit_code)))}</td>"
        f"<td>{e(t.host)}</td><td>{e(fmt_duration(t.duration))}</td></tr>"
        for t in st.tasks
    )
    age = fmt_duration(time.time() - st.created) if st.created else "-"
    return (
        f'<div class="tfk8s-status"><b>{e(st.name)}</b> ({e(st.backend)}, {e(st.mode)}) '
        f"{phase_badge(st.phase)} {e(st.reason)}<br>"
        f"owner {e(st.owner or '-')} · age {e(age)} · progress: {e(fmt_progress(st.progress))}"
        "<table><thead><tr><th>task</th><th>phase</th><th>reason</th><th>restarts</th>"
        "<th>exit</th><th>host</th><th>duration</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>logs: <code>{e(st.log_dir)}</code></div>"
    )


def list_text(statuses: list[ClusterStatus]) -> str:
    """A plain-text table of clusters."""
    if not statuses:
        return "no clusters"
    lines = [f"{'NAME':<20}{'BACKEND':<12}{'MODE':<10}{'PHASE':<11}{'TASKS':>6}  {'AGE':>7}  PROGRESS"]
    for st in statuses:
        age = fmt_duration(time.time() - st.created)
        lines.append(
            f"{st.name:<20}{st.backend:<12}{st.mode:<10}{st.phase:<11}{len(st.tasks):>6}  "
            f"{age:>7}  {fmt_progress(st.progress)}"
        )
    return "\n".join(lines)


def list_html(statuses: list[ClusterStatus]) -> str:
    """An HTML table of clusters, every value escaped."""
    e = html.escape
    if not statuses:
        return "<i>no clusters</i>"
    rows = "".join(
        f"<tr><td>{e(st.name)}</td><td>{e(st.backend)}</td><td>{e(st.mode)}</td>"
        f"<td>{phase_badge(st.phase)}</td><td>{len(st.tasks)}</td>"
        f"<td>{e(fmt_duration(time.time() - st.created))}</td><td>{e(fmt_progress(st.progress))}</td></tr>"
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
