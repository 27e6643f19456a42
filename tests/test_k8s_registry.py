"""Real pods on the test cluster's real nodes pull a lab image from the cluster's registry
(marker ``k8s``): devcluster tier 2 with ``devcluster/registry.py``.

``scripts/kube up --pods`` starts the registry (distribution, htpasswd, TLS signed by the cluster
CA) on 127.0.0.1 before the nodes, which reach it through their slot's host address (DNATed to
127.0.0.1 as the API server's port); every node's containerd trusts the CA for
``registry.tfk8s.test`` through the hosts.toml the registry writes (its ``config_path``). The same pod
spec, pulling with ``imagePullPolicy: Always`` so the node must ask the registry each time, is
refused without an image pull Secret (ErrImagePull: the registry's 401 asks for credentials) and runs with one
on every real node.
"""

from __future__ import annotations

import os
import subprocess
import tomllib
import uuid

import pytest

from devcluster import node, registry

pytestmark = pytest.mark.k8s

TASK_IMAGE = os.environ.get("TFK8S_NODE_TASK_IMAGE", "localhost/tfk8s/tensorflow-task:0.1.0")
PODMAN = ["podman", "--runtime", "/usr/sbin/runc"]
BOUND = 600.0  # seconds a pull of the 1.8 GB task image may take on a loaded 2-core machine


@pytest.fixture(scope="module")
def cluster_registry(realkube, tmp_path_factory):
    """The running cluster's registry with an image of the task image's layers pushed to it.

    Not the task image itself: the kubelet records that an image id was pulled with credentials
    and from then on refuses it, by any name, to pods without them under ``imagePullPolicy:
    Never`` (KEP-2535) -- every later test running the imported task image would get
    ErrImageNeverPull. A label gives this image an id of its own; its layers are the task
    image's (nothing new to push or unpack)."""
    from devcluster.cluster import Cluster
    from tests.realkube import require_or_skip

    cluster = Cluster()
    reg = registry.load(cluster)
    if reg is None or not cluster.procs.alive(registry.PROCESS):
        require_or_skip(
            f"the devcluster in {cluster.root} runs no registry: start it with scripts/kube up --pods"
        )
    if not node.running(cluster):
        require_or_skip(
            f"the devcluster in {cluster.root} has no real nodes: start them with scripts/kube up --pods"
        )
    slot = node.slot_of(cluster)
    if reg.node_ip != slot.host_ip:
        require_or_skip(
            f"the registry of {cluster.root} was started for {reg.node_ip}, not its nodes' slot "
            f"({slot.host_ip}): restart the cluster (scripts/kube down; scripts/kube up --pods)"
        )
    for n in node.layouts(cluster):
        conf = tomllib.loads((n.state / "containerd.toml").read_text())
        hosts = conf["plugins"]["io.containerd.cri.v1.images"].get("registry", {}).get("config_path")
        if hosts != str(registry.hosts_dir(cluster.root)):
            require_or_skip(
                f"the containerd of {n.name} was started without the registry's hosts directory: "
                "restart the cluster (scripts/kube down; scripts/kube up --pods)"
            )
    if node.podman_image_id(TASK_IMAGE) is None:
        require_or_skip(f"podman has no {TASK_IMAGE}: run scripts/build_images.py task")
    tag = f"pull-{uuid.uuid4().hex[:8]}"
    local = f"localhost/tfk8s-test/registry-pull:{tag}"
    ctx = tmp_path_factory.mktemp("pull-image")
    (ctx / "Containerfile").write_text(f"FROM {TASK_IMAGE}\nLABEL tfk8s.test={tag}\n")
    subprocess.run([*PODMAN, "build", "-q", "-t", local, str(ctx)], check=True, capture_output=True)
    try:
        image = registry.podman_push(reg, local, f"tfk8s/tensorflow-task:{tag}")
        yield reg, image
    finally:
        subprocess.run([*PODMAN, "rmi", local], capture_output=True)
    # the nodes' image stores outlive the cluster: leave no pulled copy behind in them
    for n in node.layouts(cluster):
        node.remove_image(n, image)
        left = [r for r in node.containerd_images(n) if r.startswith(image.rsplit(":", 1)[0] + ":" + tag)]
        assert not left, f"{n.name} still holds {left}"


def _pod(name: str, image: str, secret: str | None, node_name: str) -> dict:
    from tests.test_k8s_pods import _restricted_pod

    pod = _restricted_pod(name, image, ["python", "-c", "print('pulled from the registry')"])
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node_name}
    container = pod["spec"]["containers"][0]
    container["imagePullPolicy"] = "Always"  # the node asks the registry every time
    container["resources"] = {
        "requests": {"cpu": "50m", "memory": "64Mi"},
        "limits": {"cpu": "1", "memory": "256Mi"},
    }
    if secret:
        pod["spec"]["imagePullSecrets"] = [{"name": secret}]
    return pod


def _real_nodes(kube) -> list[str]:
    return sorted(
        n.metadata.name
        for n in kube.core.list_node().items
        if (n.metadata.annotations or {}).get("kwok.x-k8s.io/node") != "fake"
    )


def test_real_pods_pull_with_the_pull_secret_and_not_without(realkube, cluster_registry):
    from tests.realkube import wait_for

    reg, image = cluster_registry
    assert image.startswith("registry.tfk8s.test/tfk8s/tensorflow-task:pull-")
    # the nodes reach it at their slot's host address, the port DNATed to the registry's on 127.0.0.1
    hosts = tomllib.loads((registry.hosts_dir(reg.root.parent) / registry.NAME / "hosts.toml").read_text())
    assert hosts["server"] == f"https://{reg.node_ip}:{reg.port}" and reg.address.startswith("127.0.0.1:")
    names = _real_nodes(realkube)
    ns = realkube.user_namespace("reg", kwok=False).name
    core = realkube.core

    core.create_namespaced_pod(ns, _pod("without", image, None, names[0]))

    def waiting_reason():
        p = core.read_namespaced_pod("without", ns)
        for s in p.status.container_statuses or []:
            if s.state.waiting and s.state.waiting.reason in ("ErrImagePull", "ImagePullBackOff"):
                return s.state.waiting
        return None

    waiting = wait_for(waiting_reason, 120, 1, "the pod without a pull Secret to fail its pull")
    events = core.list_namespaced_event(ns, field_selector="involvedObject.name=without").items
    messages = " ".join(e.message or "" for e in events) + " " + (waiting.message or "")
    # containerd reached the registry over TLS it trusts (no certificate error) and got its 401's
    # Basic challenge, for which the node had no credentials
    assert "authorization failed: no basic auth credentials" in messages, messages
    assert "x509" not in messages and "certificate" not in messages, messages

    # every real node's containerd trusts the registry and pulls with the Secret's credentials
    core.create_namespaced_secret(ns, registry.pull_secret("regcred", ns, registry.USER, reg.password))
    for i, name in enumerate(names):
        core.create_namespaced_pod(ns, _pod(f"with-{i}", image, "regcred", name))
    for i, name in enumerate(names):

        def finished(pod=f"with-{i}"):
            p = core.read_namespaced_pod(pod, ns)
            return p.status.phase if p.status.phase in ("Succeeded", "Failed") else None

        assert wait_for(finished, BOUND, 2, f"the pod with the pull Secret on {name} to run") == "Succeeded"
        assert core.read_namespaced_pod(f"with-{i}", ns).spec.node_name == name
        assert core.read_namespaced_pod_log(f"with-{i}", ns).strip() == "pulled from the registry"
    # the one without is still refused: nothing the other pulls left on the node lets it through
    assert waiting_reason() is not None
    # and the imported task image still runs without a Secret on every node (its id is not the
    # pulled one's: the kubelet's record of a pull with credentials does not reach it)
    for i, name in enumerate(names):
        p = _pod(f"imported-{i}", TASK_IMAGE, None, name)
        p["spec"]["containers"][0]["imagePullPolicy"] = "Never"
        core.create_namespaced_pod(ns, p)
    for i, name in enumerate(names):

        def imported(pod=f"imported-{i}"):
            p = core.read_namespaced_pod(pod, ns)
            return p.status.phase if p.status.phase in ("Succeeded", "Failed") else None

        assert wait_for(imported, 120, 1, f"the imported task image to run on {name}") == "Succeeded"
