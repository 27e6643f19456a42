"""Every error a user of tfk8s_magics can see.

Each exception carries one actionable sentence: what was wrong, the value
given, and what to do instead.  IPython shows them without a traceback
(``_render_traceback_``), because the traceback of our own code would only
hide the sentence the user needs.
"""

from __future__ import annotations


class TFClusterError(Exception):
    """Base class of all tfk8s_magics errors shown to users."""

    def _render_traceback_(self) -> list[str]:
        # IPython calls this instead of printing a traceback.
        return [f"{type(self).__name__}: {self}"]


class SpecError(TFClusterError, ValueError):
    """A cluster spec (name, mode, replicas, script, ...) is invalid."""


class StorageError(SpecError):
    """An object-storage URL cannot be used: a missing package, object or permission (one sentence)."""


class ClusterExists(TFClusterError):
    """A cluster with this name already exists."""


class ClusterNotFound(TFClusterError, LookupError):
    """No cluster with this name exists."""


class TaskNotFound(TFClusterError, LookupError):
    """The cluster has no task with this name."""


class NoPreviousRun(TFClusterError, LookupError):
    """The cluster keeps no previous run (``logs --previous``)."""


class BackendError(TFClusterError):
    """The backend could not do what was asked (its reason is in the message)."""


class LaunchFailed(TFClusterError):
    """A launch failed part-way; what it created has been rolled back.

    ``details`` holds the failing task's last log lines and, on Kubernetes,
    the events that explain it.
    """

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(message)
        self.details = details

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base}\n{self.details}" if self.details else base


class ClusterTimeout(TFClusterError, TimeoutError):
    """A wait ended before the cluster reached the state waited for."""
