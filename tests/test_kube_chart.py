"""``helm install`` of the chart on the REAL control plane, and the hub's powers checked by the real
RBAC authorizer and the real ValidatingAdmissionPolicy (no CEL evaluated by us).

The release goes to namespace ``jhub`` as ``lab`` (so the hub is
``system:serviceaccount:jhub:lab-tfk8s-lab-hub``); its pods land on kwok nodes. The hub's own
token (TokenRequest) then does what KubeSpawner and the bootstrap do, and is refused the rest.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from kubernetes.client.rest import ApiException
from test_helm import CHART, helm_binary

from tests.realkube import KWOK_ANNOTATIONS, wait_for

pytestmark = pytest.mark.k8s

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "hub_config"))
from tfk8s_hub.bootstrap import BootstrapSpec, bootstrap_objects, namespace_labels  # noqa: E402

HUB_NS, RELEASE = "jhub", "lab"
HUB_SA = "lab-tfk8s-lab-hub"


@pytest.fixture(scope="module")
def helm(request, tmp_path_factory) -> Path:
    return helm_binary(request, tmp_path_factory)


@pytest.fixture(scope="module")
def release(realkube, helm):
    """The chart installed for real; uninstalled (and its namespace deleted) afterwards."""
    core = realkube.core
    try:
        core.delete_namespace(HUB_NS)
        wait_for(lambda: not _exists(core, HUB_NS), 120, message="an old jhub namespace to go")
    except ApiException as e:
        if e.status != 404:
            raise
    core.create_namespace(
        {
            "metadata": {
                "name": HUB_NS,
                "annotations": dict(KWOK_ANNOTATIONS),
            }
        }
    )
    r = subprocess.run(
        [
            str(helm),
            "install",
            RELEASE,
            str(CHART),
            "-n",
            HUB_NS,
            "--kubeconfig",
            realkube.kubeconfig,
            "--wait=false",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    # the API server applies a new admission policy a moment after it is created: wait for the fence
    from devcluster.cluster import Cluster

    probe = (
        "create",
        "namespace",
        "fence-probe",
        "--dry-run=server",
        "--as",
        f"system:serviceaccount:{HUB_NS}:{HUB_SA}",
    )
    wait_for(
        lambda: "ValidatingAdmissionPolicy" in Cluster().kubectl(*probe, check=False).stderr,
        60,
        message="the hub's fence to be in force",
    )
    yield realkube
    # --no-hooks: kwok runs no container, so the uninstall hook's pod would never end here
    # (tests/test_kube_states.py runs the hook's command for its pod)
    subprocess.run(
        [str(helm), "uninstall", RELEASE, "-n", HUB_NS, "--kubeconfig", realkube.kubeconfig, "--no-hooks"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    core.delete_namespace(HUB_NS)


def _exists(core, ns):
    try:
        core.read_namespace(ns)
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise


def _can_i(kube, verb, resource, namespace=None, sa=f"system:serviceaccount:{HUB_NS}:{HUB_SA}"):
    from devcluster.cluster import Cluster

    args = ["auth", "can-i", verb, resource, "--as", sa]
    args += ["-n", namespace] if namespace else []
    return Cluster().kubectl(*args, check=False).stdout.strip() == "yes"


def test_helm_install_makes_the_hub_and_its_powers_on_the_real_api_server(release):
    kube = release
    apps = __import__("kubernetes").client.AppsV1Api(kube.admin)
    names = {d.metadata.name for d in apps.list_namespaced_deployment(HUB_NS).items}
    assert any("hub" in n for n in names), names
    wait_for(
        lambda: any(
            p.status.phase == "Running" for p in kube.pods(HUB_NS, "app.kubernetes.io/component=hub")
        ),
        120,
        message="the hub pod running (on a kwok node)",
    )
    adm = __import__("kubernetes").client.AdmissionregistrationV1Api(kube.admin)
    policies = [p.metadata.name for p in adm.list_validating_admission_policy().items]
    assert policies, "the hub's fence was installed"


def test_the_hub_token_makes_a_user_namespace_and_its_bootstrap(release):
    kube = release
    token = kube.token(HUB_NS, HUB_SA)
    hub = kube.client_with_token(token)
    core = __import__("kubernetes").client.CoreV1Api(hub)
    # the backend's ClusterRole the chart ships, which the hub passes as role_name
    spec = BootstrapSpec(hub_namespace=HUB_NS, role_name=f"tfk8s-backend-{HUB_NS}")
    name = "jhub-ada"
    core.create_namespace({"metadata": {"name": name, "labels": namespace_labels(spec)}})
    kube._namespaces.append(name)
    from kubernetes import utils

    # the bootstrap objects, created with the hub's own token as its pre-spawn hook does

    for obj in bootstrap_objects(spec, name):
        utils.create_from_dict(hub, obj, namespace=name)
    assert _can_i(
        kube, "create", "jobsets.jobset.x-k8s.io", name, sa=f"system:serviceaccount:{name}:tfk8s-user"
    )


def test_the_real_fence_and_rbac_refuse_the_hub_elsewhere(release):
    kube = release
    hub = kube.client_with_token(kube.token(HUB_NS, HUB_SA))
    core = __import__("kubernetes").client.CoreV1Api(hub)
    with pytest.raises(ApiException) as e:
        core.create_namespaced_config_map("kube-system", {"metadata": {"name": "x"}})
    assert e.value.status in (403, 422)
    # a namespace that would let it escape (no Pod Security, not labelled as the lab's)
    escape = f"escape-{uuid.uuid4().hex[:6]}"
    with pytest.raises(ApiException) as e:
        core.create_namespace({"metadata": {"name": escape}})
    assert e.value.status in (403, 422), e.value.body
    assert escape not in [n.metadata.name for n in kube.core.list_namespace().items]
    assert not _can_i(kube, "create", "clusterrolebindings")
