"""The Kubernetes profile: the config loads in a real JupyterHub + KubeSpawner; hooks apply/stop."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import kubernetes.client
import kubernetes_asyncio.client
import pytest
from jupyterhub.app import JupyterHub
from kubespawner import KubeSpawner

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "hub_config"))

from tfk8s_hub.bootstrap import BootstrapSpec, bootstrap_objects  # noqa: E402
from tfk8s_hub.settings import LabSettings  # noqa: E402
from tfk8s_hub.spawner import Applier, kubespawner_config, make_modify_pod_hook, make_post_stop_hook  # noqa: E402

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


@pytest.fixture
def kubeconfig(tmp_path, monkeypatch):
    """A kubeconfig pointing nowhere: KubeSpawner loads it; nothing here calls it."""
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    monkeypatch.setenv("KUBECONFIG", str(path))
    # read from the environment when kubernetes_asyncio is imported: set it where it is used
    import kubernetes_asyncio.config.kube_config as kc

    monkeypatch.setattr(kc, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    return path


def load_hub(config_file: Path, values: dict | None, tmp_path: Path, monkeypatch) -> JupyterHub:
    """A real JupyterHub application with ``config_file`` loaded (not started)."""
    if values is not None:
        vpath = tmp_path / "values.json"
        vpath.write_text(json.dumps(values))
        monkeypatch.setenv("TFK8S_HUB_VALUES", str(vpath))
    monkeypatch.setenv("POD_NAMESPACE", "jhub")
    app = JupyterHub()
    app.load_config_file(str(config_file))
    return app


def make_spawner(app: JupyterHub, name: str = "alice") -> KubeSpawner:
    user = SimpleNamespace(
        name=name, id=7, url=f"/user/{name}/", server_url=lambda s="": f"/user/{name}/"
    )
    hub = SimpleNamespace(
        public_host="", url="http://hub:8081/hub/", base_url="/", api_url="http://hub:8081/hub/api"
    )

    async def build():
        return KubeSpawner(config=app.config, user=user, hub=hub, _mock=True)

    return asyncio.run(build())


def test_kubespawner_config_from_settings():
    cfg = kubespawner_config(
        LabSettings(storage_class="kadalu.gluster", notebook_cpu_guarantee="500m")
    )
    assert cfg["enable_user_namespaces"] is True
    assert cfg["storage_class"] == "kadalu.gluster"
    assert cfg["storage_pvc_ensure"] is True
    assert cfg["storage_access_modes"] == ["ReadWriteMany"]
    assert cfg["service_account"] == "tfk8s-user"
    assert cfg["automount_service_account_token"] is True
    assert cfg["cpu_guarantee"] == 0.5
    assert cfg["volumes"] == [
        {"name": "home", "persistentVolumeClaim": {"claimName": "{pvc_name}"}}
    ]
    assert cfg["environment"]["TFK8S_STORAGE_CLASS"] == "kadalu.gluster"
    assert cfg["environment"]["TFK8S_NAMESPACE"] == "{namespace}"


def test_config_loads_in_jupyterhub_and_sets_kubespawner(kubeconfig, tmp_path, monkeypatch):
    values = {
        "lab": {
            "storage_class": "kadalu.gluster",
            "notebook_image": "reg/nb:1",
            "task_image": "reg/task:1",
        },
        "hub": {
            "hubService": "hub",
            "namespace": "jhub",
            "proxyApiService": "proxy-api",
            "auth": {"adminUsers": ["root"]},
        },
    }
    app = load_hub(REPO / "hub_config" / "jupyterhub_config.py", values, tmp_path, monkeypatch)
    assert app.config.JupyterHub.spawner_class == "kubespawner.KubeSpawner"
    # namespace-qualified: notebooks in jhub-alice cannot resolve a short name of namespace jhub
    assert app.config.JupyterHub.hub_connect_url == "http://hub.jhub.svc:8081"
    assert app.config.ConfigurableHTTPProxy.should_start is False
    assert app.config.Authenticator.admin_users == {"root"}
    sp = make_spawner(app)
    assert sp.enable_user_namespaces is True
    assert sp.namespace == "jhub-alice"
    assert sp.service_account == "tfk8s-user"
    assert sp.storage_class == "kadalu.gluster"
    assert sp.image == "reg/nb:1"
    assert sp.pvc_name == "home-alice"
    assert callable(sp.modify_pod_hook) and callable(sp.post_stop_hook)
    pvc = sp.get_pvc_manifest()
    assert pvc.spec.storage_class_name == "kadalu.gluster"
    assert pvc.spec.access_modes == ["ReadWriteMany"]
    sp.server = None
    env = sp._expand_env(sp.environment)
    assert env["TFK8S_NAMESPACE"] == "jhub-alice"
    assert env["TFK8S_BACKEND"] == "kubernetes"
    assert env["TFK8S_IMAGE"] == "reg/task:1"
    assert sp.environment["TENSORBOARD_PROXY_URL"](sp) == "/user/alice/proxy/%PORT%/"


def test_kubespawner_gives_each_api_request_ten_times_the_slo(kubeconfig, tmp_path, monkeypatch):
    """KubeSpawner creates the user's namespace in one request with no retry: its default bound of
    3 s failed 10 of 200 spawns at once on a busy API server (bench/hub_scale.py --users 200)."""
    app = load_hub(REPO / "hub_config" / "jupyterhub_config.py", {}, tmp_path, monkeypatch)
    assert make_spawner(app).k8s_api_request_timeout == 10


def test_extra_config_runs_last(kubeconfig, tmp_path, monkeypatch):
    values = {"hub": {"extraConfig": "c.KubeSpawner.start_timeout = 123"}}
    app = load_hub(REPO / "hub_config" / "jupyterhub_config.py", values, tmp_path, monkeypatch)
    assert app.config.KubeSpawner.start_timeout == 123


#: What the fake API answers for the API server's Service and EndpointSlice (read at each spawn).
READS = {
    "read_namespaced_service": {"spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 443}]}},
    "read_namespaced_endpoint_slice": {
        "endpoints": [{"addresses": ["10.245.0.1"]}],
        "ports": [{"port": 6443, "protocol": "TCP"}],
    },
}


class FakeApi:
    """Records calls; ``fail`` maps a method name to the exception it raises once."""

    def __init__(self, calls: list, fail: dict | None = None, is_async: bool = True):
        self.calls, self.fail, self.is_async = calls, fail or {}, is_async

    def __getattr__(self, method):
        def call(*args, **kwargs):
            self.calls.append((method, args, kwargs))
            if method in self.fail:
                raise self.fail.pop(method)
            result = READS.get(method)
            if self.is_async:
                return asyncio.sleep(0, result)
            return result

        return call


def api_of(calls, fail=None, is_async=True):
    apis: dict = {}

    def get(name):
        return apis.setdefault(
            name, FakeApi(calls, fail if name == "CoreV1Api" else None, is_async)
        )

    return get


#: How the bootstrap applies: server-side apply, as the hub's own field manager, taking over
#: only the fields it sets.
SSA = {"field_manager": "tfk8s-lab-hub", "force": True,
       "_content_type": "application/apply-patch+yaml"}


def test_applier_applies_server_side_as_its_own_field_manager():
    calls: list = []
    sa = bootstrap_objects(BootstrapSpec(), "ns")[0]
    assert asyncio.run(Applier(api_of(calls)).apply(sa)) == "applied"
    assert calls == [("patch_namespaced_service_account", ("tfk8s-user", "ns", sa), SSA)]


@pytest.mark.parametrize(
    "exc_class", [kubernetes.client.ApiException, kubernetes_asyncio.client.ApiException,
                  # what the pinned client really raises for a 403 (a subclass)
                  kubernetes.client.exceptions.ForbiddenException]
)
def test_applier_raises_other_errors(exc_class):
    sa = bootstrap_objects(BootstrapSpec(), "ns")[0]
    api = api_of([], fail={"patch_namespaced_service_account": exc_class(status=403)})
    with pytest.raises(exc_class) as err:
        asyncio.run(Applier(api).apply(sa))
    assert err.value.status == 403


def test_the_bootstrap_applies_every_object_at_once():
    """A spawn waits for the slowest apply, not for the sum of them (with 100 users spawning,
    the API server's applies take ~0.3 s each: one after the other, 5 cost 2-3 s a spawn)."""
    in_flight, most = [0], [0]

    class SlowApi:
        def __getattr__(self, method):
            async def call(*args, **kwargs):
                in_flight[0] += 1
                most[0] = max(most[0], in_flight[0])
                await asyncio.sleep(0.01)
                in_flight[0] -= 1

            return call

    objs = bootstrap_objects(BootstrapSpec.from_settings(LabSettings()), "ns")  # the chart's
    done = asyncio.run(Applier(lambda name: SlowApi()).apply_all(objs))
    assert most[0] == len(objs) >= 5
    assert done == [(o["kind"], o["metadata"]["name"], "applied") for o in objs]  # in their order


def test_applier_works_with_the_sync_client_too():
    calls: list = []
    assert asyncio.run(
        Applier(api_of(calls, is_async=False)).apply(bootstrap_objects(BootstrapSpec(), "ns")[0])
    )
    assert calls[0][0] == "patch_namespaced_service_account"


def test_modify_pod_hook_bootstraps_the_namespace_and_returns_the_pod():
    calls: list = []
    hook = make_modify_pod_hook(LabSettings(hub_namespace="jhub"), api=api_of(calls))
    spawner = SimpleNamespace(namespace="jhub-bob", log=SimpleNamespace(info=lambda *a: None))
    pod = object()
    assert asyncio.run(hook(spawner, pod)) is pod
    reads, writes = calls[:2], calls[2:]
    # where the API server is, read at each spawn: the Service and its endpoints
    assert [(c[0], c[1]) for c in reads] == [
        ("read_namespaced_service", ("kubernetes", "default")),
        ("read_namespaced_endpoint_slice", ("kubernetes", "default")),
    ]
    assert [c[0] for c in writes] == [
        "patch_namespaced_service_account",
        "patch_namespaced_role_binding",
        "patch_namespaced_limit_range",
        "patch_namespaced_resource_quota",
        "patch_namespaced_resource_quota",
        "patch_namespaced_network_policy",
    ]
    assert all(c[1][1] == "jhub-bob" and c[2] == SSA for c in writes)
    policy = writes[-1][1][2]
    (api_rule,) = [r for r in policy["spec"]["egress"] if {"ipBlock": {"cidr": "10.245.0.1/32"}} in r["to"]]
    assert api_rule["to"] == [{"ipBlock": {"cidr": "10.96.0.1/32"}}, {"ipBlock": {"cidr": "10.245.0.1/32"}}]
    assert api_rule["ports"] == [{"protocol": "TCP", "port": p} for p in (443, 6443)]


@pytest.mark.parametrize("k", [kubernetes_asyncio.client, kubernetes.client], ids=["asyncio", "sync"])
@pytest.mark.parametrize("with_slice", [True, False], ids=["slice", "no-slice"])
def test_the_api_servers_addresses_are_read_from_either_clients_models(k, with_slice):
    """KubeSpawner's client answers with models, not dicts: the Service's address is read from
    a model as from the API's JSON. (The sync client's own serializer turned an asyncio model
    into snake_case keys, so ``clusterIP`` was never found: on a control plane without an
    EndpointSlice for it, every spawn failed; everywhere else the Service's address was left
    out of the user namespaces' egress rule.)"""
    from tfk8s_hub.spawner import read_api_server

    service = k.V1Service(spec=k.V1ServiceSpec(
        cluster_ip="10.96.0.1", cluster_ips=["10.96.0.1"], ports=[k.V1ServicePort(port=443, protocol="TCP")]))
    endpoint_slice = k.V1EndpointSlice(
        address_type="IPv4", endpoints=[k.V1Endpoint(addresses=["10.245.0.1"])],
        ports=[k.DiscoveryV1EndpointPort(port=6443, protocol="TCP")])

    class Api:
        async def read_namespaced_service(self, name, namespace):
            return service

        async def read_namespaced_endpoint_slice(self, name, namespace):
            if not with_slice:
                raise k.ApiException(status=404)
            return endpoint_slice

    found = asyncio.run(read_api_server(lambda name: Api()))
    if with_slice:
        assert (found.cidrs, found.ports) == (("10.96.0.1/32", "10.245.0.1/32"), (443, 6443))
    else:
        assert (found.cidrs, found.ports) == (("10.96.0.1/32",), (443,))


def test_the_hook_refuses_to_spawn_when_it_cannot_find_the_api_server():
    calls: list = []
    denied = kubernetes_asyncio.client.ApiException(status=403)
    hook = make_modify_pod_hook(
        LabSettings(hub_namespace="jhub"), api=api_of(calls, fail={"read_namespaced_service": denied})
    )
    spawner = SimpleNamespace(namespace="jhub-bob", log=SimpleNamespace(info=lambda *a: None))
    with pytest.raises(RuntimeError, match="HTTP 403.*lab.api_server_cidrs"):
        asyncio.run(hook(spawner, object()))
    assert [c[0] for c in calls] == ["read_namespaced_service"]  # nothing written
    # named CIDRs: nothing to read
    calls.clear()
    hook = make_modify_pod_hook(
        LabSettings(hub_namespace="jhub", api_server_cidrs=["10.0.0.2/32"]), api=api_of(calls)
    )
    asyncio.run(hook(spawner, object()))
    assert not [c for c in calls if c[0].startswith("read_")]


@pytest.mark.parametrize("enabled", [True, False])
def test_post_stop_hook_stops_the_users_clusters(enabled):
    calls: list = []
    hook = make_post_stop_hook(LabSettings(stop_clusters_on_stop=enabled), api=api_of(calls))
    spawner = SimpleNamespace(namespace="jhub-bob", log=SimpleNamespace(info=lambda *a: None))
    asyncio.run(hook(spawner))
    if not enabled:
        assert calls == []
        return
    assert [(c[0], c[1], c[2]["label_selector"]) for c in calls] == [
        (
            "delete_collection_namespaced_deployment",
            ("jhub-bob",),
            "app.kubernetes.io/managed-by=tfk8s,tfk8s.io/component!=serving",
        ),
        (
            "delete_collection_namespaced_custom_object",
            ("jobset.x-k8s.io", "v1alpha2", "jhub-bob", "jobsets"),
            "app.kubernetes.io/managed-by=tfk8s,tfk8s.io/detached!=true",
        ),
    ]
    assert calls[1][2]["propagation_policy"] == "Foreground"


def test_cluster_selector_matches_the_backends_labels():
    from tfk8s_magics.backends.kubernetes.manifests import MANAGED_BY

    key, value = next(iter(MANAGED_BY.items()))
    assert LabSettings().cluster_label_selector == f"{key}={value}"


def test_applier_recreates_a_role_binding_whose_role_ref_changed():
    """An older hub bound a per-namespace Role; the binding now names the chart's ClusterRole,
    and the API server refuses to change a roleRef (422): delete it and create it again."""
    calls: list = []

    class Rbac:
        def __getattr__(self, name):
            def call(*args, **kwargs):
                calls.append(name)
                if name == "patch_namespaced_role_binding" and calls.count(name) == 1:
                    raise kubernetes.client.ApiException(status=422, reason="Invalid")
            return call

    binding = next(o for o in bootstrap_objects(BootstrapSpec(), "ns") if o["kind"] == "RoleBinding")
    assert asyncio.run(Applier(lambda name: Rbac()).apply(binding)) == "recreated"
    assert calls == ["patch_namespaced_role_binding", "delete_namespaced_role_binding",
                     "patch_namespaced_role_binding"]


def test_a_control_plane_without_an_endpoint_slice_gives_the_service_address():
    calls: list = []
    missing = kubernetes.client.ApiException(status=404)
    apis: dict = {}

    def api(name):
        return apis.setdefault(
            name,
            FakeApi(calls, {"read_namespaced_endpoint_slice": missing} if name == "DiscoveryV1Api" else None),
        )

    hook = make_modify_pod_hook(LabSettings(hub_namespace="jhub"), api=api)
    spawner = SimpleNamespace(namespace="jhub-bob", log=SimpleNamespace(info=lambda *a: None))
    asyncio.run(hook(spawner, object()))
    policy = calls[-1][1][2]  # patch_namespaced_network_policy(name, namespace, body)
    assert {
        "to": [{"ipBlock": {"cidr": "10.96.0.1/32"}}],
        "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}],
    } in policy["spec"]["egress"]
