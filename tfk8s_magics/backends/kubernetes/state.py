"""Pure cluster logic: the JobSet and its pods → task and cluster statuses.

Objects are plain dicts (the API's JSON), so every rule here is tested with
literal pods and JobSets and no API.  Nothing here decides what happens to a
cluster: JobSet does (restarts, success, the end of parameter servers, the
TTL), from the :class:`~tfk8s_magics.lifecycle.LifecyclePolicy` the JobSet
was built from (:mod:`.jobset`).  This module only reads what JobSet
reports — its ``Completed``/``Failed`` conditions and ``restarts`` — and the
pods' states, and explains them: pending reasons, exit codes, signals.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ... import lifecycle
from ...lifecycle import LifecyclePolicy, TaskEnd
from ...spec import ClusterSpec, Task
from ..base import ClusterStatus, LogLocation, Phase, Progress, TaskStatus
from .jobset import RESTART_ATTEMPT_LABEL, task_of_pod
from .manifests import DETACHED_ANNOTATION, OWNER_ANNOTATION, log_claim_name, log_dir
from .storage_pods import BACKUP, SYNC, step_of_pod, steps

Pod = dict[str, Any]
#: What an ended JobSet's condition says happened to tasks it ended itself.
ENDED_BY_JOBSET = "ended when the JobSet succeeded"
#: The exit code of a container stopped by SIGTERM (128 + 15): how a pod deleted by JobSet ends.
SIGTERM_EXIT = 143
#: How a task of a JobSet that Kueue holds (suspended, queued) reads; Kueue's reason follows.
WAITING_FOR_QUEUE = "waiting for admission by queue"
#: How a task of a stopped cluster reads while its pod has not ended yet.
STOPPING_REASON = "stopping: its pod is ending"


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
    """The task a JobSet pod runs, from its role label and completion index."""
    return task_of_pod(pod.get("metadata", {}).get("labels") or {})


def pod_attempt(pod: Pod) -> int:
    """Which JobSet restart a pod belongs to (0: the first run)."""
    value = (pod.get("metadata", {}).get("labels") or {}).get(RESTART_ATTEMPT_LABEL, "0")
    return int(value) if str(value).isdigit() else 0


def latest_pods(pods: list[Pod]) -> dict[str, Pod]:
    """Task name → its newest pod (highest restart attempt, then newest created)."""
    out: dict[str, Pod] = {}
    for pod in pods:
        task = pod_task(pod)
        if task is None:
            continue
        current = out.get(task.name)
        key = (pod_attempt(pod), pod.get("metadata", {}).get("creationTimestamp") or "")
        if current is None or key >= (pod_attempt(current),
                                      current.get("metadata", {}).get("creationTimestamp") or ""):
            out[task.name] = pod
    return out


def latest_steps(pods: list[Pod]) -> dict[str, Pod]:
    """Step name (``sync``/``backup``) → its newest pod."""
    out: dict[str, Pod] = {}
    for pod in pods:
        step = step_of_pod(pod.get("metadata", {}).get("labels") or {})
        if step is None:
            continue
        key = (pod_attempt(pod), pod.get("metadata", {}).get("creationTimestamp") or "")
        current = out.get(step)
        if current is None or key >= (pod_attempt(current),
                                      current.get("metadata", {}).get("creationTimestamp") or ""):
            out[step] = pod
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
        _running(out, pod, container)
    elif phase == "Succeeded":
        out.phase, out.exit_code = Phase.SUCCEEDED, 0
    else:  # Failed or Unknown
        _explain_failure(out, pod)
    return out


def _running(out: TaskStatus, pod: Pod, container: dict[str, Any]) -> None:
    """The phase of a task whose pod's phase is ``Running``."""
    state = container.get("state") or {}
    terminated = state.get("terminated")
    if terminated:
        # The container has ended; the kubelet has not written the pod's phase yet (a moment
        # in which the pod is not ready): an ending task, not one starting again.
        if terminated.get("exitCode") == 0:
            out.phase, out.exit_code = Phase.SUCCEEDED, 0
        else:
            _explain_failure(out, pod)
        return
    ready = container.get("ready") or (_condition(pod, "Ready") or {}).get("status") == "True"
    out.phase = Phase.RUNNING if ready or _was_ready(pod, state.get("running")) else Phase.STARTING


def _was_ready(pod: Pod, running: dict[str, Any] | None) -> bool:
    """Whether a running pod that is not ready now has been ready since its container started:
    its Ready condition turned false after the start (it was true in between). A task whose
    script has ended, or that stopped answering, is not starting again."""
    ready = _condition(pod, "Ready") or {}
    changed = parse_time(ready.get("lastTransitionTime"))
    started = parse_time((running or {}).get("startedAt"))
    return ready.get("status") == "False" and None not in (changed, started) and changed > started


def _memory_limit(pod: Pod) -> str:
    """The memory limit of the pod's first container (the task's), as written in the pod."""
    containers = (pod.get("spec") or {}).get("containers") or []
    name = _container(pod).get("name")
    for c in containers:
        if c.get("name") == name or name is None:
            return str(((c.get("resources") or {}).get("limits") or {}).get("memory") or "")
    return ""


def oom_reason(pod: Pod) -> str:
    """An out-of-memory kill, with the limit it went past and what to change."""
    limit = _memory_limit(pod)
    if not limit:
        return ("OOMKilled: the task ran out of memory; launch with more memory for its role "
                "(--memory, e.g. --memory 4Gi)")
    return (f"OOMKilled: the task used more than its memory limit of {limit}; launch with a "
            f"larger --memory for its role than {limit}")


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
    elif end.reason == lifecycle.SCRIPT_BROKEN:
        out.reason = lifecycle.explain_exit(end.exit_code, end.reason)
    elif end.reason == "OOMKilled":
        out.reason = oom_reason(pod)
    elif end.reason and end.reason != "Error":  # "Error" says nothing the exit code does not
        out.reason = end.reason
    elif out.signal and (pod.get("metadata") or {}).get("deletionTimestamp"):
        out.reason = f"killed by {out.signal}: its pod was deleted"
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
    reason = status.get("reason") or terminated.get("reason") or ""
    if str(terminated.get("message") or "").startswith(lifecycle.SCRIPT_BROKEN + ":"):
        reason = lifecycle.SCRIPT_BROKEN  # the runtime's word (terminationMessagePath), not exit 3 alone
    return TaskEnd(
        exit_code=code if isinstance(code, int) else None,
        reason=reason,
        conditions=conditions,
    )


def jobset_condition(jobset: dict[str, Any] | None) -> dict[str, Any] | None:
    """The JobSet's terminal condition (``Completed`` or ``Failed``, true), if it ended."""
    for cond in ((jobset or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Completed", "Failed") and cond.get("status") == "True":
            return cond
    return None


def jobset_restarts(jobset: dict[str, Any] | None) -> int:
    """How many times JobSet restarted the cluster (its ``status.restarts``)."""
    return int(((jobset or {}).get("status") or {}).get("restarts") or 0)


def _suspended(jobset: dict[str, Any] | None) -> str | None:
    """Why a JobSet waits to start (Kueue keeps it suspended until admitted), else None."""
    if not jobset or not (jobset.get("spec") or {}).get("suspend"):
        return None
    queue = (jobset.get("metadata", {}).get("labels") or {}).get("kueue.x-k8s.io/queue-name")
    if queue:  # JobSet's own Suspended condition says only "jobset is suspended"
        return f"{WAITING_FOR_QUEUE} {queue}"
    for cond in (jobset.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Suspended" and cond.get("message"):
            return f"suspended: {cond['message']}"
    return "suspended"


def is_kueue_workload(involved: dict[str, Any], cluster: str) -> bool:
    """Whether an Event's ``involvedObject`` is the Kueue Workload of JobSet ``cluster``.

    Kueue names a JobSet's Workload ``jobset-<name>-<5 hex digits>`` (a hash
    of the JobSet's name and uid) and records its admission verdict there.
    """
    name = involved.get("name", "")
    head, _, digest = name.rpartition("-")
    return involved.get("kind") == "Workload" and head == f"jobset-{cluster}" and \
        len(digest) == 5 and all(c in "0123456789abcdef" for c in digest)


def is_own_kueue_workload(involved: dict[str, Any], cluster: str, jobset_uid: str | None) -> bool:
    """Whether an Event is about the Workload Kueue made for *this* JobSet (uid ``jobset_uid``).

    Kueue's digest is the first 5 hex digits of SHA-1 over ``JobSet``, ``jobset.x-k8s.io``, the
    name and the uid, joined by newlines (``jobframework.GetWorkloadNameForOwnerWithGVK``). Kueue
    judges a workload within the second the JobSet was made, so its ``Pending`` Event often has the
    cluster's creation second and a uid (the Workload's) the cluster never sees: the digest, not
    the time, tells it from a deleted namesake's.
    """
    if not jobset_uid or not is_kueue_workload(involved, cluster):
        return False
    digest = hashlib.sha1(f"JobSet\njobset.x-k8s.io\n{cluster}\n{jobset_uid}".encode()).hexdigest()
    return involved.get("name", "").rpartition("-")[2] == digest[:5]


def admission_message(events: list[dict[str, Any]], cluster: str) -> str | None:
    """Why Kueue has not admitted the cluster yet: its newest ``Pending`` Event, if any.

    Kueue's scheduler writes the same message as the Workload's ``QuotaReserved``
    condition (reason ``Pending``; e.g. ``couldn't assign flavors to pod set
    worker: insufficient unused quota for cpu in flavor default, 2 more needed``)
    into a ``Pending`` Event on the Workload; reading the namespace's Events
    needs no access to Kueue's objects.
    """
    pending = [e for e in events if e.get("reason") == "Pending"
               and is_kueue_workload(e.get("involvedObject") or {}, cluster)]
    if not pending:
        return None
    return max(pending, key=event_time).get("message") or None


#: Seconds the Job controller may fail to create a cluster's pods before the cluster says so.
CREATE_GRACE = 30.0


def job_name(cluster: str, role: str) -> str:
    """The Job JobSet makes for ``role`` (one replicated Job per role, one replica)."""
    return f"{cluster}-{role}-0"


def failed_creates(events: list[dict[str, Any]], cluster: str, role: str,
                   since: float = 0.0) -> list[dict[str, Any]]:
    """The ``FailedCreate`` Warnings of ``role``'s Job newer than ``since`` (the JobSet's birth).

    Task pods are created by the Job controller, so a quota, LimitRange or
    PriorityClass refusal is an Event on the Job (``Error creating: pods ... is
    forbidden: ...``), retried with backoff for as long as the Job lives.
    """
    name = job_name(cluster, role)
    return [e for e in events
            if e.get("reason") == "FailedCreate" and e.get("type") == "Warning"
            and (e.get("involvedObject") or {}).get("kind") == "Job"
            and (e.get("involvedObject") or {}).get("name") == name
            and event_time(e) >= since]


def explain_no_pod(tasks: list[TaskStatus], events: list[dict[str, Any]], cluster: str,
                   since: float = 0.0) -> None:
    """Give each pending task without a pod its Job's newest ``FailedCreate`` as the reason."""
    for t in tasks:
        if t.phase != Phase.PENDING or t.reason != "no pod":
            continue
        refused = failed_creates(events, cluster, t.name.rpartition("-")[0], since)
        if refused:  # the Job controller's own sentence: quota, LimitRange, priority
            newest = max(refused, key=event_time)
            t.reason = f"FailedCreate: {newest.get('message', '')}".rstrip(": ")


def startup_probe_noise(e: dict[str, Any], pod: Pod | None) -> bool:
    """Whether an Event is a readiness probe failing while its task starts: the probe fails
    until TensorFlow listens (normal start-up, with an empty message). Only a failure after the
    pod had been ready says something is wrong."""
    if e.get("reason") != "Unhealthy" or not str(e.get("message", "")).startswith("Readiness probe"):
        return False
    ready = _condition(pod or {}, "Ready") or {}
    became = parse_time(ready.get("lastTransitionTime"))
    if ready.get("status") != "True" or became is None:
        return not _was_ready(pod or {}, ((_container(pod or {}).get("state") or {}).get("running")))
    return first_time(e) <= became


def of_another_incarnation(e: dict[str, Any], born: float, known_uids: set[str]) -> bool:
    """Whether an Event is about a deleted cluster of the same name: older than this cluster's
    root, or in the root's second about an object this cluster does not have."""
    when = event_time(e)
    uid = (e.get("involvedObject") or {}).get("uid")
    return when < born or (when <= born and bool(uid) and uid not in known_uids)


def first_time(e: dict[str, Any]) -> float:
    """When an Event's series began (its ``firstTimestamp``, else its newest time)."""
    return parse_time(e.get("firstTimestamp")) or parse_time(e.get("eventTime")) or event_time(e)


def create_blocked(tasks: list[TaskStatus], events: list[dict[str, Any]], cluster: str,
                   since: float, now: float, grace: float | None = None) -> str | None:
    """The cluster's condition when the Job controller has failed to create a task's pod for
    longer than ``grace`` seconds (default :data:`CREATE_GRACE`; like the stall rule: a state
    no pod leaves on its own)."""
    grace = CREATE_GRACE if grace is None else grace
    for t in tasks:
        if t.phase != Phase.PENDING or not t.reason.startswith("FailedCreate"):
            continue
        failures = failed_creates(events, cluster, t.name.rpartition("-")[0], since)
        if not failures:
            continue
        began = min(first_time(e) for e in failures)
        if now - began >= grace:
            newest = max(failures, key=event_time)
            return (f"pods cannot be created for {now - began:.0f} s: {t.name}: "
                    f"{newest.get('message', '')}; fix what it names (quota, --priority, "
                    "LimitRange) or stop the cluster; --queue admits a cluster all at once")
    return None


#: A container's waiting reasons that mean its image will not come without a change.
IMAGE_PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
#: Seconds a task may fit on no node before its cluster says it cannot start (a cluster
#: autoscaler adding a node takes about a minute or two; after that, the sentence).
SCHEDULE_GRACE = 120.0


def _pull_error(message: str) -> str:
    """The kubelet's pull error without the back-off wrapper, so the sentence does not change
    every 10 s between ``ErrImagePull`` and ``ImagePullBackOff``."""
    text = message or ""
    if text.startswith("Back-off pulling image"):
        _, _, text = text.partition(": ")
    for prefix in ("ErrImagePull: ", "ImagePullBackOff: "):
        text = text.removeprefix(prefix)
    return text.strip()


def _image_of(pod: Pod) -> str:
    spec_containers = (pod.get("spec") or {}).get("containers") or []
    return _container(pod).get("image") or (spec_containers[0].get("image") if spec_containers else "")


def pull_failure(pod: Pod) -> str | None:
    """Why a pending pod's image will not come (one stable sentence), or None."""
    waiting = (_container(pod).get("state") or {}).get("waiting") or {}
    if waiting.get("reason") not in IMAGE_PULL_FAILURES:
        return None
    why = _pull_error(waiting.get("message") or "")
    image = _image_of(pod)
    detail = f": {why}" if why and not why.startswith("Back-off") else ""
    return (f"its image {image!r} cannot be pulled{detail}; launch with an --image the "
            "nodes can pull (or ask your administrator to make this one available)")


def cannot_start(view: View, now: float, grace: float | None = None) -> str | None:
    """Why a pending cluster will not start without a change (its pods would wait for ever),
    as one sentence saying what to do; None while it may still start by itself.

    An image no node can pull is said at once (the kubelet only retries it); a pod no node
    has room for after ``grace`` seconds (default :data:`SCHEDULE_GRACE`), as the scheduler
    says it.
    """
    grace = SCHEDULE_GRACE if grace is None else grace
    for task, pod in sorted(view.pods.items()):
        if (pod.get("status") or {}).get("phase") != "Pending" or \
                (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        pulled = pull_failure(pod)
        if pulled:
            return f"cannot start: {task}: {pulled}; then stop this cluster and launch again"
        scheduled = _condition(pod, "PodScheduled") or {}
        since = parse_time(scheduled.get("lastTransitionTime"))
        if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable" \
                and since is not None and now - since >= grace:
            return (f"cannot start: {task} has fit on no node for more than {grace:.0f} s "
                    f"({scheduled.get('message') or 'Unschedulable'}): stop this cluster and "
                    "launch it asking for less (--cpu, --memory, fewer tasks), or ask your "
                    "administrator for larger nodes")
    return None


@dataclass
class View:
    """What the watch knows about one cluster at one instant."""

    spec: ClusterSpec
    jobset: dict[str, Any] | None  # None: not created yet, or gone
    pods: dict[str, Pod]  # task name → newest pod
    stopped: bool = False  # the root says a user stopped it
    jobset_seen: bool = True  # False until the first listing of the JobSet is in
    steps: dict[str, Pod] = field(default_factory=dict)  # sync/backup step → newest pod
    step_line: str = ""  # the working step's newest log line (its progress)
    ends: dict[str, float] = field(default_factory=dict)  # pod name → when the watch saw it end

    @property
    def policy(self) -> LifecyclePolicy:
        """The lifecycle policy the cluster's JobSet was built from."""
        return LifecyclePolicy.of(self.spec)


def task_statuses(view: View) -> list[TaskStatus]:
    """Every task's status: its newest pod, explained by what JobSet says of the cluster."""
    ended = jobset_condition(view.jobset)
    waiting = _suspended(view.jobset)
    success = ended is not None and ended.get("type") == "Completed"
    out = []
    for task in view.spec.tasks():
        pod = view.pods.get(task.name)
        status = _ending(view, task_status(task.name, pod), pod, waiting)
        if status.phase not in Phase.TERMINAL and status.phase != Phase.STOPPING or pod is None:
            if view.stopped:
                status.phase, status.reason = Phase.STOPPED, "stopped by the user"
            elif success and task.role not in view.policy.success_roles:
                status.phase, status.reason = Phase.SUCCEEDED, ENDED_BY_JOBSET
            elif ended is not None:
                status.phase, status.reason = Phase.STOPPED, "stopped: the cluster failed"
            elif pod is None and waiting:
                status.reason = waiting
            elif pod is None and view.jobset is None and view.jobset_seen:
                status.phase, status.reason = Phase.STOPPED, "its JobSet is gone"
        out.append(status)
    return out


def _ending(view: View, status: TaskStatus, pod: Pod | None, waiting: str | None) -> TaskStatus:
    """A task whose pod has not ended while its cluster was stopped, or whose pod is being
    deleted: stopping; pending again when Kueue took the admission back; else being deleted."""
    live = pod is not None and status.phase not in Phase.TERMINAL
    if view.stopped and live:  # asked to stop: stopping until the pod has ended
        status.phase, status.reason = Phase.STOPPING, STOPPING_REASON
    elif live and pod.get("metadata", {}).get("deletionTimestamp"):
        if waiting:  # Kueue took the admission back (preempted, evicted): queued again
            status.phase, status.reason = Phase.PENDING, f"{waiting} (its pod is ending)"
        else:
            status.phase, status.reason = Phase.STOPPED, "being deleted"
    return status


def step_status(step: str, pod: Pod | None) -> TaskStatus:
    """A step's status: its pod, read through the container doing the work (the sync
    step's init container ``fetch`` until it is done)."""
    status = task_status(step, pod)
    inits = ((pod or {}).get("status") or {}).get("initContainerStatuses") or []
    busy = [c for c in inits if ((c.get("state") or {}).get("terminated") or {}).get("exitCode") != 0]
    if pod is None or not busy:
        return status
    state = busy[0].get("state") or {}
    if "waiting" in state:
        status.phase = Phase.PENDING
        status.reason = _sentence(state["waiting"].get("reason") or "Waiting",
                                  state["waiting"].get("message"))
    elif "running" in state:
        status.phase, status.reason = Phase.STARTING, "running"
    else:
        code = state["terminated"].get("exitCode")
        status.phase, status.exit_code = Phase.FAILED, code
        status.reason = _sentence(f"{busy[0].get('name')} exited {code}",
                                  state["terminated"].get("message"))
    return status


_STEP_DOING = {SYNC: "fetching {url} into /data", BACKUP: "uploading checkpoints and models to {url}"}


def _step_phase(view: View, tasks: list[TaskStatus]) -> tuple[str, str] | None:
    """While a step is what the cluster waits for: the phase and a reason naming the step."""
    before, after = steps(view.spec)
    deciding = {t.name for t in view.policy.success_tasks(view.spec)}
    done = all(t.phase == Phase.SUCCEEDED for t in tasks if t.name in deciding)
    for step in before + (after if done else []):
        st = step_status(step, view.steps.get(step))
        if st.phase == Phase.SUCCEEDED:
            continue
        url = view.spec.data_url if step == SYNC else view.spec.backup_url
        doing = _STEP_DOING[step].format(url=url)
        if st.phase == Phase.FAILED:
            return Phase.RUNNING, f"failing: {step} failed ({doing}): {st.reason}"
        if st.phase == Phase.PENDING:
            return Phase.PENDING, f"{step}: {st.reason}" if view.steps.get(step) else \
                f"{step}: waiting to start ({doing})"
        line = f": {view.step_line}" if view.step_line else ""
        return (Phase.PENDING if step == SYNC else Phase.RUNNING), f"{step}: {doing}{line}"
    return None


def working_step(view: View) -> tuple[Pod, str] | None:
    """The step pod and container doing the work now (the sync's ``fetch`` while it runs,
    the running backup), whose log shows its progress; None when no step is working."""
    sync = view.steps.get(SYNC)
    for c in ((sync or {}).get("status") or {}).get("initContainerStatuses") or []:
        if "running" in (c.get("state") or {}):
            return sync, c["name"]
    backup = view.steps.get(BACKUP)
    if backup is not None and (backup.get("status") or {}).get("phase") == "Running":
        return backup, BACKUP
    return None


def failed_steps(view: View) -> list[TaskStatus]:
    """The steps whose pod failed (a failed upload fails the cluster: it is never silent)."""
    out = [step_status(s, p) for s, p in sorted(view.steps.items())]
    return [s for s in out if s.phase == Phase.FAILED]


def cluster_phase(view: View, tasks: list[TaskStatus]) -> tuple[str, str]:
    """The cluster's phase and reason: JobSet's verdict, else what its steps and tasks show."""
    if view.stopped:
        ending = [t.name for t in tasks if t.phase == Phase.STOPPING]
        if ending:
            return Phase.STOPPING, f"stopping: waiting for {', '.join(ending)} to end"
        return Phase.STOPPED, "stopped by the user"
    # A task's failure first: a step ended by the JobSet's own end is not its cause; nor is a
    # task or step SIGTERMed (143), which is what a failing or restarting JobSet does to the rest.
    failed = sorted([*(t for t in tasks if t.phase == Phase.FAILED), *failed_steps(view)],
                    key=lambda t: _end_order(view, t))
    ended = jobset_condition(view.jobset)
    if ended is not None:
        return _ended_phase(ended, failed)
    if view.jobset is None and view.jobset_seen:
        return Phase.STOPPED, "its JobSet is gone (removed by its TTL after it ended, or deleted)"
    stepping = _step_phase(view, tasks)
    if stepping is not None:
        return stepping
    if failed:
        return _failed_phase(view, failed[0])
    phases = {t.phase for t in tasks}
    for phase in (Phase.PENDING, Phase.STARTING):
        if phase in phases:
            waiting = [t for t in tasks if t.phase == phase]
            return phase, f"{waiting[0].name}: {waiting[0].reason}" if waiting[0].reason else ""
    return Phase.RUNNING, ""


def end_began(pod: Pod) -> float | None:
    """When a pod's end began, by the API's clock (seconds): its deletion was asked for (the
    deletion timestamp less its grace) or its container ended, whichever came first."""
    meta = pod.get("metadata") or {}
    times = []
    deleted = parse_time(meta.get("deletionTimestamp"))
    if deleted is not None:
        times.append(deleted - float(meta.get("deletionGracePeriodSeconds") or 0))
    finished = parse_time(((_container(pod).get("state") or {}).get("terminated") or {}).get("finishedAt"))
    if finished is not None:
        times.append(finished)
    return min(times) if times else None


def _end_order(view: View, t: TaskStatus) -> tuple[float, float, bool]:
    """Which failure came first, so the cause is named and not a peer that lost it (a worker
    whose pod was deleted, then the peer whose collective broke): the order in which the watch
    saw the ends begin, else the API's timestamps (to the second), else a SIGTERMed task last
    (what JobSet does to the rest of a failing or restarting cluster)."""
    pod = view.pods.get(t.name) or {}
    name = (pod.get("metadata") or {}).get("name", "")
    seen = view.ends.get(name)
    began = end_began(pod) if pod else None
    inf = float("inf")
    return (inf if seen is None else seen, inf if began is None else began,
            t.exit_code == SIGTERM_EXIT)


def _ended_phase(ended: dict[str, Any], failed: list[TaskStatus]) -> tuple[str, str]:
    """The phase of a cluster whose JobSet carries a terminal condition."""
    if ended.get("type") == "Completed":
        return Phase.SUCCEEDED, "every worker finished"
    why = f"{failed[0].name} failed: {failed[0].reason}" if failed else ""
    jobset_says = ended.get("message") or ended.get("reason") or "the JobSet failed"
    return Phase.FAILED, f"{why} ({jobset_says})" if why else jobset_says


def _failed_phase(view: View, t: TaskStatus) -> tuple[str, str]:
    """A task failed, the JobSet has not ended: failing (the user's exit) or restarting."""
    pod = view.pods.get(t.name)
    if pod is not None and view.policy.classify(pod_end(pod)).action == lifecycle.FAIL:
        return Phase.RUNNING, f"failing: {t.name} failed: {t.reason} (not retried)"
    left = view.policy.restart_budget - jobset_restarts(view.jobset)
    return Phase.STARTING, f"restarting: {t.name} failed: {t.reason} ({left} restarts left)"


def cluster_status(
    view: View, root: dict[str, Any], tasks: list[TaskStatus] | None = None,
    progress: Progress | None = None,
) -> ClusterStatus:
    """The status of the cluster whose root object is ``root``, as ``view`` shows it."""
    tasks = task_statuses(view) if tasks is None else tasks
    phase, reason = cluster_phase(view, tasks)
    meta = root["metadata"]
    annotations = meta.get("annotations") or {}
    ended = jobset_condition(view.jobset)
    return ClusterStatus(
        name=view.spec.name,
        backend="kubernetes",
        mode=view.spec.mode,
        phase=phase,
        reason=reason,
        created=parse_time(meta.get("creationTimestamp")) or 0.0,
        finished=parse_time((ended or {}).get("lastTransitionTime")),
        owner=view.spec.owner or annotations.get(OWNER_ANNOTATION, ""),
        detached=annotations.get(DETACHED_ANNOTATION) == "true",
        log_dir=LogLocation(log_dir(view.spec), log_claim_name(view.spec)),
        tasks=tasks,
        progress=progress,
    )


def copy_status(status: ClusterStatus) -> ClusterStatus:
    """A copy of ``status`` and of its tasks that its reader may change (a listing hands out
    copies of the statuses it keeps)."""
    out = copy.copy(status)
    out.tasks = [copy.copy(t) for t in status.tasks]
    return out
