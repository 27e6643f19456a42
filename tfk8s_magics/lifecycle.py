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

The half of the rules that needs memory — the incident, the group restart, the
restarts that wait for their group, the cause named instead of the task that
lost it, the free moves to new ports — is :class:`RestartRule`: a pure state
machine (events in, actions out, no I/O, the clock passed in) that the local
supervisor feeds with what it observes and whose actions it performs.

The rules are what JobSet does with the same intent — a ``podFailurePolicy``
rule ``FailJob`` on exit codes 1–127, ``Ignore`` on the ``DisruptionTarget``
condition, ``backoffLimit``/``maxRestarts`` as the budget, and a failed JobSet
ends every child Job at once — so both backends behave alike and the
fields translate one-to-one.
"""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass, field

from .runtime.exitcodes import BROKEN_MARK, EXIT_PEER_LOST, EXIT_SCRIPT_BROKEN, PORT_TAKEN_MARK
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
    "Blame", "EndTasks", "Fail", "MovePort", "Restart", "RestartRule", "SettleTask", "StartDeferred",
    "Succeed",
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


# -- the restart rule as a state machine -----------------------------------------------------------

#: How many times a cluster's tasks are moved to new ports (a port taken by another process
#: between allocation and bind), free of the restart budget; after that it is a failure like any.
PORT_MOVES = 3

#: How a peer that ended a moment before the task that lost it is described (a zombie: its end is
#: not handled yet).
ZOMBIE = "had ended (its end not handled yet)"

#: Signals that only come from outside the task (a user, the OOM killer): a task they ended is
#: the cause of its incident, never the bystander of a peer's end.
OUTSIDE_SIGNALS = frozenset({"SIGKILL", "SIGTERM"})

#: Why a task is being ended by its cluster (what :meth:`RestartRule.ending` is told).
END_STOP, END_RECYCLE, END_RESTART, END_PORTS = "stop", "recycle", "restart", "ports"


@dataclass(frozen=True)
class EndTasks:
    """End these running tasks (SIGTERM, then SIGKILL): ``why`` is :data:`END_RESTART` (their
    group restarts) or :data:`END_PORTS` (the cluster's addresses changed)."""

    tasks: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Restart:
    """Count a restart of ``task`` on its row and say ``why``; start it now, or — ``deferred`` —
    once the rest of its group has ended (a :class:`StartDeferred` follows)."""

    task: str
    why: str
    deferred: bool = False


@dataclass(frozen=True)
class StartDeferred:
    """The group has ended: start these tasks, which waited for it (stop them instead if the
    cluster is stopping by the time this is performed)."""

    tasks: tuple[str, ...]


@dataclass(frozen=True)
class Blame:
    """``task`` (stopped, a zombie or gone while it looked alive) is the cause of an incident."""

    task: str
    message: str


@dataclass(frozen=True)
class MovePort:
    """``task``'s port was taken before it could listen: give it a new one, rewrite the cluster's
    addresses, then tell :meth:`RestartRule.port_moved`."""

    task: str


@dataclass(frozen=True)
class SettleTask:
    """A task the cluster ended is settled: its row becomes ``phase`` (a task phase's string:
    ``"stopped"`` with the stop's reason, ``"succeeded"`` when recycled, ``"failed"`` when it
    was the blamed cause of a failed cluster, with ``reason``)."""

    task: str
    phase: str
    reason: str | None = None


@dataclass(frozen=True)
class Fail:
    """Fail the cluster with ``reason`` and stop the rest; ``task``'s row fails with
    ``task_reason`` first."""

    reason: str
    task: str
    task_reason: str


@dataclass(frozen=True)
class Succeed:
    """``task`` exited 0 (the cluster succeeds once every success task has)."""

    task: str
    reason: str


@dataclass
class _Incident:
    until: float  # the end of its window
    cause: str  # "task: why" of its first retryable end
    restarted: set[str] = field(default_factory=set)  # a second end of one of these is new


class RestartRule:
    """The restart rule of one cluster as a pure state machine.

    Events (methods): a task :meth:`started`, the cluster began :meth:`ending` a task, a task
    :meth:`ended` (with its :class:`TaskEnd` and, when a peer looked alive but was not, that peer
    as the ``culprit``), a port was :meth:`port_moved`, a :meth:`stop_requested` (or the cluster
    failed).  Each returns the actions the process performs, in order.  The state — restarts
    spent, the open incident, the blamed causes, the restarts waiting for their group, which
    tasks run and which are being ended — lives here; the group "has ended" when no task that
    was ended for a restart still runs, which the machine sees from the :meth:`ended` events.
    """

    def __init__(self, policy: LifecyclePolicy, spec: ClusterSpec) -> None:
        self.policy = policy
        self.spec = spec
        self.restarts_used = 0
        self.port_moves = 0
        self.stopping = False
        self.failed = False
        self.incident: _Incident | None = None
        #: Tasks named as the cause of an incident (task → what was wrong with it).
        self.blamed: dict[str, str] = {}
        #: Restarted tasks waiting for the rest of their group to end: a new process never meets
        #: an old peer (JobSet likewise deletes every Job before it recreates them).
        self.deferred: list[str] = []
        self.running: set[str] = set()
        self.started_at: dict[str, float] = {}
        #: Running tasks the cluster is ending, and why (END_*).
        self.ending_why: dict[str, str] = {}

    @property
    def incident_cause(self) -> str | None:
        """"task: why" of the incident's first end (None: there was none)."""
        return self.incident.cause if self.incident else None

    # -- events ----------------------------------------------------------------------------------
    def started(self, task: str, now: float) -> None:
        """``task``'s process started at ``now``."""
        self.running.add(task)
        self.started_at[task] = now
        self.ending_why.pop(task, None)

    def ending(self, task: str, why: str) -> None:
        """The cluster asked running ``task`` to end (the first reason counts)."""
        if task in self.running:
            self.ending_why.setdefault(task, why)

    def stop_requested(self, failed: bool = False) -> None:
        """The cluster is stopping (asked to, or ``failed``): nothing is restarted any more."""
        self.stopping = True
        self.failed = self.failed or failed

    def ended(self, task: str, end: TaskEnd, now: float, culprit: tuple[str, str] | None = None,
              note: str = "") -> list:
        """``task``'s process ended as ``end``.  ``culprit``: a peer whose process was stopped, a
        zombie or gone while it looked alive, and what was wrong with it; ``note``: what to add to
        a failure's reason (a full log dir)."""
        self.running.discard(task)
        why = self.ending_why.pop(task, "")
        if why:
            return self._ended_by_us(task, why, end)
        if end.reason == PORT_TAKEN_MARK and self.port_moves < PORT_MOVES and not self.stopping:
            self.port_moves += 1
            return [MovePort(task)]
        first = self.policy.classify(end)
        if first.action == RESTART and self._in_incident(task, end, now):
            # A consequence of the incident already paid for: restart, do not count again.
            return self._restart(task, f"{first.reason}; same incident as {self.incident.cause}")
        decision = self.policy.decide(end, self.restarts_used)
        # A peer at fault is the cause of a retryable end, not its bystander — unless the end came
        # from outside (a kill): then the peer that looks dead is the one that noticed first.
        culprit = culprit if first.action == RESTART and end.killed_by not in OUTSIDE_SIGNALS else None
        out: list = []
        if culprit is not None:
            self.blamed[culprit[0]] = culprit[1]
            out.append(Blame(culprit[0], f"{culprit[1]}; {task} lost it ({decision.reason})"))
        if decision.action == SUCCEED:
            return [*out, Succeed(task, decision.reason)]
        if decision.action == RESTART and not self.stopping:
            return out + self._new_incident(task, decision, now, culprit)
        if culprit is not None:
            return [*out, Fail(f"{culprit[0]} failed: {culprit[1]}; {task} lost it ({decision.reason})",
                               task, f"lost {culprit[0]} ({decision.reason})")]
        reason = _with_note(decision.reason, note)
        return [*out, Fail(f"{task} failed: {reason}", task, reason)]

    def _new_incident(self, task: str, decision: Decision, now: float,
                      culprit: tuple[str, str] | None) -> list:
        """A retryable end outside any incident: spend one restart, open the incident, end the
        group (and the cause), restart ``task`` once they have ended."""
        self.restarts_used += 1
        cause = f"{culprit[0]}: {culprit[1]}" if culprit else f"{task}: {decision.reason}"
        self.incident = _Incident(now + self.policy.incident_window, cause)
        group = [t.name for t in self.policy.restarts_with(self.spec, self.spec.task(task))
                 if t.name in self.running and t.name not in self.ending_why]
        if culprit is not None and culprit[0] not in group and culprit[0] not in self.ending_why:
            group.append(culprit[0])  # the cause restarts too, in the group or not
        out: list = []
        if group:
            for name in group:
                self.ending(name, END_RESTART)
            out.append(EndTasks(tuple(group), END_RESTART))
        lost = f"lost {culprit[0]} ({decision.reason})" if culprit else decision.reason
        budget = self.policy.restart_budget
        return out + self._restart(task, f"{lost}; restart {self.restarts_used} of {budget}")

    def port_moved(self, task: str, old: str) -> list:
        """``task`` has a new port (``old`` was taken): every other running task restarts with the
        new addresses, free of the budget, and so does ``task``."""
        others = tuple(n for n in sorted(self.running, key=self._order) if n != task)
        for name in others:
            self.ending(name, END_PORTS)
        out: list = [EndTasks(others, END_PORTS)] if others else []
        return out + self._restart(task, f"on a new port ({old} was taken)")

    # -- the rules -------------------------------------------------------------------------------
    def _order(self, name: str) -> int:
        names = [t.name for t in self.spec.tasks()]
        return names.index(name) if name in names else len(names)

    def _ended_by_us(self, task: str, why: str, end: TaskEnd) -> list:
        """Settle the end of a task the cluster ended (stop, recycle, a group restart, new ports)."""
        if task in self.blamed and self.failed:
            return [SettleTask(task, "failed", self.blamed.pop(task))]  # the cause, not a bystander
        if why == END_STOP or (why in (END_RESTART, END_PORTS) and self.stopping):
            return [SettleTask(task, "stopped")]
        if why == END_RECYCLE:
            return [SettleTask(task, "succeeded", RECYCLED)]
        if why == END_PORTS:  # the cluster's addresses changed
            return self._restart(task, "restarted with the cluster's new addresses (not counted)")
        if task in self.blamed:  # the cause of the incident
            cause = self.blamed.pop(task)
            if cause.endswith(ZOMBIE):  # it had ended on its own: say how, now that it is reaped
                cause = self.policy.classify(TaskEnd(exit_code=end.exit_code, signal=end.signal)).reason
            return self._restart(task, f"{cause}; restart {self.restarts_used} of "
                                 f"{self.policy.restart_budget} (the cause of this incident)")
        # its group restarts after another's end
        return self._restart(task, f"restarted with its group ({self.incident_cause})")

    def _in_incident(self, task: str, end: TaskEnd, now: float) -> bool:
        """Whether ``task``'s end belongs to the open incident (its first end since it opened):
        within the incident window, or — however late — a lost peer reported by a process that
        was already running when the incident began (measured: TF1 workers notice a dead
        parameter server ~30 s later), since the peer it lost is the one that ended then."""
        if self.incident is None or self.stopping or task in self.incident.restarted:
            return False
        if now < self.incident.until:
            return True
        began = self.incident.until - self.policy.incident_window
        started = self.started_at.get(task)
        return end.exit_code == EXIT_PEER_LOST and started is not None and started < began

    def _group_ending(self) -> bool:
        return any(why in (END_RESTART, END_PORTS) for name, why in self.ending_why.items()
                   if name in self.running)

    def _restart(self, task: str, why: str) -> list:
        """Restart ``task`` — once no peer of its group is still being ended for the same incident
        (measured under load: a restarted worker that reached a dying peer's server lost it a
        moment later and cost a second restart)."""
        if self.incident is not None:
            self.incident.restarted.add(task)
        if self._group_ending():
            self.deferred.append(task)
            return [Restart(task, why, deferred=True)]
        out: list = [Restart(task, why)]
        if self.deferred:
            waiting, self.deferred = tuple(self.deferred), []
            out.append(StartDeferred(waiting))
        return out


def _with_note(reason: str, note: str) -> str:
    """``reason`` with the disk's part in it: a full log dir is named, and a traceback is not
    promised in a log that could not be written."""
    if note and reason.endswith("; the traceback is in its log"):
        reason = reason.removesuffix("; the traceback is in its log") + (
            "; its traceback may be missing from its log")
    return reason + note
