"""The lifecycle policy: one object that says how every cluster lives and ends.

Both backends obey the same :class:`LifecyclePolicy` (built from the spec
with :meth:`LifecyclePolicy.of`): the local supervisor
(:mod:`.backends.local.supervisor`) executes it on processes, asking
:meth:`LifecyclePolicy.decide` what follows each :class:`TaskEnd` (exit
code, signal, the runtime's reason, pod conditions); the Kubernetes backend
translates it into the fields of the cluster's JobSet
(:mod:`.backends.kubernetes.jobset`), which JobSet enforces in the cluster.
The rules:

* **Success** is decided by the *success roles*: a between-graph cluster
  succeeds when its chief and workers have all exited 0.  Evaluators and
  parameter servers are not waited for; an in-graph cluster has no success
  role and runs until it is stopped.
* **Recycling:** what still runs after success (parameter servers,
  evaluators) gets ``grace_period`` seconds, then it is stopped and shown
  as succeeded with the reason :data:`RECYCLED`.
* **Retried** — failures the task did not cause: killed by a signal
  (locally a negative return code; in a container an exit code of 128 +
  the signal, so any exit ≥ 128 counts), OOM kills, eviction, preemption,
  node loss or shutdown (a runtime reason in :data:`RETRYABLE_REASONS` or
  a ``DisruptionTarget`` pod condition), and a pod or process removed by
  someone else.  Restarts come out of one **restart budget** for the whole
  cluster (not per task); when it is used up, the next such failure fails
  the cluster.
* **One incident, one restart:** a lost collective peer or parameter server
  makes the others raise TensorFlow's Unavailable/Aborted/Cancelled; the
  task runtime maps that to :data:`EXIT_PEER_LOST` (75), which is retried.
  The first retryable end opens an *incident* (``incident_window``
  seconds): ends inside it — and, however late, a lost peer (75) reported
  by a task already running when it opened — are restarted without
  spending the budget again,
  and for a between-graph cluster the other success-role tasks (the
  synchronous group) are restarted with the first, as JobSet restarts all
  its Jobs — also when the first is a parameter server, whose variables the
  whole group loses (measured: TF1 workers noticed a killed parameter server
  0.2 s and 7 s after it died; the first, already restarted, then lost the
  second and cost another restart).  (Local supervisor.  On Kubernetes
  JobSet does it: the first failed Job restarts every Job of the JobSet,
  one ``failurePolicy`` restart, and exit 75 is left out of the
  ``podFailurePolicy`` codes that fail at once.)
* **Not retried** — the user's outcome: any other exit code from 1 to 127
  the script (or server) chose: :data:`EXIT_SCRIPT_RAISED` (the script raised:
  rerunning the same code on the same data raises again, and the traceback
  is in the log) and :data:`EXIT_SCRIPT_BROKEN` (syntax or import error: no
  restart can fix it) included.  Exit 3 is called "cannot run" only when the
  runtime's termination message says so (reason :data:`SCRIPT_BROKEN`): a
  script's own ``sys.exit(3)`` is reported as "exit code 3".
* **After a failure** the other tasks are stopped at once
  (``failure_grace`` = 0): a between-graph cluster with a dead worker hangs
  or fails at its next collective, and a parameter server of a failed
  cluster only holds resources.
* **TTL:** ``ttl_after_finished`` seconds after it ended, a cluster is
  deleted (None: kept until deleted by hand).  Only the Kubernetes backend
  enforces it (JobSet's ``ttlSecondsAfterFinished``, in the cluster); the
  local backend refuses a TTL at launch rather than ignore it.

The rules are what JobSet does with the same intent — a ``podFailurePolicy``
rule ``FailJob`` on exit codes 1–127, ``Ignore`` on the ``DisruptionTarget``
condition, ``backoffLimit``/``maxRestarts`` as the budget, and a failed JobSet
ends every child Job at once — so both backends behave alike and the
fields translate one-to-one.
"""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass

from .runtime.exitcodes import BROKEN_MARK, EXIT_PEER_LOST, EXIT_SCRIPT_BROKEN
from .spec import BETWEEN, ClusterSpec, Task

#: The script raised an exception (Python's own exit code for that).
EXIT_SCRIPT_RAISED = 1
#: Exit codes at or above this mean "killed by signal (code - 128)" in a container.
SIGNAL_EXIT_BASE = 128

#: The reason a recycled parameter server or evaluator shows.
RECYCLED = "recycled after the workers finished"

#: Runtime reasons (pod ``status.reason`` or the container's terminated reason)
#: meaning the node or the cluster, not the task, ended it.
RETRYABLE_REASONS = frozenset(
    {"OOMKilled", "Evicted", "Preempting", "NodeLost", "Shutdown", "NodeShutdown", "Terminated",
     "UnexpectedAdmissionError", "NodeAffinity", "OutOfcpu", "OutOfmemory"}
)
#: Pod conditions that mark a disruption (eviction, preemption, node drain).
RETRYABLE_CONDITIONS = frozenset({"DisruptionTarget"})

#: The reason a task's end carries when the runtime said its script cannot run (syntax error,
#: import error at the top, a strategy that does not fit): its termination message, not the exit
#: code alone — a script's own ``sys.exit(3)`` is the user's exit code 3.
SCRIPT_BROKEN = BROKEN_MARK

#: What :meth:`LifecyclePolicy.decide` answers.
SUCCEED = "succeed"
RESTART = "restart"
FAIL = "fail"

__all__ = [
    "EXIT_PEER_LOST", "EXIT_SCRIPT_BROKEN", "EXIT_SCRIPT_RAISED", "FAIL", "RECYCLED", "RESTART",
    "SCRIPT_BROKEN", "SUCCEED",
    "Decision", "LifecyclePolicy", "TaskEnd",
]


@dataclass(frozen=True)
class TaskEnd:
    """How one try of a task ended, as a backend observed it.

    ``exit_code`` is None when the process was killed by a signal and the
    runtime says which (``signal``, e.g. ``"SIGKILL"``); ``reason`` is the
    runtime's word for it (``OOMKilled``, ``Evicted``...); ``conditions``
    the pod conditions true at the end; ``vanished`` means the pod or
    process was removed by someone else.
    """

    exit_code: int | None = None
    signal: str | None = None
    reason: str = ""
    conditions: frozenset[str] = frozenset()
    vanished: bool = False

    @property
    def killed_by(self) -> str | None:
        """The signal that ended it: given, or read from a container's exit code (128 + N)."""
        if self.signal:
            return self.signal
        if self.exit_code is not None and self.exit_code > SIGNAL_EXIT_BASE:
            try:
                return _signal.Signals(self.exit_code - SIGNAL_EXIT_BASE).name
            except ValueError:
                return f"signal {self.exit_code - SIGNAL_EXIT_BASE}"
        return None


@dataclass(frozen=True)
class Decision:
    """What follows one task's end: :data:`SUCCEED`, :data:`RESTART` or :data:`FAIL`, and why."""

    action: str
    reason: str


def explain_exit(exit_code: int | None, reason: str = "") -> str:
    """One phrase for an exit code a task chose (the same words on every backend); ``reason``
    :data:`SCRIPT_BROKEN` (the runtime's termination message) makes exit 3 "cannot run"."""
    if reason == SCRIPT_BROKEN and exit_code == EXIT_SCRIPT_BROKEN:
        return f"the script cannot run: it failed on an import or did not compile (exit code {exit_code})"
    if exit_code == EXIT_SCRIPT_RAISED:
        return f"the script raised an exception (exit code {exit_code}); the traceback is in its log"
    return f"exit code {exit_code}"


@dataclass(frozen=True)
class LifecyclePolicy:
    """The rules one cluster lives by; see the module docstring.  Build it with :meth:`of`."""

    #: Roles whose exit 0 (all of them) makes the cluster succeed; empty: runs until stopped.
    success_roles: frozenset[str] = frozenset({"chief", "worker"})
    #: Restarts the whole cluster may spend on retryable failures.
    restart_budget: int = 2
    #: Whether a kill by signal (exit ≥ 128 in a container) is retried.
    retry_signals: bool = True
    #: Runtime reasons that are retried whatever the exit code.
    retry_reasons: frozenset[str] = RETRYABLE_REASONS
    #: Pod conditions that are retried whatever the exit code.
    retry_conditions: frozenset[str] = RETRYABLE_CONDITIONS
    #: Exit codes (inclusive range) that are the user's outcome: never retried ...
    user_exit_codes: tuple[int, int] = (1, SIGNAL_EXIT_BASE - 1)
    #: ... except these: the task runtime's "lost a peer" (a consequence of another end).
    retry_exit_codes: frozenset[int] = frozenset({EXIT_PEER_LOST})
    #: Seconds after a retryable end during which further retryable ends are the same
    #: incident: restarted, but not counted against the budget again.
    incident_window: float = 30.0
    #: Seconds the others run on after the cluster failed (0: stopped at once).
    failure_grace: float = 0.0
    #: Seconds what runs on after success (parameter servers, evaluators) is kept.
    grace_period: float = 30.0
    #: Seconds after the end before the cluster is deleted (None: never).
    ttl_after_finished: float | None = None

    @classmethod
    def of(cls, spec: ClusterSpec) -> LifecyclePolicy:
        """The policy of ``spec``'s cluster."""
        return cls(
            success_roles=frozenset({"chief", "worker"}) if spec.mode == BETWEEN else frozenset(),
            restart_budget=spec.restart_budget,
            grace_period=spec.ps_grace_period,
            ttl_after_finished=spec.ttl_after_finished,
        )

    # -- which tasks --------------------------------------------------------------
    def success_tasks(self, spec: ClusterSpec) -> list[Task]:
        """The tasks whose exit 0 makes the cluster succeed (none: it runs until stopped)."""
        return [t for t in spec.tasks() if t.role in self.success_roles]

    def restarts_with(self, spec: ClusterSpec, task: Task) -> list[Task]:
        """The tasks restarted together with ``task`` when its end is retried: in a between-graph
        cluster, the synchronous group (chief and workers) when ``task`` is one of them or a
        parameter server; nothing else (an evaluator only reads checkpoints)."""
        if task.role not in self.success_roles and task.role != "ps":
            return []
        return [t for t in self.success_tasks(spec) if t.name != task.name]

    def recycled_when_done(self, spec: ClusterSpec) -> list[Task]:
        """The tasks stopped a grace period after the cluster succeeded."""
        return [t for t in spec.tasks() if t.role not in self.success_roles]

    # -- what follows a task's end ---------------------------------------------------
    def budget_left(self, restarts_used: int) -> bool:
        """Whether the cluster may restart one more task."""
        return restarts_used < self.restart_budget

    def classify(self, end: TaskEnd) -> Decision:
        """Whether ``end`` is a success, worth a retry, or the user's failure (budget aside)."""
        if end.vanished:
            return Decision(RESTART, "removed by someone else")
        if end.reason in self.retry_reasons:
            return Decision(RESTART, end.reason)
        if self.retry_conditions & end.conditions:
            return Decision(RESTART, ", ".join(sorted(self.retry_conditions & end.conditions)))
        killed = end.killed_by
        if killed is not None:
            return Decision(RESTART if self.retry_signals else FAIL, f"killed by {killed}")
        if end.exit_code == 0:
            return Decision(SUCCEED, "exit code 0")
        if end.exit_code in self.retry_exit_codes:
            return Decision(RESTART, f"lost a peer (exit code {end.exit_code})")
        low, high = self.user_exit_codes
        if end.exit_code is not None and not low <= end.exit_code <= high:
            return Decision(RESTART, f"exit code {end.exit_code}")
        return Decision(FAIL, explain_exit(end.exit_code, end.reason))

    def decide(self, end: TaskEnd, restarts_used: int) -> Decision:
        """What follows ``end``, with ``restarts_used`` restarts already spent by the cluster."""
        decision = self.classify(end)
        if decision.action == RESTART and not self.budget_left(restarts_used):
            return Decision(FAIL, f"{decision.reason} (restart budget {self.restart_budget} used up)")
        return decision
