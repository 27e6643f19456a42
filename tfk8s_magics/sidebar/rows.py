"""What the sidebar shows of a cluster: a :class:`~tfk8s_magics.backends.ClusterStatus` as one JSON row.

Pure functions, tested against literal dicts (``tests/test_sidebar_server.py``).  The browser
only formats what is here; every figure (tasks ready, percent, ETA, the first failed task, the
stall sentence) is decided once, on the server, from the public status object.
"""

from __future__ import annotations

from typing import Any

from ..backends import ClusterStatus, Event, Phase

#: Task phases that count as ready in "tasks ready/total" (a finished worker was ready).
_READY = (Phase.RUNNING, Phase.SUCCEEDED)


def cluster_row(st: ClusterStatus, now: float) -> dict[str, Any]:
    """One cluster as the sidebar's row: phase (``stalled`` shown as such), tasks, progress, reasons."""
    failed = [t.name for t in st.tasks if t.phase == Phase.FAILED]
    p = st.progress
    ended = st.terminal
    progress = None
    if p is not None:
        progress = {
            "step": p.step,
            "total": p.total,
            "percent": p.percent,
            "eta": None if ended else p.eta,
            "rate": None if ended else p.rate,
            "metrics": dict(p.metrics),
            "time": p.time,
        }
    return {
        "name": st.name,
        "backend": st.backend,
        "mode": st.mode,
        "phase": st.shown_phase,
        "terminal": ended,
        "reason": st.reason,
        "stall": st.stall_text(now),
        "created": st.created,
        "finished": st.finished,
        "detached": st.detached,
        "owner": st.owner,
        "log_dir": str(st.log_dir),
        "ready": sum(t.phase in _READY for t in st.tasks),
        "total": len(st.tasks),
        "tasks": [
            {"name": t.name, "phase": t.phase, "reason": t.reason, "restarts": t.restarts,
             "exit_code": t.exit_code}
            for t in st.tasks
        ],
        "failed_task": failed[0] if failed else None,
        "progress": progress,
    }


def event_row(e: Event) -> dict[str, Any]:
    """One event as JSON."""
    return {"time": e.time, "task": e.task, "reason": e.reason, "message": e.message, "type": e.type}
