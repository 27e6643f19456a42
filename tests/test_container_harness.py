"""The container harness itself (tests/containers): pods found, mapped as written, or refused.

No podman needed: these check the mapping from rendered objects to ``podman
run`` arguments that ``tests/test_containers.py`` then runs for real.
"""

from __future__ import annotations

import pytest
import yaml

import tfk8s_magics as tk
from tests.containers.pods import Unmappable, container_plan, expand, pod_instances
from tfk8s_magics.backends.kubernetes import KubernetesBackend
from tfk8s_magics.spec import ClusterSpec

IMAGE = "localhost/tfk8s/tensorflow-task:h-test"


def rendered(**spec) -> list[dict]:
    text = tk.render(ClusterSpec(**spec), KubernetesBackend(namespace="ns1", user="alice"))
    return [d for d in yaml.safe_load_all(text) if d]


def plan_of(objects, pod_name, **kw):
    (pod,) = [p for p in pod_instances(objects) if p.name == pod_name]
    return container_plan(pod, objects, prefix="t", network="t-net", image_user="1000", **kw)


def worker_template(objects) -> dict:
    """The worker pod template of the rendered JobSet (every task runs from one)."""
    jobset = next(o for o in objects if o["kind"] == "JobSet")
    rjob = next(r for r in jobset["spec"]["replicatedJobs"] if r["name"] == "worker")
    return rjob["template"]["spec"]["template"]


def flag_values(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]


def test_a_rendered_task_pod_is_mapped_field_by_field():
    objects = rendered(name="c1", workers=2, ps=1, script="print(1)\n", image=IMAGE)
    plan = plan_of(objects, "c1-worker-0-1")
    args = plan.run_args
    assert plan.image == IMAGE and args[-1] == IMAGE  # no args: the command alone runs
    assert flag_values(args, "--entrypoint") == [
        '["python", "-m", "tfk8s_magics.backends.kubernetes.logcopy", "/log/tasks/{task}.log", '
        '"--", "python", "-m", "tfk8s_magics.runtime.task"]']
    assert flag_values(args, "--user") == ["1000:1000"] and flag_values(args, "--group-add") == ["100"]
    assert "--read-only" in args and "--read-only-tmpfs=false" in args
    assert flag_values(args, "--cap-drop") == ["ALL"]
    assert flag_values(args, "--security-opt") == ["no-new-privileges"]
    assert flag_values(args, "--workdir") == ["/data"]
    assert flag_values(args, "--hostname") == ["c1-worker-0-1"]
    assert plan.dns_names == ["c1-worker-0-1.c1.ns1.svc.cluster.local"]
    assert flag_values(args, "--dns-search") == [
        "ns1.svc.cluster.local", "svc.cluster.local", "cluster.local"]
    env = dict(e.split("=", 1) for e in flag_values(args, "--env"))
    assert env["TFK8S_SCRIPT"] == "/etc/tfk8s/script.py" and env["TFK8S_LOG_DIR"] == "/log"
    # the pod derives its TF_CONFIG from these (runtime/task.py: resolve_identity)
    assert '"c1-worker-0-1.c1.ns1.svc:2222"' in env["TFK8S_CLUSTER_DEF"]
    assert (env["TFK8S_ROLE"], env["JOB_COMPLETION_INDEX"]) == ("worker", "1")
    assert flag_values(args, "-v") == ["@claim:c1-data:/data:rw", "@claim:c1-log:/log:rw",
                                       "@files:cm-c1-worker-0-1-script-0:/etc/tfk8s:ro"]
    assert flag_values(args, "--mount") == ["type=tmpfs,destination=/tmp,tmpfs-mode=0777"]
    assert plan.config_files["cm-c1-worker-0-1-script-0"] == {"script.py": ("print(1)\n", 0o644)}
    assert plan.readiness == ["test", "-f", "/tmp/tfk8s-ready"]


def test_no_dns_name_without_the_headless_service_that_promises_it():
    objects = rendered(name="c1", workers=1, script="x=1\n")
    jobset = next(o for o in objects if o["kind"] == "JobSet")
    jobset["spec"]["network"]["enableDNSHostnames"] = False  # JobSet then makes no Service
    assert plan_of(objects, "c1-worker-0-0").dns_names == []


@pytest.mark.parametrize("change, field", [
    (lambda s: s.update(nodeSelector={"gpu": "yes"}), "pod.spec.nodeSelector"),
    (lambda s: s["containers"][0].update(livenessProbe={"exec": {"command": ["true"]}}), "livenessProbe"),
    (lambda s: s["containers"][0]["securityContext"].update(privileged=True), "privileged"),
    (lambda s: s["containers"][0].setdefault("resources", {}).setdefault("limits", {}).update(
        {"nvidia.com/gpu": "1"}), "nvidia.com/gpu"),
    (lambda s: s["volumes"].append({"name": "x", "hostPath": {"path": "/"}}) or
     s["containers"][0]["volumeMounts"].append({"name": "x", "mountPath": "/x"}), "hostPath"),
    (lambda s: s.update(automountServiceAccountToken=True), "automountServiceAccountToken"),
    (lambda s: s["containers"][0]["volumeMounts"][0].update(subPath="a"), "subPath"),
    (lambda s: s["securityContext"].update(runAsUser=0), "runAsNonRoot"),
])
def test_what_cannot_be_mapped_is_refused_loudly(change, field):
    objects = rendered(name="c1", workers=1, script="x=1\n")
    change(worker_template(objects)["spec"])
    with pytest.raises(Unmappable, match=field.replace(".", r"\.")):
        plan_of(objects, "c1-worker-0-0")


def test_a_claim_that_nobody_creates_is_refused():
    objects = [o for o in rendered(name="c1", workers=1, script="x=1\n")
               if o["kind"] != "PersistentVolumeClaim"]
    with pytest.raises(Unmappable, match="claim 'c1-data'"):
        plan_of(objects, "c1-worker-0-0")
    assert plan_of(objects, "c1-worker-0-0", existing_claims=("c1-data", "c1-log")).claims == {
        "c1-data": False, "c1-log": False}


def test_env_expansion_follows_the_api():
    env = {"A": "x", "B": "y"}
    assert expand("$(A)-$(B)-$(C)-$$(A)", env) == "x-y-$(C)-$(A)"


def test_jobset_pods_come_from_replicated_job_templates():
    """The JobSet form: ``replicatedJobs[].template.spec.template``, named as the controllers do."""
    objects = rendered(name="c1", workers=2, script="x=1\n", image=IMAGE)
    env = worker_template(objects)["spec"]["containers"][0]["env"]
    env.append({"name": "WHO", "value": "worker-$(JOB_COMPLETION_INDEX)"})
    pods = pod_instances(objects)
    assert [p.name for p in pods] == ["c1-worker-0-0", "c1-worker-0-1"]
    plan = container_plan(pods[1], objects, prefix="t", network="n", image_user="1000")
    assert plan.dns_names == ["c1-worker-0-1.c1.ns1.svc.cluster.local"]
    env = dict(e.split("=", 1) for e in flag_values(plan.run_args, "--env"))
    assert env["JOB_COMPLETION_INDEX"] == "1" and env["WHO"] == "worker-1"
