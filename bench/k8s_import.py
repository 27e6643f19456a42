"""podman run → ``import tensorflow`` done, in the task image: node page cache cold vs warm.

What a task pod's start costs once its image is on the node (the
pre-puller's job) and it is scheduled (the placeholders' job): the
container start plus Python importing TensorFlow.  "Cold" evicts the
image's Python files from the page cache first (``posix_fadvise
DONTNEED`` on every file of the image's site-packages and stdlib: a node
that pulled the image but never ran it); "warm" runs right after.  Rounds
alternate cold / warm.  Needs root (``podman image mount``) and the task
image built (``scripts/images``).

    python3 bench/k8s_import.py [ROUNDS]

(docs/contributors/kubernetes-backend.md, "Warm start on Kubernetes").
"""
import os
import statistics
import subprocess
import sys
import time

IMAGE = "localhost/tfk8s/tensorflow-task:0.1.0"
CODE = "import time; t=time.perf_counter(); import tensorflow as tf; print(f'{time.perf_counter()-t:.3f}')"


def evict(roots):
    """Drop the page-cache pages of every file under ``roots``."""
    n = 0
    for root in roots:
        for d, _, files in os.walk(root):
            for f in files:
                try:
                    fd = os.open(os.path.join(d, f), os.O_RDONLY | os.O_NOFOLLOW)
                except OSError:
                    continue
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    n += 1
                finally:
                    os.close(fd)
    return n


def run():
    """One container: (podman run → exit, seconds; import tensorflow inside, seconds)."""
    t0 = time.perf_counter()
    out = subprocess.run(["podman", "run", "--rm", "--runtime", "/usr/sbin/runc", "--network", "none",
                          "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000", "--read-only",
                          "--tmpfs", "/tmp", "-e", "HOME=/tmp", "-e", "TF_CPP_MIN_LOG_LEVEL=2",
                          "--entrypoint", "python", IMAGE, "-c", CODE],
                         capture_output=True, text=True, timeout=300)
    total = time.perf_counter() - t0
    imp = float(out.stdout.strip().splitlines()[-1])
    return total, imp
def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    mount = subprocess.run(["podman", "image", "mount", IMAGE], capture_output=True, text=True,
                           check=True).stdout.strip()
    roots = [mount + "/opt/venv/lib/python3.11/site-packages", mount + "/usr/lib/python3.11"]
    res = {"cold": [], "warm": []}
    try:
        run()  # once untimed: podman's own files in the cache
        for i in range(rounds):
            evict(roots)
            res["cold"].append(run())
            res["warm"].append(run())
            print(f"round {i + 1}: cold {res['cold'][-1]}, warm {res['warm'][-1]}", flush=True)
    finally:
        subprocess.run(["podman", "image", "unmount", IMAGE], capture_output=True)
    for k, v in res.items():
        print(f"{k}: podman run -> import done median {statistics.median(t for t, _ in v):.2f} s, "
              f"import tensorflow median {statistics.median(i for _, i in v):.2f} s  ({len(v)} runs)")
    c = statistics.median(t for t, _ in res["cold"])
    w = statistics.median(t for t, _ in res["warm"])
    print(f"warm/cold {w / c:.2f}   load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
