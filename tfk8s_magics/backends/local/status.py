"""The local backend's task status: the shared :class:`TaskStatus` plus the task's process id."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...records import number
from ..base import Phase, TaskStatus

_PHASES = frozenset({Phase.PENDING, Phase.STARTING, Phase.RUNNING, Phase.SUCCEEDED, Phase.FAILED,
                     Phase.STOPPED, Phase.UNKNOWN})


def _text(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


#: How each field of a task row is read: a value of another type is dropped (the default stands).
_FIELDS = {
    "name": _text, "phase": _text, "reason": _text, "signal": _text, "host": _text,
    "exit_code": _int, "restarts": _int, "pid": _int, "pid_start": _int,
    "started": number, "finished": number,
}


@dataclass
class LocalTaskStatus(TaskStatus):
    """A task of a local cluster; ``pid`` is its process (None once it ended)."""

    pid: int | None = None
    #: The process's start time (``/proc/<pid>/stat``): (pid, start) names it, a bare pid may not.
    pid_start: int | None = None

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> LocalTaskStatus:
        """Rebuild from ``status.json`` leniently: unknown keys are ignored (a newer writer never
        breaks a reader) and a value of the wrong type is dropped.  Raises ValueError for a row
        that is not an object with a task name."""
        if not isinstance(record, Mapping) or not isinstance(record.get("name"), str):
            raise ValueError("a task row of status.json is not an object with a task name")
        values = {k: read(record[k]) for k, read in _FIELDS.items() if k in record}
        st = cls(**{k: v for k, v in values.items() if v is not None})
        if st.phase not in _PHASES:
            st.phase = Phase.UNKNOWN
        st.restarts = max(0, st.restarts)
        return st
