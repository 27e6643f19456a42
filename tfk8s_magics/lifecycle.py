"""The lifecycle rules every backend follows: pure, so both backends decide alike.

* A between-graph cluster **succeeds** when its chief and workers have all
  exited 0 (evaluators may run on; they are not waited for).
* Then, after ``spec.ps_grace_period`` seconds, what still runs — parameter
  servers and evaluators — is **recycled**: stopped, and reported as
  succeeded with the reason :data:`RECYCLED`.
* A crash is retried while the cluster has restarts left: the **restart
  budget** (``spec.restart_budget``) counts restarts across the whole
  cluster, not per task.
* A script that cannot run (exit :data:`EXIT_SCRIPT_BROKEN`: syntax or
  import error) is never retried.
"""

from __future__ import annotations

from .runtime.task import EXIT_SCRIPT_BROKEN
from .spec import BETWEEN, ClusterSpec, Task

#: The reason a recycled parameter server or evaluator shows.
RECYCLED = "recycled after the workers finished"

__all__ = ["EXIT_SCRIPT_BROKEN", "RECYCLED", "budget_left", "recycled_when_done", "success_tasks"]


def success_tasks(spec: ClusterSpec) -> list[Task]:
    """The tasks whose exit 0 makes a between-graph cluster succeed (none in-graph)."""
    if spec.mode != BETWEEN:
        return []
    return [t for t in spec.tasks() if t.role in ("chief", "worker")]


def recycled_when_done(spec: ClusterSpec) -> list[Task]:
    """The tasks stopped a grace period after the cluster succeeded."""
    done = set(success_tasks(spec))
    return [t for t in spec.tasks() if t not in done]


def budget_left(spec: ClusterSpec, restarts_used: int) -> bool:
    """Whether the cluster may restart one more crashed task."""
    return restarts_used < spec.restart_budget
