"""Fetch a 200 MB dataset from S3 into a data dir: tfk8s_magics.storage.sync_down vs s3fs's own get.

The S3 endpoint is moto's server (``ThreadedMotoServer`` on 127.0.0.1, in a
process of its own so neither side shares its interpreter); the dataset is
20 objects of 10 MB under one prefix.  Each round copies it once with ours
(``storage.sync_down(url, dir, progress=...)``: listing, a hidden temporary
dir renamed into place, byte progress — what ``--data-sync`` and the
Kubernetes init container run) and once with the baseline
(``s3fs.S3FileSystem().get(url, dir, recursive=True)``), interleaved, each
into a fresh dir that is removed after.  Throughput = bytes / wall seconds;
the target is ours ≥ 0.95 × the baseline's (medians).  A third side, ``cli``,
runs ``python -m tfk8s_magics.storage fetch URL DIR`` as a process — what a
local ``--data-sync`` runs since the copy became a child the supervisor can
kill, and what the Kubernetes init container runs — its interpreter start
and imports inside the timer.  Its baseline is the same thing done by hand:
``base-cli`` runs s3fs's ``get`` in a fresh ``python -c`` process (start,
imports, a cold connection pool: what every process pays); ``cli`` is held
to ≥ 0.95 × ``base-cli``, and reported against the in-process ``base`` too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import PYTHON, assert_clean, cleanup_on_exit, killpg, machine, median, parse_args, run, verdict

FILES, FILE_BYTES, BUCKET = 20, 10 * 1000 * 1000, "bench-data"
SERVER = ("import sys\nfrom moto.server import ThreadedMotoServer\n"
          "s = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False)\ns.start()\n"
          "print(s.get_host_and_port()[1], flush=True)\nsys.stdin.read()\n")


def main() -> int:
    args = parse_args(__doc__, rounds=5)
    print(machine())
    server = subprocess.Popen([PYTHON, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL,  # its request log
                              text=True, start_new_session=True)
    work = Path(tempfile.mkdtemp(prefix="tfk8s-bench-storage-"))
    try:
        port = int(server.stdout.readline())
        os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                          AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_DEFAULT_REGION="us-east-1")
        import boto3
        import s3fs

        from tfk8s_magics import storage

        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        for i in range(FILES):
            client.put_object(Bucket=BUCKET, Key=f"ds/part-{i:03d}.bin", Body=os.urandom(FILE_BYTES))
        url, total = f"s3://{BUCKET}/ds", FILES * FILE_BYTES
        print(f"dataset: {url}, {FILES} objects, {total / 1e6:.0f} MB; moto S3 on 127.0.0.1:{port}")

        def timed(copy) -> dict:
            dest = work / "data"
            started = time.perf_counter()
            copy(dest)
            took = time.perf_counter() - started
            got = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
            shutil.rmtree(dest)
            if got != total:
                raise RuntimeError(f"copied {got} bytes, expected {total}")
            return {"s": took, "mbps": total / took / 1e6}

        def ours(_i):
            seen = []
            r = timed(lambda d: storage.sync_down(url, d, progress=lambda done, t: seen.append(done)))
            return {**r, "progress_calls": len(seen)}

        def base(_i):
            # As a user calls it: a filesystem from the environment, then get (ours opens one too).
            return timed(lambda d: s3fs.S3FileSystem(skip_instance_cache=True).get(url, str(d),
                                                                                  recursive=True))

        def cli(_i):
            said = []

            def child(d):
                out = subprocess.run([PYTHON, "-m", "tfk8s_magics.storage", "fetch", url, str(d)], check=True,
                                     stdout=subprocess.PIPE, text=True).stdout
                said.append(float(out.strip().splitlines()[-1].rsplit(" in ", 1)[1].split()[0]))
            r = timed(child)
            return {**r, "own_s": said[0]}  # the copy as the tool timed it: the rest is start + imports

        bare = ("import os, s3fs, sys\n"
                "s3fs.S3FileSystem(skip_instance_cache=True).get(sys.argv[1], sys.argv[2], recursive=True)\n")

        def base_cli(_i):
            return timed(lambda d: subprocess.run([PYTHON, "-c", bare, url, str(d)], check=True))

        a, b, c, e = [], [], [], []
        for i in range(args.rounds):  # interleaved, and the order alternates: neither side always goes first
            sides = [("ours", ours, a), ("base", base, b), ("cli", cli, c), ("base-cli", base_cli, e)]
            for label, fn, acc in (sides if i % 2 == 0 else sides[::-1]):
                r = fn(i)
                acc.append(r)
                extra = f"  ({r['progress_calls']} progress calls)" if "progress_calls" in r else ""
                extra += f"  (the tool's own copy time {r['own_s']:.1f} s)" if "own_s" in r else ""
                print(f"round {i + 1}/{args.rounds}  {label}  {r['s']:.3f} s  {r['mbps']:.1f} MB/s{extra}",
                      flush=True)
        mo, mb = median([r["mbps"] for r in a]), median([r["mbps"] for r in b])
        per_round = median([x["mbps"] / y["mbps"] for x, y in zip(a, b, strict=True)])
        ratio = mo / mb
        print(f"\nmedian throughput: ours {mo:.1f} MB/s, s3fs get {mb:.1f} MB/s")
        print(f"ratio ours/baseline = {ratio:.3f} (median of per-round ratios {per_round:.3f}); "
              f"target ≥ 0.95: {verdict(ratio >= 0.95)}")
        mc, me = median([r["mbps"] for r in c]), median([r["mbps"] for r in e])
        cli_ratio = mc / me
        cli_round = median([x["mbps"] / y["mbps"] for x, y in zip(c, e, strict=True)])
        print(f"cli (python -m tfk8s_magics.storage fetch, a process) {mc:.1f} MB/s, "
              f"s3fs get in a fresh process {me:.1f} MB/s: ratio = {cli_ratio:.3f} "
              f"(median of per-round ratios {cli_round:.3f}); "
              f"target ≥ 0.95: {verdict(cli_ratio >= 0.95)}; against the in-process get: {mc / mb:.3f}")
        return 0 if ratio >= 0.95 and cli_ratio >= 0.95 else 1
    finally:
        server.stdin.close()
        killpg([server])
        shutil.rmtree(work, ignore_errors=True)
        assert_clean("the storage bench")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    with cleanup_on_exit():
        run(main)
