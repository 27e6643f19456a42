"""The bootstrap objects an administrator's registry, storage credentials, workload identity and
Kueue queue add to a user namespace: literal dicts, and strict Kubernetes 1.29 / 1.37 schemas."""

from __future__ import annotations

import sys
from pathlib import Path

import kubernetes_validate
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "hub_config"))

from tfk8s_hub import bootstrap as b  # noqa: E402
from tfk8s_hub.settings import LabSettings  # noqa: E402

NS = "jhub-alice"
LABELS = {
    "app.kubernetes.io/name": "tfk8s-lab",
    "app.kubernetes.io/component": "user-namespace",
    "app.kubernetes.io/part-of": "tfk8s-lab",
    "app.kubernetes.io/managed-by": "tfk8s-lab-hub",
}
IRSA = {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/lab"}


@pytest.fixture
def spec() -> b.BootstrapSpec:
    return b.BootstrapSpec.from_settings(LabSettings(
        hub_namespace="jhub", image_pull_secrets=["regcred"], copy_secrets=["s3-creds", "regcred"],
        service_account_annotations=IRSA, queue="team"))


def test_both_service_accounts_carry_the_pull_secrets_and_the_identity(spec):
    def sa(name):
        return {"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": name, "namespace": NS, "labels": LABELS, "annotations": IRSA},
                "imagePullSecrets": [{"name": "regcred"}]}

    assert b.service_accounts(spec, NS) == [sa("tfk8s-user"), sa("default")]
    # nothing to carry: "default" is left to Kubernetes
    plain = b.BootstrapSpec.from_settings(LabSettings(hub_namespace="jhub"))
    assert [o["metadata"]["name"] for o in b.service_accounts(plain, NS)] == ["tfk8s-user"]


def test_pull_secrets_an_admin_added_are_kept_first():
    ours = {"kind": "ServiceAccount", "imagePullSecrets": [{"name": "regcred"}]}
    live = {"imagePullSecrets": [{"name": "admin-added"}, {"name": "regcred"}]}
    assert b.with_pull_secrets_of(ours, live)["imagePullSecrets"] == [
        {"name": "admin-added"}, {"name": "regcred"}]
    assert b.with_pull_secrets_of(ours, None)["imagePullSecrets"] == [{"name": "regcred"}]
    assert b.with_pull_secrets_of(ours, {"imagePullSecrets": [{"name": "x"}]})["imagePullSecrets"] == [
        {"name": "x"}, {"name": "regcred"}]


def test_a_copied_secret_keeps_type_and_data_and_nothing_else_of_its_source(spec):
    source = {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": "regcred", "namespace": "jhub", "uid": "u-1", "resourceVersion": "42",
                     "labels": {"team": "infra"}, "managedFields": [{"manager": "kubectl"}],
                     "ownerReferences": [{"kind": "X", "name": "y", "uid": "z", "apiVersion": "v1"}]},
        "data": {".dockerconfigjson": "e30="},
    }
    assert b.copied_secret(source, NS) == {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": "regcred", "namespace": NS, "labels": LABELS,
                     "annotations": {"tfk8s.io/copied-from": "jhub/regcred"}},
        "data": {".dockerconfigjson": "e30="},
    }
    assert b.secrets_to_copy(spec) == ["regcred", "s3-creds"]  # pull secrets first, once each


def test_a_local_queue_feeds_the_cluster_queue_of_the_same_name(spec):
    assert b.local_queue(spec, NS) == {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": "team", "namespace": NS, "labels": LABELS},
        "spec": {"clusterQueue": "team"},
    }
    assert b.local_queue(spec, NS, "v1beta1")["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    assert b.local_queue(b.BootstrapSpec(), NS) is None
    assert [o["kind"] for o in b.bootstrap_objects(spec, NS)] == [
        "ServiceAccount", "ServiceAccount", "RoleBinding", "LimitRange", "ResourceQuota",
        "ResourceQuota", "NetworkPolicy", "LocalQueue"]


@pytest.mark.parametrize("version", ["1.29", "1.37"])
def test_the_core_objects_validate_strictly(spec, version):
    source = {"metadata": {"name": "s3-creds", "namespace": "jhub"}, "type": "Opaque",
              "data": {"AWS_SECRET_ACCESS_KEY": "eA=="}}
    for obj in [*b.service_accounts(spec, NS), b.copied_secret(source, NS)]:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("kwargs, words", [
    ({"image_pull_secrets": ["Reg_Cred"]}, ["image_pull_secrets", "'Reg_Cred'", "Secret name"]),
    ({"copy_secrets": [""]}, ["copy_secrets", "''"]),
    ({"start_timeout": 0}, ["start_timeout", "0", "300"]),
])
def test_bad_admin_settings_are_refused_with_the_value_named(kwargs, words):
    from traitlets import TraitError

    with pytest.raises(TraitError) as err:
        LabSettings(**kwargs)
    for word in words:
        assert word in str(err.value)
