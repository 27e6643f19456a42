"""Issue 23, "What a real cluster shows": the pure rules of each fix, and the few behaviours the
real cluster cannot produce on demand, on the API double (tests/kubeapi): a log stream the server
drops mid-follow, a JobSet CRD older than v0.7, a JobSet whose InOrder start holds pods back while
a quota is counted, and a notebook that may not read PriorityClasses (the test cluster's chart may
grant it).

Every other fix is proven on the real cluster as the user's ServiceAccount in
tests/test_k8s_defects_real.py (``k8s``); the log followed through a quiet period on real pods
in tests/test_k8s_pods.py.
"""

from __future__ import annotations

import threading
import time

import pytest

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


def test_ttl_is_an_option_of_the_magic_cli_api_and_hub(monkeypatch):
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
    backend = KubernetesBackend(namespace=NS, user="alice")  # render needs no cluster
    rendered = backend.render(api.make_spec("x", script=SCRIPT, ttl=60))
    assert [m["spec"]["ttlSecondsAfterFinished"] for m in rendered if m["kind"] == "JobSet"] == [60]
    # what a detached launch gets on the cluster (TFK8S_DETACHED_TTL):
    # tests/test_k8s_defects_real.py::test_detached_runs_get_the_admin_default_ttl_and_an_own_ttl_wins


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

    from tests import jobset_schema as crd
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
