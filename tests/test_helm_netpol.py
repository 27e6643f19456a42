"""The chart's NetworkPolicies against the per-user bootstrap's, rendered (no cluster): one set of
Zero-to-JupyterHub egress flags, the same rules for the hub and for user namespaces; the API
server never reached through a whole range; the hub's Cilium policy rendered on its own when the
cluster serves Cilium's CRDs (cilium/cilium#20550)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_helm import CHART, by_kind, helm_binary, render, run_helm

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "hub_config"))
from tfk8s_hub import bootstrap as b  # noqa: E402

CILIUM = ("--api-versions", "cilium.io/v2/CiliumClusterwideNetworkPolicy",
          "--api-versions", "cilium.io/v2/CiliumNetworkPolicy")
PRIVATE = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"]


@pytest.fixture(scope="session")
def helm(request, tmp_path_factory) -> Path:
    """The helm binary, as tests/test_helm.py extracts it."""
    return helm_binary(request, tmp_path_factory)


def policies(helm, *args) -> tuple[dict, dict]:
    """The hub's and the proxy's NetworkPolicy specs."""
    docs = {d["metadata"]["name"]: d for d in by_kind(render(helm, *args), "NetworkPolicy")}
    return docs["lab-tfk8s-lab-hub"]["spec"], docs["lab-tfk8s-lab-proxy"]["spec"]


def flags(only: str | None) -> list[str]:
    return [a for k in b.EGRESS_ALLOW_RULES
            for a in ("--set", f"networkPolicy.egressAllowRules.{k}={'true' if k == only else 'false'}")]


@pytest.mark.parametrize("flag", [*b.EGRESS_ALLOW_RULES, None])
def test_the_hub_gets_the_rules_a_user_namespace_gets_for_the_same_flag(helm, flag):
    hub, proxy = policies(helm, *flags(flag))
    expected = b.egress_allow_rules({k: k == flag for k in b.EGRESS_ALLOW_RULES})
    # the hub's own rules come first: proxy API, notebooks, the API server
    assert hub["egress"][3:] == expected
    dns = expected if flag and flag.startswith("dnsPorts") else []
    assert proxy["egress"][2:] == dns  # the proxy resolves names, and reaches nothing else


def test_the_hubs_defaults_keep_private_ranges_and_the_metadata_server_closed(helm):
    hub, proxy = policies(helm)
    assert hub["egress"][3:] == b.egress_allow_rules({
        **b.EGRESS_ALLOW_RULES, "privateIPs": False, "cloudMetadataServer": False})
    internet = hub["egress"][-1]["to"][0]["ipBlock"]
    assert internet == {"cidr": "0.0.0.0/0", "except": [*PRIVATE, "169.254.0.0/16"]}
    # NodeLocal DNSCache at kubespray's address, and GKE Cloud DNS on DNS ports only
    dns = proxy["egress"][2]
    assert {"ipBlock": {"cidr": "169.254.25.10/32"}} in dns["to"]
    assert {"ipBlock": {"cidr": "169.254.169.254/32"}} in dns["to"]
    assert dns["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    # the deprecated name still closes the internet
    hub, _ = policies(helm, "--set", "networkPolicy.hubInternet=false")
    assert not [r for r in hub["egress"] if r["to"][0].get("ipBlock", {}).get("cidr") == "0.0.0.0/0"]


def test_the_hub_reaches_the_api_server_only_where_it_is(helm):
    hub, _ = policies(helm)
    api = hub["egress"][2]
    assert api["ports"] == [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]
    # no cluster to look up (helm template): the private ranges, never 0.0.0.0/0
    assert api["to"] == [{"ipBlock": {"cidr": c}} for c in PRIVATE]
    hub, _ = policies(helm, "--set", "lab.api_server_cidrs={192.168.5.2/32}")
    assert hub["egress"][2]["to"] == [{"ipBlock": {"cidr": "192.168.5.2/32"}}]


def test_the_hub_may_read_where_the_api_server_is_and_nothing_else(helm):
    docs = render(helm)
    (role,) = by_kind(docs, "Role")
    assert role["metadata"]["namespace"] == "default"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["services"], "resourceNames": ["kubernetes"],
         "verbs": ["get"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
         "resourceNames": ["kubernetes"], "verbs": ["get"]}]
    (binding,) = by_kind(docs, "RoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "lab-tfk8s-lab-hub", "namespace": "jhub"}]
    # named addresses: nothing to read
    assert not by_kind(render(helm, "--set", "lab.api_server_cidrs={10.0.0.2/32}"), "Role")


def test_cilium_policies_are_rendered_when_the_cluster_serves_ciliums_crds(helm):
    assert not [d for d in render(helm) if d["apiVersion"] == "cilium.io/v2"]
    docs = render(helm, *CILIUM)
    (users,) = by_kind(docs, "CiliumClusterwideNetworkPolicy")
    (hub,) = by_kind(docs, "CiliumNetworkPolicy")
    api = {"toEntities": ["kube-apiserver"], "toPorts": [{"ports": [
        {"port": "443", "protocol": "TCP"}, {"port": "6443", "protocol": "TCP"}]}]}
    node_dns = {"toEntities": ["host"], "toPorts": [{"ports": [
        {"port": "53", "protocol": "UDP"}, {"port": "53", "protocol": "TCP"}]}]}
    assert users["spec"]["egress"] == [api, node_dns]
    hub_rule, proxy_rule = hub["specs"]
    assert hub_rule["endpointSelector"] == {"matchLabels": {
        "app.kubernetes.io/name": "tfk8s-lab", "app.kubernetes.io/instance": "lab",
        "app.kubernetes.io/component": "hub"}}
    assert hub_rule["egress"] == [api, node_dns]  # the hub, not only its users (the defect)
    assert proxy_rule["endpointSelector"]["matchLabels"]["app.kubernetes.io/component"] == "proxy"
    assert proxy_rule["egress"] == [node_dns]
    # the value wins over the cluster's CRDs, both ways
    assert not [d for d in render(helm, *CILIUM, "--set", "networkPolicy.ciliumApiServer=false")
                if d["apiVersion"] == "cilium.io/v2"]
    forced = render(helm, "--set", "networkPolicy.ciliumApiServer=true")
    assert len([d for d in forced if d["apiVersion"] == "cilium.io/v2"]) == 2
    # without DNS to private addresses, no DNS to the node either
    docs = render(helm, *CILIUM, "--set", "lab.egress_allow_rules.dnsPortsPrivateIPs=false",
                  "--set", "networkPolicy.egressAllowRules.dnsPortsPrivateIPs=false")
    assert by_kind(docs, "CiliumClusterwideNetworkPolicy")[0]["spec"]["egress"] == [api]
    assert by_kind(docs, "CiliumNetworkPolicy")[0]["specs"] == [{**hub_rule, "egress": [api]}]


@pytest.mark.parametrize(("args", "words"), [
    (("--set", "lab.egress_allow_rules.dnsPortsNodeLocal=true"), "dnsPortsNodeLocal"),
    (("--set", "networkPolicy.egressAllowRules.everything=true"), "everything"),
    (("--set", "lab.api_server_cidrs={apiserver.example}"), "api_server_cidrs"),
])
def test_the_schema_refuses_unknown_rules_and_addresses_that_are_no_cidr(helm, args, words):
    r = run_helm(helm, "template", "lab", str(CHART), "--namespace", "jhub", *args, check=False)
    assert r.returncode != 0 and words in r.stderr, r.stderr
