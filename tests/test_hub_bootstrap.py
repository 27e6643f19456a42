"""The per-user bootstrap objects: literal dicts, and strict Kubernetes 1.29 / 1.37 schemas."""

from __future__ import annotations

import sys
from pathlib import Path

import kubernetes_validate
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "hub_config"))

from tfk8s_hub import bootstrap as b  # noqa: E402
from tfk8s_hub.settings import LabSettings  # noqa: E402

K8S_VERSIONS = ["1.29", "1.37"]
NS = "jhub-alice"
LABELS = {
    "app.kubernetes.io/name": "tfk8s-lab",
    "app.kubernetes.io/component": "user-namespace",
    "app.kubernetes.io/part-of": "tfk8s-lab",
    "app.kubernetes.io/managed-by": "tfk8s-lab-hub",
}


@pytest.fixture
def spec() -> b.BootstrapSpec:
    return b.BootstrapSpec.from_settings(LabSettings(hub_namespace="jhub"))


def test_service_account(spec):
    assert b.service_account(spec, NS) == {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "tfk8s-user", "namespace": NS, "labels": LABELS},
    }


def test_no_role_is_made_per_namespace_the_binding_grants_the_charts_cluster_role(spec):
    # The hub holds none of the backend's rules: it binds the chart's ClusterRole (by
    # "bind" on that one name), in the user's namespace only (issue 23, item 5).
    assert not hasattr(b, "role")
    rb = b.role_binding(spec, NS)
    assert rb["kind"] == "RoleBinding"  # never a ClusterRoleBinding
    assert rb["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "tfk8s-backend",
    }
    assert rb["subjects"] == [{"kind": "ServiceAccount", "name": "tfk8s-user", "namespace": NS}]
    assert rb["metadata"]["namespace"] == NS
    assert LABELS.items() <= rb["metadata"]["labels"].items()


def test_quota_and_limits_from_settings():
    settings = LabSettings(
        quota={"requests.cpu": "4", "pods": 10},
        default_limits={"cpu": "1"},
        default_requests={},
        max_limits={"memory": "8Gi"},
    )
    spec = b.BootstrapSpec.from_settings(settings)
    assert b.resource_quota(spec, NS) == {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "tfk8s-quota", "namespace": NS, "labels": LABELS},
        "spec": {"hard": {"requests.cpu": "4", "pods": "10"}},
    }
    assert b.limit_range(spec, NS) == {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": "tfk8s-limits", "namespace": NS, "labels": LABELS},
        "spec": {
            "limits": [{"type": "Container", "default": {"cpu": "1"}, "max": {"memory": "8Gi"}}]
        },
    }


def test_no_quota_no_limits_no_policy_when_switched_off():
    spec = b.BootstrapSpec.from_settings(
        LabSettings(quota={}, default_limits={}, default_requests={}, network_policy=False)
    )
    objs = b.bootstrap_objects(spec, NS)
    # the cross-namespace affinity quota is isolation, not a resource limit: it always stays
    assert [(o["kind"], o["metadata"]["name"]) for o in objs] == [
        ("ServiceAccount", "tfk8s-user"), ("RoleBinding", "tfk8s-backend"),
        ("ResourceQuota", "tfk8s-no-cross-namespace-affinity")]


API = b.ApiServer(("10.96.0.1/32", "192.168.5.2/32"), (443, 6443, 8443))
DNS_PORTS = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
PRIVATE = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"]


def test_network_policy(spec):
    assert b.network_policy(spec, NS, API) == {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "tfk8s-user-isolation", "namespace": NS, "labels": LABELS},
        "spec": {
            "podSelector": {},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [
                        {"podSelector": {}},
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": "jhub"}
                            },
                            "podSelector": {
                                "matchLabels": {"hub.jupyter.org/network-access-singleuser": "true"}
                            },
                        },
                    ]
                }
            ],
            "egress": [
                {"to": [{"podSelector": {}}]},
                {
                    "to": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": "jhub"}
                            },
                            "podSelector": {"matchLabels": {"app.kubernetes.io/component": "hub"}},
                        }
                    ],
                    "ports": [{"protocol": "TCP", "port": 8081}],
                },
                # the API server where the cluster says it is (Service and endpoints), not 0.0.0.0/0
                {
                    "to": [{"ipBlock": {"cidr": "10.96.0.1/32"}},
                           {"ipBlock": {"cidr": "192.168.5.2/32"}}],
                    "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443},
                              {"protocol": "TCP", "port": 8443}],
                },
                # Zero-to-JupyterHub's singleuser defaults: DNS three ways, then the internet
                {
                    "ports": DNS_PORTS,
                    "to": [
                        {"ipBlock": {"cidr": "169.254.169.254/32"}},  # GKE Cloud DNS
                        {"namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}},
                        # a node-local cache on the kube-dns ClusterIP, or on its link-local
                        # address (upstream's and kubespray's)
                        *({"ipBlock": {"cidr": c}} for c in PRIVATE),
                        {"ipBlock": {"cidr": "169.254.20.10/32"}},
                        {"ipBlock": {"cidr": "169.254.25.10/32"}},
                    ],
                },
                {"to": [{"ipBlock": {"cidr": "0.0.0.0/0",
                                     "except": [*PRIVATE, "169.254.0.0/16"]}}]},
            ],
        },
    }


# Zero-to-JupyterHub's flags, one at a time: (flag, the rule it adds)
ONE_RULE = [
    ("dnsPortsCloudMetadataServer", {"ports": DNS_PORTS, "to": [
        {"ipBlock": {"cidr": "169.254.169.254/32"}}]}),
    ("dnsPortsKubeSystemNamespace", {"ports": DNS_PORTS, "to": [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}]}),
    ("dnsPortsPrivateIPs", {"ports": DNS_PORTS, "to": [
        *({"ipBlock": {"cidr": c}} for c in PRIVATE),
        {"ipBlock": {"cidr": "169.254.20.10/32"}}, {"ipBlock": {"cidr": "169.254.25.10/32"}}]}),
    ("nonPrivateIPs", {"to": [{"ipBlock": {"cidr": "0.0.0.0/0",
                                           "except": [*PRIVATE, "169.254.0.0/16"]}}]}),
    ("privateIPs", {"to": [{"ipBlock": {"cidr": c}} for c in PRIVATE]}),
    ("cloudMetadataServer", {"to": [{"ipBlock": {"cidr": "169.254.169.254/32"}}]}),
]


@pytest.mark.parametrize(("flag", "rule"), ONE_RULE, ids=[f for f, _ in ONE_RULE])
def test_each_egress_allow_rule_adds_its_rule(flag, rule):
    rules = {k: k == flag for k in b.EGRESS_ALLOW_RULES}
    assert b.egress_allow_rules(rules) == [rule]


def test_egress_allow_rules_have_zero_to_jupyterhubs_singleuser_defaults():
    assert b.EGRESS_ALLOW_RULES == {
        "cloudMetadataServer": False, "dnsPortsCloudMetadataServer": True,
        "dnsPortsKubeSystemNamespace": True, "dnsPortsPrivateIPs": True,
        "nonPrivateIPs": True, "privateIPs": False}
    assert b.egress_allow_rules({}) == []


def test_extra_egress_and_a_partial_rule_set_from_settings():
    mirror = {"to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}], "ports": [{"port": 3128}]}
    spec = b.BootstrapSpec.from_settings(LabSettings(
        hub_namespace="jhub", egress_allow_rules={"nonPrivateIPs": False}, extra_egress=[mirror],
        api_server_cidrs=["10.0.0.1/32"]))
    egress = b.network_policy(spec, NS)["spec"]["egress"]
    assert egress[-1] == mirror  # last, as Zero-to-JupyterHub's .egress
    assert not any(p.get("ipBlock", {}).get("cidr") == "0.0.0.0/0" for r in egress for p in r["to"])
    assert any(r.get("ports") == DNS_PORTS for r in egress)  # the other flags kept their defaults


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"egress_allow_rules": {"dnsPortsNodeLocal": True}}, "no rule 'dnsPortsNodeLocal'"),
])
def test_an_unknown_egress_rule_is_named(kwargs, words):
    from traitlets import TraitError

    with pytest.raises(TraitError, match=words):
        LabSettings(**kwargs)


def test_allow_internet_is_the_deprecated_name_of_non_private_ips():
    with pytest.warns(DeprecationWarning, match="nonPrivateIPs"):
        settings = LabSettings(hub_namespace="jhub", allow_internet=False)
    assert b.BootstrapSpec.from_settings(settings).egress_allow_rules["nonPrivateIPs"] is False


def test_network_policy_without_internet_denies_every_other_namespace():
    spec = b.BootstrapSpec.from_settings(LabSettings(
        hub_namespace="jhub", egress_allow_rules={"nonPrivateIPs": False, "dnsPortsPrivateIPs": False},
        api_server_cidrs=["10.0.0.1/32"]))
    pol = b.network_policy(spec, NS, API)["spec"]  # set CIDRs win over what the cluster says
    # every peer is this namespace, the hub namespace, kube-system DNS, GKE's DNS or the API server
    peers = [peer for rule in pol["egress"] for peer in rule["to"]] + pol["ingress"][0]["from"]
    for peer in peers:
        if "namespaceSelector" in peer:
            assert peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] in (
                "jhub",
                "kube-system",
            )
        elif "ipBlock" in peer:
            assert peer["ipBlock"] in ({"cidr": "10.0.0.1/32"}, {"cidr": "169.254.169.254/32"})
        else:
            assert peer == {"podSelector": {}}
    (metadata,) = [r for r in pol["egress"] if {"ipBlock": {"cidr": "169.254.169.254/32"}} in r["to"]]
    assert metadata["ports"] == DNS_PORTS  # the metadata server on DNS ports only


def test_no_api_server_rule_reopens_private_ranges():
    # the defect: a 0.0.0.0/0 default opened every private address on 443/6443
    assert b.BootstrapSpec().api_server_cidrs == ()
    assert LabSettings().api_server_cidrs == []
    spec = b.BootstrapSpec.from_settings(LabSettings(hub_namespace="jhub"))
    egress = b.network_policy(spec, NS, API)["spec"]["egress"]
    for rule in egress:
        for peer in rule["to"]:
            block = peer.get("ipBlock")
            if block and "ports" in rule and rule["ports"] != DNS_PORTS:
                assert block["cidr"].endswith("/32"), rule
    # no address known: no API rule (the hub refuses to spawn instead, spawner.read_api_server)
    assert len(b.network_policy(spec, NS)["spec"]["egress"]) == len(egress) - 1


def test_the_api_server_is_where_the_kubernetes_service_and_its_endpoints_are():
    service = {"spec": {"clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1", "fd00::1"],
                        "ports": [{"name": "https", "port": 443, "protocol": "TCP"}]}}
    slices = [{"addressType": "IPv4", "endpoints": [{"addresses": ["192.168.5.2"]},
                                                    {"addresses": ["192.168.5.3"]}],
               "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}]}]
    assert b.ApiServer.from_objects(service, slices) == b.ApiServer(
        ("10.96.0.1/32", "fd00::1/128", "192.168.5.2/32", "192.168.5.3/32"), (443, 6443))
    assert b.ApiServer.from_objects(None, []) == b.ApiServer((), ())


def test_cross_namespace_affinity_is_refused_by_a_scoped_quota(spec):
    assert b.affinity_quota(spec, NS) == {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "tfk8s-no-cross-namespace-affinity", "namespace": NS,
                     "labels": LABELS},
        "spec": {"hard": {"pods": "0"}, "scopeSelector": {"matchExpressions": [
            {"scopeName": "CrossNamespacePodAffinity", "operator": "Exists"}]}},
    }


def test_the_default_quota_gives_no_gpu():
    spec = b.BootstrapSpec.from_settings(LabSettings(hub_namespace="jhub"))
    assert b.resource_quota(spec, NS)["spec"]["hard"]["requests.nvidia.com/gpu"] == "0"


def test_order_service_account_first_and_nothing_cluster_scoped(spec):
    objs = b.bootstrap_objects(spec, NS)
    assert [o["kind"] for o in objs] == [
        "ServiceAccount",
        "RoleBinding",
        "LimitRange",
        "ResourceQuota",
        "ResourceQuota",
        "NetworkPolicy",
    ]
    assert all(o["metadata"]["namespace"] == NS for o in objs)


def test_builders_are_pure(spec):
    assert b.bootstrap_objects(spec, NS) == b.bootstrap_objects(spec, NS)
    first = b.bootstrap_objects(spec, NS)
    first[0]["metadata"]["labels"]["x"] = "y"
    assert "x" not in b.bootstrap_objects(spec, NS)[0]["metadata"]["labels"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_objects_validate_strictly(spec, version):
    for obj in b.bootstrap_objects(spec, NS, API):
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_bad_quota_would_be_caught_by_the_schema_validator(version):
    obj = b.resource_quota(b.BootstrapSpec(quota={"pods": "1"}), NS)
    obj["spec"]["hardd"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, version, strict=True)


def test_user_namespaces_enforce_pod_security_restricted_and_name_their_hub(spec):
    labels = b.namespace_labels(spec)
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert labels["pod-security.kubernetes.io/enforce-version"] == "latest"
    # the chart's admission policy and the hub's NetworkPolicy recognise user namespaces by it
    assert labels[b.USER_NAMESPACE_LABEL] == "jhub"
    assert LABELS.items() <= labels.items()


def test_default_quota_counts_no_cpu_limit_and_the_limit_range_sets_none():
    # the resource model: tasks set no CPU limit, so neither may the quota count limits.cpu
    # nor the LimitRange default one (it would throttle every task and refuse --cpu above it)
    spec = b.BootstrapSpec.from_settings(LabSettings(hub_namespace="jhub"))
    assert "limits.cpu" not in b.resource_quota(spec, NS)["spec"]["hard"]
    (item,) = b.limit_range(spec, NS)["spec"]["limits"]
    assert item == {
        "type": "Container",
        "default": {"memory": "4Gi"},
        "defaultRequest": {"cpu": "500m", "memory": "1Gi"},
    }
