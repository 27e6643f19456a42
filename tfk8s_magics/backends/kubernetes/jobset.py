"""Pure JobSet builder: ``(ClusterSpec, K8sSettings, LifecyclePolicy)`` → one JobSet.

The JobSet is a ``jobset.x-k8s.io/v1alpha2`` object (kubernetes-sigs/jobset).

A cluster's tasks run as one JobSet (kubernetes-sigs/jobset), so its
lifecycle lives in the cluster, not in a notebook kernel: restarts, success,
the end of the parameter servers and the TTL go on with no client attached.
The :class:`~tfk8s_magics.lifecycle.LifecyclePolicy` maps onto it field by
field:

=============================  ==================================================
policy                         JobSet
=============================  ==================================================
``success_roles``              ``successPolicy``: ``All`` of those replicated Jobs
                               (in-graph: none; all servers, which never exit 0,
                               so it never succeeds by itself)
``restart_budget``             ``failurePolicy.maxRestarts`` (a restart recreates
                               every Job: one budget for the whole cluster)
``user_exit_codes`` (1–127)    each Job's ``podFailurePolicy`` ``FailJob`` on those
                               exit codes, and the JobSet rule ``FailJobSet`` on the
                               Job failure reason ``PodFailurePolicy``: no restart
``retry_conditions``           ``podFailurePolicy`` ``Ignore`` on
(``DisruptionTarget``)         ``DisruptionTarget``: an evicted or preempted pod is
                               replaced without spending the budget
signals, OOM (exit ≥ 128)      counted: ``backoffLimit: 0`` fails the Job, and the
                               JobSet restarts within ``maxRestarts``
``grace_period``               ``terminationGracePeriodSeconds`` of parameter
                               servers and evaluators (see below)
``ttl_after_finished``         ``ttlSecondsAfterFinished``
``spec.active_deadline``       each Job's ``activeDeadlineSeconds`` + the rule
                               ``FailJobSet`` on ``DeadlineExceeded``
``--data-sync`` (a URL)        a ``sync`` replicated Job first, ``InOrder``: its init
                               container fills ``/data`` before any task pod exists
``--backup URL``               a ``backup`` replicated Job last, in ``successPolicy``:
                               success needs the upload; its failure fails the JobSet
=============================  ==================================================

(The two steps: :mod:`.storage_pods`.)

**Parameter servers end when the JobSet succeeds:** a finished JobSet deletes
the Jobs still running (its controller, ``deleteJobs`` on a finished JobSet).
Kubernetes has no "keep running N seconds after success" for them, so the
grace period becomes the time they get between SIGTERM and SIGKILL.  A
server exits on SIGTERM at once, so for parameter servers it is effectively
0 here; an evaluator may catch SIGTERM to finish its last evaluation within
it.  (A ``preStop`` sleep would keep them serving, but would also delay every
stop and delete by the same time.)

**Names:** one replicated Job per role (``ps``, ``chief``, ``worker``,
``evaluator``), one Indexed Job of ``n`` pods each; pod hostnames are
``<cluster>-<role>-0-<index>`` under the subdomain ``<cluster>`` (JobSet's
own headless Service), so task ``worker-1`` of ``mnist`` is
``mnist-worker-0-1.mnist.<ns>.svc``.  The pod template is per role: a pod
learns its index from ``JOB_COMPLETION_INDEX`` and derives its TF_CONFIG
(:func:`tfk8s_magics.runtime.task.resolve_identity`), so a replacement pod
has the same identity.  Parameter servers come first and, with
``startupPolicy: InOrder``, are ready before the workers start.
"""

from __future__ import annotations

import json
from typing import Any

from ... import lifecycle
from ...lifecycle import LifecyclePolicy, TaskEnd
from ...spec import ROLES, ClusterSpec, Task
from ...tfconfig import cluster_def
from ...yamltext import dump_yaml
from . import manifests as m
from . import storage_pods as steps_mod
from .settings import K8sSettings

Manifest = dict[str, Any]

API_VERSION = "jobset.x-k8s.io/v1alpha2"
KIND = "JobSet"
#: JobSet's labels on the Jobs and pods it creates (kubernetes-sigs/jobset, api/jobset/v1alpha2).
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
RESTART_ATTEMPT_LABEL = m.RESTART_ATTEMPT_LABEL
#: The Job controller's label and annotation on the pods of an Indexed Job.
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
#: Kueue's label naming the LocalQueue that admits the JobSet as one gang.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GPU_RESOURCE = "nvidia.com/gpu"
#: Start order: parameter servers first (workers dial them as they start).
START_ORDER = ("ps", "chief", "worker", "evaluator")
#: Failure-policy rule names (JobSet: a letter, then letters, digits, ``_,:``).
RULE_USER_ERROR = "UserError"
RULE_DEADLINE = "DeadlineExceeded"


def hostname(spec: ClusterSpec, task: Task) -> str:
    """The pod hostname JobSet gives ``task``: ``<cluster>-<role>-0-<index>``."""
    return f"{spec.name}-{task.role}-0-{task.index}"


def task_host(spec: ClusterSpec, settings: K8sSettings, task: Task) -> str:
    """The stable DNS name of ``task``: ``<hostname>.<cluster>.<namespace>.svc``."""
    host = f"{hostname(spec, task)}.{spec.name}.{settings.namespace}.svc"
    return f"{host}.{settings.cluster_domain}" if settings.cluster_domain else host


def cluster_addresses(spec: ClusterSpec, settings: K8sSettings) -> dict[str, list[str]]:
    """The TF_CONFIG ``cluster`` dict by JobSet's DNS names (the chief left out in-graph)."""
    return cluster_def(spec, lambda t: f"{task_host(spec, settings, t)}:{settings.port}")


def roles(spec: ClusterSpec) -> list[str]:
    """The roles of the cluster in start order (one replicated Job each)."""
    return [r for r in START_ORDER if spec.replicas().get(r)]


def _env(spec: ClusterSpec, settings: K8sSettings, role: str) -> list[Manifest]:
    env = {
        "TFK8S_ROLE": role,
        "TFK8S_CLUSTER_DEF": json.dumps(cluster_addresses(spec, settings), sort_keys=True),
        **m.role_env(spec, settings, role),
    }
    return [{"name": k, "value": v} for k, v in env.items()]


def node_requirement(text: str) -> Manifest:
    """``key=value`` / ``key!=value`` / ``key`` / ``!key`` as a node selector requirement."""
    if "!=" in text:
        key, value = text.split("!=", 1)
        return {"key": key, "operator": "NotIn", "values": [value]}
    if "=" in text:
        key, value = text.split("=", 1)
        return {"key": key, "operator": "In", "values": [value]}
    if text.startswith("!"):
        return {"key": text[1:], "operator": "DoesNotExist"}
    return {"key": text, "operator": "Exists"}


def affinity(spec: ClusterSpec, role: str) -> Manifest:
    """``role``'s node affinity (``spec.node_affinity``) and spreading (``spec.spread``)."""
    out: Manifest = {}
    reqs = spec.node_affinity.get(role, ())
    if reqs:
        out["nodeAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [node_requirement(r) for r in reqs]}]
            }
        }
    if role in spec.spread:
        same_role = {m.CLUSTER_LABEL: spec.name, m.ROLE_LABEL: role}
        out["podAntiAffinity"] = {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "labelSelector": {"matchLabels": same_role},
                        "topologyKey": "kubernetes.io/hostname",
                    },
                }
            ]
        }
    return out


def pod_template(
    spec: ClusterSpec, settings: K8sSettings, policy: LifecyclePolicy, role: str
) -> Manifest:
    """The pod template of ``role``: the shared task pod spec plus scheduling."""
    body = m.pod_spec(spec, settings, role, _env(spec, settings, role), None)
    steps_mod.add_to_task(body["containers"][0], spec, role, role in policy.success_roles)
    if spec.resources_for(role).gpus:
        gpu = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
        body["tolerations"] = [*body.get("tolerations", []), gpu]
    placement = affinity(spec, role)
    if placement:
        body["affinity"] = placement
    if spec.scheduler:
        body["schedulerName"] = spec.scheduler
    if spec.priority:
        body["priorityClassName"] = spec.priority
    if role not in policy.success_roles:
        # Ended by JobSet when it finishes: the grace is their SIGTERM → SIGKILL time.
        body["terminationGracePeriodSeconds"] = int(policy.grace_period)
    labels = {**m.object_labels(spec, settings, "task"), m.ROLE_LABEL: role}
    return {"metadata": {"labels": labels}, "spec": body}


def failing_exit_codes(policy: LifecyclePolicy) -> list[int]:
    """The exit codes ``policy`` never retries (1–255; 0 is success): asked of the policy itself."""
    return [c for c in range(1, 256)
            if policy.classify(TaskEnd(exit_code=c)).action == lifecycle.FAIL]


def pod_failure_policy(policy: LifecyclePolicy) -> Manifest:
    """Disruptions are replaced for free; the user's exit codes fail the Job at once."""
    rules: list[Manifest] = [
        {"action": "Ignore", "onPodConditions": [{"type": cond, "status": "True"}]}
        for cond in sorted(policy.retry_conditions)
    ]
    rules.append(
        {
            "action": "FailJob",
            "onExitCodes": {
                "containerName": m.CONTAINER,
                "operator": "In",
                "values": failing_exit_codes(policy),
            },
        }
    )
    return {"rules": rules}


def replicated_job(
    spec: ClusterSpec, settings: K8sSettings, policy: LifecyclePolicy, role: str
) -> Manifest:
    """One replicated Job: an Indexed Job of all of ``role``'s tasks, no retry of its own."""
    n = spec.replicas()[role]
    job: Manifest = {
        "parallelism": n,
        "completions": n,
        "completionMode": "Indexed",
        # Every counted failure fails the Job; the JobSet decides the restart
        # (one budget for the whole cluster, as the policy says).
        "backoffLimit": 0,
        "podFailurePolicy": pod_failure_policy(policy),
        "template": pod_template(spec, settings, policy, role),
    }
    if spec.active_deadline:
        job["activeDeadlineSeconds"] = int(spec.active_deadline)
    labels = {**m.object_labels(spec, settings, "task"), m.ROLE_LABEL: role}
    return {"name": role, "replicas": 1, "template": {"metadata": {"labels": labels}, "spec": job}}


def failure_policy(spec: ClusterSpec, policy: LifecyclePolicy) -> Manifest:
    """``maxRestarts`` = the restart budget; user errors and the deadline fail at once."""
    rules = [
        {"name": RULE_USER_ERROR, "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}
    ]
    if spec.active_deadline:
        rules.append(
            {"name": RULE_DEADLINE, "action": "FailJobSet", "onJobFailureReasons": ["DeadlineExceeded"]}
        )
    # restartStrategy is JobSet's default, written out: the field exists since JobSet v0.7
    # (the minimum: v0.6 keeps active Jobs running until a TTL expires, jobset#667), and a
    # JobSet created with fieldValidation=Strict is refused by an older CRD (apply.py says so).
    return {"maxRestarts": policy.restart_budget, "restartStrategy": "Recreate", "rules": rules}


def success_policy(spec: ClusterSpec, policy: LifecyclePolicy) -> Manifest:
    """``All`` of the roles that decide success, and the backup step after them; in-graph,
    all servers (never reached)."""
    deciding = [r for r in roles(spec) if r in policy.success_roles]
    if deciding:
        deciding += steps_mod.steps(spec)[1]
    out: Manifest = {"operator": "All"}
    if deciding:
        out["targetReplicatedJobs"] = deciding
    return out


def jobset(spec: ClusterSpec, settings: K8sSettings, policy: LifecyclePolicy) -> Manifest:
    """The JobSet running every task of ``spec`` under ``policy``."""
    labels = m.object_labels(spec, settings, "jobset")
    if spec.queue:
        labels[QUEUE_LABEL] = spec.queue
    before, after = steps_mod.steps(spec)
    deciding = [t.name for t in policy.success_tasks(spec)]
    step_jobs = {s: steps_mod.step_job(spec, settings, s, pod_failure_policy(policy), deciding)
                 for s in (*before, *after)}
    body: Manifest = {
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True,
                    "subdomain": spec.name},
        "replicatedJobs": [*(step_jobs[s] for s in before),
                           *(replicated_job(spec, settings, policy, r) for r in roles(spec)),
                           *(step_jobs[s] for s in after)],
        "successPolicy": success_policy(spec, policy),
        "failurePolicy": failure_policy(spec, policy),
        # InOrder: a replicated Job starts once the previous one's pods are ready or done,
        # so the parameter servers come up first, and nothing starts before the sync step's
        # init container has filled /data (see .storage_pods).
        "startupPolicy": {"startupPolicyOrder": "InOrder" if spec.ps or before else "AnyOrder"},
    }
    if policy.ttl_after_finished is not None:
        body["ttlSecondsAfterFinished"] = int(policy.ttl_after_finished)
    meta = {"name": spec.name, "namespace": settings.namespace, "labels": labels}
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": body}


def cluster_manifests(
    spec: ClusterSpec, settings: K8sSettings, tensorboard: bool = False
) -> list[Manifest]:
    """Every object of a cluster, in creation order: root, claims, policy, TensorBoard, JobSet.

    The JobSet comes last: its pods mount the root ConfigMap and the claims.
    Besides these, JobSet itself creates the headless Service (named after
    the cluster) and one Job per role.
    """
    out = [m.root_configmap(spec, settings), *m.claims(spec, settings)]
    if tensorboard:
        out += m.tensorboard_manifests(spec, settings)
    out.append(jobset(spec, settings, LifecyclePolicy.of(spec)))
    return out


def render_yaml(spec: ClusterSpec, settings: K8sSettings, tensorboard: bool = False) -> str:
    """The cluster's manifests as one multi-document YAML string.

    Without ownerReferences (their uid exists only once the root is
    created): delete a rendered cluster with
    ``kubectl delete jobset,cm,pvc,deploy,svc -l tfk8s.io/cluster=NAME``.
    """
    return dump_yaml(cluster_manifests(spec, settings, tensorboard=tensorboard))


def task_of_pod(pod_labels: dict[str, str]) -> Task | None:
    """The task a JobSet pod runs, read from its labels (None for another pod)."""
    role = pod_labels.get(m.ROLE_LABEL) or pod_labels.get(REPLICATED_JOB_LABEL)
    index = pod_labels.get(COMPLETION_INDEX_LABEL, "")
    if role not in ROLES or not index.isdigit():
        return None
    return Task(role, int(index))
