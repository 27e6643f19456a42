"""The local backend's task status: the shared :class:`TaskStatus` plus the task's process id."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..base import TaskStatus


@dataclass
class LocalTaskStatus(TaskStatus):
    """A task of a local cluster; ``pid`` is its process (None once it ended)."""

    pid: int | None = None
    #: The process's start time (``/proc/<pid>/stat``): (pid, start) names it, a bare pid may not.
    pid_start: int | None = None

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> LocalTaskStatus:
        """Rebuild from ``status.json`` (unknown keys are ignored: a newer writer never breaks a reader)."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in known})
