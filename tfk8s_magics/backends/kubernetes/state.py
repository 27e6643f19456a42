"""Pure cluster logic: pods → task statuses, and what the watcher must do next.

Pods are plain dicts (the API's JSON), so every rule here is tested with
literal pods and no API.

Restart policy (tasks run as bare Pods with ``restartPolicy: Never``; the
backend's watcher replaces a failed pod while ``spec.restart_budget``
allows):

* **retried** — failures the task did not cause: OOM kill, any kill by
  signal (exit ≥ 128: SIGKILL, or a SIGTERM the user did not ask for),
  eviction, preemption, node loss or shutdown (a ``DisruptionTarget``
  condition), and a pod deleted by someone else;
* **not retried** — the script's own outcome: exit 3 (the script cannot
  run: syntax or import error; no restart can fix it), exit 1 (the script
  raised: the traceback is in the log, and rerunning the same code on the
  same data would raise again), and any other exit code the script chose.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ... import lifecycle
from ...spec import ClusterSpec, Task
from ..base import Phase, TaskStatus
from .manifests import ATTEMPT_ANNOTATION, INDEX_LABEL, ROLE_LABEL

Pod = dict[str, Any]

#: Pod ``status.reason`` values meaning the node, not the task, ended it.
RETRYABLE_POD_REASONS = frozenset(
    {"Evicted", "Preempting", "NodeLost", "Shutdown", "NodeShutdown", "Terminated",
     "UnexpectedAdmissionError", "NodeAffinity", "OutOfcpu", "OutOfmemory"}
)
EXIT_SCRIPT_RAISED = 1
EXIT_SCRIPT_BROKEN = 3


def parse_time(value: str | None) -> float | None:
    """An RFC 3339 API timestamp as seconds since the epoch."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


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
        out.phase = Phase.PENDING
        scheduled = _condition(pod, "PodScheduled")
        if scheduled and scheduled.get("status") == "False":
            out.reason = _sentence(scheduled.get("reason") or "Unschedulable",
                                   scheduled.get("message"))
        elif waiting:
            out.reason = _sentence(waiting.get("reason") or "Waiting", waiting.get("message"))
        else:
            out.reason = "waiting to be scheduled"
    elif phase == "Running":
        ready = container.get("ready") or (_condition(pod, "Ready") or {}).get("status") == "True"
        out.phase = Phase.RUNNING if ready else Phase.STARTING
    elif phase == "Succeeded":
        out.phase, out.exit_code = Phase.SUCCEEDED, 0
    else:  # Failed or Unknown
        out.phase = Phase.FAILED
        if terminated:
            out.exit_code = terminated.get("exitCode")
            out.reason = terminated.get("reason") or ""
        if status.get("reason"):
            out.reason = _sentence(status["reason"], status.get("message"))
        if out.exit_code is not None and out.exit_code > 128:
            try:
                out.signal = signal.Signals(out.exit_code - 128).name
            except ValueError:
                pass
        if not out.reason:
            out.reason = failure_reason(out.exit_code)
    return out


def failure_reason(exit_code: int | None) -> str:
    """A short phrase for an exit code."""
    if exit_code == EXIT_SCRIPT_BROKEN:
        return "the script cannot run (syntax or import error)"
    if exit_code == EXIT_SCRIPT_RAISED:
        return "the script raised an exception"
    return f"exit code {exit_code}"


def is_retryable(pod: Pod) -> bool:
    """Whether a failed pod failed for a reason a new pod may not hit (see module doc)."""
    status = pod.get("status") or {}
    if status.get("reason") in RETRYABLE_POD_REASONS:
        return True
    disruption = _condition(pod, "DisruptionTarget")
    if disruption and disruption.get("status") == "True":
        return True
    terminated = ((_container(pod).get("state") or {}).get("terminated")) or {}
    if terminated.get("reason") == "OOMKilled":
        return True
    code = terminated.get("exitCode")
    return isinstance(code, int) and code >= 128


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


def task_statuses(view: View) -> list[TaskStatus]:
    """Every task's status, with absent pods explained by the cluster's state."""
    script_done = _script_tasks_done(view)
    recycled = set(lifecycle.recycled_when_done(view.spec))
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
    script = lifecycle.success_tasks(view.spec)
    return bool(script) and all(
        task_status(t.name, view.pods.get(t.name)).phase == Phase.SUCCEEDED for t in script
    )


def restarts_used(view: View) -> int:
    """Restarts the cluster has spent: every task's attempt number, pods gone included."""
    used = sum(pod_attempt(p) for p in view.pods.values())
    return used + sum(n for task, n in view.gone.items() if task not in view.pods)


def _will_retry(view: View, pod: Pod) -> bool:
    return is_retryable(pod) and lifecycle.budget_left(view.spec, restarts_used(view))


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
    """The actions that bring the cluster to where its spec and lifecycle say it should be."""
    if view.stopped:
        return []
    spec = view.spec
    actions: list[object] = []
    tasks = task_statuses(view)
    phase, _ = cluster_phase(view, tasks)
    for task in spec.tasks():
        pod = view.pods.get(task.name)
        if pod is None:
            last = view.gone.get(task.name)
            budget_left = last is not None and lifecycle.budget_left(spec, restarts_used(view))
            if budget_left and phase not in Phase.TERMINAL:
                actions.append(Create(task, last + 1, "its pod was deleted"))
            continue
        attempt = pod_attempt(pod)
        status = task_status(task.name, pod)
        if status.phase == Phase.FAILED and _will_retry(view, pod) and phase not in (
            Phase.FAILED,
            Phase.STOPPED,
        ):
            actions.append(Create(task, attempt + 1, status.reason or "killed"))
    live = [
        n for n, p in view.pods.items()
        if task_status(n, p).phase not in Phase.TERMINAL
        and not p.get("metadata", {}).get("deletionTimestamp")
    ]
    grace = spec.ps_grace_period
    if phase in Phase.TERMINAL:
        since = view.done_since if view.done_since is not None else now
        if live and now >= since + grace:
            why = ("the workers finished" if phase == Phase.SUCCEEDED
                   else "the cluster failed")
            actions.append(DeletePods(tuple(_pod_names(view, live)), why))
        if view.finished_at is None:
            actions.append(MarkFinished(phase))
        elif spec.ttl_after_finished is not None and now >= view.finished_at + float(
            spec.ttl_after_finished
        ):
            actions.append(DeleteCluster(f"finished {spec.ttl_after_finished:g} s ago (TTL)"))
    return actions


def _pod_names(view: View, tasks: list[str]) -> list[str]:
    return sorted(view.pods[t]["metadata"]["name"] for t in tasks)


def next_wakeup(view: View, now: float) -> float | None:
    """When the lifecycle must act next with no new pod event (grace or TTL), if ever."""
    times = []
    tasks = task_statuses(view)
    phase, _ = cluster_phase(view, tasks)
    if phase in Phase.TERMINAL and not view.stopped:
        since = view.done_since if view.done_since is not None else now
        times.append(since + view.spec.ps_grace_period)
        if view.finished_at is not None and view.spec.ttl_after_finished is not None:
            times.append(view.finished_at + float(view.spec.ttl_after_finished))
    future = [t for t in times if t > now]
    return min(future) if future else None
