"""The test cluster's shared storage: a GlusterFS volume serving the ``glusterfs`` StorageClass.

How the lab's seed runs it: Debian's ``glusterfs-server`` (``scripts/bootstrap kube-node``) gives a
volume whose bricks are local directories, FUSE-mounted where the real nodes' kubelets see it,
and rancher's local-path-provisioner (built from its published module, cached by version,
:mod:`devcluster.build`) provisions ReadWriteMany volumes on that mount with
``sharedFileSystemPath``: every claim of the class is a directory of the Gluster volume, the same
files on every node.

- ``glusterd`` runs as a process of the cluster with its own working directory, unix socket and
  logs under ``<cluster>/storage``, listening on the host's end of the slot's node bridge only
  (:attr:`devcluster.network.Slot.host_ip`, 10.246.k.1: Gluster refuses loopback bricks, and
  each cluster's real nodes have their own slot, so several clusters' glusterds coexist); the
  volume :data:`VOLUME` has two bricks, ``<cluster>/storage/bricks/b1`` and ``b2``
  (distributed), whose servers glusterd starts on that address too;
- the FUSE mount is ``<cluster>/storage/mnt``. The real nodes share the host's mount namespace
  (:mod:`devcluster.nodes`), so this one mount is the one every node's kubelet of the slot sees;
- the provisioner runs on the host with a client certificate of the cluster CA for the user
  :data:`USER`, bound to the ClusterRole its upstream manifest grants; its helper pods (which make
  and remove a claim's directory) run on the real nodes only, in the namespace :data:`NAMESPACE`.

The pure builders (``glusterd_vol``, ``provisioner_config``, ``objects``) return data;
:func:`up` performs them, :func:`down` unmounts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import yaml

from . import build
from .network import Slot
from .pki import CA

VOLUME = "tfk8s"
CLASS = "glusterfs"
PROVISIONER = "rancher.io/local-path"
NAMESPACE = "tfk8s-storage"
USER = "system:tfk8s-storage"
HELPER_SA = "local-path-helper"
CONFIGMAP = "local-path-config"


class StorageError(RuntimeError):
    """The shared storage could not be started; the message says what failed and what to do."""


# -- pure builders ------------------------------------------------------------------------------


def glusterd_vol(workdir: Path, sock: Path, address: str) -> str:
    """glusterd's own volfile: its working directory, CLI socket, and ``address`` only (the host's
    end of the slot's node bridge)."""
    return f"""\
volume management
    type mgmt/glusterd
    option working-directory {workdir}
    option glusterd-sockfile {sock}
    option transport-type socket
    option transport.socket.bind-address {address}
    option transport.socket.listen-port 24007
    option transport.socket.keepalive-time 10
    option transport.socket.keepalive-interval 2
    option transport.socket.read-fail-log off
    option ping-timeout 0
    option event-threads 1
    option max-port 60999
end-volume
"""


def provisioner_config(mount: Path) -> dict:
    """local-path-provisioner's config.json: every volume a directory of the shared mount."""
    return {"sharedFileSystemPath": str(mount)}


def objects(helper_image: str) -> list[dict]:
    """The class, the provisioner's RBAC, namespace and helper-pod ConfigMap (its upstream scripts)."""
    helper_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "helper-pod"},
        "spec": {
            # the real nodes only: a kwok node would never run it
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "type", "operator": "NotIn", "values": ["kwok"]}]}
                        ]
                    }
                }
            },
            # as root: it makes the claim's directory in the mount's root (the lab's images run as 1000)
            "securityContext": {"runAsUser": 0},
            "containers": [{"name": "helper-pod", "image": helper_image, "imagePullPolicy": "IfNotPresent"}],
        },
    }
    rules = [
        {"apiGroups": [""],
         "resources": ["nodes", "persistentvolumeclaims", "configmaps", "pods", "pods/log"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["persistentvolumes"],
         "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"], "verbs": ["get", "list", "watch"]},
    ]  # fmt: skip
    subject = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]
    return [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            # the helper pods mount the volume's parent directory from the host
            "metadata": {"name": NAMESPACE, "labels": {"pod-security.kubernetes.io/enforce": "privileged"}},
        },
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": HELPER_SA, "namespace": NAMESPACE},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "tfk8s-storage"},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "tfk8s-storage"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "tfk8s-storage",
            },
            "subjects": subject,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "tfk8s-storage", "namespace": NAMESPACE},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods"],
                    "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"],
                }
            ],
        },  # fmt: skip
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "tfk8s-storage", "namespace": NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tfk8s-storage"},
            "subjects": subject,
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CONFIGMAP, "namespace": NAMESPACE},
            "data": {
                "setup": '#!/bin/sh\nset -eu\nmkdir -m 0777 -p "$VOL_DIR"\n',
                "teardown": '#!/bin/sh\nset -eu\nrm -rf "$VOL_DIR"\n',
                "helperPod.yaml": yaml.safe_dump(helper_pod),
            },
        },
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": CLASS},
            "provisioner": PROVISIONER,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        },
    ]


# -- performing ---------------------------------------------------------------------------------


def _run(argv: list[str], what: str, timeout: float = 120) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if r.returncode:
        raise StorageError(f"{what} failed: {(r.stderr or r.stdout).strip()[-1500:]}")
    return r.stdout


def mounted(mount: Path) -> bool:
    """True when ``mount`` is a GlusterFS FUSE mount."""
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[1] == str(mount) and parts[2] == "fuse.glusterfs":
            return True
    return False


def up(cluster, slot: Slot, helper_image: str, timeout: float = 120.0, log=print) -> Path:
    """Start glusterd, make and start the volume, mount it, start the provisioner; the mount's path.

    The slot's node bridge must exist (``scripts/kube up --pods`` starts the real nodes first). On
    a failure, what was started here is stopped again (:func:`down`).
    """
    try:
        return _up(cluster, slot, helper_image, timeout, log)
    except BaseException:
        down(cluster)
        raise


def _up(cluster, slot: Slot, helper_image: str, timeout: float, log) -> Path:
    host_ip = slot.host_ip
    for tool in ("glusterd", "gluster", "mount.glusterfs"):
        if not shutil.which(tool):
            raise StorageError(
                f"{tool} is missing: run scripts/bootstrap kube-node (Debian's glusterfs-server)"
            )
    comp = build.ensure("local-path-provisioner")
    root = cluster.root / "storage"
    work, logs, mount = root / "glusterd", root / "logs", root / "mnt"
    sock = root / "glusterd.socket"
    bricks = [root / "bricks" / "b1", root / "bricks" / "b2"]
    for d in (work, logs, mount, *bricks):
        d.mkdir(parents=True, exist_ok=True)
    (root / "glusterd.vol").write_text(glusterd_vol(work, sock, host_ip))
    t0 = time.monotonic()
    if not cluster.procs.alive("glusterd"):
        cluster.procs.start(
            "glusterd",
            ["glusterd", "-N", "-f", str(root / "glusterd.vol"),
             "-p", str(root / "glusterd.pid"), "-l", str(logs / "glusterd.log")],
        )  # fmt: skip
    cli = ["gluster", "--mode=script", f"--glusterd-sock={sock}", f"--log-file={logs / 'cli.log'}"]
    deadline = time.monotonic() + timeout
    while subprocess.run([*cli, "volume", "list"], capture_output=True).returncode:
        if not cluster.procs.alive("glusterd") or time.monotonic() > deadline:
            raise StorageError(
                f"glusterd did not answer; its log:\n{(logs / 'glusterd.log').read_text()[-1500:]}"
            )
        time.sleep(0.3)
    if VOLUME not in _run([*cli, "volume", "list"], "gluster volume list").split():
        # bricks on the root file system: Gluster asks for force
        _run(
            [*cli, "volume", "create", VOLUME, *(f"{host_ip}:{b}" for b in bricks), "force"],
            "gluster volume create",
        )
    info = _run([*cli, "volume", "info", VOLUME], "gluster volume info")
    if "Status: Started" not in info:
        _run([*cli, "volume", "start", VOLUME], "gluster volume start")
    if not mounted(mount):
        _run(["mount", "-t", "glusterfs", "-o", f"log-file={logs / 'mount.log'}",
              f"{host_ip}:/{VOLUME}", str(mount)], "mounting the Gluster volume")  # fmt: skip
    mount.chmod(0o755)
    t_gluster = time.monotonic() - t0
    from .cluster import _kubeconfig

    crt, key = CA(cluster.pki).issue("storage", USER, client=True)
    kc = _kubeconfig(root / "kubeconfig", cluster.server, cluster.pki / "ca.crt", crt, key, user=USER)
    cluster.apply(objects(helper_image))
    (root / "config.json").write_text(json.dumps(provisioner_config(mount)))
    if not cluster.procs.alive("local-path-provisioner"):
        cluster.procs.start(
            "local-path-provisioner",
            [
                str(comp.path("local-path-provisioner")), "start",
                "--config", str(root / "config.json"),
                "--provisioner-name", PROVISIONER,
                "--namespace", NAMESPACE,
                "--configmap-name", CONFIGMAP,
                "--service-account-name", HELPER_SA,
                "--helper-image", helper_image,
                "--kubeconfig", str(kc),
            ],
        )  # fmt: skip
    log(
        f"devcluster: Gluster volume {VOLUME} mounted at {mount} in {t_gluster:.1f} s; "
        f"local-path-provisioner {comp.version} serves the {CLASS} class "
        f"({time.monotonic() - t0:.1f} s in all)"
    )
    return mount


def down(cluster) -> None:
    """Stop the provisioner, unmount the volume, stop the brick processes glusterd started, and
    glusterd."""
    root = cluster.root / "storage"
    cluster.procs.stop("local-path-provisioner")
    if mounted(root / "mnt"):
        subprocess.run(["umount", "-l", str(root / "mnt")], capture_output=True)
    # glusterd starts each brick as a daemon of its own, with a pid file of this machine's
    for pidfile in Path("/var/run/gluster/vols", VOLUME).glob("*.pid"):
        try:
            pid = int(pidfile.read_text().strip())
            if str(root) in Path(f"/proc/{pid}/cmdline").read_text():
                os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):
            pass
        if str(root).replace("/", "-") in pidfile.name:
            pidfile.unlink(missing_ok=True)
    cluster.procs.stop("glusterd")
