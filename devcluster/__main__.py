"""``python -m devcluster build|up|down|env|status|gomod`` (``scripts/kube`` runs this)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import build
from .cluster import Cluster, ClusterError


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; exit 1 with one sentence when the cluster cannot be started."""
    ap = argparse.ArgumentParser(prog="scripts/kube", description="A real Kubernetes for the tests.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (or find cached) every binary of the cluster")
    b.add_argument("components", nargs="*", help="which (default: the control plane, kwok, JobSet, Kueue)")
    b.add_argument(
        "--pods",
        action="store_true",
        help="every component of up --pods too (the real nodes', Cilium's, the longest, first; the "
        "registry's, the glusterfs class's provisioner, the Ingress controller's and Dex's)",
    )
    up = sub.add_parser("up", help="start the cluster (builds first if needed)")
    up.add_argument("--nodes", type=int, default=2, help="kwok nodes to create (default 2)")
    up.add_argument(
        "--pods",
        action="store_true",
        default=os.environ.get("TFK8S_KUBE_PODS") == "1",
        help="also start real nodes running real pods, each in its own network namespace: containerd, "
        "runc, kubelet, kube-proxy, a node-local DNS cache; CoreDNS, the image registry they pull from, "
        "the glusterfs StorageClass, the Ingress controller, Dex on the slot's SSO host "
        "(default: $TFK8S_KUBE_PODS=1; how many: $TFK8S_KUBE_REAL_NODES, default 2)",
    )
    sub.add_parser("down", help="stop every process of the cluster and remove its state")
    sub.add_parser("env", help="print the shell lines that point kubectl and the tests at the cluster")
    sub.add_parser("status", help="say whether the cluster runs, and its processes")
    sub.add_parser("gomod", help="regenerate devcluster/go/kubernetes/go.mod from versions.env")
    a = ap.parse_args(argv)
    c = Cluster()
    try:
        if a.cmd == "build":
            pods = (
                *build.TIER2_FIRST,
                *build.TIER1,
                *(n for n in build.TIER2 if n not in build.TIER2_FIRST),
                *build.TIER2_PARTS,
            )
            build.ensure_all(tuple(a.components) or (pods if a.pods else build.TIER1))
        elif a.cmd == "up":
            c.up(nodes=a.nodes, pods=a.pods)
        elif a.cmd == "down":
            c.down()
        elif a.cmd == "env":
            print(f"export KUBECONFIG={c.kubeconfig}")
            print(f"export PATH={build.COMPONENTS['kubernetes'].dir}:$PATH")
        elif a.cmd == "status":
            from . import node

            print(
                json.dumps(
                    {
                        "running": c.running(),
                        "dir": str(c.root),
                        "processes": {n: c.procs.alive(n) for n in c.procs.names()},
                        "nodes": node.status(c),
                    },
                    indent=1,
                )
            )
            return 0 if c.running() else 3
        elif a.cmd == "gomod":
            from .gomod import write_kubernetes_gomod

            write_kubernetes_gomod()
    except ClusterError as e:
        print(f"scripts/kube: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
