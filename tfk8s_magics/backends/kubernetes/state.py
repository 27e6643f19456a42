"""Pure cluster logic: pods → task statuses, and what the watcher must do next.

Pods are plain dicts (the API's JSON), so every rule here is tested with
literal pods and no API.

Tasks run as bare Pods with ``restartPolicy: Never``; which failed pod is
replaced, what decides success, and what happens after success or failure
is the cluster's :class:`~tfk8s_magics.lifecycle.LifecyclePolicy`, the same
one the local supervisor executes.  :func:`pod_end` describes a failed pod
to the policy (exit code, signal, runtime reason, pod conditions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ... import lifecycle
from ...lifecycle import LifecyclePolicy, TaskEnd
from ...spec import ClusterSpec, Task
from ..base import ClusterStatus, LogLocation, Phase, Progress, TaskStatus
from .manifests import (
    ATTEMPT_ANNOTATION,
    DETACHED_ANNOTATION,
    INDEX_LABEL,
    OWNER_ANNOTATION,
    ROLE_LABEL,
    log_claim_name,
    log_dir,
)

Pod = dict[str, Any]


def parse_time(value: str | None) -> float | None:
    """An RFC 3339 API timestamp as seconds since the epoch."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def event_time(e: dict[str, Any]) -> float:
    """When an API Event happened (its newest timestamp)."""
    for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
        t = parse_time(e.get(key))
        if t:
            return t
    return parse_time((e.get("metadata") or {}).get("creationTimestamp")) or 0.0


def pod_task(pod: Pod) -> Task | None:
    """The task a pod runs, from its role/index labels."""
    labels = pod.get("metadata", {}).get("labels") or {}
    role, index = labels.get(ROLE_LABEL), labels.get(INDEX_LABEL)
    if not role or not str(index).isdigit():
        return None
    return Task(role, int(index))


def pod_attempt(pod: Pod) -> int:
    """Which try of its task a pod is (0 first)."""
    value = (pod.get("metadata", {}).get("annotations") or {}).get(ATTEMPT_ANNOTATION, "0")
    return int(value) if str(value).isdigit() else 0


def latest_pods(pods: list[Pod]) -> dict[str, Pod]:
    """Task name → its newest pod (highest attempt)."""
    out: dict[str, Pod] = {}
    for pod in pods:
        task = pod_task(pod)
        if task is None:
            continue
        current = out.get(task.name)
        if current is None or pod_attempt(pod) >= pod_attempt(current):
            out[task.name] = pod
    return out


def _container(pod: Pod) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return statuses[0] if statuses else {}


def _condition(pod: Pod, kind: str) -> dict[str, Any] | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return cond
    return None


def _sentence(reason: str, message: str | None) -> str:
    return f"{reason}: {message}" if message else reason


def task_status(name: str, pod: Pod | None) -> TaskStatus:
    """The status of task ``name`` as its newest pod shows it (``None``: no pod)."""
    if pod is None:
        return TaskStatus(name=name, phase=Phase.PENDING, reason="no pod")
    status = pod.get("status") or {}
    container = _container(pod)
    state = container.get("state") or {}
    running, terminated = state.get("running"), state.get("terminated")
    waiting = state.get("waiting")
    out = TaskStatus(
        name=name,
        host=status.get("podIP") or (pod.get("spec") or {}).get("nodeName") or "",
        restarts=pod_attempt(pod),
        started=parse_time((running or terminated or {}).get("startedAt")),
        finished=parse_time((terminated or {}).get("finishedAt")),
    )
    phase = status.get("phase") or "Pending"
    if phase == "Pending":
        out.phase, out.reason = Phase.PENDING, _pending_reason(pod, waiting)
    elif phase == "Running":
        ready = container.get("ready") or (_condition(pod, "Ready") or {}).get("status") == "True"
        out.phase = Phase.RUNNING if ready else Phase.STARTING
    elif phase == "Succeeded":
        out.phase, out.exit_code = Phase.SUCCEEDED, 0
    else:  # Failed or Unknown
        _explain_failure(out, pod)
    return out


def _pending_reason(pod: Pod, waiting: dict[str, Any] | None) -> str:
    """Why a pending pod waits: the scheduler's word, else the container's."""
    scheduled = _condition(pod, "PodScheduled")
    if scheduled and scheduled.get("status") == "False":
        return _sentence(scheduled.get("reason") or "Unschedulable", scheduled.get("message"))
    if waiting:
        return _sentence(waiting.get("reason") or "Waiting", waiting.get("message"))
    return "waiting to be scheduled"


def _explain_failure(out: TaskStatus, pod: Pod) -> None:
    """Fill a failed task's exit code, signal and reason, in the words the policy uses."""
    status = pod.get("status") or {}
    end = pod_end(pod)
    out.phase, out.exit_code = Phase.FAILED, end.exit_code
    if end.exit_code is not None and end.exit_code > lifecycle.SIGNAL_EXIT_BASE:
        out.signal = end.killed_by
    if status.get("reason"):
        out.reason = _sentence(status["reason"], status.get("message"))
    elif end.reason and end.reason != "Error":  # "Error" says nothing the exit code does not
        out.reason = end.reason
    elif out.signal:
        out.reason = f"killed by {out.signal}"
    else:
        out.reason = lifecycle.explain_exit(end.exit_code)


def pod_end(pod: Pod) -> TaskEnd:
    """How a failed pod ended, as the lifecycle policy reads it."""
    status = pod.get("status") or {}
    terminated = ((_container(pod).get("state") or {}).get("terminated")) or {}
    code = terminated.get("exitCode")
    conditions = frozenset(
        c.get("type", "") for c in status.get("conditions") or [] if c.get("status") == "True"
    )
    return TaskEnd(
        exit_code=code if isinstance(code, int) else None,
        reason=status.get("reason") or terminated.get("reason") or "",
        conditions=conditions,
    )


def is_retryable(pod: Pod, policy: LifecyclePolicy) -> bool:
    """Whether ``policy`` retries a failed pod's end (the restart budget aside)."""
    return policy.classify(pod_end(pod)).action == lifecycle.RESTART


# -- what the watcher does next ------------------------------------------------


@dataclass(frozen=True)
class Create:
    """Create the pod for ``task``'s ``attempt``."""

    task: Task
    attempt: int
    reason: str


@dataclass(frozen=True)
class DeletePods:
    """Delete these pods (recycled parameter servers, leftovers of a failed cluster)."""

    names: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class MarkFinished:
    """Record on the root object when the cluster ended (for the TTL)."""

    phase: str


@dataclass(frozen=True)
class DeleteCluster:
    """The finished cluster's TTL has passed: delete it."""

    reason: str


@dataclass
class View:
    """What the watcher knows about one cluster at one instant."""

    spec: ClusterSpec
    pods: dict[str, Pod]  # task name → newest pod
    stopped: bool = False
    finished_at: float | None = None  # from the root object
    done_since: float | None = None  # first time script tasks were seen all done
    #: task → attempt of its pod that someone else deleted (no newer pod seen)
    gone: dict[str, int] = field(default_factory=dict)

    @property
    def policy(self) -> LifecyclePolicy:
        """The lifecycle policy of the cluster's spec."""
        return LifecyclePolicy.of(self.spec)


def task_statuses(view: View) -> list[TaskStatus]:
    """Every task's status, with absent pods explained by the cluster's state."""
    script_done = _script_tasks_done(view)
    recycled = set(view.policy.recycled_when_done(view.spec))
    failed = any(
        task_status(n, p).phase == Phase.FAILED and not _will_retry(view, p)
        for n, p in view.pods.items()
    )
    out = []
    for task in view.spec.tasks():
        pod = view.pods.get(task.name)
        status = task_status(task.name, pod)
        if pod is not None and pod.get("metadata", {}).get("deletionTimestamp"):
            if status.phase not in Phase.TERMINAL:
                status.phase, status.reason = Phase.STOPPED, "being deleted"
        if status.phase not in Phase.TERMINAL or pod is None:
            if view.stopped:
                status.phase, status.reason = Phase.STOPPED, "stopped by the user"
            elif pod is None and task in recycled and script_done:
                status.phase, status.reason = Phase.SUCCEEDED, lifecycle.RECYCLED
            elif pod is None and failed:
                status.phase, status.reason = Phase.STOPPED, "stopped after the cluster failed"
            elif status.phase == Phase.STOPPED and task in recycled and script_done:
                status.phase, status.reason = Phase.SUCCEEDED, lifecycle.RECYCLED
        out.append(status)
    return out


def _script_tasks_done(view: View) -> bool:
    script = view.policy.success_tasks(view.spec)
    return bool(script) and all(
        task_status(t.name, view.pods.get(t.name)).phase == Phase.SUCCEEDED for t in script
    )


def restarts_used(view: View) -> int:
    """Restarts the cluster has spent: every task's attempt number, pods gone included."""
    used = sum(pod_attempt(p) for p in view.pods.values())
    return used + sum(n for task, n in view.gone.items() if task not in view.pods)


def _will_retry(view: View, pod: Pod) -> bool:
    policy = view.policy
    return is_retryable(pod, policy) and policy.budget_left(restarts_used(view))


def cluster_phase(view: View, tasks: list[TaskStatus]) -> tuple[str, str]:
    """The cluster's phase and reason from its tasks'."""
    if view.stopped:
        return Phase.STOPPED, "stopped by the user"
    for t in tasks:
        pod = view.pods.get(t.name)
        if t.phase == Phase.FAILED and not (pod is not None and _will_retry(view, pod)):
            return Phase.FAILED, f"{t.name} failed: {t.reason}"
    if _script_tasks_done(view):
        return Phase.SUCCEEDED, "every worker finished"
    phases = {t.phase for t in tasks}
    for phase in (Phase.PENDING, Phase.STARTING):
        if phase in phases:
            waiting = [t for t in tasks if t.phase == phase]
            return phase, f"{waiting[0].name}: {waiting[0].reason}" if waiting[0].reason else ""
    return Phase.RUNNING, ""


def plan(view: View, now: float) -> list[object]:
    """The actions that bring the cluster to where its spec and lifecycle policy say it should be."""
    if view.stopped:
        return []
    phase, _ = cluster_phase(view, task_statuses(view))
    if phase not in Phase.TERMINAL:
        return _replacements(view)
    return _endgame(view, phase, now)


def _replacements(view: View) -> list[object]:
    """A new pod for every task whose last pod ended in a way the policy retries."""
    policy = view.policy
    actions: list[object] = []
    for task in view.spec.tasks():
        pod = view.pods.get(task.name)
        if pod is None:
            last = view.gone.get(task.name)
            decision = policy.decide(TaskEnd(vanished=True), restarts_used(view))
            if last is not None and decision.action == lifecycle.RESTART:
                actions.append(Create(task, last + 1, "its pod was deleted"))
            continue
        status = task_status(task.name, pod)
        if status.phase == Phase.FAILED and _will_retry(view, pod):
            actions.append(Create(task, pod_attempt(pod) + 1, status.reason or "killed"))
    return actions


def _endgame(view: View, phase: str, now: float) -> list[object]:
    """After the end: stop what runs on (after its grace), record the end, delete at the TTL."""
    actions: list[object] = []
    live = [
        n for n, p in view.pods.items()
        if task_status(n, p).phase not in Phase.TERMINAL
        and not p.get("metadata", {}).get("deletionTimestamp")
    ]
    since = view.done_since if view.done_since is not None else now
    if live and now >= since + _grace(view, phase):
        why = "the workers finished" if phase == Phase.SUCCEEDED else "the cluster failed"
        actions.append(DeletePods(tuple(_pod_names(view, live)), why))
    ttl = view.policy.ttl_after_finished
    if view.finished_at is None:
        actions.append(MarkFinished(phase))
    elif ttl is not None and now >= view.finished_at + ttl:
        actions.append(DeleteCluster(f"finished {ttl:g} s ago (TTL)"))
    return actions


def _grace(view: View, phase: str) -> float:
    """Seconds what still runs is kept after the cluster ended in ``phase``."""
    policy = view.policy
    return policy.grace_period if phase == Phase.SUCCEEDED else policy.failure_grace


def _pod_names(view: View, tasks: list[str]) -> list[str]:
    return sorted(view.pods[t]["metadata"]["name"] for t in tasks)


def next_wakeup(view: View, now: float) -> float | None:
    """When the lifecycle must act next with no new pod event (grace or TTL), if ever."""
    times = []
    tasks = task_statuses(view)
    phase, _ = cluster_phase(view, tasks)
    if phase in Phase.TERMINAL and not view.stopped:
        since = view.done_since if view.done_since is not None else now
        times.append(since + _grace(view, phase))
        ttl = view.policy.ttl_after_finished
        if view.finished_at is not None and ttl is not None:
            times.append(view.finished_at + ttl)
    future = [t for t in times if t > now]
    return min(future) if future else None


def cluster_status(
    view: View, root: dict[str, Any], tasks: list[TaskStatus] | None = None,
    progress: Progress | None = None,
) -> ClusterStatus:
    """The status of the cluster whose root object is ``root``, as ``view`` shows it."""
    tasks = task_statuses(view) if tasks is None else tasks
    phase, reason = cluster_phase(view, tasks)
    meta = root["metadata"]
    annotations = meta.get("annotations") or {}
    return ClusterStatus(
        name=view.spec.name,
        backend="kubernetes",
        mode=view.spec.mode,
        phase=phase,
        reason=reason,
        created=parse_time(meta.get("creationTimestamp")) or 0.0,
        finished=view.finished_at,
        owner=view.spec.owner or annotations.get(OWNER_ANNOTATION, ""),
        detached=annotations.get(DETACHED_ANNOTATION) == "true",
        log_dir=LogLocation(log_dir(view.spec), log_claim_name(view.spec)),
        tasks=tasks,
        progress=progress,
    )
