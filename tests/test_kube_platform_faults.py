"""Faults of the platform itself, on the REAL control plane (``scripts/kube up``).

kube-apiserver and etcd are restarted mid-run (a restarted API server's watch cache starts at the
current revision, so every watch the notebook held resumes with ``410 Gone`` and must re-list);
JobSet's controller is stopped while a worker dies and started again; a task pod is deleted by hand
and another evicted through the Eviction API. Each time the backend's view must follow within
seconds, the run must end as JobSet decides, and ``delete`` must leave nothing.
"""

from __future__ import annotations

import time

import pytest

from tests.realkube import wait_for
from tests.test_kube_controlplane import jobset, spec, task_pods, wait_phase
from tfk8s_magics.backends.base import Phase

pytestmark = pytest.mark.k8s


@pytest.fixture
def devcluster():
    from devcluster.cluster import Cluster

    c = Cluster()
    yield c
    # whatever a test stopped runs again for the next one
    for name in ("etcd", "kube-apiserver", "jobset"):
        if not c.procs.alive(name):
            c.procs.restart(name)
    wait_for(lambda: c.get("/readyz", timeout=2)[0] == 200, 120, message="the API server after the test")


@pytest.fixture
def user(kube_user):
    # not strict: a request cut by the restarted API server is this module's point
    return kube_user("fault", user="fault", strict=False)


def _running(realkube, ns, name, n=3):
    wait_for(
        lambda: (
            len(pods := task_pods(realkube, ns, name)) == n and all(p.status.phase == "Running" for p in pods)
        ),
        90,
        message=f"{n} running pods of {name}",
    )


def _finish_workers(realkube, ns, name):
    for p in task_pods(realkube, ns, name, "worker"):
        realkube.exit_pod(ns, p.metadata.name, 0)


def _completed(js):
    return any(c.get("type") == "Completed" and c.get("status") == "True"
               for c in (js.get("status") or {}).get("conditions") or [])


def _ready(c):
    try:
        return c.get("/readyz", timeout=2)[0] == 200
    except OSError:
        return False


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
def test_the_view_resumes_after_the_control_plane_restarts(realkube, user, devcluster, component):
    ns, backend = user
    backend.launch(spec("steady"))
    _running(realkube, ns.name, "steady")
    assert backend.status("steady").phase == Phase.RUNNING
    devcluster.procs.restart(component, down_for=3)
    wait_for(lambda: _ready(devcluster), 120, message=f"the API server after {component} restarted")
    _finish_workers(realkube, ns.name, "steady")
    # the Job and JobSet controllers re-open their own watches (client-go backs off up to 30 s):
    # their time is theirs; the view must follow the API within seconds of the JobSet's end
    wait_for(lambda: _completed(jobset(realkube, ns.name, "steady")), 120,
             message=f"JobSet to complete the run after {component} restarted")
    t0 = time.monotonic()
    st = wait_phase(backend, "steady", {Phase.SUCCEEDED, Phase.FAILED}, timeout=60)
    assert st.phase == Phase.SUCCEEDED, st
    seen = time.monotonic() - t0
    assert seen < 30, f"the view followed the API {seen:.0f} s late"
    # the watches were re-opened (a re-list after the restart), not left dead
    relists = [r for r in ns.requests() if r.verb == "list" and r.resource in ("pods", "jobsets")]
    assert len(relists) >= 2, relists
    backend.delete("steady")
    wait_for(lambda: not task_pods(realkube, ns.name, "steady"), 60, message="pods gone after delete")


def test_jobset_down_while_a_worker_dies_restarts_when_it_comes_back(realkube, user, devcluster):
    ns, backend = user
    backend.launch(spec("ctl", restart_budget=2))
    _running(realkube, ns.name, "ctl")
    devcluster.procs.stop("jobset")
    realkube.exit_pod(ns.name, task_pods(realkube, ns.name, "ctl", "worker")[0].metadata.name, 137)
    time.sleep(3)
    assert jobset(realkube, ns.name, "ctl").get("status", {}).get("restarts", 0) == 0  # nobody decided yet
    # meanwhile the notebook says what happened and what JobSet will do (the budget left)
    st = wait_for(lambda: (s := backend.status("ctl")).reason.startswith("restarting") and s, 60,
                  message="the restarting reason while JobSet is down")
    assert (st.phase, st.reason) == (
        Phase.STARTING, "restarting: worker-0 failed: killed by SIGKILL (2 restarts left)")
    devcluster.procs.restart("jobset")
    wait_for(
        lambda: jobset(realkube, ns.name, "ctl").get("status", {}).get("restarts", 0) == 1,
        90,
        message="JobSet to restart the cluster once it runs again",
    )
    _running(realkube, ns.name, "ctl")
    assert backend.status("ctl").phase == Phase.RUNNING
    _finish_workers(realkube, ns.name, "ctl")
    assert wait_phase(backend, "ctl", {Phase.SUCCEEDED, Phase.FAILED}).phase == Phase.SUCCEEDED


@pytest.mark.parametrize("how", ["delete", "evict"])
def test_a_pod_removed_by_hand_or_evicted_is_replaced_and_the_run_finishes(realkube, user, how):
    ns, backend = user
    backend.launch(spec("gone", restart_budget=2))
    _running(realkube, ns.name, "gone")
    victim = task_pods(realkube, ns.name, "gone", "worker")[0].metadata.name
    if how == "delete":
        realkube.core.delete_namespaced_pod(victim, ns.name)
    else:
        realkube.core.create_namespaced_pod_eviction(
            victim,
            ns.name,
            {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": victim, "namespace": ns.name},
            },
        )
    wait_for(
        lambda: (
            victim not in [p.metadata.name for p in task_pods(realkube, ns.name, "gone")]
            or len(task_pods(realkube, ns.name, "gone")) == 3
        ),
        60,
        message="the pod to be replaced",
    )
    _running(realkube, ns.name, "gone")
    assert backend.status("gone").phase == Phase.RUNNING
    _finish_workers(realkube, ns.name, "gone")
    assert wait_phase(backend, "gone", {Phase.SUCCEEDED, Phase.FAILED}).phase == Phase.SUCCEEDED
    backend.delete("gone")
    wait_for(lambda: not task_pods(realkube, ns.name, "gone"), 60, message="pods gone after delete")
