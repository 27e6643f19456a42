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
        "spec": {"limits": [{"type": "Container", "default": {"cpu": "1"}, "max": {"memory": "8Gi"}}]},
    }


def test_no_quota_no_limits_no_policy_when_switched_off():
    spec = b.BootstrapSpec.from_settings(
        LabSettings(quota={}, default_limits={}, default_requests={}, network_policy=False)
    )
    kinds = [o["kind"] for o in b.bootstrap_objects(spec, NS)]
    assert kinds == ["ServiceAccount", "RoleBinding"]


def test_network_policy(spec):
    assert b.network_policy(spec, NS) == {
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
                            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "jhub"}},
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
                            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "jhub"}},
                            "podSelector": {"matchLabels": {"app.kubernetes.io/component": "hub"}},
                        }
                    ],
                    "ports": [{"protocol": "TCP", "port": 8081}],
                },
                {
                    "to": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                            }
                        },
                        # NodeLocal DNSCache: pods' resolv.conf names it when it runs
                        {"ipBlock": {"cidr": "169.254.20.10/32"}},
                    ],
                    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
                },
                {
                    "to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}],
                    "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}],
                },
                {
                    "to": [
                        {
                            "ipBlock": {
                                "cidr": "0.0.0.0/0",
                                "except": [
                                    "10.0.0.0/8",
                                    "172.16.0.0/12",
                                    "192.168.0.0/16",
                                    "169.254.0.0/16",
                                ],
                            }
                        }
                    ]
                },
            ],
        },
    }


def test_network_policy_without_internet_denies_every_other_namespace():
    spec = b.BootstrapSpec.from_settings(
        LabSettings(hub_namespace="jhub", allow_internet=False, api_server_cidrs=["10.0.0.1/32"])
    )
    pol = b.network_policy(spec, NS)["spec"]
    # every peer is this namespace, the hub namespace, kube-system DNS or the API server
    peers = [peer for rule in pol["egress"] for peer in rule["to"]] + pol["ingress"][0]["from"]
    for peer in peers:
        if "namespaceSelector" in peer:
            assert peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] in (
                "jhub",
                "kube-system",
            )
        elif "ipBlock" in peer:
            assert peer["ipBlock"] in ({"cidr": "10.0.0.1/32"}, {"cidr": "169.254.20.10/32"})
        else:
            assert peer == {"podSelector": {}}


def test_order_service_account_first_and_nothing_cluster_scoped(spec):
    objs = b.bootstrap_objects(spec, NS)
    assert [o["kind"] for o in objs] == [
        "ServiceAccount",
        "RoleBinding",
        "LimitRange",
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
    for obj in b.bootstrap_objects(spec, NS):
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
