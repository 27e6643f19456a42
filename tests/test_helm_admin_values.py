"""The chart with the values an administrator brings from Zero-to-JupyterHub: an Ingress with
TLS, registry credentials (``imagePullSecrets: [name]``), the cluster's default StorageClass
(empty ``lab.storage_class``). Rendered by ``helm template`` and compared with literal objects;
the rendered hub config loaded as JupyterHub loads it."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "hub_config"))

from test_helm import CHART, K8S_VERSIONS, by_kind, helm_binary, render, run_helm  # noqa: E402
from test_hub_spawner import kubeconfig, make_spawner  # noqa: E402, F401

#: Values as a Zero-to-JupyterHub user writes them (its keys and shapes, ours where it has none).
Z2JH_VALUES = """\
imagePullSecrets: [regcred]
ingress:
  enabled: true
  ingressClassName: traefik
  annotations:
    cert-manager.io/cluster-issuer: letsencrypt
  hosts: [lab.example.org]
  tls:
    - hosts: [lab.example.org]
      secretName: lab-tls
prePuller:
  enabled: true
placeholder:
  enabled: true
lab:
  storage_class: ""
"""

PULL = [{"name": "regcred"}]


@pytest.fixture(scope="session")
def helm(request, tmp_path_factory) -> Path:
    """The helm binary, as tests/test_helm.py extracts it."""
    return helm_binary(request, tmp_path_factory)


@pytest.fixture
def values_file(tmp_path) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(Z2JH_VALUES)
    return path


def pod_templates(docs: list[dict]) -> dict[str, dict]:
    """Every pod spec the chart renders, by its object's name."""
    out = {}
    for doc in docs:
        template = (doc.get("spec") or {}).get("template")
        if template:
            out[f"{doc['kind']}/{doc['metadata']['name']}"] = template["spec"]
    return out


def test_an_ingress_with_tls_routes_to_the_proxys_public_service(helm, values_file):
    docs = render(helm, "-f", str(values_file))
    (ingress,) = by_kind(docs, "Ingress")
    assert ingress["metadata"]["annotations"] == {"cert-manager.io/cluster-issuer": "letsencrypt"}
    assert ingress["spec"] == {
        "ingressClassName": "traefik",
        "rules": [{
            "host": "lab.example.org",
            "http": {"paths": [{
                "path": "/",
                "pathType": "Prefix",
                "backend": {"service": {"name": "lab-tfk8s-lab-proxy-public",
                                        "port": {"name": "http"}}},
            }]},
        }],
        "tls": [{"hosts": ["lab.example.org"], "secretName": "lab-tls"}],
    }
    public = next(s for s in by_kind(docs, "Service")
                  if s["metadata"]["name"] == "lab-tfk8s-lab-proxy-public")
    assert [p["name"] for p in public["spec"]["ports"]] == ["http"]  # the port the Ingress names


def test_an_ingress_follows_the_base_url_and_serves_every_host_when_none_is_named(helm):
    docs = render(helm, "--set", "ingress.enabled=true", "--set", "hub.baseUrl=/lab/")
    (ingress,) = by_kind(docs, "Ingress")
    assert ingress["spec"] == {"rules": [{"http": {"paths": [{
        "path": "/lab/", "pathType": "Prefix",
        "backend": {"service": {"name": "lab-tfk8s-lab-proxy-public", "port": {"name": "http"}}},
    }]}}]}
    assert not by_kind(render(helm), "Ingress")  # off by default


def test_the_hub_mounts_the_admins_extra_volumes_beside_its_own(helm, tmp_path):
    """Zero-to-JupyterHub's hub.extraVolumes / hub.extraVolumeMounts: a private OIDC provider's CA
    from a ConfigMap, read through SSL_CERT_FILE (install.md, "Logging in once")."""
    values = tmp_path / "ca.yaml"
    values.write_text(yaml.safe_dump({"hub": {
        "extraVolumes": [{"name": "sso-ca", "configMap": {"name": "sso-ca"}}],
        "extraVolumeMounts": [{"name": "sso-ca", "mountPath": "/etc/sso-ca", "readOnly": True}],
        "extraEnv": [{"name": "SSL_CERT_FILE", "value": "/etc/sso-ca/ca.crt"}],
    }}))
    hub = pod_templates(render(helm, "-f", str(values)))["Deployment/lab-tfk8s-lab-hub"]
    assert [v["name"] for v in hub["volumes"]] == ["tmp", "config", "db", "sso-ca"]
    assert hub["volumes"][-1] == {"name": "sso-ca", "configMap": {"name": "sso-ca"}}
    (container,) = hub["containers"]
    assert container["volumeMounts"][-1] == {"name": "sso-ca", "mountPath": "/etc/sso-ca", "readOnly": True}
    assert [m["mountPath"] for m in container["volumeMounts"][:-1]] == [
        "/tmp", "/etc/jupyterhub/jupyterhub_config.py", "/etc/jupyterhub/values.json", "/srv/jupyterhub"]
    assert {"name": "SSL_CERT_FILE", "value": "/etc/sso-ca/ca.crt"} in container["env"]
    # none by default
    default = pod_templates(render(helm))["Deployment/lab-tfk8s-lab-hub"]
    assert [v["name"] for v in default["volumes"]] == ["tmp", "config", "db"]


def test_every_pod_template_pulls_with_the_secrets(helm, values_file):
    templates = pod_templates(render(helm, "-f", str(values_file)))
    assert sorted(templates) == [
        "DaemonSet/lab-tfk8s-lab-image-puller",
        "Deployment/lab-tfk8s-lab-hub",
        "Deployment/lab-tfk8s-lab-placeholder",
        "Deployment/lab-tfk8s-lab-proxy",
        "Job/lab-tfk8s-lab-uninstall",
    ]
    for name, spec in templates.items():
        assert spec["imagePullSecrets"] == PULL, name
    # none without the value, and both spellings Zero-to-JupyterHub accepts give the same list
    assert not any("imagePullSecrets" in s for s in pod_templates(render(
        helm, "--set", "prePuller.enabled=true", "--set", "placeholder.enabled=true")).values())
    both = pod_templates(render(helm, "--set", "imagePullSecrets[0]=a",
                                "--set", "imagePullSecrets[1].name=b"))
    assert {json.dumps(s["imagePullSecrets"]) for s in both.values()} == {
        json.dumps([{"name": "a"}, {"name": "b"}])}


def test_the_hub_reads_only_the_secrets_it_copies_in_its_own_namespace(helm, values_file):
    docs = render(helm, "-f", str(values_file), "--set", "lab.copy_secrets={s3-creds}")
    # the Role that reads Secrets (the other reads where the API server is: tests/test_helm_netpol.py)
    (role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-secrets")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
                              "resourceNames": ["regcred", "s3-creds"]}]
    (binding,) = [b for b in by_kind(docs, "RoleBinding") if b["roleRef"]["name"] == role["metadata"]["name"]]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "lab-tfk8s-lab-hub",
                                    "namespace": "jhub"}]
    assert not [r for r in by_kind(render(helm), "Role")  # nothing to copy: nothing to read
                if any("secrets" in rule["resources"] for rule in r["rules"])]
    hub = next(r for r in by_kind(docs, "ClusterRole")
               if r["metadata"]["labels"]["app.kubernetes.io/component"] == "hub")
    (secrets,) = [r for r in hub["rules"] if "secrets" in r["resources"]]
    assert secrets["verbs"] == ["create", "patch"]  # written in user namespaces, never read there


def test_the_values_file_carries_the_pull_secrets_and_an_empty_storage_class(helm, values_file):
    (cm,) = by_kind(render(helm, "-f", str(values_file)), "ConfigMap")
    lab = json.loads(cm["data"]["values.json"])["lab"]
    assert (lab["image_pull_secrets"], lab["storage_class"]) == (["regcred"], "")
    # helm drops a key set to null: the hub must still get "the cluster's default", not its own
    (cm,) = by_kind(render(helm, "--set", "lab.storage_class=null"), "ConfigMap")
    assert json.loads(cm["data"]["values.json"])["lab"]["storage_class"] == ""


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_admin_values_validate_strictly(helm, values_file, version):
    docs = render(helm, "-f", str(values_file), "--set", "lab.copy_secrets={s3-creds}",
                  "--set", "lab.queue=team", "--kube-version", f"{version}.0")
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("args, words", [
    (["--set", "imagePullSecrets[0]=Not_A_Name"], ["imagePullSecrets"]),
    (["--set", "ingress.tls[0].secret=x"], ["secret"]),
    (["--set", "ingress.pathType=Regex"], ["/ingress/pathType"]),
    (["--set", "lab.start_timeout=0"], ["/lab/start_timeout"]),
    (["--set", "lab.data_size=lots"], ["/lab/data_size"]),
])
def test_the_schema_refuses_bad_admin_values(helm, args, words):
    r = run_helm(helm, "template", "lab", str(CHART), *args, check=False)
    assert r.returncode != 0
    for word in words:
        assert word in r.stderr


@pytest.mark.usefixtures("kubeconfig")
def test_the_rendered_hub_gives_kubespawner_what_a_production_cluster_needs(
        helm, values_file, tmp_path, monkeypatch):
    """The ConfigMap's files, loaded as JupyterHub loads them: a start timeout a fresh node can
    pull a multi-GB image in, homes kept when users are deleted, no empty storage class (the
    cluster's default binds the home), and the pull secret on the notebook pod."""
    from jupyterhub.app import JupyterHub

    (cm,) = by_kind(render(helm, "-f", str(values_file), namespace="lab"), "ConfigMap")
    for name, text in cm["data"].items():
        (tmp_path / name).write_text(text)
    monkeypatch.setenv("TFK8S_HUB_VALUES", str(tmp_path / "values.json"))
    app = JupyterHub()
    app.load_config_file(str(tmp_path / "jupyterhub_config.py"))
    sp = make_spawner(app, "ada")
    assert sp.start_timeout >= 300
    assert sp.delete_pvc is False
    assert sp.storage_class is None
    assert sp.image_pull_secrets == PULL
    assert sp.image_pull_policy is None  # Kubernetes' own default for the notebook image
    pvc = sp.get_pvc_manifest()
    assert pvc.spec.storage_class_name is None
    assert "volume.beta.kubernetes.io/storage-class" not in (pvc.metadata.annotations or {})
    pod = asyncio.run(sp.get_pod_manifest())
    assert [r.name for r in pod.spec.image_pull_secrets] == ["regcred"]
    assert pod.spec.security_context["fsGroup"] == 100  # the tasks' too (one group per claim)
    env = sp._expand_env(sp.environment)
    assert env["TFK8S_STORAGE_CLASS"] == ""  # the notebook's clusters: the default class too


def test_culling_users_keeps_their_homes_unless_the_admin_says_otherwise(helm, tmp_path):
    from tfk8s_hub.settings import LabSettings
    from tfk8s_hub.spawner import kubespawner_config

    for args, delete in (([], False), (["--set", "lab.delete_pvc=true"], True)):
        (cm,) = by_kind(render(helm, "--set", "cull.users=true", *args), "ConfigMap")
        lab = json.loads(cm["data"]["values.json"])["lab"]
        assert kubespawner_config(LabSettings(**lab))["delete_pvc"] is delete
    assert "DATA LOSS" in yaml.safe_dump((CHART / "values.yaml").read_text())
