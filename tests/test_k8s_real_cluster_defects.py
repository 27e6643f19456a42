"""Issue 23, "What a real cluster shows": each defect the review traced against the real
sources, reproduced on the API double taught the real behaviour (tests/kubeapi).

The same fixes are proven on the real cluster in tests/test_k8s_issue23_real.py (``k8s``).
"""

from __future__ import annotations

import threading
import time

import pytest

from tfk8s_magics.backends.base import Phase
from tfk8s_magics.backends.kubernetes import KubernetesBackend
from tfk8s_magics.backends.kubernetes.logs import LogCursor, container_terminated, stamp_key
from tfk8s_magics.backends.kubernetes.rbac import backend_role
from tfk8s_magics.spec import ClusterSpec, Resources

NS = "alice"
SCRIPT = "print('training')\n"
BOUND = 15.0


def spec(name="mnist", **kw) -> ClusterSpec:
    kw.setdefault("ps", 0)
    kw.setdefault("workers", 1)
    kw.setdefault("script", SCRIPT)
    return ClusterSpec(name=name, **kw)


def env(kube, **kw) -> KubernetesBackend:
    kube.create_namespace(NS)
    kube.set_role(backend_role(NS), NS, service_account="jupyter")
    return KubernetesBackend(namespace=NS, api_client=kube.api_client, user="alice",
                             storage_class="standard", **kw)


def wait_for(predicate, what, timeout=BOUND):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


# -- 1. followed logs -----------------------------------------------------------------------

def test_the_log_cursor_drops_what_a_reopened_stream_repeats_and_nothing_else():
    c = LogCursor()
    first = ["2026-01-01T00:00:01.5Z", "2026-01-01T00:00:01.700000000Z",
             "2026-01-01T00:00:01.700000000Z"]
    assert [c.fresh(s) for s in first] == [True, True, True]
    assert c.since == "2026-01-01T00:00:01.700000000Z"
    c.reopened()  # the server starts again at the second (sinceTime to the second)
    again = [*first, "2026-01-01T00:00:01.700000000Z", "2026-01-01T00:00:02Z"]
    assert [c.fresh(s) for s in again] == [False, False, False, True, True]
    assert stamp_key("2026-01-01T00:00:01.5Z") == stamp_key("2026-01-01T00:00:01.500000000Z")
    assert container_terminated({"status": {"phase": "Running", "containerStatuses": [
        {"state": {"terminated": {"exitCode": 0}}}]}})
    assert not container_terminated({"status": {"phase": "Running", "containerStatuses": [
        {"state": {"running": {}}}]}})


def _follow(backend, name):
    stop = threading.Event()
    lines: list = []
    follower = threading.Thread(target=lambda: lines.extend(
        line for line in backend.follow_logs(name, stop)), daemon=True)
    follower.start()
    return stop, lines, follower


def test_a_task_quiet_for_longer_than_the_request_timeout_is_still_followed(make_kube):
    kube = make_kube()
    backend = env(kube, request_timeout=1.0)  # a read timeout would end the stream at 1 s
    backend.launch(spec(), detach=True)
    pod = kube.jobsets.pod_name(NS, "mnist", "worker", 0)
    stop, lines, follower = _follow(backend, "mnist")
    kube.kubelet.run(NS, pod)
    kube.kubelet.log(NS, pod, "importing tensorflow")
    wait_for(lambda: [ln.text for ln in lines] == ["importing tensorflow"], "the first line")
    time.sleep(2.5)  # silence: longer than the request timeout
    kube.kubelet.log(NS, pod, "epoch 1")
    wait_for(lambda: [ln.text for ln in lines][-1:] == ["epoch 1"], "the line after the silence")
    # one stream all along: the quiet did not time it out (no read timeout on a follow)
    assert len([r for r in kube.requests if r.resource_path == "pods/log"]) == 1
    kube.kubelet.succeed(NS, pod)
    kube.jobsets.finish(NS, "mnist")
    follower.join(BOUND)
    assert not follower.is_alive()
    assert [ln.text for ln in lines] == ["importing tensorflow", "epoch 1"]
    backend.close()


def test_a_dropped_stream_is_reopened_where_it_stopped_no_line_twice_none_lost(make_kube):
    kube = make_kube()
    backend = env(kube)
    backend.launch(spec(), detach=True)
    pod = kube.jobsets.pod_name(NS, "mnist", "worker", 0)
    stop, lines, follower = _follow(backend, "mnist")
    kube.kubelet.run(NS, pod)
    for i in range(5):
        kube.kubelet.log(NS, pod, f"line {i}")
    wait_for(lambda: len(lines) == 5, "five lines")
    opened = len([r for r in kube.requests if r.resource_path == "pods/log"])
    kube.api.drop_log_streams()  # the server ends the stream; the container runs on
    wait_for(lambda: len([r for r in kube.requests if r.resource_path == "pods/log"]) > opened,
             "the stream re-opened")
    reopened = [r for r in kube.requests if r.resource_path == "pods/log"][-1]
    assert "sinceTime" in reopened.query and reopened.query.get("timestamps") == "true"
    for i in range(5, 8):
        kube.kubelet.log(NS, pod, f"line {i}")
    kube.kubelet.succeed(NS, pod)
    kube.jobsets.finish(NS, "mnist")
    follower.join(BOUND)
    assert not follower.is_alive()
    assert [ln.text for ln in lines] == [f"line {i}" for i in range(8)]
    assert all(r.allowed for r in kube.requests)
    backend.close()


# -- 3. detached clusters and served models survive the hub's stop hook ---------------------

def _deployment(name: str, component: str) -> dict:
    labels = {"app.kubernetes.io/managed-by": "tfk8s", "tfk8s.io/component": component,
              "app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "c", "image": "x:1"}]}}}}


def test_the_hub_stop_hook_keeps_detached_clusters_and_served_models(make_kube):
    import asyncio
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    import kubernetes.client

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "hub_config"))
    from tfk8s_hub.settings import LabSettings
    from tfk8s_hub.spawner import make_post_stop_hook

    kube = make_kube()
    backend = env(kube)
    backend.launch(spec("attached"), detach=True)
    backend.launch(spec("away"), detach=True)
    # "attached" stands for a run whose notebook stops it: relabel it as launched attached
    js = kube.get_object("jobsets", "attached", NS)
    assert js["metadata"]["labels"]["tfk8s.io/detached"] == "true"
    custom = kubernetes.client.CustomObjectsApi(kube.admin_api_client)
    custom.patch_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", NS, "jobsets",
                                          "attached", {"metadata": {"labels": {
                                              "tfk8s.io/detached": None}}})
    kube.create_object(_deployment("away-serving", "serving"))
    kube.create_object(_deployment("attached-tensorboard", "tensorboard"))
    apis = {"AppsV1Api": kubernetes.client.AppsV1Api(kube.admin_api_client),
            "CustomObjectsApi": custom}
    hook = make_post_stop_hook(LabSettings(), api=apis.__getitem__)
    asyncio.run(hook(SimpleNamespace(namespace=NS, log=SimpleNamespace(info=lambda *a: None))))
    wait_for(lambda: kube.get_object("jobsets", "attached", NS) is None, "the attached JobSet gone")
    assert kube.get_object("jobsets", "away", NS) is not None  # detached: left running
    assert kube.get_object("deployments", "away-serving", NS) is not None  # a served model
    assert kube.get_object("deployments", "attached-tensorboard", NS) is None
    backend.close()


def test_ttl_is_an_option_of_the_magic_cli_api_and_hub_and_detached_runs_get_the_admin_default(
        make_kube, monkeypatch):
    import sys
    from pathlib import Path

    from tfk8s_magics import api, options

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "hub_config"))
    from tfk8s_hub.settings import LabSettings

    from tfk8s_magics import cli

    for parser in (cli._parser(), options.build_parser("%tfcluster", options.defaults())):
        for command in ("launch", "render"):
            assert parser.parse_args([command, "x", "--ttl", "600"]).ttl == 600.0
    assert api.make_spec("x", script=SCRIPT, ttl=600).ttl_after_finished == 600.0
    monkeypatch.setenv("TFK8S_TTL", "120")  # the hub's default reaches the spec
    assert api.make_spec("x", script=SCRIPT).ttl_after_finished == 120.0
    monkeypatch.delenv("TFK8S_TTL")
    assert LabSettings(default_ttl=300, detached_ttl=3600).extension_environment()[
        "TFK8S_DETACHED_TTL"] == "3600"
    assert "TFK8S_TTL" not in LabSettings().extension_environment()  # unset: no variable
    kube = make_kube()
    backend = env(kube)
    rendered = backend.render(api.make_spec("x", script=SCRIPT, ttl=60))
    assert [m["spec"]["ttlSecondsAfterFinished"] for m in rendered if m["kind"] == "JobSet"] == [60]
    monkeypatch.setenv("TFK8S_DETACHED_TTL", "86400")
    backend.launch(spec("away"), detach=True)
    backend.launch(spec("mine", ttl_after_finished=30), detach=True)
    assert kube.get_object("jobsets", "away", NS)["spec"]["ttlSecondsAfterFinished"] == 86400
    assert kube.get_object("jobsets", "mine", NS)["spec"]["ttlSecondsAfterFinished"] == 30
    backend.close()


# -- 6. a cluster name equal to an existing Service -----------------------------------------

def test_a_name_another_service_has_is_refused_before_anything_is_created(make_kube):
    from tfk8s_magics.errors import LaunchFailed

    kube = make_kube()
    backend = env(kube)
    kube.create_object({"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": "mnist", "namespace": NS,
        "labels": {"tfk8s.io/cluster": "other", "tfk8s.io/component": "tensorboard"}},
        "spec": {"ports": [{"port": 6006}], "selector": {"app": "tb"}}})
    with pytest.raises(LaunchFailed, match=r"cluster name 'mnist' is taken by the tensorboard "
                       r"Service of cluster 'other' .* choose another name"):
        backend.launch(spec("mnist"), detach=True)
    for kind in ("configmaps", "jobsets", "persistentvolumeclaims"):
        assert kube.list_objects(kind, NS, "tfk8s.io/cluster=mnist") == []
    backend.close()


# -- 7. the smaller sentences ----------------------------------------------------------------

def _refusal(status: int, message: str):
    import json

    from kubernetes.client.rest import ApiException

    e = ApiException(status=status, reason="Forbidden")
    e.body = json.dumps({"kind": "Status", "message": message, "code": status})
    return e


def test_a_webhook_denial_is_not_reported_as_missing_rbac():
    from tfk8s_magics.backends.kubernetes.apply import failure_sentence

    manifest = {"kind": "JobSet", "metadata": {"name": "mnist"}}
    for message in ('admission webhook "vjobset.kb.io" denied the request: spec.replicatedJobs[0]'
                    ': Invalid value', 'admission webhook "vjobset.kueue.x-k8s.io" denied the '
                    'request: the queue does not exist'):
        sentence = failure_sentence(_refusal(403, message), manifest, NS)
        assert sentence.startswith(f"the {message.split(chr(34))[1]} admission webhook refused "
                                   "JobSet mnist (")
        assert "Role" not in sentence and "service account" not in sentence
    rbac = failure_sentence(_refusal(403, 'jobsets.jobset.x-k8s.io is forbidden: User "x" '
                                          'cannot create resource'), manifest, NS)
    assert "bind the tfk8s-backend" in rbac


def test_a_node_listing_refusal_says_nodes_not_quota(make_kube):
    from tfk8s_magics.backends.kubernetes.apply import preflight
    from tfk8s_magics.errors import LaunchFailed

    kube = make_kube()
    backend = env(kube)
    with pytest.raises(LaunchFailed, match=r"the node check \(check_nodes\) needs to list the "
                       r"cluster's nodes, which the notebook's service account may not") as e:
        preflight(backend.api, backend.render(spec()), check_nodes=True)
    assert "quota" not in str(e.value)
    backend.close()


def test_delete_waits_longer_than_a_backup_step_may_drain():
    from tfk8s_magics.backends.kubernetes.backend import delete_wait
    from tfk8s_magics.backends.kubernetes.storage_pods import BACKUP_GRACE

    assert delete_wait(spec(backup_url="s3://bucket/run")) > BACKUP_GRACE
    assert delete_wait(spec(ps=1, ps_grace_period=600)) > 600


# -- 2. pods the Job controller cannot create -------------------------------------------------

def _quota(kube, hard: dict) -> None:
    kube.create_object({"apiVersion": "v1", "kind": "ResourceQuota",
                        "metadata": {"name": "tfk8s-quota", "namespace": NS},
                        "spec": {"hard": hard}})


def test_a_task_whose_pod_cannot_be_created_shows_the_jobs_failed_create_everywhere(
        make_kube, monkeypatch):
    from tfk8s_magics.backends.kubernetes import state

    kube = make_kube(jobset_in_order=True)
    backend = env(kube)
    # InOrder: the worker's pod is created once the parameter server's is ready
    backend.launch(spec("late", ps=1, workers=1), detach=True)
    (ps,) = kube.jobsets.pods(NS, "late")
    # meanwhile the quota shrank (another launch took the room): the worker's pod is refused
    # (the double creates a pod once; the Job controller would retry for ever)
    _quota(kube, {"pods": "1"})
    kube.kubelet.run(NS, ps["metadata"]["name"])
    want = r"FailedCreate: Error creating: pods \"late-worker-0-0-.*\" is forbidden: exceeded quota"
    import re
    # (Events are listed at most every EVENT_PERIOD seconds while a task waits unexplained)
    wait_for(lambda: re.match(want, backend.status("late").task("worker-0").reason), "the reason",
             timeout=40)
    listed = {c.name: c for c in backend.list_clusters()}
    assert re.match(want, listed["late"].task("worker-0").reason)
    # after the grace, the cluster says it (like a stall), and records it once
    monkeypatch.setattr(state, "CREATE_GRACE", 0.0)
    snap = backend.status("late")
    assert snap.phase == Phase.PENDING
    assert snap.reason.startswith("pods cannot be created for ") and "exceeded quota" in snap.reason
    assert [e.reason for e in backend.events("late") if e.reason == "FailedCreate" and not e.task]
    backend.close()


def test_the_preflight_counts_the_pods_other_clusters_are_still_to_create(make_kube):
    from tfk8s_magics.errors import LaunchFailed

    kube = make_kube(jobset_in_order=True)
    backend = env(kube)
    _quota(kube, {"requests.cpu": "4"})
    # InOrder: the workers' pods wait for the parameter server's to be ready; used = 1 CPU
    one = {r: Resources(cpu="1") for r in ("ps", "worker")}
    first = spec("first", ps=1, workers=2, resources=one)
    js = backend.render(first)
    assert [m for m in js if m["kind"] == "JobSet"][0]["spec"]["startupPolicy"][
        "startupPolicyOrder"] == "InOrder"
    backend.launch(first, detach=True)
    assert len(kube.jobsets.pods(NS, "first")) == 1
    # 2 CPUs are free by status.used, but "first" is still to create 2 pods of 1 CPU
    with pytest.raises(LaunchFailed, match=r"needs requests.cpu 2 .* leaves 1 .*2 for pods other "
                       r"clusters are still to create.*--queue"):
        backend.launch(spec("second", workers=2, resources=one), detach=True)
    assert kube.get_object("configmaps", "second", NS) is None
    backend.close()


def test_a_priority_class_that_does_not_exist_is_refused_before_anything_is_created(make_kube):
    from tfk8s_magics.errors import LaunchFailed

    kube = make_kube()
    backend = env(kube)
    # the chart's rbac.readPriorityClasses: get on priorityclasses, cluster-wide
    kube.set_role(backend_role(NS), NS, service_account="jupyter", cluster_rules=[{
        "apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"], "verbs": ["get"]}])
    with pytest.raises(LaunchFailed, match=r"--priority 'hihg': the cluster has no PriorityClass"):
        backend.launch(spec("mnist", priority="hihg"), detach=True)
    assert kube.get_object("configmaps", "mnist", NS) is None
    kube.create_object({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                        "metadata": {"name": "high"}, "value": 1000})
    backend.launch(spec("mnist", priority="high"), detach=True)
    assert kube.jobsets.pods(NS, "mnist")[0]["spec"]["priority"] == 1000
    backend.close()


def test_without_the_right_to_read_priority_classes_the_status_explains_the_refusal(make_kube):
    import re

    kube = make_kube()
    backend = env(kube)  # the namespace Role only: cannot get PriorityClasses (403)
    backend.launch(spec("mnist", priority="hihg"), detach=True)
    wait_for(lambda: re.search(r"FailedCreate: .*no PriorityClass with name hihg was found",
                               backend.status("mnist").task("worker-0").reason), "the reason")
    assert all(r.allowed for r in kube.requests)  # it asked (SelfSubjectAccessReview) first
    backend.close()


# -- 8. JobSet v0.7 at least ---------------------------------------------------------------

def test_a_jobset_older_than_v0_7_is_refused_at_launch_and_rolled_back(make_kube, monkeypatch):
    import copy
    import functools

    import jsonschema

    from tests.kubeapi import crd
    from tfk8s_magics.errors import LaunchFailed

    # JobSet v0.6's CRD: failurePolicy has no restartStrategy (added in v0.7.0)
    v06 = copy.deepcopy(crd.schema("jobset.x-k8s.io/v1alpha2", "JobSet"))
    del v06["properties"]["spec"]["properties"]["failurePolicy"]["properties"]["restartStrategy"]
    monkeypatch.setattr(crd, "schema", lambda *a: v06)
    monkeypatch.setattr(crd, "_validator", functools.cache(
        lambda *a: jsonschema.Draft7Validator(v06)))
    kube = make_kube()
    backend = env(kube)
    with pytest.raises(LaunchFailed, match=r"this cluster runs JobSet older than v0.7, which tfk8s "
                       r"needs .* upgrade JobSet to v0.7 or newer"):
        backend.launch(spec("mnist"), detach=True)
    for kind in ("configmaps", "jobsets", "persistentvolumeclaims"):
        assert kube.list_objects(kind, NS, "tfk8s.io/cluster=mnist") == []
    (create,) = [r for r in kube.requests if r.resource == "jobsets" and r.verb == "create"]
    assert create.query.get("fieldValidation") == "Strict"
    backend.close()


# -- 8. storage the tasks cannot write to ---------------------------------------------------------

def test_a_task_on_storage_it_cannot_write_ends_in_one_sentence_and_is_not_retried(
        tmp_path, monkeypatch):
    import json
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from tfk8s_magics import lifecycle
    from tfk8s_magics.runtime import task

    base = Path(tempfile.mkdtemp(prefix="tfk8s-fsgroup-", dir="/tmp"))  # reachable by nobody
    base.chmod(0o755)
    request_cleanup = shutil.rmtree
    log = base / "log"
    log.mkdir()
    log.chmod(0o555)  # what a volume without fsGroup support looks like to the pod's uid
    term = base / "term"
    term.touch()
    term.chmod(0o666)
    for key, value in {"TFK8S_LOG_DIR": str(log), "TFK8S_TERMINATION_FILE": str(term),
                       "TF_CONFIG": json.dumps({"cluster": {"worker": ["localhost:1"]},
                                                "task": {"type": "worker", "index": 0}}),
                       "TFK8S_TASK": "worker-0", "TFK8S_SCRIPT": str(tmp_path / "never.py")}.items():
        monkeypatch.setenv(key, value)
    # as root every directory is writable: the task runs as nobody in a child, as a pod runs
    # as non-root (the runtime's main, in-process: no interpreter start under load)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 99
        try:
            if os.getuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            code = task.main()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == lifecycle.EXIT_SCRIPT_BROKEN
    sentence = term.read_text()
    assert sentence.startswith(f"{lifecycle.SCRIPT_BROKEN}: the log directory {log} is not "
                               "writable by this task (uid ")
    assert "Permission denied" in sentence and "fsGroup" in sentence
    request_cleanup(base)
