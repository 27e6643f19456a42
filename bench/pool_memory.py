"""Memory of the warm pool per user: one pool shared by every kernel vs a pool per kernel.

For 3 and 5 kernels (processes that call ``pool.ensure()`` as a notebook
kernel's first local launch does; ``warm_kernel`` off, so the kernels hold no
TensorFlow themselves), with ``pool_size`` 2:

* ours: the kernels share this user's pool (they have the same task
  environment, as the kernels of one lab have);
* baseline, same run: each kernel has a pool of its own (a private
  ``$XDG_RUNTIME_DIR`` each gives each kernel a different pool), which is what
  every kernel had before pools became per user.

Measured once every pool is full (every process idle): the PSS of the pool
daemons and their processes (``/proc/PID/smaps_rollup``), in MiB, and the
ratio ours / baseline.  Every process is ended after each case, and checked.

    .venv/bin/python bench/pool_memory.py [--rounds 1]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import _common as c

SIZE = 2
TIMEOUT = 900.0
KERNEL = textwrap.dedent('''
    import json, sys, time
    from tfk8s_magics.backends.local import pool
    print(json.dumps({"sock": pool.ensure()}), flush=True)
    time.sleep(3600)
''')


def pss(pid: int) -> int:
    from tfk8s_magics.backends.local import pool

    return pool.memory(pid).get("pss", 0)


def run(kernels: int, shared: bool) -> dict:
    """Start ``kernels`` kernels, wait until their pool(s) are full; PSS of the pools, in MiB."""
    from tfk8s_magics.backends.local import pool

    base = tempfile.mkdtemp(prefix="tfk8s-bench-", dir="/tmp")
    procs = []
    try:
        socks = set()
        for i in range(kernels):
            run_dir = os.path.join(base, "shared" if shared else str(i))
            os.makedirs(run_dir, mode=0o700, exist_ok=True)
            env = {**os.environ, "XDG_RUNTIME_DIR": run_dir, "TFK8S_POOL_SIZE": str(SIZE),
                   "TFK8S_WARM_KERNEL": "0", "TFK8S_POOL_IDLE": "0"}
            p = subprocess.Popen([sys.executable, "-c", KERNEL], stdout=subprocess.PIPE, text=True,
                                 env=env, cwd=base)
            procs.append(p)
            socks.add(json.loads(p.stdout.readline())["sock"])
        deadline = time.monotonic() + TIMEOUT
        while True:
            found = [pool.info(s, with_memory=False) for s in socks]
            if all(f and sum(p["state"] == "idle" for p in f["processes"]) >= SIZE for f in found):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the pools did not fill within {TIMEOUT:g} s: {found}")
            time.sleep(0.5)
        time.sleep(2.0)  # settle
        pids = [f["pid"] for f in found] + [p["pid"] for f in found for p in f["processes"]]
        return {"pools": len(found), "processes": len(pids) - len(found),
                "pss_mib": sum(pss(p) for p in pids) / 2**20}
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(base, ignore_errors=True)
        c.assert_clean(f"{kernels} kernels, {'shared' if shared else 'per kernel'}", wait=30)


def main() -> int:
    args = c.parse_args(__doc__, rounds=1)
    print(c.machine())
    print(f"pool_size {SIZE}; PSS of the pool daemons and their processes once full")
    with c.cleanup_on_exit():
        for kernels in (3, 5):
            ours, base = [], []
            for _ in range(args.rounds):
                ours.append(run(kernels, shared=True))
                base.append(run(kernels, shared=False))
            o = c.median([r["pss_mib"] for r in ours])
            b = c.median([r["pss_mib"] for r in base])
            print(f"{kernels} kernels: one pool per user {o:.0f} MiB ({ours[0]['processes']} processes, "
                  f"{ours[0]['pools']} pool) vs a pool per kernel {b:.0f} MiB ({base[0]['processes']} "
                  f"processes, {base[0]['pools']} pools): {o / b:.3f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
