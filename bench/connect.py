"""in-graph connect: what ``connect`` adds after an in-graph cluster is up, in a fresh kernel.

Each side runs in a fresh Python process (a new kernel: TensorFlow not
imported yet), with its warm pool (``pool_size`` 4) filled first (not timed),
then times ``tk.launch(name, mode="in-graph", ps=2, workers=2,
wait_ready=...)`` (cluster-up: launch -> every task ready) and then
``tk.connect(name)`` (the ``ParameterServerStrategy`` with this process as chief).

off       no background import at all: the kernel imports TensorFlow inside
          ``connect``, after the cluster is up (the behaviour before issue 16).
launch    ``TFK8S_WARM_KERNEL=0``: only the in-graph launch starts importing
          TensorFlow in a background thread, overlapping the cluster's start.
warm      as shipped: the kernel imports TensorFlow in the background when its
          warm pool starts; "warm" means the pool and the kernel both finished
          their imports before the timed launch (the pool fill is not timed
          on any side, the kernel's import only on this one: printed apart).

Rounds alternate off / launch / warm.  Target (issue 16, item 2): on the warm
side, connect adds no more than the cluster's own start (connect <= cluster-up).

    .venv/bin/python bench/connect.py [--rounds N]
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile

import _common as c

TIMEOUT = 600.0
SIDES = ("off", "launch", "warm")

KERNEL = '''
import json, os, sys, time
os.environ["TFK8S_POOL_SIZE"] = "4"
side = sys.argv[2]
os.environ["TFK8S_WARM_KERNEL"] = "1" if side == "warm" else "0"
import tfk8s_magics as tk
from tfk8s_magics import ingraph
from tfk8s_magics.backends.local import LocalBackend, pool
if side == "off":
    ingraph.preimport = lambda legacy_keras: None
assert "tensorflow" not in sys.modules
t = time.perf_counter()
sock = pool.ensure(pool.HOST)  # in-graph tasks run on the host's network
while sum(p["state"] == "idle" and p["kind"] == pool.HOST
          for p in pool.info(sock, with_memory=False)["processes"]) < 4:
    time.sleep(0.1)
filled = time.perf_counter() - t
imported = ingraph.preimported(600) and time.perf_counter() - t
assert (side == "warm") == ("tensorflow" in sys.modules)
be = LocalBackend(sys.argv[1])
t0 = time.perf_counter()
cluster = tk.launch("cn", mode="in-graph", ps=2, workers=2, backend=be, wait_ready=300)
t1 = time.perf_counter()
strategy = tk.connect("cn", backend=be)
t2 = time.perf_counter()
cold = [e.message for e in cluster.events() if e.reason == "StartedCold"]
cluster.delete()
pool.shutdown()
print(json.dumps({"up": t1 - t0, "connect": t2 - t1, "cold": cold, "filled": filled,
                  "imported": imported}), flush=True)
'''


def run(tmp: str, i: int, side: str) -> dict:
    state = os.path.join(tmp, f"{side}-{i}")
    done = subprocess.run([c.PYTHON, "-c", KERNEL, state, side], capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=tmp)
    if done.returncode != 0:
        raise RuntimeError(f"{side} round {i + 1} failed:\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if out["cold"]:
        raise RuntimeError(f"{side} round {i + 1} started tasks cold: {out['cold']}")
    c.assert_clean(f"{side} round {i + 1}")
    return out


def main() -> int:
    args = c.parse_args(__doc__, rounds=3)
    print(f"in-graph connect after launch, 2 PS + 2 workers, warm pool  {c.machine()}", flush=True)
    with c.cleanup_on_exit(), tempfile.TemporaryDirectory(prefix="bench-cn-") as tmp:
        results = c.rounds(args.rounds, [(side, lambda i, side=side: run(tmp, i, side)) for side in SIDES],
                           lambda _l, _i, r: (f"cluster-up {r['up']:.3f} s   connect {r['connect']:.3f} s"
                                              f"   (pool filled in {r['filled']:.1f} s"
                                              + (f", kernel import done at {r['imported']:.1f} s)"
                                                 if r["imported"] else ")")))
    for label, rs in zip(SIDES, results, strict=True):
        up, cn = c.median([r["up"] for r in rs]), c.median([r["connect"] for r in rs])
        print(f"{label:6s}  median cluster-up {up:.3f} s   connect {cn:.3f} s   connect / cluster-up "
              f"{cn / up:.2f}   launch + connect {up + cn:.3f} s   (connect per round "
              f"{' '.join(format(r['connect'], '.3f') for r in rs)})")
    warm = results[SIDES.index("warm")]
    up, cn = c.median([r["up"] for r in warm]), c.median([r["connect"] for r in warm])
    print(f"target (warm): connect <= cluster-up: {c.verdict(cn <= up)}   {c.machine()}")
    return 0


if __name__ == "__main__":
    c.run(main)
