"""in-graph connect: what ``connect`` adds after an in-graph cluster is up, in a fresh kernel.

Each side runs in a fresh Python process (a new kernel: TensorFlow not
imported yet), with its warm pool (``pool_size`` 4) filled first (not timed),
then times ``tk.launch(name, mode="in-graph", ps=2, workers=2,
wait_ready=...)`` (cluster-up) and then ``tk.connect(name)`` (the
``ParameterServerStrategy`` with this process as chief).

off       ``ingraph.preimport`` disabled: the kernel imports TensorFlow inside
          ``connect``, after the cluster is up (the behaviour before issue 16).
on        as shipped: an in-graph launch starts importing TensorFlow in a
          background thread, so the import overlaps the cluster's start.

Rounds alternate off / on.  Target (issue 16, item 2): on the "on" side,
connect adds no more than the cluster's own start (connect ≤ cluster-up).

    .venv/bin/python bench/connect.py [--rounds N]
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile

import _common as c

TIMEOUT = 600.0

KERNEL = '''
import json, os, sys, time
os.environ["TFK8S_POOL_SIZE"] = "4"
import tfk8s_magics as tk
from tfk8s_magics import ingraph
from tfk8s_magics.backends.local import LocalBackend, pool
if sys.argv[2] == "off":
    ingraph.preimport = lambda legacy_keras: None
sock = pool.ensure()
while sum(p["state"] == "idle" for p in pool.info(sock, with_memory=False)["processes"]) < 4:
    time.sleep(0.1)
assert "tensorflow" not in sys.modules
be = LocalBackend(sys.argv[1])
t0 = time.perf_counter()
cluster = tk.launch("cn", mode="in-graph", ps=2, workers=2, backend=be, wait_ready=300)
t1 = time.perf_counter()
strategy = tk.connect("cn", backend=be)
t2 = time.perf_counter()
cold = [e.message for e in cluster.events() if e.reason == "StartedCold"]
cluster.delete()
pool.shutdown()
print(json.dumps({"up": t1 - t0, "connect": t2 - t1, "cold": cold}), flush=True)
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
        off, on = c.rounds(args.rounds, [("off", lambda i: run(tmp, i, "off")),
                                         ("on", lambda i: run(tmp, i, "on"))],
                           lambda _l, _i, r: f"cluster-up {r['up']:.3f} s   connect {r['connect']:.3f} s")
    for label, rs in (("off", off), ("on", on)):
        up, cn = c.median([r["up"] for r in rs]), c.median([r["connect"] for r in rs])
        print(f"{label:3s}  median cluster-up {up:.3f} s   connect {cn:.3f} s   connect / cluster-up "
              f"{cn / up:.2f}   launch + connect {up + cn:.3f} s")
    up, cn = c.median([r["up"] for r in on]), c.median([r["connect"] for r in on])
    print(f"target (on): connect <= cluster-up: {c.verdict(cn <= up)}")
    return 0


if __name__ == "__main__":
    c.run(main)
