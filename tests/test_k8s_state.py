"""Pure cluster logic: a JobSet and its pods → task and cluster statuses; quota; RBAC.

Nothing here decides a restart, a recycle or a TTL: JobSet does.  These
tests check how what JobSet reports reads."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tfk8s_magics.backends.base import Phase
from tfk8s_magics.backends.kubernetes import state
from tfk8s_magics.backends.kubernetes.jobset import cluster_manifests
from tfk8s_magics.backends.kubernetes.quota import demand, node_problems, quota_problems
from tfk8s_magics.backends.kubernetes.rbac import (
    backend_role,
    backend_role_binding,
    role_rules,
)
from tfk8s_magics.backends.kubernetes.settings import K8sSettings
from tfk8s_magics.spec import ClusterSpec, Resources

SPEC = ClusterSpec(name="c", ps=1, workers=2, script="pass", restart_budget=1,
                   ps_grace_period=30, ttl_after_finished=60)


def pod(task: str, phase: str = "Running", attempt: int = 0, ready: bool = True,
        terminated: dict | None = None, **status) -> dict:
    """A JobSet pod as the API shows it (labels from JobSet and the Job controller)."""
    role, _, index = task.rpartition("-")
    container: dict = {"name": "tensorflow", "ready": ready and phase == "Running", "state": {}}
    if terminated is not None:
        container["state"] = {"terminated": terminated}
    return {
        "metadata": {
            "name": f"c-{role}-0-{index}-x{attempt}abc",
            "labels": {"tfk8s.io/role": role, "batch.kubernetes.io/job-completion-index": index,
                       "jobset.sigs.k8s.io/restart-attempt": str(attempt)},
        },
        "status": {"phase": phase, "containerStatuses": [container], **status},
    }


def jobset(condition: str | None = None, restarts: int = 0, message: str = "",
           suspend: bool = False) -> dict:
    status: dict = {"restarts": restarts}
    if condition:
        status["conditions"] = [{"type": condition, "status": "True", "reason": condition,
                                 "message": message, "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    return {"metadata": {"name": "c", "labels": {}}, "spec": {"suspend": suspend},
            "status": status}


def view(*pods, **kw) -> state.View:
    kw.setdefault("jobset", jobset())
    return state.View(spec=kw.pop("spec", SPEC), pods=state.latest_pods(list(pods)), **kw)


def test_pending_reason_comes_from_the_scheduler_or_the_container():
    unsched = pod("worker-0", "Pending", conditions=[{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}])
    s = state.task_status("worker-0", unsched)
    assert (s.phase, s.reason) == (
        Phase.PENDING, "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")
    pulling = pod("worker-0", "Pending")
    pulling["status"]["containerStatuses"][0]["state"] = {
        "waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}
    s = state.task_status("worker-0", pulling)
    assert (s.phase, s.reason) == (Phase.PENDING, "ImagePullBackOff: Back-off pulling image")


def test_running_is_starting_until_ready():
    assert state.task_status("ps-0", pod("ps-0", ready=False)).phase == Phase.STARTING
    assert state.task_status("ps-0", pod("ps-0")).phase == Phase.RUNNING


def test_exit_codes_are_explained():
    # "Cannot run" needs the runtime's termination message (terminationMessagePath), not exit 3 alone.
    broken = {"exitCode": 3, "reason": "Error",
              "message": "ScriptBroken: the training script failed on an import"}
    s = state.task_status("worker-0", pod("worker-0", "Failed", terminated=broken))
    assert (s.phase, s.exit_code, s.reason) == (
        Phase.FAILED, 3, "the script cannot run: it failed on an import or did not compile (exit code 3)")
    own = {"exitCode": 3, "reason": "Error"}
    s = state.task_status("worker-0", pod("worker-0", "Failed", terminated=own))
    assert (s.phase, s.exit_code, s.reason) == (Phase.FAILED, 3, "exit code 3")  # the script's sys.exit(3)
    # an OOM kill names the limit it went past and the option that changes it
    oom = pod("worker-0", "Failed", terminated={"exitCode": 137, "reason": "OOMKilled"})
    oom["spec"] = {"containers": [{"name": "tensorflow", "resources": {"limits": {"memory": "512Mi"}}}]}
    s = state.task_status("worker-0", oom)
    assert (s.exit_code, s.signal, s.reason) == (
        137, "SIGKILL", "OOMKilled: the task used more than its memory limit of 512Mi; launch with a "
        "larger --memory for its role than 512Mi")


def test_the_first_end_is_the_cause_not_the_peer_that_lost_it():
    """A worker's pod deleted by hand, then its peer's collective breaks (exit 1, not retried
    alone): the deleted pod is the cause and JobSet restarts. The order the watch saw the ends
    in decides; without it (a fresh listing), the API's seconds: the deletion was asked for at
    :00 (its timestamp less its grace), the peer ended at :01."""
    deleted = pod("worker-1", "Failed", terminated={"exitCode": 143, "reason": "Error",
                                                    "finishedAt": "2026-01-01T00:00:01Z"})
    deleted["metadata"].update(deletionTimestamp="2026-01-01T00:00:30Z", deletionGracePeriodSeconds=30)
    peer = pod("worker-0", "Failed", terminated={"exitCode": 1, "reason": "Error",
                                                 "finishedAt": "2026-01-01T00:00:01Z"})
    for ends in ({}, {deleted["metadata"]["name"]: 1.0, peer["metadata"]["name"]: 2.0}):
        v = view(deleted, peer, pod("ps-0"), ends=ends)
        assert state.cluster_phase(v, state.task_statuses(v)) == (
            Phase.STARTING, "restarting: worker-1 failed: killed by SIGTERM: its pod was deleted "
            "(1 restarts left)"), ends
    # the order the watch saw wins over the API's seconds
    v = view(deleted, peer, pod("ps-0"),
             ends={deleted["metadata"]["name"]: 2.0, peer["metadata"]["name"]: 1.0})
    assert state.cluster_phase(v, state.task_statuses(v))[1].startswith("failing: worker-0 failed")


def test_an_ended_container_is_not_starting_again():
    """The container ended, the pod's phase not written yet (not ready for a moment); or a task
    that was ready stops answering its probe: neither is starting."""
    done = pod("worker-0", "Running", ready=False,
               terminated={"exitCode": 0, "finishedAt": "2026-01-01T00:01:00Z"})
    assert state.task_status("worker-0", done).phase == Phase.SUCCEEDED
    crashed = pod("worker-0", "Running", ready=False, terminated={"exitCode": 1})
    assert state.task_status("worker-0", crashed).phase == Phase.FAILED
    was_ready = pod("worker-0", ready=False,
                    conditions=[{"type": "Ready", "status": "False",
                                 "lastTransitionTime": "2026-01-01T00:01:00Z"}])
    was_ready["status"]["containerStatuses"][0]["state"] = {
        "running": {"startedAt": "2026-01-01T00:00:00Z"}}
    assert state.task_status("worker-0", was_ready).phase == Phase.RUNNING
    starting = pod("worker-0", ready=False,
                   conditions=[{"type": "Ready", "status": "False",
                                "lastTransitionTime": "2025-12-31T23:59:59Z"}])
    starting["status"]["containerStatuses"][0]["state"] = {
        "running": {"startedAt": "2026-01-01T00:00:00Z"}}
    assert state.task_status("worker-0", starting).phase == Phase.STARTING


def test_a_failed_task_reads_as_restarting_until_jobset_says_otherwise():
    killed = pod("worker-0", "Failed", terminated={"exitCode": 137})
    v = view(killed, pod("ps-0"), pod("worker-1"))
    assert state.cluster_phase(v, state.task_statuses(v)) == (
        Phase.STARTING, "restarting: worker-0 failed: killed by SIGKILL (1 restarts left)")
    raised = pod("worker-0", "Failed", terminated={"exitCode": 1})
    v = view(raised, pod("ps-0"), pod("worker-1"))
    phase, reason = state.cluster_phase(v, state.task_statuses(v))
    assert phase == Phase.RUNNING and reason.startswith("failing: worker-0 failed: the script raised")


def test_the_newest_attempt_wins_and_counts_restarts():
    v = view(pod("worker-0", "Failed", terminated={"exitCode": 137}), pod("worker-0", attempt=1),
             pod("ps-0", attempt=1), pod("worker-1", attempt=1), jobset=jobset(restarts=1))
    tasks = state.task_statuses(v)
    assert [(t.name, t.phase, t.restarts) for t in tasks] == [
        ("ps-0", Phase.RUNNING, 1), ("worker-0", Phase.RUNNING, 1), ("worker-1", Phase.RUNNING, 1)]
    assert state.cluster_phase(v, tasks) == (Phase.RUNNING, "")


def test_jobset_failure_is_the_verdict():
    v = view(pod("worker-0", "Failed", attempt=1, terminated={"exitCode": 137}),
             pod("worker-1", attempt=1),
             jobset=jobset("Failed", restarts=1,
                           message="jobset failed due to reaching max number of restarts"))
    tasks = state.task_statuses(v)
    assert state.cluster_phase(v, tasks) == (
        Phase.FAILED, "worker-0 failed: killed by SIGKILL "
        "(jobset failed due to reaching max number of restarts)")
    # what JobSet ended (its active Jobs are deleted) reads as stopped, not pending
    assert {t.name: t.phase for t in tasks} == {
        "ps-0": Phase.STOPPED, "worker-0": Phase.FAILED, "worker-1": Phase.STOPPED}


def test_parameter_servers_end_when_the_jobset_succeeds():
    done = {"exitCode": 0}
    v = view(pod("worker-0", "Succeeded", terminated=done),
             pod("worker-1", "Succeeded", terminated=done), jobset=jobset("Completed"))
    tasks = state.task_statuses(v)
    assert state.cluster_phase(v, tasks) == (Phase.SUCCEEDED, "every worker finished")
    assert (tasks[0].name, tasks[0].phase, tasks[0].reason) == (
        "ps-0", Phase.SUCCEEDED, state.ENDED_BY_JOBSET)
    status = state.cluster_status(v, {"metadata": {"name": "c", "creationTimestamp":
                                                   "2025-12-31T00:00:00Z"}}, tasks)
    assert status.finished == 1767225600.0


def test_a_gone_jobset_and_a_stopped_cluster():
    # asked to stop, a pod still there (running, or Terminating): stopping until it has ended
    terminating = pod("worker-0")
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    v = view(pod("ps-0"), terminating, stopped=True)
    assert {t.name: t.phase for t in state.task_statuses(v)} == {
        "ps-0": Phase.STOPPING, "worker-0": Phase.STOPPING, "worker-1": Phase.STOPPED}
    assert state.cluster_phase(v, state.task_statuses(v)) == (
        Phase.STOPPING, "stopping: waiting for ps-0, worker-0 to end")
    # a pod that has ended keeps its end; none left: stopped
    v = view(pod("worker-0", "Failed", terminated={"exitCode": 143}), stopped=True)
    assert all(t.phase in Phase.TERMINAL for t in state.task_statuses(v))
    assert state.cluster_phase(v, state.task_statuses(v)) == (Phase.STOPPED, "stopped by the user")
    v = view(stopped=True, jobset=None)
    assert state.cluster_phase(v, state.task_statuses(v)) == (Phase.STOPPED, "stopped by the user")
    v = view(jobset=None)
    assert state.cluster_phase(v, state.task_statuses(v))[0] == Phase.STOPPED
    assert "its JobSet is gone" in state.cluster_phase(v, state.task_statuses(v))[1]
    v = view(jobset=None, jobset_seen=False)  # not listed yet: nothing concluded
    assert state.cluster_phase(v, state.task_statuses(v))[0] == Phase.PENDING


def test_a_jobset_kueue_suspends_again_is_pending_not_stopped():
    """Kueue takes an admission back (preemption, eviction): it suspends the JobSet and JobSet
    deletes the pods. A suspension the user did not ask for is pending, with the queue named."""
    js = jobset(suspend=True)
    js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "team-a"
    ending = pod("worker-0")
    ending["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    v = view(ending, jobset=js)
    tasks = state.task_statuses(v)
    assert {t.name: t.phase for t in tasks} == {
        "ps-0": Phase.PENDING, "worker-0": Phase.PENDING, "worker-1": Phase.PENDING}
    assert tasks[1].reason == "waiting for admission by queue team-a (its pod is ending)"
    assert state.cluster_phase(v, tasks)[0] == Phase.PENDING


def test_a_queued_jobset_says_it_waits_for_admission():
    js = jobset(suspend=True)
    js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "team-a"
    v = view(jobset=js)
    tasks = state.task_statuses(v)
    assert tasks[0].reason == "waiting for admission by queue team-a"
    assert state.cluster_phase(v, tasks) == (
        Phase.PENDING, "ps-0: waiting for admission by queue team-a")


def test_kueue_reason_is_the_pending_event_of_this_jobsets_workload():
    def ev(name, reason, message, stamp, kind="Workload"):
        return {"involvedObject": {"kind": kind, "name": name}, "reason": reason,
                "message": message, "lastTimestamp": stamp}

    events = [
        ev("jobset-c-1a2b3", "Pending", "old", "2026-01-01T00:00:00Z"),
        ev("jobset-c-1a2b3", "Pending", "couldn't assign flavors", "2026-01-01T00:01:00Z"),
        ev("jobset-c-1a2b3", "QuotaReserved", "admitted elsewhere", "2026-01-01T00:02:00Z"),
        # another cluster's Workload ("c-x"), a JobSet named like one, a non-hash suffix
        ev("jobset-c-x-9f9f9", "Pending", "not ours", "2026-01-01T00:03:00Z"),
        ev("jobset-c-1a2b3", "Pending", "not a Workload", "2026-01-01T00:03:00Z", kind="JobSet"),
        ev("jobset-c-zzzzz", "Pending", "not Kueue's name", "2026-01-01T00:03:00Z"),
    ]
    assert state.admission_message(events, "c") == "couldn't assign flavors"
    assert state.admission_message(events, "c-x") == "not ours"
    assert state.admission_message(events[2:3], "c") is None
    # the queue label decides the words, whatever JobSet's own Suspended condition says
    js = jobset(suspend=True)
    js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "q"
    js["status"] = {"conditions": [{"type": "Suspended", "status": "True",
                                    "message": "jobset is suspended"}]}
    assert state.task_statuses(view(jobset=js))[0].reason == "waiting for admission by queue q"


def test_in_graph_cluster_runs_until_stopped():
    spec = ClusterSpec(name="c", mode="in-graph", ps=1, workers=1)
    v = view(pod("ps-0"), pod("worker-0"), spec=spec)
    assert state.cluster_phase(v, state.task_statuses(v)) == (Phase.RUNNING, "")


# -- quota pre-flight -----------------------------------------------------------

SETTINGS = K8sSettings(namespace="u", user="u", storage_class="gluster")


def _manifests(**res):
    spec = ClusterSpec(name="q", ps=1, workers=2, script="pass",
                       resources={k: Resources(**v) for k, v in res.items()})
    return cluster_manifests(spec, SETTINGS)


def test_demand_sums_requests_objects_and_storage():
    need = demand(_manifests(worker={"cpu": "1500m", "memory": "1Gi", "gpus": 1},
                             ps={"cpu": "1", "memory": "512Mi"}))
    assert need["requests.cpu"] == Decimal("4")
    assert need["requests.memory"] == Decimal(2 * 2**30 + 2**29)
    assert need["requests.nvidia.com/gpu"] == 2
    assert need["pods"] == 3
    assert need["count/jobs.batch"] == 2  # one Job per role
    assert need["services"] == 1  # JobSet's headless Service
    assert need["persistentvolumeclaims"] == 2
    assert need["requests.storage"] == 20 * 2**30
    assert need["gluster.storageclass.storage.k8s.io/requests.storage"] == 20 * 2**30


def test_quota_problems_name_the_resource_and_what_is_left():
    quota = {"metadata": {"name": "user-quota"},
             "status": {"hard": {"requests.cpu": "4", "pods": "10"},
                        "used": {"requests.cpu": "1500m", "pods": "2"}}}
    ms = _manifests(worker={"cpu": "1", "memory": "1Gi"}, ps={"cpu": "1", "memory": "1Gi"})
    assert quota_problems(ms, [quota]) == [
        "the cluster needs requests.cpu 3 but ResourceQuota user-quota leaves 2.5 "
        "(hard 4, used 1500m): ask for fewer tasks or resources, or delete finished clusters; "
        "--queue (Kueue) admits a cluster all at once or not at all."
    ]
    quota["status"]["used"]["requests.cpu"] = "1"
    assert quota_problems(ms, [quota]) == []


def test_quota_on_cpu_requires_every_pod_to_ask_for_cpu():
    quota = {"metadata": {"name": "q"}, "status": {"hard": {"requests.cpu": "100"}}}
    problems = quota_problems(_manifests(worker={"cpu": "1"}), [quota])
    assert problems == [
        "ResourceQuota q counts requests.cpu, so every pod must set requests.cpu, but "
        "q-ps do not and the namespace's LimitRange gives no default: give --cpu for "
        "every role (e.g. --cpu 1 --memory 2Gi)."
    ]


def test_node_problems():
    nodes = [{"status": {"allocatable": {"cpu": "4", "memory": "8Gi"}}},
             {"spec": {"unschedulable": True},
              "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"}}}]
    assert node_problems(_manifests(worker={"cpu": "2", "memory": "4Gi"}), nodes) == []
    problems = node_problems(_manifests(worker={"cpu": "2", "gpus": 1}), nodes)
    assert problems == [
        "q-worker asks for cpu 2, nvidia.com/gpu 1, more than any schedulable node can "
        "allocate: ask for less per task.",
    ]


# -- RBAC objects ---------------------------------------------------------------

def test_role_and_binding_are_namespaced_and_least_privilege():
    role = backend_role("alice")
    assert role["kind"] == "Role" and role["metadata"]["namespace"] == "alice"
    assert role["rules"] == role_rules()
    granted = {(g, r, v) for rule in role_rules() for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    assert not any(r in ("pods/exec", "pods/attach", "roles", "rolebindings")
                   for _, r, _ in granted)
    # Secrets: only made (TensorBoard's token, which the notebook keeps itself), never read
    assert {(g, r, v) for g, r, v in granted if r == "secrets"} == {("", "secrets", "create")}
    assert not any(v in ("*", "escalate", "bind", "impersonate") for _, _, v in granted)
    assert backend_role_binding("alice", "default") == {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "tfk8s-backend", "namespace": "alice",
                     "labels": {"app.kubernetes.io/name": "tfk8s",
                                "app.kubernetes.io/component": "backend-rbac"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "tfk8s-backend"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "alice"}],
    }


@pytest.mark.parametrize("version", ["1.29", "1.37"])
def test_rbac_objects_validate(version):
    import kubernetes_validate

    kubernetes_validate.validate(backend_role("alice"), version, strict=True)
    kubernetes_validate.validate(backend_role_binding("alice", "sa"), version, strict=True)




def test_the_task_that_failed_not_the_one_the_failing_jobset_terminated_is_the_cause():
    """Seen on the real cluster: worker-1's script raised (exit 1), JobSet failed and deleted the
    worker Job, worker-0 ended SIGTERMed (143). The reason names worker-1, as the double (which
    removed the other pods outright) did."""
    def pod(index, code):
        return {"metadata": {"labels": {"tfk8s.io/role": "worker",
                                        "batch.kubernetes.io/job-completion-index": str(index)}},
                "status": {"phase": "Failed", "containerStatuses": [{"name": "c", "state": {
                    "terminated": {"exitCode": code, "reason": "Error"}}}]}}

    spec = ClusterSpec(name="mnist", workers=2, script="print(1)\n")
    failed = {"status": {"conditions": [{"type": "Failed", "status": "True", "message":
                                         "applying FailJobSet failure policy action"}]}}
    for jobset in (failed, {}):  # JobSet's verdict, and the moment before it
        view = state.View(spec=spec, jobset=jobset, pods={"worker-0": pod(0, 143),
                                                          "worker-1": pod(1, 1)})
        phase, reason = state.cluster_phase(view, state.task_statuses(view))
        assert "worker-1 failed: the script raised an exception (exit code 1)" in reason, reason


def test_a_memory_quota_refusal_says_gi_not_bytes():
    """The quota controller may write a memory total in bytes: the sentence says 1Gi."""
    quota = {"metadata": {"name": "tfk8s-quota"},
             "status": {"hard": {"limits.memory": "4294967296"},
                        "used": {"limits.memory": "1073741824"}}}
    ms = _manifests(worker={"cpu": "1", "memory": "2Gi"}, ps={"cpu": "1", "memory": "1Gi"})
    [problem] = quota_problems(ms, [quota])
    assert "(hard 4Gi, used 1Gi)" in problem, problem
    assert "1073741824" not in problem


def test_a_cluster_that_cannot_start_says_so_in_one_stable_sentence():
    """An image no node can pull: at once, the same sentence whichever of the kubelet's two
    reasons it shows; a pod no node has room for: after the grace, in the scheduler's words."""
    def pulling(reason, message):
        p = pod("worker-0", "Pending", ready=False)
        p["status"]["containerStatuses"][0].update(
            image="nope/missing:1", state={"waiting": {"reason": reason, "message": message}})
        return p

    failed = 'failed to pull and unpack image "docker.io/nope/missing:1": not found'
    first = state.cannot_start(view(pulling("ErrImagePull", failed), pod("ps-0")), now=0)
    backoff = f'Back-off pulling image "nope/missing:1": ErrImagePull: {failed}'
    again = state.cannot_start(view(pulling("ImagePullBackOff", backoff), pod("ps-0")), now=0)
    assert first == again == (
        "cannot start: worker-0: its image 'nope/missing:1' cannot be pulled: " + failed +
        "; launch with an --image the nodes can pull (or ask your administrator to make this one "
        "available); then stop this cluster and launch again")
    unschedulable = pod("worker-1", "Pending", ready=False, conditions=[{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        "message": "0/1 nodes are available: 1 Insufficient cpu."}])
    born = state.parse_time("2026-01-01T00:00:00Z")
    v = view(unschedulable, pod("ps-0"), pod("worker-0"))
    assert state.cannot_start(v, now=born + 119) is None  # a node may still be on its way
    assert state.cannot_start(v, now=born + 121) == (
        "cannot start: worker-1 has fit on no node for more than 120 s (0/1 nodes are available: "
        "1 Insufficient cpu.): stop this cluster and launch it asking for less (--cpu, --memory, "
        "fewer tasks), or ask your administrator for larger nodes")
    assert state.cannot_start(view(pod("ps-0"), pod("worker-0")), now=born + 999) is None


def test_start_up_probe_failures_and_a_deleted_namesakes_events_are_not_shown():
    probe = {"reason": "Unhealthy", "message": "Readiness probe failed: ", "type": "Warning",
             "firstTimestamp": "2026-01-01T00:00:05Z", "lastTimestamp": "2026-01-01T00:00:07Z"}
    became_ready = pod("worker-0", conditions=[{"type": "Ready", "status": "True",
                                                "lastTransitionTime": "2026-01-01T00:00:08Z"}])
    assert state.startup_probe_noise(probe, became_ready)  # before TensorFlow listened
    assert state.startup_probe_noise(probe, pod("worker-0", ready=False))  # still starting
    later = {**probe, "firstTimestamp": "2026-01-01T00:05:00Z", "lastTimestamp": "2026-01-01T00:05:00Z"}
    was_ready = pod("worker-0", ready=False, conditions=[{"type": "Ready", "status": "False",
                                                         "lastTransitionTime": "2026-01-01T00:05:00Z"}])
    was_ready["status"]["containerStatuses"][0]["state"] = {"running": {"startedAt": "2026-01-01T00:00:01Z"}}
    assert not state.startup_probe_noise(later, was_ready)  # it had answered, then stopped
    assert not state.startup_probe_noise({**probe, "reason": "BackOff"}, became_ready)

    born = state.parse_time("2026-01-01T01:00:00Z")
    old = {"reason": "Killing", "lastTimestamp": "2026-01-01T00:59:59Z",
           "involvedObject": {"kind": "Pod", "name": "c-worker-0-0-abc", "uid": "old-pod"}}
    assert state.of_another_incarnation(old, born, {"new-pod"})
    same_second = {**old, "lastTimestamp": "2026-01-01T01:00:00Z"}
    assert state.of_another_incarnation(same_second, born, {"new-pod"})
    assert not state.of_another_incarnation({**same_second, "involvedObject": {"uid": "new-pod"}},
                                            born, {"new-pod"})
    assert not state.of_another_incarnation({**old, "lastTimestamp": "2026-01-01T01:00:01Z"},
                                            born, {"new-pod"})


def test_a_gpu_quota_counts_gpus_without_asking_every_pod_to_name_one():
    # the API server requires only CPU and memory to be named; a pod without GPUs uses none
    quota = {"metadata": {"name": "q"}, "spec": {"hard": {"requests.nvidia.com/gpu": "0"}}}
    assert quota_problems(_manifests(worker={"cpu": "1"}), [quota]) == []
    (problem,) = quota_problems(_manifests(worker={"cpu": "1", "gpus": 1}), [quota])
    assert problem.startswith("the cluster needs requests.nvidia.com/gpu 2 but ResourceQuota q leaves 0")


def test_a_scoped_quota_counts_only_the_pods_in_its_scope():
    # the bootstrap's CrossNamespacePodAffinity quota holds no pod: the lab's own pods are not in it
    no_cross = {
        "metadata": {"name": "x"},
        "spec": {
            "hard": {"pods": "0"},
            "scopeSelector": {
                "matchExpressions": [{"scopeName": "CrossNamespacePodAffinity", "operator": "Exists"}]
            },
        },
    }
    ms = _manifests(worker={"cpu": "1"})
    assert quota_problems(ms, [no_cross]) == []
    jobset = next(m for m in ms if m["kind"] == "JobSet")
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {}, "topologyKey": "kubernetes.io/hostname", "namespaceSelector": {}}
            ]
        }
    }
    (problem,) = quota_problems(ms, [no_cross])
    assert "ResourceQuota x leaves 0" in problem
    # a scope this check does not evaluate is left to the API server
    priority = {
        "metadata": {"name": "p"},
        "spec": {
            "hard": {"pods": "0"},
            "scopeSelector": {
                "matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["x"]}]
            },
        },
    }
    assert quota_problems(ms, [priority]) == []


def test_the_workload_kueue_made_for_this_jobset_is_told_from_a_namesakes_by_its_digest():
    """Kueue judges a gang within the second its JobSet was made: the ``Pending`` Event of the
    Workload (a uid the cluster never sees) has the cluster's creation second, which the
    same-second rule took for a deleted namesake's, so the reason never showed. Pairs of a JobSet
    uid and the Workload name Kueue v0.17 gave it, read from the test cluster."""
    made = {"jobset-gang2-2ca58": ("gang2", "04b9a62b-72f0-456d-b2df-d4eba835e523"),
            "jobset-gang-b8512": ("gang", "165bf708-f8f4-482d-9f30-b9b006be9685")}
    for workload, (cluster, uid) in made.items():
        involved = {"kind": "Workload", "name": workload, "uid": "wl"}
        assert state.is_own_kueue_workload(involved, cluster, uid)
        assert not state.is_own_kueue_workload(involved, cluster, "d3c0a1e5-0000-4000-8000-000000000000")
        assert not state.is_own_kueue_workload(involved, cluster, None)
        assert not state.is_own_kueue_workload({**involved, "kind": "Pod"}, cluster, uid)


def test_a_listed_status_is_handed_out_as_a_copy_its_reader_may_change():
    """``list_clusters`` keeps each cluster's status while its objects keep their versions and
    hands out copies: what a reader changes in one never reaches the kept one."""
    from tfk8s_magics.backends.base import ClusterStatus, TaskStatus

    kept = ClusterStatus(name="a", backend="kubernetes", mode="between", phase=Phase.RUNNING,
                         tasks=[TaskStatus("ps-0", Phase.RUNNING), TaskStatus("worker-0", Phase.PENDING)])
    copy = state.copy_status(kept)
    assert copy == kept and copy is not kept
    copy.reason = "changed"
    copy.tasks[1].reason = "changed"
    copy.tasks.append(TaskStatus("worker-1", Phase.RUNNING))
    assert kept.reason == "" and kept.tasks[1].reason == "" and len(kept.tasks) == 2
