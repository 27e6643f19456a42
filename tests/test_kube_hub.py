"""The chart on the REAL node (tier 2): ``helm install``, a user logs in, KubeSpawner starts their
notebook pod in their own namespace under Pod Security ``restricted``, ``helm uninstall``.

Needs ``scripts/kube up --pods`` (the control plane of ``devcluster/`` and the real node: containerd,
runc, a kubelet, kube-proxy, CoreDNS) and podman with the lab's images (``scripts/build_images.py``).
The hub and notebook images built from this tree and the configurable-http-proxy stand-in
(``tests/test_container_hub.py``: the same npm package; the chart's image cannot be pulled here)
are imported into the node's containerd (``devcluster.node.import_images``) and run with
``pullPolicy: Never``. The hub's database is on a claim of the cluster's "standard" class.

Everything a user does goes through the proxy's Service, reached by ``kubectl port-forward`` bound
to 127.0.0.1: log in with the chart's shared-password authenticator, start the server (the
hub's KubeSpawner and its pre-spawn bootstrap act with the hub's own ServiceAccount, under the
chart's RBAC and admission fence), ``/user/<name>/api``. The notebook pod's own ServiceAccount
token is then used from inside the pod, as the lab's Kubernetes backend uses it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import time
from pathlib import Path

import pytest
from kubernetes.client.rest import ApiException
from test_helm import CHART, helm_binary

from devcluster import node
from tests.hubclient import Hub
from tests.realkube import podman_cluster, require_or_skip, wait_for

pytestmark = pytest.mark.k8s

REPO = Path(__file__).resolve().parent.parent
HUB_NS, RELEASE, USER = "labhub", "lab", "ada"
USER_NS = f"{HUB_NS}-{USER}"  # lab.user_namespace_template "{hubnamespace}-{username}"
FULLNAME = f"{RELEASE}-tfk8s-lab"
BOUND = 600.0  # seconds any one wait may take on a loaded 2-core machine
# On this machine a notebook pod (a 2.9 GB image, JupyterLab's start on a shared 2-core VM) takes
# longer than KubeSpawner's 60 s default; production clusters pulling the image need more too.
EXTRA_CONFIG = "c.KubeSpawner.start_timeout = 600\nc.KubeSpawner.http_timeout = 300\n"


import test_containers  # noqa: E402 - after the fixtures' imports, as test_container_hub does

images = test_containers.images  # the lab's images, built once per session from this tree


@pytest.fixture(scope="module")
def real_node(realkube):
    """The devcluster's real node runs (checked before any image is built)."""
    cluster = podman_cluster()
    if not node.running(cluster):
        require_or_skip(
            f"the real node of {cluster.root} is not running: start it with scripts/kube up --pods"
        )
    return cluster


@pytest.fixture(scope="module")
def lab_images(real_node, images, tmp_path_factory):
    """The hub, notebook and proxy stand-in images, from podman into the real node's containerd."""
    cluster = real_node
    from test_container_hub import base_image, proxy_standin

    from tests.containers.podman import PodmanRun

    built = images
    tmp = tmp_path_factory.mktemp("hubnode")
    pods = PodmanRun(f"tfk8s-hubnode-{os.getpid()}", tmp / "podman")
    try:
        chp = proxy_standin(pods, base_image(), tmp)
    finally:
        pods.cleanup()
    refs = {"hub": built["hub"], "notebook": built["notebook"], "proxy": chp}
    # the release tag first when it is the same build: containerd then replaces its 0.1.0 (which
    # `up` imported) and gives the h- tag the same content by name, instead of a second copy
    releases = tuple(
        f"{ref.rsplit(':', 1)[0]}:0.1.0"
        for ref in (built["hub"], built["notebook"])
        if node.podman_image_id(f"{ref.rsplit(':', 1)[0]}:0.1.0") == node.podman_image_id(ref)
    )
    t0 = time.monotonic()
    imported = node.import_images(cluster, (*releases, *refs.values()))
    assert set(refs.values()) <= set(imported), imported
    print(f"images in the node's containerd in {time.monotonic() - t0:.0f} s: {refs}")
    return refs


@pytest.fixture(scope="module")
def helm(request, tmp_path_factory) -> Path:
    return helm_binary(request, tmp_path_factory)


def _values(images: dict[str, str], password: str) -> dict:
    def image(ref: str) -> dict:
        repository, tag = ref.rsplit(":", 1)
        return {"repository": repository, "tag": tag, "pullPolicy": "Never"}

    return {
        "hub": {
            "image": image(images["hub"]),
            "db": {"storageClass": "standard"},
            "extraConfig": EXTRA_CONFIG,
        },
        "proxy": {"image": image(images["proxy"])},
        "auth": {"sharedPassword": password},
        "lab": {"notebook_image": images["notebook"], "storage_class": "standard"},
    }


class PortForward:
    """``kubectl port-forward`` of a Service to a free port on 127.0.0.1 (loopback only)."""

    def __init__(self, kubeconfig: str, namespace: str, service: str, port: int):
        from devcluster import build

        self.proc = subprocess.Popen(
            [
                str(build.COMPONENTS["kubernetes"].path("kubectl")),
                "--kubeconfig",
                kubeconfig,
                "-n",
                namespace,
                "port-forward",
                "--address",
                "127.0.0.1",
                f"service/{service}",
                f":{port}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()  # "Forwarding from 127.0.0.1:NNNNN -> 8000"
        m = re.match(r"Forwarding from 127\.0\.0\.1:(\d+) ->", line)
        if not m:
            self.close()
            raise AssertionError(f"kubectl port-forward said {line!r}: {self.proc.stderr.read()[-2000:]}")
        self.url = f"http://127.0.0.1:{m.group(1)}"

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def release(realkube, helm, lab_images, tmp_path_factory):
    """The chart installed on the real node, the hub and proxy pods Ready; uninstalled afterwards."""
    kube = realkube
    core = kube.core
    kube.clear_namespaces(USER_NS, HUB_NS)  # a previous run's leftovers
    core.create_namespace({"metadata": {"name": HUB_NS}})  # no kwok annotations: the real node
    password = secrets.token_urlsafe(16)
    values = tmp_path_factory.mktemp("values") / "values.json"
    values.write_text(json.dumps(_values(lab_images, password)))
    helm_cmd = [str(helm), "--kubeconfig", kube.kubeconfig, "-n", HUB_NS]
    t0 = time.monotonic()
    r = subprocess.run(
        [
            *helm_cmd,
            "install",
            RELEASE,
            str(CHART),
            "-f",
            str(values),
            "--wait",
            "--timeout",
            f"{int(BOUND)}s",
        ],
        capture_output=True,
        text=True,
        timeout=BOUND + 60,
    )
    installed = time.monotonic() - t0
    if r.returncode:
        from devcluster.cluster import Cluster

        pods = Cluster().kubectl("get", "pods,events", "-n", HUB_NS, "-o", "wide", check=False).stdout
        pytest.fail(f"helm install failed: {r.stderr[-2000:]}\n{pods[-4000:]}")
    manifest = subprocess.run(
        [*helm_cmd, "get", "manifest", RELEASE], capture_output=True, text=True, check=True
    )
    forward = PortForward(kube.kubeconfig, HUB_NS, f"{FULLNAME}-proxy-public", 80)
    try:
        yield {
            "kube": kube,
            "password": password,
            "url": forward.url,
            "images": lab_images,
            "manifest": manifest.stdout,
            "helm": helm_cmd,
            "installed_s": installed,
        }
    finally:
        forward.close()
        subprocess.run([*helm_cmd, "uninstall", RELEASE, "--wait"], capture_output=True, timeout=BOUND)
        for ns in (USER_NS, HUB_NS):
            if kube.namespace_exists(ns):
                core.delete_namespace(ns)


def _in_pod(kube, namespace: str, pod: str, code: str) -> str:
    """Run python ``code`` in the pod's container (kubectl exec as admin); its stdout."""
    from devcluster.cluster import Cluster

    r = Cluster().kubectl(
        "exec", "-n", namespace, pod, "-c", "notebook", "--", "python3", "-c", code, check=False
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


# What the notebook's own token may do, asked from inside the pod with the in-cluster config, as
# the lab's backend asks it: its namespace's pods, JobSets (a server-side dry run), events; and
# what it may not: other namespaces, cluster-scoped objects, RBAC of its own namespace.
SA_PROBE = r"""
import json
from kubernetes import client, config
from kubernetes.client.rest import ApiException
config.load_incluster_config()
ns = open("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read()
core, custom, rbac = client.CoreV1Api(), client.CustomObjectsApi(), client.RbacAuthorizationV1Api()
def code(f):
    try:
        f()
        return 200
    except ApiException as e:
        return e.status
pod = {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}
jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "probe"},
          "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": {"template": pod}}}]}}
print(json.dumps({
    "namespace": ns,
    "list_pods": code(lambda: core.list_namespaced_pod(ns)),
    "list_events": code(lambda: core.list_namespaced_event(ns)),
    "create_jobset": code(lambda: custom.create_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", ns, "jobsets", jobset, dry_run="All")),
    "pods_elsewhere": code(lambda: core.list_namespaced_pod("kube-system")),
    "hub_secrets": code(lambda: core.list_namespaced_secret("%(hub)s")),
    "namespaces": code(lambda: core.list_namespace()),
    "nodes": code(lambda: core.list_node()),
    "own_roles": code(lambda: rbac.create_namespaced_role(ns, {"metadata": {"name": "x"}, "rules": []},
                                                          dry_run="All")),
}))
"""


def test_a_user_logs_in_and_kubespawner_starts_their_notebook_on_the_real_node(release):
    kube, url = release["kube"], release["url"]
    core = kube.core
    # the hub and the proxy: Ready by their own readiness probes, on the real node
    for component in ("hub", "proxy"):
        (pod,) = kube.pods(HUB_NS, f"app.kubernetes.io/component={component}")
        assert pod.spec.node_name in node.NODE_NAMES, (component, pod.spec.node_name)
        assert {c.type: c.status for c in pod.status.conditions}["Ready"] == "True", component
        assert pod.spec.containers[0].readiness_probe is not None
    claim = core.read_namespaced_persistent_volume_claim(f"{FULLNAME}-hub-db", HUB_NS)
    assert claim.status.phase == "Bound" and claim.spec.storage_class_name == "standard"

    hub = Hub(url)
    refused = Hub(url).login(USER, "not-the-password")
    assert refused.status_code == 403, refused.status_code  # the authenticator is in force
    r = hub.login(USER, release["password"])
    assert r.status_code == 302, (r.status_code, r.text[-500:])
    t0 = time.monotonic()
    r = hub.api("POST", f"/hub/api/users/{USER}/server")
    assert r.status_code in (201, 202), r.text

    def ready():
        u = hub.api("GET", f"/hub/api/users/{USER}").json()
        server = (u.get("servers") or {}).get("", {})
        if not server.get("pending") and not server.get("ready") and time.monotonic() - t0 > 5:
            from devcluster.cluster import Cluster

            events = Cluster().kubectl("get", "events", "-n", USER_NS, check=False).stdout
            raise AssertionError(f"the spawn failed: {u}\n{events[-3000:]}")
        return server.get("ready")

    try:
        wait_for(ready, BOUND, 2, "the user's server to be ready")
    except AssertionError:
        (hub_pod,) = kube.pods(HUB_NS, "app.kubernetes.io/component=hub")
        log = core.read_namespaced_pod_log(hub_pod.metadata.name, HUB_NS, tail_lines=60)
        raise AssertionError(f"the user's server did not get ready; the hub's last lines:\n{log}") from None
    spawn_s = time.monotonic() - t0

    # the per-user bootstrap, made by the hub's KubeSpawner and its pre-spawn hook
    ns = core.read_namespace(USER_NS)
    labels = ns.metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted", labels
    assert labels["tfk8s.io/hub-namespace"] == HUB_NS and labels["hub.jupyter.org/username"] == USER, labels
    assert core.read_namespaced_service_account("tfk8s-user", USER_NS)
    rbac = __import__("kubernetes").client.RbacAuthorizationV1Api(kube.admin)
    (binding,) = rbac.list_namespaced_role_binding(USER_NS).items
    assert [(s.kind, s.name) for s in binding.subjects] == [("ServiceAccount", "tfk8s-user")]
    # the chart's backend ClusterRole, bound in this namespace only
    assert (binding.role_ref.kind, binding.role_ref.name) == ("ClusterRole", f"tfk8s-backend-{HUB_NS}")
    quotas = {q.metadata.name: q.spec for q in core.list_namespaced_resource_quota(USER_NS).items}
    assert set(quotas) == {"tfk8s-quota", "tfk8s-no-cross-namespace-affinity"}, quotas
    hard = quotas["tfk8s-quota"].hard
    assert hard["pods"] == "40" and hard["requests.nvidia.com/gpu"] == "0", hard  # the chart's defaults
    # no pod with an affinity term over other namespaces (it could keep other users off a node)
    affinity = quotas["tfk8s-no-cross-namespace-affinity"]
    assert affinity.hard == {"pods": "0"}, affinity.hard
    assert [e.scope_name for e in affinity.scope_selector.match_expressions] == ["CrossNamespacePodAffinity"]
    (limits,) = core.list_namespaced_limit_range(USER_NS).items
    assert limits.spec.limits[0].default["memory"] == "4Gi"

    # the notebook pod: in the user's namespace, Running on the real node, admitted under restricted
    (pod,) = kube.pods(USER_NS, "component=singleuser-server")
    assert pod.status.phase == "Running" and pod.spec.node_name in node.NODE_NAMES
    assert pod.spec.service_account_name == "tfk8s-user"
    assert pod.spec.containers[0].image == release["images"]["notebook"]
    psc = pod.spec.security_context
    assert psc.run_as_non_root is True and psc.seccomp_profile.type == "RuntimeDefault"
    assert psc.fs_group == 100
    csc = pod.spec.containers[0].security_context
    assert csc.allow_privilege_escalation is False and csc.capabilities.drop == ["ALL"]
    assert csc.run_as_user == 1000
    # the API server admitted it as restricted: a pod that breaks the profile is refused there
    bad = {"metadata": {"name": "root"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod(USER_NS, bad, dry_run="All")
    message = json.loads(e.value.body)["message"]
    assert e.value.status == 403 and 'violates PodSecurity "restricted:latest"' in message, message

    # the user's server answers through the proxy
    r = hub.api("GET", f"/user/{USER}/api")
    assert r.status_code == 200 and "version" in r.json(), (r.status_code, r.text[:500])
    r = hub.api("GET", f"/user/{USER}/api/status")
    assert r.status_code == 200, r.text[:500]

    # the notebook's own token: what the lab needs in its namespace, nothing outside it
    seen = json.loads(_in_pod(kube, USER_NS, pod.metadata.name, SA_PROBE % {"hub": HUB_NS}).splitlines()[-1])
    assert seen == {
        "namespace": USER_NS,
        "list_pods": 200,
        "list_events": 200,
        "create_jobset": 200,
        "pods_elsewhere": 403,
        "hub_secrets": 403,
        "namespaces": 403,
        "nodes": 403,
        "own_roles": 403,
    }, seen

    # stop: the pod goes, the namespace and the home claim stay (the user's files)
    r = hub.api("DELETE", f"/hub/api/users/{USER}/server")
    assert r.status_code in (202, 204), r.text
    wait_for(
        lambda: not kube.pods(USER_NS, "component=singleuser-server"), BOUND, 1, "the notebook pod to go"
    )
    assert core.read_namespaced_persistent_volume_claim(f"home-{USER}", USER_NS).status.phase == "Bound"
    print(f"helm install --wait: {release['installed_s']:.0f} s; spawn to ready: {spawn_s:.0f} s")


def test_helm_uninstall_leaves_nothing_of_the_release(release):
    """Runs after the spawn test (same module, file order): the chart's every object goes."""
    import yaml

    kube, helm_cmd = release["kube"], release["helm"]
    objects = [o for o in yaml.safe_load_all(release["manifest"]) if o]
    assert {o["kind"] for o in objects} >= {"Deployment", "Service", "PersistentVolumeClaim", "ClusterRole"}
    r = subprocess.run(
        [*helm_cmd, "uninstall", RELEASE, "--wait", "--timeout", f"{int(BOUND)}s"],
        capture_output=True,
        text=True,
        timeout=BOUND + 60,
    )
    assert r.returncode == 0, r.stderr
    from devcluster.cluster import Cluster

    def left() -> list[str]:
        out = []
        for o in objects:
            args = ["get", o["kind"], o["metadata"]["name"], "--ignore-not-found", "-o", "name"]
            if o["kind"] not in (
                "ClusterRole",
                "ClusterRoleBinding",
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding",
                "StorageClass",
                "PriorityClass",
            ):
                args += ["-n", HUB_NS]
            out += Cluster().kubectl(*args).stdout.split()
        out += [f"pod/{p.metadata.name}" for p in kube.pods(HUB_NS)]
        return out

    wait_for(lambda: not left(), BOUND, 1, f"the release's objects to go (left: {left()})")
    # the hub's database volume was released and the pool empties it for the next claim
    secrets_left = [s.metadata.name for s in kube.core.list_namespaced_secret(HUB_NS).items]
    assert not [s for s in secrets_left if s.startswith(("sh.helm.release", FULLNAME))], secrets_left
