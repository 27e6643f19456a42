"""The Kubernetes backend on a REAL control plane (tier 1: ``scripts/kube up``), as a lab user.

Real kube-apiserver (RBAC, PodSecurity, LimitRanger, ResourceQuota, ValidatingAdmissionPolicy,
webhooks), kube-controller-manager (Jobs, GC, quota status, namespaces), kube-scheduler, JobSet's
and Kueue's own controllers; kwok plays the nodes and the pods' phases. Every call of the backend
is made with the user's own ServiceAccount token from the hub's bootstrap, and the API server's
audit log proves every request was allowed and stayed in the user's namespace. A pod "ends" when
the test labels it (kwok's stage); what follows — restarts, success, failure, TTL — is decided by
JobSet's controller, not by us.
"""

from __future__ import annotations

import pytest

from tests.realkube import wait_for
from tfk8s_magics.backends.base import Phase
from tfk8s_magics.spec import ClusterSpec

pytestmark = pytest.mark.k8s

SCRIPT = "print('training')\n"


@pytest.fixture
def user(kube_user):
    """A bootstrapped user namespace and a backend acting as its ServiceAccount."""
    return kube_user("alice")


def spec(name="mnist", **kw) -> ClusterSpec:
    kw.setdefault("ps", 1)
    kw.setdefault("workers", 2)
    kw.setdefault("ps_grace_period", 0.5)
    if kw.get("mode") != "in-graph":
        kw.setdefault("script", SCRIPT)
    return ClusterSpec(name=name, **kw)


def task_pods(kube, ns, name, role=None):
    sel = f"jobset.sigs.k8s.io/jobset-name={name}"
    if role:
        sel += f",jobset.sigs.k8s.io/replicatedjob-name={role}"
    return [p for p in kube.pods(ns, sel) if p.metadata.deletion_timestamp is None]


def jobset(kube, ns, name):
    return kube.custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets", name)


def wait_phase(backend, name, phases, timeout=90):
    return wait_for(
        lambda: (s := backend.status(name)).phase in phases and s,
        timeout,
        message=f"{name} to reach {phases}",
    )


def test_a_user_launches_and_every_task_runs_on_the_real_api_server(realkube, user):
    ns, backend = user
    backend.launch(spec())
    wait_for(
        lambda: len([p for p in task_pods(realkube, ns.name, "mnist") if p.status.phase == "Running"]) == 3,
        90,
        message="3 running task pods",
    )
    st = wait_phase(backend, "mnist", {Phase.RUNNING})
    assert st.phase == Phase.RUNNING
    # the JobSet's real controller made one Job per role and the headless Service for DNS
    js = jobset(realkube, ns.name, "mnist")
    assert {r["name"] for r in js["spec"]["replicatedJobs"]} == {"ps", "worker"}
    svc = realkube.core.read_namespaced_service(
        js["spec"]["network"]["subdomain"] if js["spec"].get("network", {}).get("subdomain") else "mnist",
        ns.name,
    )
    assert svc.spec.cluster_ip == "None"
    # under Pod Security "restricted" (the namespace label the hub sets)
    labels = realkube.core.read_namespace(ns.name).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    names = [c.name for c in backend.list_clusters()]
    assert names == ["mnist"]


def test_workers_that_succeed_end_the_cluster_as_jobset_decides(realkube, user):
    ns, backend = user
    backend.launch(spec("done"))
    wait_for(
        lambda: (
            len(task_pods(realkube, ns.name, "done", "worker")) == 2
            and all(p.status.phase == "Running" for p in task_pods(realkube, ns.name, "done"))
        ),
        90,
        message="running pods",
    )
    for p in task_pods(realkube, ns.name, "done", "worker"):
        realkube.exit_pod(ns.name, p.metadata.name, 0)
    st = wait_phase(backend, "done", {Phase.SUCCEEDED, Phase.FAILED})
    assert st.phase == Phase.SUCCEEDED, st
    conds = {
        c["type"]: c["status"] for c in jobset(realkube, ns.name, "done")["status"].get("conditions", [])
    }
    assert conds.get("Completed") == "True"
    # the parameter server is not left running once JobSet has decided (JobSet >= 0.7)
    wait_for(
        lambda: not [p for p in task_pods(realkube, ns.name, "done", "ps") if p.status.phase == "Running"],
        60,
        message="the parameter server to end",
    )


def test_a_killed_worker_is_restarted_by_jobset_within_the_budget(realkube, user):
    """A signal (exit >= 128) is retried: JobSet recreates every Job, until the budget is spent."""
    ns, backend = user
    backend.launch(spec("flaky", restart_budget=1))
    wait_for(
        lambda: (
            all(p.status.phase == "Running" for p in task_pods(realkube, ns.name, "flaky"))
            and len(task_pods(realkube, ns.name, "flaky")) == 3
        ),
        90,
        message="running pods",
    )
    w0 = task_pods(realkube, ns.name, "flaky", "worker")[0]
    realkube.exit_pod(ns.name, w0.metadata.name, 137)
    wait_for(
        lambda: jobset(realkube, ns.name, "flaky").get("status", {}).get("restarts", 0) >= 1,
        90,
        message="JobSet to restart the cluster",
    )
    wait_for(
        lambda: (
            len(task_pods(realkube, ns.name, "flaky")) == 3
            and all(p.status.phase == "Running" for p in task_pods(realkube, ns.name, "flaky"))
        ),
        90,
        message="the restarted pods to run",
    )
    st = backend.status("flaky")
    assert st.phase == Phase.RUNNING, st
    # a second failure spends the budget: JobSet fails the cluster, and the status says so
    w0 = task_pods(realkube, ns.name, "flaky", "worker")[0]
    realkube.exit_pod(ns.name, w0.metadata.name, 137)
    st = wait_phase(backend, "flaky", {Phase.FAILED})
    assert st.phase == Phase.FAILED
    assert st.reason, "a failed cluster says why"


def test_an_error_in_the_users_script_fails_at_once_without_spending_the_budget(realkube, user):
    ns, backend = user
    backend.launch(spec("oops", restart_budget=3))
    wait_for(
        lambda: (
            len(task_pods(realkube, ns.name, "oops")) == 3
            and all(p.status.phase == "Running" for p in task_pods(realkube, ns.name, "oops"))
        ),
        90,
        message="running pods",
    )
    realkube.exit_pod(ns.name, task_pods(realkube, ns.name, "oops", "worker")[1].metadata.name, 1)
    st = wait_phase(backend, "oops", {Phase.FAILED})
    assert st.phase == Phase.FAILED
    assert jobset(realkube, ns.name, "oops").get("status", {}).get("restarts", 0) == 0


def test_delete_leaves_nothing_behind(realkube, user):
    ns, backend = user
    backend.launch(spec("gone"))
    wait_for(lambda: len(task_pods(realkube, ns.name, "gone")) == 3, 90, message="pods")
    backend.delete("gone")

    def leftovers():
        sel = "tfk8s.io/cluster=gone"
        found = []
        found += [
            p.metadata.name for p in realkube.core.list_namespaced_pod(ns.name, label_selector=sel).items
        ]
        found += [
            c.metadata.name
            for c in realkube.core.list_namespaced_config_map(ns.name, label_selector=sel).items
        ]
        found += [
            s.metadata.name for s in realkube.core.list_namespaced_service(ns.name, label_selector=sel).items
        ]
        found += [
            j["metadata"]["name"]
            for j in realkube.custom.list_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", ns.name, "jobsets"
            )["items"]
        ]
        return found

    wait_for(lambda: not leftovers(), 60, message="every object of the cluster to go")
    assert backend.list_clusters() == []


def test_a_detached_finished_cluster_is_removed_by_its_ttl_with_no_client(realkube, user):
    ns, backend = user
    backend.launch(spec("ttl", ttl_after_finished=3), detach=True)
    wait_for(
        lambda: (
            len(task_pods(realkube, ns.name, "ttl", "worker")) == 2
            and all(p.status.phase == "Running" for p in task_pods(realkube, ns.name, "ttl"))
        ),
        90,
        message="running pods",
    )
    backend.close()  # no client attached from here on
    for p in task_pods(realkube, ns.name, "ttl", "worker"):
        realkube.exit_pod(ns.name, p.metadata.name, 0)

    def gone():
        items = realkube.custom.list_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", ns.name, "jobsets"
        )["items"]
        return not [j for j in items if j["metadata"]["name"] == "ttl"]

    wait_for(gone, 90, message="JobSet's TTL to delete the finished cluster")


def test_a_bad_object_is_refused_by_the_real_admission_and_nothing_is_left(realkube, user):
    ns, backend = user
    # Pod Security "restricted" refuses a privileged task: the launch fails and rolls back
    from tfk8s_magics.errors import LaunchFailed, SpecError

    bad = spec("priv", priority="no-such-priority-class")
    with pytest.raises((LaunchFailed, SpecError)) as exc:
        backend.launch(bad)
        # the JobSet may be accepted and its pods refused later: then the status must say why
        # (the Job controller's FailedCreate names the class: "no pod" says nothing)
        st = wait_for(lambda: "no-such-priority-class" in (s := backend.status("priv")).reason
                      and s, 60, message="a reason naming the class")
        raise LaunchFailed(st.reason)
    assert "no-such-priority-class" in str(exc.value)


def test_kueue_admits_a_gang_or_keeps_it_queued(realkube, user):
    ns, backend = user
    flavor = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "default-flavor"},
    }
    cq = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": f"cq-{ns.name}"},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns.name}},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory"],
                    "flavors": [
                        {
                            "name": "default-flavor",
                            "resources": [
                                {"name": "cpu", "nominalQuota": "3"},
                                {"name": "memory", "nominalQuota": "12Gi"},
                            ],
                        }
                    ],
                }
            ],
        },
    }
    lq = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": "team", "namespace": ns.name},
        "spec": {"clusterQueue": f"cq-{ns.name}"},
    }
    realkube.apply([flavor, cq, lq])
    from tfk8s_magics.spec import Resources

    small = {"worker": Resources(cpu="1", memory="1Gi"), "ps": Resources(cpu="1", memory="1Gi")}
    backend.launch(spec("gang1", queue="team", resources=small))
    wait_for(lambda: len(task_pods(realkube, ns.name, "gang1")) == 3, 90, message="the admitted gang's pods")
    # the second gang does not fit beside the first: Kueue keeps it suspended, no pod at all
    backend.launch(spec("gang2", queue="team", resources=small))
    wait_for(
        lambda: jobset(realkube, ns.name, "gang2")["spec"].get("suspend") is True,
        30,
        message="Kueue to suspend the second gang",
    )
    st = backend.status("gang2")
    assert not task_pods(realkube, ns.name, "gang2")
    assert st.phase == Phase.PENDING
    assert st.reason.startswith("ps-0: waiting for admission by queue team"), st.reason
    # Kueue's own verdict (its Workload's Pending Event) is the reason of every task and an event
    st = wait_for(lambda: "insufficient unused quota" in (s := backend.status("gang2")).reason and s,
                  60, message="Kueue's Pending reason in the status")
    why = st.task("worker-1").reason.split("waiting for admission by queue team: ", 1)[1]
    assert "couldn't assign flavors to pod set" in why, why
    assert any(e.reason == "Pending" and e.message == why and e.type == "Warning"
               for e in backend.events("gang2"))
    # the first gang ends: the second is admitted as one
    for p in task_pods(realkube, ns.name, "gang1", "worker"):
        realkube.exit_pod(ns.name, p.metadata.name, 0)
    wait_for(
        lambda: len(task_pods(realkube, ns.name, "gang2")) == 3, 120, message="the queued gang to be admitted"
    )
    assert not jobset(realkube, ns.name, "gang2")["spec"].get("suspend")
    wait_phase(backend, "gang2", {Phase.RUNNING})  # admitted, running
