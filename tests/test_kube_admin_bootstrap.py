"""The hub's per-user bootstrap on the REAL API server (``scripts/kube up``), as the hub's own
ServiceAccount with exactly the RBAC the chart renders: server-side apply that keeps what an
administrator added (IRSA annotations, pull secrets), the registry and storage Secrets copied
from the hub's namespace, pull secrets reaching pods that run as ``default``, a LocalQueue per
user namespace, and a launch naming a missing queue refused in one sentence."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import kubernetes.client
import pytest
from kubernetes.client.rest import ApiException

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "hub_config"))

from test_helm import by_kind, helm_binary, render  # noqa: E402
from tfk8s_hub.bootstrap import BootstrapSpec, namespace_labels  # noqa: E402
from tfk8s_hub.settings import LabSettings  # noqa: E402
from tfk8s_hub.spawner import FIELD_MANAGER, make_modify_pod_hook  # noqa: E402

import tfk8s_magics as tk  # noqa: E402
from tfk8s_magics.errors import LaunchFailed  # noqa: E402

pytestmark = pytest.mark.k8s


@pytest.fixture(scope="session")
def helm(request, tmp_path_factory) -> Path:
    """The helm binary, as tests/test_helm.py extracts it."""
    return helm_binary(request, tmp_path_factory)

IRSA = "eks.amazonaws.com/role-arn"
DOCKERCONFIG = base64.b64encode(json.dumps(
    {"auths": {"registry.example:5000": {"auth": base64.b64encode(b"lab:secret").decode()}}}
).encode()).decode()


def _kueue(kind: str, name: str, spec: dict) -> dict:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind, "metadata": {"name": name},
            "spec": spec}


@pytest.fixture
def hub(realkube, helm):
    """A hub namespace holding the admin's Secrets, and the hub's ServiceAccount with the RBAC the
    chart renders for it (imagePullSecrets, lab.copy_secrets and lab.queue set): yields
    ``(settings, api, token)`` -- the hub's LabSettings from the rendered values.json, the API
    objects the hub's own token reaches, and that token."""
    hub_ns = realkube.namespace("hub")
    cq = f"cq-{uuid.uuid4().hex[:6]}"
    docs = render(helm, "--set", "imagePullSecrets={regcred}", "--set", "lab.copy_secrets={s3-creds}",
                  "--set", f"lab.queue={cq}", "--set", "networkPolicy.enabled=false",
                  "--set", "lab.network_policy=false", namespace=hub_ns)
    rbac = [d for d in docs if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                                              "Role", "RoleBinding")]
    for d in rbac:
        if d["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
            d["metadata"]["namespace"] = hub_ns
    realkube.apply([*rbac, _kueue("ClusterQueue", cq, {"namespaceSelector": {}, "resourceGroups": []})])
    realkube.core.create_namespaced_secret(hub_ns, {
        "metadata": {"name": "regcred"}, "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": DOCKERCONFIG}})
    realkube.core.create_namespaced_secret(hub_ns, {
        "metadata": {"name": "s3-creds"}, "type": "Opaque",
        "stringData": {"AWS_ACCESS_KEY_ID": "lab", "AWS_SECRET_ACCESS_KEY": "s3cr3t"}})
    (cm,) = by_kind(docs, "ConfigMap")
    settings = LabSettings(**json.loads(cm["data"]["values.json"])["lab"])
    token = realkube.token(hub_ns, "lab-tfk8s-lab-hub")
    client = realkube.client_with_token(token)
    yield settings, (lambda name: getattr(kubernetes.client, name)(client)), token
    rbac_api = kubernetes.client.RbacAuthorizationV1Api(realkube.admin)
    for d in rbac:
        if d["kind"] == "ClusterRole":
            rbac_api.delete_cluster_role(d["metadata"]["name"])
        elif d["kind"] == "ClusterRoleBinding":
            rbac_api.delete_cluster_role_binding(d["metadata"]["name"])
    realkube.custom.delete_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", cq)


def _spawn(settings: LabSettings, api, namespace: str) -> None:
    """What KubeSpawner does before creating the notebook pod: the modify_pod_hook."""
    hook = make_modify_pod_hook(settings, api=api)
    spawner = SimpleNamespace(namespace=namespace, log=SimpleNamespace(info=lambda *a: None))
    asyncio.run(hook(spawner, object()))


def _user_namespace(realkube, settings: LabSettings) -> str:
    # created as KubeSpawner creates it (its labels come from the hub's settings)
    return realkube.namespace("jhub-ada", labels=namespace_labels(BootstrapSpec.from_settings(settings)))


def test_a_spawn_keeps_what_an_admin_added_to_the_service_accounts(realkube, hub):
    settings, api, _ = hub
    ns = _user_namespace(realkube, settings)
    _spawn(settings, api, ns)
    core = realkube.core
    for sa in ("tfk8s-user", "default"):
        # the admin annotates for IRSA and adds a pull secret of their own, by hand
        core.patch_namespaced_service_account(sa, ns, {
            "metadata": {"annotations": {IRSA: "arn:aws:iam::123456789012:role/lab"}},
            "imagePullSecrets": [{"name": "admin-added"}, {"name": "regcred"}]})
    _spawn(settings, api, ns)  # the user's next start
    for sa in ("tfk8s-user", "default"):
        obj = core.read_namespaced_service_account(sa, ns)
        assert obj.metadata.annotations[IRSA] == "arn:aws:iam::123456789012:role/lab", sa
        assert [r.name for r in obj.image_pull_secrets] == ["admin-added", "regcred"], sa
        assert obj.metadata.labels["app.kubernetes.io/managed-by"] == "tfk8s-lab-hub", sa
        managers = {(f.manager, f.operation) for f in obj.metadata.managed_fields}
        assert (FIELD_MANAGER, "Apply") in managers, managers
    # the attack the merge defends against: the old create-or-replace (a PUT of the hub's
    # object) takes the admin's annotation away
    mine = core.read_namespaced_service_account("tfk8s-user", ns)
    core.replace_namespaced_service_account("tfk8s-user", ns, {
        "metadata": {"name": "tfk8s-user", "resourceVersion": mine.metadata.resource_version,
                     "labels": mine.metadata.labels}})
    assert IRSA not in (core.read_namespaced_service_account("tfk8s-user", ns).metadata.annotations or {})


def test_workload_identity_annotations_reach_both_service_accounts(realkube, hub):
    settings, api, _ = hub
    settings.service_account_annotations = {"iam.gke.io/gcp-service-account": "lab@p.iam.gserviceaccount.com"}
    ns = _user_namespace(realkube, settings)
    _spawn(settings, api, ns)
    for sa in ("tfk8s-user", "default"):
        annotations = realkube.core.read_namespaced_service_account(sa, ns).metadata.annotations
        assert annotations == {"iam.gke.io/gcp-service-account": "lab@p.iam.gserviceaccount.com"}, sa


def test_the_admins_secrets_are_copied_and_pods_of_default_pull_with_them(realkube, hub):
    settings, api, _ = hub
    ns = _user_namespace(realkube, settings)
    _spawn(settings, api, ns)
    core = realkube.core
    reg = core.read_namespaced_secret("regcred", ns)
    assert (reg.type, reg.data) == ("kubernetes.io/dockerconfigjson", {".dockerconfigjson": DOCKERCONFIG})
    s3 = core.read_namespaced_secret("s3-creds", ns)
    assert base64.b64decode(s3.data["AWS_SECRET_ACCESS_KEY"]) == b"s3cr3t"
    assert s3.metadata.annotations["tfk8s.io/copied-from"] == f"{settings.hub_namespace}/s3-creds"
    # a task pod names no pull secret and runs as "default": admission gives it the registry's
    task = {"metadata": {"name": "task"}, "spec": {
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "t", "image": "registry.example:5000/tfk8s/task:0.1.0",
                        "securityContext": {"allowPrivilegeEscalation": False,
                                            "capabilities": {"drop": ["ALL"]}}}]}}
    made = core.create_namespaced_pod(ns, task, dry_run="All")
    assert [r.name for r in made.spec.image_pull_secrets] == ["regcred"]
    # a changed Secret reaches the user namespace at the next start
    realkube.core.patch_namespaced_secret("s3-creds", settings.hub_namespace,
                                          {"stringData": {"AWS_SECRET_ACCESS_KEY": "rotated"}})
    _spawn(settings, api, ns)
    assert base64.b64decode(core.read_namespaced_secret("s3-creds", ns).data["AWS_SECRET_ACCESS_KEY"]) \
        == b"rotated"


def test_a_missing_secret_fails_the_spawn_with_its_name(realkube, hub):
    from tfk8s_hub.spawner import BootstrapError

    settings, api, _ = hub
    realkube.core.delete_namespaced_secret("s3-creds", settings.hub_namespace)  # never made
    ns = _user_namespace(realkube, settings)
    with pytest.raises(BootstrapError) as err:
        _spawn(settings, api, ns)
    assert str(err.value) == (
        "Secret 's3-creds', which the lab's settings name (imagePullSecrets or lab.copy_secrets), "
        f"does not exist in the hub's namespace {settings.hub_namespace!r}: create it there, or "
        "remove it from the values, then start the server again.")
    # the hub may read only the Secrets the values name: any other stays closed to it
    realkube.core.create_namespaced_secret(settings.hub_namespace, {
        "metadata": {"name": "other"}, "stringData": {"k": "v"}})
    with pytest.raises(ApiException) as denied:
        api("CoreV1Api").read_namespaced_secret("other", settings.hub_namespace)
    assert denied.value.status == 403


def test_each_user_namespace_gets_a_local_queue_of_the_lab_queue(realkube, hub):
    settings, api, _ = hub
    ns = _user_namespace(realkube, settings)
    _spawn(settings, api, ns)
    lq = realkube.custom.get_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", ns, "localqueues",
                                                      settings.queue)
    assert lq["spec"]["clusterQueue"] == settings.queue
    assert lq["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "tfk8s-lab-hub"


def test_a_launch_naming_a_missing_queue_is_refused_in_one_sentence(realkube, kube_user):
    cq = f"cq-{uuid.uuid4().hex[:6]}"
    realkube.apply([_kueue("ClusterQueue", cq, {"namespaceSelector": {}, "resourceGroups": []})])
    try:
        ns, backend = kube_user("q", bootstrap=BootstrapSpec(hub_namespace="default", queue=cq))
        spec = tk.make_spec("gang", script="print(1)\n", queue="nope", workers=1)
        with pytest.raises(LaunchFailed) as err:
            backend.launch(spec)
        assert str(err.value) == (
            f"--queue 'nope': namespace {ns.name!r} has no Kueue LocalQueue of that name, so the "
            "cluster would wait for admission for ever; `kubectl get localqueues` lists the queues "
            "you may use (ask your administrator for one), or launch without --queue. Nothing was "
            "created.")
        assert not realkube.core.list_namespaced_config_map(
            ns.name, label_selector="tfk8s.io/cluster=gang").items
        # the queue the hub made is accepted: the JobSet is created, labelled for Kueue
        backend.launch(tk.make_spec("gang", script="print(1)\n", queue=cq, workers=1), detach=True)
        js = realkube.custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns.name,
                                                          "jobsets", "gang")
        assert js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == cq
        backend.delete("gang")
    finally:
        realkube.custom.delete_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", cq)


def test_the_hubs_asyncio_client_applies_the_same_way(realkube, hub):
    """In the hub the hook runs on KubeSpawner's kubernetes_asyncio clients: the same apply, with
    the apply-patch content type, through that client's own serialiser."""
    import kubernetes_asyncio.client as aclient

    settings, _, token = hub
    ns = _user_namespace(realkube, settings)
    cfg = aclient.Configuration()
    cfg.host = realkube.configuration.host
    cfg.ssl_ca_cert = realkube.configuration.ssl_ca_cert
    cfg.api_key = {"BearerToken": token}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}

    async def spawn_twice():
        async with aclient.ApiClient(cfg) as client:
            hook = make_modify_pod_hook(settings, api=lambda name: getattr(aclient, name)(client))
            spawner = SimpleNamespace(namespace=ns, log=SimpleNamespace(info=lambda *a: None))
            await hook(spawner, None)
            await asyncio.to_thread(realkube.core.patch_namespaced_service_account, "default", ns,
                                    {"metadata": {"annotations": {IRSA: "arn:aws:iam::1:role/x"}},
                                     "imagePullSecrets": [{"name": "admin-added"}, {"name": "regcred"}]})
            await hook(spawner, None)

    asyncio.run(spawn_twice())
    sa = realkube.core.read_namespaced_service_account("default", ns)
    assert sa.metadata.annotations[IRSA] == "arn:aws:iam::1:role/x"
    assert [r.name for r in sa.image_pull_secrets] == ["admin-added", "regcred"]
    assert realkube.core.read_namespaced_secret("s3-creds", ns).type == "Opaque"
    lq = realkube.custom.get_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", ns, "localqueues",
                                                      settings.queue)
    assert lq["spec"]["clusterQueue"] == settings.queue


def test_a_users_launch_names_the_copied_secret(realkube, hub):
    """The admin's storage path end to end on the API server: the hub copies the Secret, and a
    launch as the user's own ServiceAccount with --credentials-secret wires it into its pods."""
    from tests.realkube import KWOK_ANNOTATIONS
    from tfk8s_magics.backends.kubernetes import KubernetesBackend

    settings, api, _ = hub
    ns = _user_namespace(realkube, settings)
    realkube.core.patch_namespace(ns, {"metadata": {"annotations": KWOK_ANNOTATIONS}})
    _spawn(settings, api, ns)
    user = realkube.client_with_token(realkube.token(ns, settings.service_account))
    backend = KubernetesBackend(namespace=ns, api_client=user, user="ada", storage_class="standard")
    try:
        backend.launch(tk.make_spec("s3run", script="print(1)\n", workers=1,
                                    backup_url="s3://bucket/run", credentials_secret="s3-creds"),
                       detach=True)
        js = realkube.custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns,
                                                          "jobsets", "s3run")
        refs = {ref["secretRef"]["name"] for job in js["spec"]["replicatedJobs"]
                for c in job["template"]["spec"]["template"]["spec"]["containers"]
                for ref in c.get("envFrom", [])}
        assert refs == {"s3-creds"}
    finally:  # the namespace, and the detached cluster in it, go at the session's cleanup
        backend.close()
