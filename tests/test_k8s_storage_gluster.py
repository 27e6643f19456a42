"""The ``glusterfs`` StorageClass of the test cluster (marker ``k8s``): devcluster/storage.py.

A ReadWriteMany claim of the class is provisioned by rancher's local-path-provisioner as a
directory of the GlusterFS volume's FUSE mount (``sharedFileSystemPath``); a pod on one real node
writes a file, a pod on the other reads it, and the file is in one of the volume's bricks on the
host, so it went through Gluster, not a plain directory. glusterd and its brick servers listen
on the slot's host address only.
"""

from __future__ import annotations

import uuid

import pytest

from devcluster import storage
from tests.realkube import require_or_skip

pytestmark = pytest.mark.k8s

BOUND = 300.0


@pytest.fixture(scope="module")
def gluster(realkube):
    from devcluster.cluster import Cluster
    from tests.realkube import require_or_skip

    cluster = Cluster()
    mount = cluster.root / "storage" / "mnt"
    if not storage.mounted(mount) or not cluster.procs.alive("local-path-provisioner"):
        require_or_skip(
            f"the devcluster in {cluster.root} has no Gluster volume: start it with scripts/kube up --pods"
        )
    return cluster


def _real_nodes(kube) -> list[str]:
    return sorted(
        n.metadata.name
        for n in kube.core.list_node().items
        if (n.metadata.annotations or {}).get("kwok.x-k8s.io/node") != "fake"
    )


def _pod(name: str, node_name: str, script: str) -> dict:
    from devcluster.images import LAB_IMAGES
    from tests.test_k8s_pods import _restricted_pod

    pod = _restricted_pod(name, LAB_IMAGES[0], ["sh", "-c", script])
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node_name}
    pod["spec"]["volumes"] = [{"name": "shared", "persistentVolumeClaim": {"claimName": "shared"}}]
    container = pod["spec"]["containers"][0]
    container["imagePullPolicy"] = "IfNotPresent"
    container["volumeMounts"] = [{"name": "shared", "mountPath": "/shared"}]
    container["resources"] = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}}
    return pod


def test_a_rwx_claim_written_on_one_node_is_read_on_the_other(realkube, gluster):
    from tests.realkube import wait_for

    names = _real_nodes(realkube)
    if len(names) < 2:
        require_or_skip(f"{len(names)} real node(s): the test needs two (scripts/kube up --pods)")
    ns = realkube.user_namespace("gl", kwok=False).name
    core = realkube.core
    core.create_namespaced_persistent_volume_claim(
        ns,
        {
            "metadata": {"name": "shared"},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": storage.CLASS,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    claim = wait_for(
        lambda: (
            (c := core.read_namespaced_persistent_volume_claim("shared", ns)).status.phase == "Bound" and c
        ),
        BOUND,
        1,
        "the glusterfs claim to be bound",
    )
    pv = core.read_persistent_volume(claim.spec.volume_name)
    assert pv.spec.access_modes == ["ReadWriteMany"]
    assert pv.spec.host_path.path.startswith(str(gluster.root / "storage" / "mnt") + "/")
    token = uuid.uuid4().hex

    def run(name: str, node_name: str, script: str) -> str:
        core.create_namespaced_pod(ns, _pod(name, node_name, script))

        def done():
            p = core.read_namespaced_pod(name, ns)
            return p.status.phase if p.status.phase in ("Succeeded", "Failed") else None

        phase = wait_for(done, BOUND, 1, f"pod {name} on {node_name}")
        log = core.read_namespaced_pod_log(name, ns)
        assert phase == "Succeeded", log
        assert core.read_namespaced_pod(name, ns).spec.node_name == node_name
        return log

    run("writer", names[0], f"echo {token} > /shared/token && echo written")
    assert run("reader", names[1], "cat /shared/token").strip() == token
    # the file is in one of the volume's bricks: it went through Gluster
    bricks = gluster.root / "storage" / "bricks"
    found = [p for p in bricks.rglob("token") if p.read_text().strip() == token]
    assert found, f"no brick under {bricks} holds the file"


def test_glusterd_and_its_bricks_listen_on_the_slots_host_address_only(gluster):
    import psutil

    from devcluster import node

    host_ip = node.slot_of(gluster).host_ip
    root = str(gluster.root / "storage")
    servers = [
        p for p in psutil.process_iter(["name", "cmdline"])
        if p.info["name"] in ("glusterd", "glusterfsd") and root in " ".join(p.info["cmdline"] or [])
    ]  # fmt: skip
    assert sorted(p.info["name"] for p in servers) == ["glusterd", "glusterfsd", "glusterfsd"]
    listening = {
        (p.info["name"], c.laddr.ip)
        for p in servers
        for c in p.net_connections("inet")
        if c.status == "LISTEN"
    }
    assert listening == {("glusterd", host_ip), ("glusterfsd", host_ip)}, listening
