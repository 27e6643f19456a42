"""kube-nodes: what a second real node costs ``scripts/kube up --pods`` (warm: every binary and image cached).

ours      ``scripts/kube up --pods`` with two real nodes (``TFK8S_KUBE_REAL_NODES=2``, the default).
baseline  the same with one real node (``TFK8S_KUBE_REAL_NODES=1``).

Both in a cluster directory of their own (``TFK8S_KUBE_DIR`` under a temporary directory), each
round followed by ``scripts/kube down``. Before the timed rounds one priming ``up``/``down`` with
two nodes fills both nodes' image stores (a cold import is a one-time cost, reported apart). Rounds
alternate ours / baseline. Prints the per-round seconds of the whole ``up`` and of the real nodes'
part (``node(s) Ready in`` of the log), the medians and ratio = median(ours) / median(baseline).
Target: the second node adds ≤ 25 % to the whole warm ``up``.

    .venv/bin/python bench/kube_nodes.py [--rounds N]     (as root; needs the cached binaries)
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time

import _common as c

TARGET = 1.25


def up_down(kube_dir: str, nodes: int) -> dict:
    env = dict(os.environ, TFK8S_KUBE_DIR=kube_dir, TFK8S_KUBE_REAL_NODES=str(nodes))
    t0 = time.perf_counter()
    r = subprocess.run(["scripts/kube", "up", "--pods"], cwd=c.ROOT, env=env, capture_output=True, text=True)
    took = time.perf_counter() - t0
    try:
        if r.returncode:
            raise RuntimeError(f"scripts/kube up --pods ({nodes} node(s)) failed: {r.stderr[-2000:]}")
        m = re.search(r"real node\(s\) Ready in ([0-9.]+) s .*image imports ([0-9]+) s", r.stderr)
        return {"up": took, "nodes": float(m.group(1)), "imports": float(m.group(2))}
    finally:
        subprocess.run(["scripts/kube", "down"], cwd=c.ROOT, env=env, capture_output=True)


def main() -> int:
    args = c.parse_args(__doc__, rounds=3)
    print(c.machine())
    with tempfile.TemporaryDirectory(prefix="kube-nodes-") as tmp:
        prime = up_down(os.path.join(tmp, "prime"), 2)
        print(f"priming up (two nodes): {prime['up']:.1f} s, of which image imports {prime['imports']:.0f} s")
        ours, base = [], []
        for i in range(args.rounds):
            o = up_down(os.path.join(tmp, f"two-{i}"), 2)
            b = up_down(os.path.join(tmp, f"one-{i}"), 1)
            ours.append(o)
            base.append(b)
            print(
                f"round {i}: two nodes {o['up']:.1f} s (nodes {o['nodes']:.1f} s), "
                f"one node {b['up']:.1f} s (node {b['nodes']:.1f} s)"
            )
    mo, mb = c.median([o["up"] for o in ours]), c.median([b["up"] for b in base])
    no, nb = c.median([o["nodes"] for o in ours]), c.median([b["nodes"] for b in base])
    ratio = mo / mb
    print(f"median up: two nodes {mo:.1f} s, one node {mb:.1f} s; ratio {ratio:.2f} (target ≤ {TARGET})")
    print(f"median real-node part: two {no:.1f} s, one {nb:.1f} s: the second node costs {no - nb:.1f} s")
    print(c.verdict(ratio <= TARGET))
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    c.run(main)
