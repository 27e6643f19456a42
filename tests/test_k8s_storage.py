"""Object storage on Kubernetes (issue 15): the ``sync`` and ``backup`` steps and the Secret.

Layers: the pure builders against literal dicts, the JobSet CRD schema (strict)
and the 1.29/1.37 Job schemas (``kubernetes-validate --strict``); the restricted
Pod Security profile by the real API server's dry-run (``k8s``); then the backend
against the API test double (a missing Secret, a Secret referenced by name only, the
steps in the status, a failed upload); the in-pod commands (``steps.py``, the marker ``logcopy`` leaves) run
for real as processes.  The real-cluster test (marker ``k8s``, ``scripts/kube up``) is at the
end of this file.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import kubernetes_validate
import pytest

from tests import jobset_schema as crd
from tests.test_lifecycle import TABLE as LIFECYCLE_TABLE
from tests.test_lifecycle import _what_jobset_does as what_jobset_does
from tfk8s_magics.backends.base import Phase
from tfk8s_magics.backends.kubernetes import KubernetesBackend, steps
from tfk8s_magics.backends.kubernetes import jobset as j
from tfk8s_magics.backends.kubernetes import storage_pods as sp
from tfk8s_magics.backends.kubernetes.rbac import backend_role
from tfk8s_magics.backends.kubernetes.settings import K8sSettings
from tfk8s_magics.errors import LaunchFailed, SpecError
from tfk8s_magics.lifecycle import LifecyclePolicy
from tfk8s_magics.spec import ClusterSpec
from tfk8s_magics.ui.render import header_html

NS = "alice"
SETTINGS = K8sSettings(namespace=NS, image="tfk8s/tensorflow-task:0.1.0", user="alice")
SCRIPT = "print('hi')\n"
DATA = "s3://bucket/datasets/mnist"
OUT = "s3://bucket/runs/mnist"
SECRET = "s3-creds"
#: Values that must never leave the Secret (the grep test looks for each of them).
SECRET_VALUES = {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLEKEYID0042",
                 "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY",
                 "AWS_ENDPOINT_URL": "http://127.0.0.1:59999/secret-endpoint"}
LABELS = {
    "app.kubernetes.io/managed-by": "tfk8s",
    "app.kubernetes.io/name": "tfk8s",
    "app.kubernetes.io/part-of": "tfk8s-lab",
    "app.kubernetes.io/instance": "mnist",
    "app.kubernetes.io/component": "task",
    "tfk8s.io/cluster": "mnist",
    "tfk8s.io/component": "task",
    "tfk8s.io/user": "alice",
}
SECURITY = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]}}
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 100,
                "fsGroupChangePolicy": "OnRootMismatch", "seccompProfile": {"type": "RuntimeDefault"}}
STEP_ENV = [{"name": "HOME", "value": "/tmp"}, {"name": "PYTHONUNBUFFERED", "value": "1"}]
RESOURCES = {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
ATTEMPT = {"name": "TFK8S_RESTART_ATTEMPT", "valueFrom": {"fieldRef": {
    "fieldPath": "metadata.labels['jobset.sigs.k8s.io/restart-attempt']"}}}
USER_CODES = [c for c in range(1, 128) if c != 75]


def mnist(**kw) -> ClusterSpec:
    kw.setdefault("workers", 2)
    return ClusterSpec(name="mnist", script=SCRIPT, owner="alice", **kw)


def synced_and_backed_up(**kw) -> ClusterSpec:
    return mnist(data_url=DATA, data_sync=True, backup_url=OUT, credentials_secret=SECRET, **kw)


def build(spec: ClusterSpec) -> dict:
    return j.jobset(spec, SETTINGS, LifecyclePolicy.of(spec))


def rjob(js: dict, name: str) -> dict:
    return next(r for r in js["spec"]["replicatedJobs"] if r["name"] == name)


def pod_spec(js: dict, name: str) -> dict:
    return rjob(js, name)["template"]["spec"]["template"]["spec"]


def step_job_spec(pod: dict) -> dict:
    return {
        "parallelism": 1, "completions": 1, "completionMode": "Indexed", "backoffLimit": 0,
        "podFailurePolicy": {"rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            # no containerName: every container of the step, its init container included
            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": USER_CODES}},
        ]},
        "template": pod,
    }


# -- the pure builders, literally ------------------------------------------------------

def test_sync_step_is_exactly_this():
    labels = {**LABELS, "tfk8s.io/role": "sync"}
    assert rjob(build(synced_and_backed_up()), "sync") == {
        "name": "sync", "replicas": 1,
        "template": {"metadata": {"labels": labels}, "spec": step_job_spec({
            "metadata": {"labels": labels},
            "spec": {
                "restartPolicy": "Never", "automountServiceAccountToken": False,
                "enableServiceLinks": False, "securityContext": POD_SECURITY,
                "initContainers": [{
                    "name": "fetch", "image": "tfk8s/tensorflow-task:0.1.0",
                    "command": ["/opt/storage/bin/python", "-m", "tfk8s_magics.storage", "fetch", DATA,
                                "/data"],
                    "env": STEP_ENV, "resources": RESOURCES, "securityContext": SECURITY,
                    "volumeMounts": [{"name": "data", "mountPath": "/data"},
                                     {"name": "tmp", "mountPath": "/tmp"}],
                    "envFrom": [{"secretRef": {"name": SECRET}}],
                }],
                "containers": [{
                    "name": "synced", "image": "tfk8s/tensorflow-task:0.1.0",
                    "command": ["/opt/storage/bin/python", "-m",
                                "tfk8s_magics.backends.kubernetes.steps", "synced", "/data"],
                    "env": STEP_ENV, "resources": RESOURCES, "securityContext": SECURITY,
                    "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True},
                                     {"name": "tmp", "mountPath": "/tmp"}],
                }],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "mnist-data"}},
                            {"name": "tmp", "emptyDir": {}}],
            },
        })},
    }


def test_backup_step_is_exactly_this():
    labels = {**LABELS, "tfk8s.io/role": "backup"}
    assert rjob(build(synced_and_backed_up()), "backup") == {
        "name": "backup", "replicas": 1,
        "template": {"metadata": {"labels": labels}, "spec": step_job_spec({
            "metadata": {"labels": labels},
            "spec": {
                "restartPolicy": "Never", "automountServiceAccountToken": False,
                "enableServiceLinks": False, "securityContext": POD_SECURITY,
                "terminationGracePeriodSeconds": 120,
                "containers": [{
                    "name": "backup", "image": "tfk8s/tensorflow-task:0.1.0",
                    "command": ["/opt/storage/bin/python", "-m",
                                "tfk8s_magics.backends.kubernetes.steps", "backup",
                                "--done-dir", "/log/.tfk8s/done/$(TFK8S_RESTART_ATTEMPT)",
                                "--tasks", "worker-0,worker-1", "--source", "/log", "--to", OUT],
                    "env": [ATTEMPT, *STEP_ENV], "resources": RESOURCES,
                    "securityContext": SECURITY,
                    "volumeMounts": [{"name": "log", "mountPath": "/log", "readOnly": True},
                                     {"name": "tmp", "mountPath": "/tmp"}],
                    "envFrom": [{"secretRef": {"name": SECRET}}],
                }],
                "volumes": [{"name": "log", "persistentVolumeClaim": {"claimName": "mnist-log",
                                                                      "readOnly": True}},
                            {"name": "tmp", "emptyDir": {}}],
            },
        })},
    }


def test_steps_frame_the_tasks_and_the_policies_follow():
    spec = synced_and_backed_up(ps=1, chief=1)
    assert sp.steps(spec) == (["sync"], ["backup"])
    js = build(spec)
    assert [r["name"] for r in js["spec"]["replicatedJobs"]] == ["sync", "ps", "chief", "worker",
                                                                 "backup"]
    # nothing starts before the sync pod is ready, i.e. its init container is done
    assert js["spec"]["startupPolicy"] == {"startupPolicyOrder": "InOrder"}
    # success needs the upload; the sync step decides nothing
    assert js["spec"]["successPolicy"] == {"operator": "All",
                                           "targetReplicatedJobs": ["chief", "worker", "backup"]}
    # a step's exit 1 (missing object, wrong credential) fails the JobSet through the same rule
    assert js["spec"]["failurePolicy"]["rules"][0] == {
        "name": "UserError", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}
    # JobSet refuses dependsOn together with InOrder (CRD rule), and v0.6 does not know it
    assert not any("dependsOn" in r for r in js["spec"]["replicatedJobs"])
    assert "--tasks" in (cmd := pod_spec(js, "backup")["containers"][0]["command"])
    assert cmd[cmd.index("--tasks") + 1] == "chief-0,worker-0,worker-1"


def test_sync_alone_starts_in_order_even_without_ps_and_backup_alone_does_not():
    assert build(mnist(data_url=DATA, data_sync=True))["spec"]["startupPolicy"] == {
        "startupPolicyOrder": "InOrder"}
    js = build(mnist(backup_url=OUT))
    assert js["spec"]["startupPolicy"] == {"startupPolicyOrder": "AnyOrder"}
    assert [r["name"] for r in js["spec"]["replicatedJobs"]] == ["worker", "backup"]


def test_the_secret_reaches_only_the_containers_that_use_the_storage():
    js = build(synced_and_backed_up(ps=1))
    with_secret = sorted(
        c["name"] + "@" + r["name"] for r in js["spec"]["replicatedJobs"]
        for c in [*r["template"]["spec"]["template"]["spec"].get("initContainers", []),
                  *r["template"]["spec"]["template"]["spec"]["containers"]]
        if c.get("envFrom"))
    assert with_secret == ["backup@backup", "fetch@sync"]
    # nowhere is there a value of it: the name only, in envFrom
    text = json.dumps(js)
    assert text.count(SECRET) == 2 and "secretKeyRef" not in text


def test_streaming_hands_the_url_and_the_secret_to_the_script_tasks_only():
    js = build(mnist(ps=1, chief=1, data_url=DATA, credentials_secret=SECRET))
    assert [r["name"] for r in js["spec"]["replicatedJobs"]] == ["ps", "chief", "worker"]
    for role in ("chief", "worker"):
        c = pod_spec(js, role)["containers"][0]
        assert {"name": "TFK8S_DATA_URL", "value": DATA} in c["env"]
        assert c["envFrom"] == [{"secretRef": {"name": SECRET}}]
    ps = pod_spec(js, "ps")["containers"][0]
    assert "envFrom" not in ps and "TFK8S_DATA_URL" not in json.dumps(ps)


def test_deciding_tasks_leave_a_marker_per_restart_attempt():
    js = build(synced_and_backed_up(ps=1, evaluator=1))
    for role, deciding in (("worker", True), ("ps", False), ("evaluator", False)):
        env = pod_spec(js, role)["containers"][0]["env"]
        names = [e["name"] for e in env]
        assert ("TFK8S_DONE_FILE" in names) is deciding, role
        if deciding:
            # defined after the attempt, so the API's $(VAR) expansion sees it
            assert names.index("TFK8S_RESTART_ATTEMPT") < names.index("TFK8S_DONE_FILE")
            assert env[names.index("TFK8S_DONE_FILE")]["value"] == \
                "/log/.tfk8s/done/$(TFK8S_RESTART_ATTEMPT)/{task}"


def test_no_storage_means_no_step_no_secret_no_new_env():
    plain = build(mnist(ps=1))
    text = json.dumps(plain)
    assert [r["name"] for r in plain["spec"]["replicatedJobs"]] == ["ps", "worker"]
    for word in ("envFrom", "TFK8S_DATA_URL", "TFK8S_DONE_FILE", "initContainers"):
        assert word not in text


def test_a_shared_log_claim_keeps_the_markers_in_the_clusters_own_folder():
    js = build(synced_and_backed_up(log_claim="shared-logs"))
    cmd = pod_spec(js, "backup")["containers"][0]["command"]
    assert cmd[cmd.index("--done-dir") + 1] == "/log/mnist/.tfk8s/done/$(TFK8S_RESTART_ATTEMPT)"
    assert cmd[cmd.index("--source") + 1] == "/log/mnist"


def test_the_deadline_caps_the_steps_as_it_caps_the_tasks():
    js = build(synced_and_backed_up(active_deadline=600))
    for name in ("sync", "worker", "backup"):
        assert rjob(js, name)["template"]["spec"]["activeDeadlineSeconds"] == 600
    assert {"name": "DeadlineExceeded", "action": "FailJobSet",
            "onJobFailureReasons": ["DeadlineExceeded"]} in js["spec"]["failurePolicy"]["rules"]


def test_in_graph_backup_is_refused_in_one_sentence():
    spec = ClusterSpec(name="ig", mode="in-graph", ps=1, workers=1, backup_url=OUT)
    with pytest.raises(SpecError, match=r"^cluster 'ig': on Kubernetes --backup s3://bucket/runs/"
                                        r"mnist needs a between-graph cluster .*\.$"):
        build(spec)


VARIANTS = {
    "sync+backup+secret": lambda: synced_and_backed_up(ps=1, chief=1),
    "stream+secret": lambda: mnist(data_url=DATA, credentials_secret=SECRET),
    "backup, no secret": lambda: mnist(backup_url=OUT),
    "in-graph sync": lambda: ClusterSpec(name="ig", mode="in-graph", ps=1, workers=2,
                                         data_url=DATA, data_sync=True, credentials_secret=SECRET),
}


@pytest.mark.parametrize("which", sorted(VARIANTS))
def test_every_storage_jobset_is_valid_against_the_crd_schema(which):
    assert crd.problems(build(VARIANTS[which]())) == []


@pytest.mark.parametrize("version", ["1.29", "1.37"])
@pytest.mark.parametrize("which", sorted(VARIANTS))
def test_every_step_and_task_job_is_strictly_valid(version, which):
    js = build(VARIANTS[which]())
    for r in js["spec"]["replicatedJobs"]:
        job = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": f"{js['metadata']['name']}-{r['name']}-0", "namespace": NS,
                            **r["template"]["metadata"]},
               "spec": r["template"]["spec"]}
        kubernetes_validate.validate(job, version, strict=True)
        # the pod JobSet's Job makes of it, strictly valid too
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod",
                                      "metadata": {"name": "p", "namespace": NS},
                                      "spec": r["template"]["spec"]["template"]["spec"]},
                                     version, strict=True)


@pytest.mark.k8s
@pytest.mark.parametrize("which", sorted(VARIANTS))
def test_every_pod_passes_the_restricted_pod_security_profile(realkube, which):
    """Each step's and task's pod, dry-run on the real API server under "restricted"."""
    js = build(VARIANTS[which]())
    for r in js["spec"]["replicatedJobs"]:
        assert realkube.restricted_refusal(r["template"]["spec"]["template"]["spec"]) == "", r["name"]


@pytest.mark.k8s
def test_the_pod_security_check_sees_init_containers(realkube):
    """The check above is not vacuous: a privileged init container fails it."""
    pod = copy.deepcopy(pod_spec(build(synced_and_backed_up()), "sync"))
    pod["initContainers"][0]["securityContext"] = {"privileged": True}
    assert 'container "fetch" must not set securityContext.privileged=true' in \
        realkube.restricted_refusal(pod)


def test_exit_code_rules_name_containers_that_exist():
    """The API server refuses a containerName no container or init container has."""
    js = build(synced_and_backed_up(ps=1))
    for r in js["spec"]["replicatedJobs"]:
        pod = r["template"]["spec"]["template"]["spec"]
        names = {c["name"] for c in [*pod.get("initContainers", []), *pod["containers"]]}
        for rule in r["template"]["spec"]["podFailurePolicy"]["rules"]:
            name = (rule.get("onExitCodes") or {}).get("containerName")
            assert name is None or name in names


def test_render_yaml_shows_both_steps_and_never_a_value():
    import tfk8s_magics as tk

    text = tk.render(synced_and_backed_up(), KubernetesBackend(namespace=NS, user="alice"))
    assert text == j.render_yaml(synced_and_backed_up(), SETTINGS)  # what %tfcluster render prints
    for word in ("name: sync", "initContainers:", "name: fetch", "name: backup", "secretRef:",
                 f"name: {SECRET}", DATA, OUT):
        assert word in text
    for value in SECRET_VALUES.values():
        assert value not in text


# -- the in-pod commands, run for real -----------------------------------------------------

def test_logcopy_marks_done_only_on_exit_0(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "TFK8S_ROLE": "worker",
           "JOB_COMPLETION_INDEX": "1", "TFK8S_DONE_FILE": str(tmp_path / "done/0/{task}")}
    for code in (3, 0):
        rc = subprocess.run(
            [sys.executable, "-m", "tfk8s_magics.backends.kubernetes.logcopy",
             str(tmp_path / "tasks/{task}.log"), "--", sys.executable, "-c",
             f"raise SystemExit({code})"], env=env, timeout=60).returncode
        assert rc == code
        assert (tmp_path / "done/0/worker-1").exists() is (code == 0)


class Recorder:
    def __init__(self, code=0):
        self.calls, self.code = [], code

    def __call__(self, argv):
        self.calls.append(argv[3:])
        return subprocess.CompletedProcess(argv, self.code)


def test_backup_waits_for_every_deciding_task_then_uploads(tmp_path, monkeypatch):
    (tmp_path / "log/checkpoints").mkdir(parents=True)
    (tmp_path / "log/models/m/1").mkdir(parents=True)
    done = tmp_path / "log/.tfk8s/done/0"
    done.mkdir(parents=True)
    recorder = Recorder()
    monkeypatch.setattr(steps.subprocess, "run", recorder)
    result = {}
    worker = threading.Thread(target=lambda: result.setdefault("rc", steps.backup(
        str(done), ["worker-0", "worker-1"], str(tmp_path / "log"), OUT + "/", poll=0.05)))
    worker.start()
    (done / "worker-0").touch()
    time.sleep(0.3)
    assert worker.is_alive() and recorder.calls == []  # worker-1 has not finished
    (done / "worker-1").touch()
    worker.join(10)
    assert result["rc"] == 0
    assert recorder.calls == [
        ["upload", str(tmp_path / "log/checkpoints"), OUT + "/checkpoints"],
        ["upload", str(tmp_path / "log/models"), OUT + "/models"],
    ]


def test_a_failed_upload_is_the_steps_exit_code(tmp_path, monkeypatch):
    (tmp_path / "checkpoints").mkdir()
    monkeypatch.setattr(steps.subprocess, "run", Recorder(code=1))
    assert steps.backup(str(tmp_path), [], str(tmp_path), OUT) == 1


def test_backup_ended_early_uploads_what_exists_and_exits_143(tmp_path, monkeypatch):
    (tmp_path / "models").mkdir()
    recorder = Recorder()
    monkeypatch.setattr(steps.subprocess, "run", recorder)
    ended = threading.Event()
    ended.set()
    assert steps.backup(str(tmp_path / "done"), ["worker-0"], str(tmp_path), OUT, ended) == 143
    assert recorder.calls == [["upload", str(tmp_path / "models"), OUT + "/models"]]


def test_backup_with_nothing_to_upload_says_so_and_succeeds(tmp_path, capsys):
    assert steps.upload_all(str(tmp_path), OUT) == 0
    assert "nothing to upload: no checkpoints or models under" in capsys.readouterr().out


def test_backup_process_ends_on_sigterm_within_its_grace(tmp_path):
    """The real process: waiting for a task that never finishes, SIGTERM ends it (143)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfk8s_magics.backends.kubernetes.steps", "backup", "--done-dir",
         str(tmp_path / "done"), "--tasks", "worker-0", "--source", str(tmp_path), "--to", OUT],
        env=env, stdout=subprocess.PIPE, text=True)
    assert "backup waits for worker-0" in proc.stdout.readline()
    proc.terminate()
    assert proc.wait(timeout=30) == 143
    assert "best effort" in proc.stdout.read()


def test_synced_reports_what_landed(tmp_path, capsys):
    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub/b").write_bytes(b"y" * 5)
    assert steps.synced(str(tmp_path)) == 0
    assert capsys.readouterr().out == f"tfk8s: {tmp_path} holds 2 files, 15 bytes\n"


# -- against the API test double ---------------------------------------------------------

def _secret() -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET, "namespace": NS},
            "type": "Opaque",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in SECRET_VALUES.items()}}


@pytest.fixture
def restricted(kube):
    kube.create_namespace(NS, labels={"pod-security.kubernetes.io/enforce": "restricted"})
    return kube


def _backend(kube) -> KubernetesBackend:
    return KubernetesBackend(namespace=NS, api_client=kube.api_client, user="alice",
                             storage_class="standard")


def test_a_failed_fetch_and_a_failed_upload_are_visible(restricted):
    kube = restricted
    kube.set_role(backend_role(NS), NS, service_account="jupyter")
    backend = _backend(kube)
    try:
        backend.launch(mnist(data_url=DATA, data_sync=True, backup_url=OUT), detach=True)
        sync_pod = kube.jobsets.pod_name(NS, "mnist", "sync", 0)
        kube.kubelet.fail_init(NS, sync_pod, 1)
        deadline = time.monotonic() + 10
        while "failing" not in (status := backend.status("mnist")).reason and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        assert status.reason == f"failing: sync failed (fetching {DATA} into /data): fetch exited 1"
        # what JobSet does with it (podFailurePolicy FailJob → FailJobSet), said by the test
        kube.jobsets.finish(NS, "mnist", "Failed", "FailedJobs", "jobset failed due to "
                            "PodFailurePolicy")
        deadline = time.monotonic() + 10
        while (status := backend.status("mnist")).phase != Phase.FAILED and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        assert status.reason.startswith("sync failed: fetch exited 1")
    finally:
        backend.close()


def test_the_sync_progress_is_the_fetch_containers_newest_line(restricted):
    """While ``fetch`` runs, the status (and so the dashboard) carries its newest log line."""
    kube = restricted
    kube.set_role(backend_role(NS), NS, service_account="jupyter")
    backend = _backend(kube)
    try:
        backend.launch(mnist(data_url=DATA, data_sync=True), detach=True)
        sync_pod = kube.jobsets.pod_name(NS, "mnist", "sync", 0)
        kube.kubelet.run_init(NS, sync_pod)
        kube.kubelet.log(NS, sync_pod, "fetched 10 of 40 MB\nfetched 20 of 40 MB", container="fetch")
        want = f"sync: fetching {DATA} into /data: fetched 20 of 40 MB"
        deadline = time.monotonic() + 15
        while (status := backend.status("mnist")).reason != want and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (status.phase, status.reason) == (Phase.PENDING, want)
        assert f"sync: fetching {DATA} into /data: fetched 20 of 40 MB" in header_html(status, "mnist")
        reads = [r for r in kube.requests if r.resource_path == "pods/log"]
        assert reads and all(r.query.get("container") == "fetch" for r in reads)
    finally:
        backend.close()


def test_no_task_pod_exists_before_the_sync_init_container_ended(make_kube):
    """JobSet's InOrder rule (the double's ``jobset_in_order``, after v0.6's
    ``allReplicasStarted``): the parameter servers' pods are created only once the sync
    pod is ready or done, and a pod whose init container runs is neither; the workers
    only once the PS is ready."""
    kube = make_kube(jobset_in_order=True)
    kube.create_namespace(NS, labels={"pod-security.kubernetes.io/enforce": "restricted"})
    kube.set_role(backend_role(NS), NS, service_account="jupyter")
    backend = _backend(kube)

    def roles():
        return sorted(p["metadata"]["labels"]["tfk8s.io/role"]
                      for p in kube.jobsets.pods(NS, "mnist"))

    try:
        backend.launch(mnist(ps=1, data_url=DATA, data_sync=True), detach=True)
        assert roles() == ["sync"]
        sync_pod = kube.jobsets.pod_name(NS, "mnist", "sync", 0)
        kube.kubelet.run_init(NS, sync_pod)  # fetch runs: the pod is not ready
        assert roles() == ["sync"]
        kube.kubelet.run(NS, sync_pod)  # fetch done, "synced" runs: ready
        assert roles() == ["ps", "sync"]
        kube.kubelet.succeed(NS, sync_pod)
        assert roles() == ["ps", "sync"]  # the PS is not ready yet: no worker
        kube.kubelet.run(NS, kube.jobsets.pod_name(NS, "mnist", "ps", 0))  # running and ready
        assert roles() == ["ps", "sync", "worker", "worker"]
    finally:
        backend.close()


def test_without_in_order_the_double_creates_every_pod_at_once(make_kube):
    """The default double (every pod at once, as every other test expects) is unchanged."""
    kube = make_kube()
    kube.create_namespace(NS)
    kube.set_role(backend_role(NS), NS, service_account="jupyter")
    backend = _backend(kube)
    try:
        backend.launch(mnist(ps=1, data_url=DATA, data_sync=True), detach=True)
        assert len(kube.jobsets.pods(NS, "mnist")) == 4
    finally:
        backend.close()


def test_a_failed_task_not_the_ended_backup_is_named_as_the_cause():
    """The JobSet failed on a worker's exit 1 and ended the waiting backup (SIGTERM, 143):
    the reason names the worker."""
    from tfk8s_magics.backends.kubernetes import state

    def pod(role, code):
        return {"metadata": {"labels": {"tfk8s.io/role": role,
                                        "batch.kubernetes.io/job-completion-index": "0"}},
                "status": {"phase": "Failed", "containerStatuses": [{"name": "c", "state": {
                    "terminated": {"exitCode": code, "reason": "Error"}}}]}}

    spec = mnist(workers=1, backup_url=OUT)
    failed = {"status": {"conditions": [{"type": "Failed", "status": "True",
                                         "message": "jobset failed due to PodFailurePolicy"}]}}
    view = state.View(spec=spec, jobset=failed, pods={"worker-0": pod("worker", 1)},
                      steps={"backup": pod("backup", 143)})
    phase, reason = state.cluster_phase(view, state.task_statuses(view))
    assert phase == Phase.FAILED and reason.startswith("worker-0 failed: the script raised")


def test_the_double_starts_init_containers_before_the_app_containers(restricted):
    """What the status reads while the sync step works: the double's pod as a kubelet
    writes it (init statuses), checked against the same rule as a literal pod."""
    from tfk8s_magics.backends.kubernetes import state

    running = {"metadata": {"labels": {"tfk8s.io/role": "sync"}}, "status": {
        "phase": "Pending",
        "initContainerStatuses": [{"name": "fetch", "state": {"running": {"startedAt": "x"}}}],
        "containerStatuses": [{"name": "synced", "state": {"waiting": {
            "reason": "PodInitializing"}}}]}}
    assert state.step_status("sync", running).phase == Phase.STARTING
    view = state.View(spec=mnist(data_url=DATA, data_sync=True), jobset={}, pods={},
                      steps={"sync": running})
    assert state.cluster_phase(view, state.task_statuses(view)) == (
        Phase.PENDING, f"sync: fetching {DATA} into /data")


# -- a real cluster (marker k8s) -----------------------------------------------------------

@pytest.mark.k8s
def test_real_cluster_refuses_a_missing_secret_and_names_an_existing_one(realkube, kube_user):
    """On the real cluster (``scripts/kube up``), as the user's ServiceAccount given ``get`` on
    secrets: a missing Secret refused before anything is made, then a launch with it whose step
    pods the API server admits under "restricted" and whose JobSet carries the Secret's name only."""
    from tests.realkube import wait_for

    ns, backend = kube_user("stor")
    ns.grant("secret-get", [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}])
    spec = ClusterSpec(name="stor", script=SCRIPT, workers=1, data_url=DATA, data_sync=True,
                       credentials_secret=SECRET)
    before = len(ns.requests())
    with pytest.raises(LaunchFailed) as err:
        backend.launch(spec, detach=True)
    assert str(err.value) == (
        f"--credentials-secret '{SECRET}': there is no Secret of that name in namespace "
        f"'{ns.name}'; create it there first (e.g. `kubectl create secret generic {SECRET} "
        "--from-literal=AWS_ACCESS_KEY_ID=...`), then launch again.")
    assert not [r for r in ns.requests()[before:] if r.verb == "create"]
    assert realkube.core.list_namespaced_config_map(
        ns.name, label_selector="tfk8s.io/cluster=stor").items == []
    asked = [(r.verb, r.code) for r in ns.requests()[before:] if r.resource == "secrets"]
    assert asked == [("get", 404)]
    realkube.core.create_namespaced_secret(ns.name, {"metadata": {"name": SECRET},
                                                     "stringData": dict(SECRET_VALUES)})
    # the existence check is a metadata-only read: the server answers without the data
    from tfk8s_magics.backends.kubernetes.client import METADATA_ONLY

    raw = backend.api.core.read_namespaced_secret(
        SECRET, ns.name, _headers={"Accept": METADATA_ONLY}, _preload_content=False)
    body = json.loads(raw.data)
    assert body["kind"] == "PartialObjectMetadata" and "data" not in body
    assert backend.api.secret_metadata(SECRET)["metadata"]["name"] == SECRET
    assert backend.api.secret_metadata("other") is None
    backend.launch(spec, detach=True)
    js = realkube.custom.get_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", ns.name, "jobsets", "stor")
    text = json.dumps(js)
    assert SECRET in text and not any(v in text for v in SECRET_VALUES.values())
    # the sync pod (init container fetch, envFrom the Secret) admitted under "restricted"
    sync = wait_for(lambda: realkube.pods(ns.name, "tfk8s.io/cluster=stor,tfk8s.io/role=sync"), 90,
                    message="the sync pod, made by the Job controller through admission")
    assert [c.name for c in sync[0].spec.init_containers] == ["fetch"]
    backend.delete("stor")


def test_quota_counts_a_step_pod_as_the_api_server_does():
    """Pod usage = per resource max(sum of app containers, largest init container): the sync
    pod's fetch and synced containers count once, not twice."""
    from decimal import Decimal

    from tfk8s_magics.backends.kubernetes import quota

    need = quota.demand([build(synced_and_backed_up())])
    assert need["pods"] == 4  # sync, 2 workers, backup
    assert need["requests.cpu"] == Decimal("0.5")
    assert need["requests.memory"] == 2 * 256 * 2**20
    assert need["limits.memory"] == 2 * 2**30
    bigger = copy.deepcopy(build(synced_and_backed_up()))
    sync = pod_spec(bigger, "sync")
    sync["initContainers"][0]["resources"]["requests"]["cpu"] = "2"
    assert quota.demand([bigger])["requests.cpu"] == Decimal("2.25")


@pytest.mark.parametrize("step", ["sync", "backup"])
@pytest.mark.parametrize(("end", "used", "budget", "action", "words"), LIFECYCLE_TABLE)
def test_the_steps_obey_the_lifecycle_table(step, end, used, budget, action, words):
    """The lifecycle table (tests/test_lifecycle.py) run against each step's Job by the same
    documented Job/JobSet rules: a failed fetch or upload (exit 1) fails the cluster, a
    killed or evicted step pod is retried within the budget — as for a task."""
    if end.signal or end.vanished or end.exit_code == 0:
        pytest.skip("a pod cannot show this end (signals arrive as exit codes 128+N)")
    js = build(synced_and_backed_up(restart_budget=budget))
    js["spec"]["replicatedJobs"].append(rjob(js, step))  # the rule reader takes the last Job
    assert what_jobset_does(js, end, used) == action


# -- the container harness runs the sync pod as written (mapping; tests/containers) ---------

def _objects_with_secret() -> list[dict]:
    from tfk8s_magics.backends.kubernetes.jobset import cluster_manifests

    secret = {**_secret(), "metadata": {"name": SECRET, "namespace": NS}}
    return [*cluster_manifests(synced_and_backed_up(), SETTINGS), secret]


def test_the_harness_maps_the_sync_pod_init_container_first():
    from tests.containers.pods import container_plan, pod_instances

    objects = _objects_with_secret()
    (pod,) = [p for p in pod_instances(objects) if p.name == "mnist-sync-0-0"]
    plan = container_plan(pod, objects, prefix="t", network="t-net", image_user="1000")
    (fetch,) = plan.init
    args = fetch.run_args

    def values(flag):
        return [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]

    assert fetch.container == "t-mnist-sync-0-0-init-fetch" and fetch.dns_names == []
    assert values("--entrypoint") == [json.dumps(["/opt/storage/bin/python", "-m",
                                                  "tfk8s_magics.storage", "fetch", DATA, "/data"])]
    env = dict(e.split("=", 1) for e in values("--env"))
    assert {k: env[k] for k in SECRET_VALUES} == SECRET_VALUES  # envFrom, as the kubelet does
    assert env["JOB_COMPLETION_INDEX"] == "0" and env["HOME"] == "/tmp"
    assert values("--user") == ["1000:1000"] and values("--cap-drop") == ["ALL"]
    assert "--read-only" in args and values("--restart") == ["no"]
    assert values("-v") == ["@claim:mnist-data:/data:rw"]
    assert fetch.claims == {"mnist-data": False}
    # the app container reads what the init container wrote; it has no Secret
    assert plan.claims == {"mnist-data": True}
    assert not any(k in e for e in plan.run_args for k in SECRET_VALUES)


def test_the_harness_refuses_a_pod_whose_secret_is_missing():
    from tests.containers.pods import Unmappable, container_plan, pod_instances

    objects = _objects_with_secret()[:-1]
    (pod,) = [p for p in pod_instances(objects) if p.name == "mnist-sync-0-0"]
    with pytest.raises(Unmappable, match="CreateContainerConfigError"):
        container_plan(pod, objects, prefix="t", network="t-net", image_user="1000")


@pytest.mark.parametrize("field", ["data_url", "backup_url"])
def test_a_url_with_a_password_is_refused_before_it_is_recorded_anywhere(field):
    url = "https://reader:hunter2-secret@data.example/mnist"
    with pytest.raises(SpecError) as err:
        mnist(**{field: url})
    assert "hunter2" not in str(err.value) and "carries a password" in str(err.value)


@pytest.mark.k8s
def test_with_the_secret_on_the_real_cluster_no_value_leaves_it(realkube, kube_user):
    """Launch with sync + backup as the user's ServiceAccount: JobSet's own InOrder start and
    successPolicy take the run to its backup step (``backup: uploading …`` once the workers
    succeeded); the steps reference the Secret by name only, and its values (plain and base64)
    appear nowhere the backend writes or shows: the JobSet, the root ConfigMap, the pods, Events,
    the status, list, events, spec, the rendered YAML."""
    from tests.realkube import wait_for

    ns, backend = kube_user("stor")
    ns.grant("secret-get", [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}])
    realkube.core.create_namespaced_secret(ns.name, {
        "metadata": {"name": SECRET}, "type": "Opaque",
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in SECRET_VALUES.items()}})
    spec = synced_and_backed_up()
    status = backend.launch(spec, detach=True)
    assert status.phase == Phase.PENDING and status.reason.startswith("sync: "), status

    def pods(role=None):
        sel = "tfk8s.io/cluster=mnist" + (f",tfk8s.io/role={role}" if role else "")
        return [p for p in realkube.pods(ns.name, sel) if not p.metadata.deletion_timestamp]

    # the sync step: its init container fetched (kwok: at once), "synced" ends with exit 0
    (sync,) = wait_for(lambda: [p for p in pods("sync") if p.status.phase == "Running"], 120,
                       message="the sync pod running")
    realkube.exit_pod(ns.name, sync.metadata.name, 0)
    workers = wait_for(lambda: len(p := pods("worker")) == 2
                       and all(x.status.phase == "Running" for x in p) and p, 120,
                       message="the workers, started by JobSet after the sync step")
    for p in workers:
        realkube.exit_pod(ns.name, p.metadata.name, 0)
    uploading = f"backup: uploading checkpoints and models to {OUT}"
    seen = []
    try:
        status = wait_for(lambda: (s := backend.status("mnist")).reason == uploading and s
                          or seen.append((s.phase, s.reason, [(p.metadata.name, p.status.phase)
                                                              for p in pods()])), 120,
                          message="the backup step running after the workers succeeded")
    except AssertionError as e:
        raise AssertionError(f"{e}; last seen {seen[-1:]}") from None
    assert status.phase == Phase.RUNNING
    shown = [repr(backend.status("mnist")), repr(backend.list_clusters()),
             repr(backend.events("mnist")), repr(backend.spec("mnist"))]
    every = pods()
    refs = {c.name: c.env_from for p in every
            for c in [*(p.spec.init_containers or []), *p.spec.containers]}
    assert [(r.secret_ref.name) for r in refs["fetch"]] == [SECRET]
    assert [(r.secret_ref.name) for r in refs["backup"]] == [SECRET]
    assert refs["tensorflow"] is None and refs["synced"] is None
    ser = realkube.admin.sanitize_for_serialization
    written = json.dumps([
        realkube.custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns.name,
                                                     "jobsets", "mnist"),
        ser(realkube.core.read_namespaced_config_map("mnist", ns.name)), ser(every),
        ser(realkube.events(ns.name))])
    rendered = backend.render_yaml(spec)
    for value in [*SECRET_VALUES.values(), *(base64.b64encode(v.encode()).decode()
                                             for v in SECRET_VALUES.values())]:
        for where, text in (("objects", written), ("render", rendered), *(
                (f"shown[{i}]", s) for i, s in enumerate(shown))):
            assert value not in text, f"a Secret value leaked into {where}"
    assert "AWS_" not in written  # not even the keys: only the Secret's name travels
    backend.delete("mnist")
