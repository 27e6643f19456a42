"""The test cluster's Ingress controller (devcluster/ingress.py), its pure builders: Traefik built
from its published module, its least RBAC, its HTTPS-only configuration on the node's address.
The controller at work (HTTPS to the chart's hub through it) is tests/test_kube_ingress.py."""

from __future__ import annotations

import base64
import re
from pathlib import Path

from devcluster import build, ingress
from devcluster.versions import versions

REPO = Path(__file__).resolve().parent.parent


def test_traefik_is_pinned_and_built_from_its_module_through_a_consumer_module():
    v = versions()["TRAEFIK"]
    assert re.fullmatch(r"v3\.\d+\.\d+", v), v
    comp = build.COMPONENTS["traefik"]
    assert comp.version_key == "TRAEFIK" and comp.binaries == ("traefik",)
    gomod = (REPO / "devcluster" / "go" / "traefik" / "go.mod").read_text()
    assert f"require github.com/traefik/traefik/v3 {v}\n" in gomod
    # the replacements of Traefik's own go.mod (Containous forks): without them it does not build
    replaced = dict(re.findall(r"^\t(\S+) => (\S+ \S+)$", gomod, re.M))
    assert set(replaced) == {
        "github.com/abbot/go-http-auth",
        "github.com/gorilla/mux",
        "github.com/mailgun/minheap",
    }
    assert all(r.startswith("github.com/containous/") for r in replaced.values()), replaced
    assert (REPO / "devcluster" / "go" / "traefik" / "go.sum").is_file()
    # scripts/kube build --pods (the suite's background builds) builds it; up --pods starts it
    assert "traefik" in build.TIER2_PARTS and "traefik" not in build.TIER1


def test_the_service_account_may_only_list_and_watch_what_the_provider_reads():
    objs = {(o["kind"], o["metadata"]["name"]): o for o in ingress.objects()}
    role = objs[("ClusterRole", ingress.CLUSTER_ROLE)]
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}  # fmt: skip
    assert granted == {
        (g, r, v)
        for g, r in (
            ("", "services"),
            ("", "secrets"),
            ("", "nodes"),
            ("discovery.k8s.io", "endpointslices"),
            ("networking.k8s.io", "ingresses"),
            ("networking.k8s.io", "ingressclasses"),
        )
        for v in ("list", "watch")
    }, granted  # no write anywhere, not even ingresses/status (no ingressEndpoint is published)
    binding = objs[("ClusterRoleBinding", ingress.CLUSTER_ROLE)]
    assert binding["roleRef"]["name"] == ingress.CLUSTER_ROLE
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": ingress.SERVICE_ACCOUNT, "namespace": ingress.NAMESPACE}
    ]
    token = objs[("Secret", ingress.TOKEN_SECRET)]
    assert token["type"] == "kubernetes.io/service-account-token"
    assert token["metadata"]["annotations"] == {"kubernetes.io/service-account.name": ingress.SERVICE_ACCOUNT}
    cls = objs[("IngressClass", "traefik")]
    assert cls["spec"] == {"controller": "traefik.io/ingress-controller"}


def test_the_kubeconfig_names_the_token_file_never_the_token(tmp_path):
    kc = ingress.kubeconfig("https://10.246.3.1:6443", tmp_path / "ca.crt", tmp_path / "token")
    (cluster,) = kc["clusters"]
    assert cluster["cluster"] == {
        "server": "https://10.246.3.1:6443",
        "certificate-authority": str(tmp_path / "ca.crt"),
        "tls-server-name": "localhost",
    }
    (user,) = kc["users"]
    assert user["user"] == {"tokenFile": str(tmp_path / "token")}


def test_it_serves_https_only_on_the_node_address_and_calls_nobody(tmp_path):
    cfg = ingress.static_config("10.246.3.11", tmp_path / "dynamic.yaml")
    assert cfg["entryPoints"] == {"websecure": {"address": "10.246.3.11:443", "http": {"tls": {}}}}
    assert cfg["global"] == {"checkNewVersion": False, "sendAnonymousUsage": False}
    assert cfg["providers"]["kubernetesIngress"] == {"ingressClass": "traefik"}
    assert cfg["providers"]["file"]["filename"] == str(tmp_path / "dynamic.yaml")
    # no dashboard, API, ping or metrics: nothing else listens (each would open the :8080 entrypoint)
    assert not {"api", "ping", "metrics"} & set(cfg)
    dyn = ingress.dynamic_config(tmp_path / "d.crt", tmp_path / "d.key")
    assert dyn["tls"]["stores"]["default"]["defaultCertificate"] == {
        "certFile": str(tmp_path / "d.crt"),
        "keyFile": str(tmp_path / "d.key"),
    }
    assert dyn["tls"]["options"]["default"]["minVersion"] == "VersionTLS12"


def test_tls_secret_is_what_an_ingress_names():
    s = ingress.tls_secret("lab-tls", "labhub", b"CERT", b"KEY")
    assert s["type"] == "kubernetes.io/tls"
    assert s["metadata"] == {"name": "lab-tls", "namespace": "labhub"}
    assert {k: base64.b64decode(v) for k, v in s["data"].items()} == {"tls.crt": b"CERT", "tls.key": b"KEY"}


def test_the_host_name_is_in_the_reserved_test_domain():
    assert ingress.HOST.endswith(".test")  # RFC 2606: no resolver answers it


def test_a_cluster_without_real_nodes_is_refused_in_one_sentence_leaving_nothing(tmp_path, monkeypatch):
    import types

    import pytest

    monkeypatch.setattr(build, "ensure", lambda name: pytest.fail(f"{name} was built for a refused start"))
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(ingress.IngressError) as e:
        ingress.up(types.SimpleNamespace(root=tmp_path))
    message = str(e.value)
    assert message.count(". ") == 0 and "scripts/kube up --pods" in message, message
    assert sorted(tmp_path.rglob("*")) == before
