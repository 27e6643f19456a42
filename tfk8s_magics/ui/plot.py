"""Small inline SVG line plots of reported metrics (no plotting library needed).

:class:`MetricHistory` records the metrics a cluster's training script
reports (``report_progress(step, total, loss=...)``), one history per
cluster feed, so a dashboard opened late still draws the whole curve.
:func:`sparkline_svg` draws one metric as an escaped SVG string.
"""

from __future__ import annotations

import html
import math
import threading
import weakref

from ..backends import ClusterStatus

#: Points kept per metric; beyond it every other point is dropped (the curve keeps its shape).
MAX_POINTS = 400
#: Metrics drawn (the first ones reported, in name order).
MAX_METRICS = 4


class MetricHistory:
    """The (step, value) points of every metric seen in a cluster's progress records."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._points: dict[str, list[tuple[int, float]]] = {}
        self._last: tuple[int, float] | None = None
        self.version = 0

    def record(self, st: ClusterStatus) -> None:
        """Add the metrics of ``st.progress`` if it is a new record (a feed callback)."""
        p = st.progress
        if p is None or not p.metrics:
            return
        key = (p.step, p.time)
        with self._lock:
            if key == self._last:
                return
            self._last = key
            for name, value in p.metrics.items():
                try:
                    value = float(value)
                except (TypeError, ValueError):
                    continue
                if not math.isfinite(value):
                    continue
                pts = self._points.setdefault(str(name), [])
                if pts and p.step <= pts[-1][0]:
                    # Training started over (a restarted task): show the current run.
                    pts[:] = [q for q in pts if q[0] < p.step]
                pts.append((int(p.step), value))
                if len(pts) > MAX_POINTS:
                    kept = pts[::2]
                    if kept[-1] != pts[-1]:
                        kept.append(pts[-1])
                    pts[:] = kept
            self.version += 1

    def points(self) -> dict[str, list[tuple[int, float]]]:
        """A copy of every metric's points, by name."""
        with self._lock:
            return {k: list(v) for k, v in sorted(self._points.items())}


_histories: weakref.WeakKeyDictionary[object, MetricHistory] = weakref.WeakKeyDictionary()
_histories_lock = threading.Lock()


def history_of(feed) -> MetricHistory:
    """The metric history of a :class:`~tfk8s_magics.watch.ClusterFeed` (recorded from now on).

    The recorder stays subscribed for the feed's life (it is a plain
    callback: no thread), so every later view gets the curve from the start
    of the first one.
    """
    with _histories_lock:
        h = _histories.get(feed)
        if h is None:
            h = MetricHistory()
            _histories[feed] = h
            feed.subscribe(on_status=h.record, replay=True)
        return h


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def sparkline_svg(
    name: str,
    points: list[tuple[int, float]],
    width: int = 260,
    height: int = 90,
    colour: str = "#268bd2",
) -> str:
    """One metric's curve as an SVG element; ``name`` and every label are escaped."""
    e = html.escape
    pad_l, pad_r, pad_t, pad_b = 4, 4, 16, 14
    head = (
        f'<svg class="tfk8s-curve" data-metric="{e(name, quote=True)}" '
        'xmlns="http://www.w3.org/2000/svg" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'style="background:var(--jp-layout-color1,#fff);'
        "border:1px solid var(--jp-border-color2,#ddd);"
        'margin:2px 6px 2px 0;font:10px sans-serif">'
    )
    if not points:
        return head + f'<text x="{pad_l}" y="12" fill="#888">{e(name)}: no values yet</text></svg>'
    last_step, last_value = points[-1]
    title = f"{name} {_fmt(last_value)} (step {last_step})"
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    w = width - pad_l - pad_r
    h = height - pad_t - pad_b

    def sx(x: float) -> float:
        return pad_l + (x - x0) / (x1 - x0) * w

    def sy(y: float) -> float:
        return pad_t + (1 - (y - y0) / (y1 - y0)) * h

    coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
    return (
        head
        + f'<text x="{pad_l}" y="11" fill="currentColor">{e(title)}</text>'
        + f'<text x="{width - pad_r}" y="11" text-anchor="end" fill="#888">'
        f"max {e(_fmt(max(ys)))}</text>"
        + f'<text x="{width - pad_r}" y="{height - 3}" text-anchor="end" fill="#888">'
        f"min {e(_fmt(min(ys)))} · steps {e(str(min(xs)))}–{e(str(max(xs)))}</text>"
        + f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{coords}"/>'
        + (f'<circle cx="{sx(last_step):.1f}" cy="{sy(last_value):.1f}" r="2" fill="{colour}"/>')
        + "</svg>"
    )


_COLOURS = ("#268bd2", "#dc322f", "#859900", "#6c71c4")


def curves_html(points: dict[str, list[tuple[int, float]]], ended: bool = False) -> str:
    """Every metric's sparkline side by side (at most :data:`MAX_METRICS`); ``ended``: the
    cluster has ended (no "yet" about what will not come)."""
    if not points:
        # Where to report them is said on the progress line (the script, or in-graph the kernel).
        text = "no metrics were reported" if ended else "no metrics reported yet"
        return f'<div class="tfk8s-curves tfk8s-muted" style="color:#888">{text}</div>'
    names = list(points)[:MAX_METRICS]
    return (
        '<div class="tfk8s-curves" style="display:flex;flex-wrap:wrap">'
        + "".join(
            sparkline_svg(n, points[n], colour=_COLOURS[i % len(_COLOURS)])
            for i, n in enumerate(names)
        )
        + "</div>"
    )
