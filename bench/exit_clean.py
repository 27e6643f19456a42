"""exit_clean: does a process that used the lab end cleanly at interpreter exit?

Each run is a fresh ``python -X faulthandler`` process driving an in-process
IPython shell (``InteractiveShell.instance()``, as a kernel holds one) through
a between-graph cluster's whole life: ``%load_ext tfk8s_magics``, ``%%tfcluster
launch`` of a two-worker MultiWorkerMirroredStrategy script, ``wait``,
``logs``, ``delete`` — then the interpreter exits.  Every step must succeed;
what is counted is how the process ended (exit code, and any faulthandler
dump: which thread was alive and where, at a crash).  The warm pool is on (its
default), as in a notebook.

A crash at interpreter exit comes from a thread or handle still running while
the interpreter tears down (a daemon thread inside C code, a gRPC channel):
the dump names it.

    nice -n 5 .venv/bin/python bench/exit_clean.py [--runs 30] [--keep DIR] [--kernel]
        [--warm SECONDS --pause SECONDS]

Measured here (2 shared cores, load 10-20): ``--warm 40 --pause 15``, 30 of 30 runs exited
cleanly (each run 3-69 s).  What was alive at exit in a fast run: the kernel's background import
of TensorFlow (``tfk8s-import-tensorflow``), still importing; a process in which that import
finishes inside an exit handler segfaults at exit every time (6 of 6), so the import is a
non-daemon thread now, joined before the exit handlers run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench._common import machine  # noqa: E402  (after the path line above)

#: What the shell runs, cell by cell (the script is the cell body of the launch).
CELLS = [
    "%load_ext tfk8s_magics",
    """%%tfcluster launch exitcheck --workers 2 --ps 0
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    v = tf.Variable(1.0)
print("sum", strategy.reduce("SUM", strategy.run(lambda: v * 2.0), axis=None).numpy())
""",
    "import tfk8s_magics as tk\n_c = tk.get('exitcheck')\n_st = _c.wait(timeout=300)\n"
    "assert _st.phase == 'succeeded', (_st.phase, _st.reason, _c.logs()[-3000:])",
    "_logs = _c.logs()\nassert _logs.count('sum 4.0') == 2, _logs[-3000:]",
    "_c.delete()",
]

#: The child with ipykernel's in-process kernel (a kernel's shell, display and comms in this
#: process, as a notebook's kernel has them; widgets get a comm).
CHILD_KERNEL = r"""
import sys
from ipykernel.inprocess.manager import InProcessKernelManager
km = InProcessKernelManager()
km.start_kernel()
kc = km.client()
kc.start_channels()
shell = km.kernel.shell
for cell in CELLS:
    r = shell.run_cell(cell)
    if not r.success:
        print("CELL FAILED:", cell.splitlines()[0], file=sys.stderr, flush=True)
        sys.exit(7)
print("ALL CELLS OK", flush=True)
"""

#: The child: one shell, the cells in order, a non-zero exit if any cell failed.
CHILD = r"""
import sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
for cell in CELLS:
    r = shell.run_cell(cell)
    if not r.success:
        print("CELL FAILED:", cell.splitlines()[0], file=sys.stderr, flush=True)
        sys.exit(7)
print("ALL CELLS OK", flush=True)
"""


#: Another owner of the warm pool (as another kernel of the lab is): it keeps the pool and its
#: imported processes between runs, so each run's launch is sub-second, as in a lab.
OWNER = (
    "import sys, time\n"
    "from tfk8s_magics.backends.local import pool\n"
    "print(pool.ensure(), flush=True)\n"
    "sys.stdin.read()\n"  # until the bench ends
)


def run_env(state: Path) -> dict[str, str]:
    """The environment of every process of the bench: one state dir, so one pool (by its key)."""
    return dict(os.environ, TFK8S_STATE_DIR=str(state), PYTHONFAULTHANDLER="1",
                PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def one_run(i: int, keep: Path | None, kernel: bool, state: Path) -> tuple[int, str]:
    """Run the sequence once in a fresh process; (its exit code, its stderr)."""
    with tempfile.TemporaryDirectory(prefix="tfk8s-exit-") as tmp:
        code = f"CELLS = {CELLS!r}\n" + (CHILD_KERNEL if kernel else CHILD)
        proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], env=run_env(state),
                              cwd=tmp, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    if keep is not None:
        (keep / f"run-{i:02d}.log").write_text(f"exit {proc.returncode}\n{out}")
    return proc.returncode, out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--keep", type=Path, help="write each run's output to DIR/run-NN.log")
    p.add_argument("--kernel", action="store_true",
                   help="drive ipykernel's in-process kernel (display, widget comms), not a bare shell")
    p.add_argument("--warm", type=float, default=0, metavar="SECONDS",
                   help="keep the warm pool up between runs (another owner holds it), SECONDS to let it "
                        "import first, as in a lab where another kernel keeps it (default: off)")
    p.add_argument("--pause", type=float, default=0, metavar="SECONDS",
                   help="wait between runs (the warm pool refills: each run's launch is then warm)")
    args = p.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    print(machine(), flush=True)
    state = Path(tempfile.mkdtemp(prefix="tfk8s-exit-state-"))
    owner = None
    if args.warm:
        owner = subprocess.Popen([sys.executable, "-c", OWNER], env=run_env(state), stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        print("warm pool:", owner.stdout.readline().strip(), flush=True)
        time.sleep(args.warm)  # its processes import TensorFlow
    try:
        codes = runs(args, state)
    finally:
        if owner is not None:
            owner.stdin.close()  # the owner ends; the pool ends with its last owner
            owner.wait()
    clean = sum(1 for c in codes if c == 0)
    print(f"clean exits: {clean} of {len(codes)}")
    return 0 if clean == len(codes) else 1


def runs(args: argparse.Namespace, state: Path) -> list[int]:
    """Run the sequence ``args.runs`` times; each run's exit code."""
    codes = []
    for i in range(args.runs):
        if i:
            time.sleep(args.pause)
        t0 = time.monotonic()
        rc, out = one_run(i, args.keep, args.kernel, state)
        codes.append(rc)
        crashed = "Fatal Python error" in out or rc < 0 or rc >= 128
        print(f"run {i + 1:2d}: exit {rc} in {time.monotonic() - t0:.0f} s"
              + ("  CRASH" if crashed else "") + ("" if "ALL CELLS OK" in out else "  (a step failed)"),
              flush=True)
        if crashed and not args.keep:
            print(out[-4000:], flush=True)
    return codes


if __name__ == "__main__":
    sys.exit(main())
