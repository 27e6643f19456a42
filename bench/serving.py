"""serving: predict latency and throughput of the local TF-Serving-compatible endpoint vs in-process.

A small MLP (32 → 64 → 64 → 10, float32) is exported as a SavedModel.

ours      the lab's local serving process (``python -m tfk8s_magics.serving.server``, what
          ``%tfcluster serve`` starts), queried over REST (``POST …:predict`` with row
          ``instances``, one keep-alive ``requests.Session``) and over gRPC
          (``PredictionService.Predict`` with ``tensorflow-serving-api``'s stub);
baseline  the same SavedModel loaded in this process (``tf.saved_model.load``) and its
          ``serving_default`` signature called directly on a tensor of the same rows.

Batches: small (1 row) and large (1024 rows).  Rounds alternate ours / baseline; each
round makes ``--requests`` calls per batch size after a warm-up.  Reported per batch:
latency p50 / p95 (ms, pooled over rounds), throughput (rows/s = rows × calls / wall
time), and ratios ours / in-process.  An endpoint pays JSON (or protobuf) encoding,
HTTP/2 or HTTP/1.1, a socket round trip and a thread hop: the ratio says what that
costs on this machine, not a target.

    .venv/bin/python bench/serving.py [--rounds 3] [--requests 200]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from _common import PYTHON, ROOT, assert_clean, cleanup_on_exit, free_ports, killpg, machine, pct, run

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
BATCHES = {"small": 1, "large": 1024}


def export(path: str) -> None:
    import tensorflow as tf

    inp = tf.keras.Input((32,), name="x")
    h = tf.keras.layers.Dense(64, activation="relu")(inp)
    h = tf.keras.layers.Dense(64, activation="relu")(h)
    out = tf.keras.layers.Dense(10, name="y")(h)
    tf.saved_model.save(tf.keras.Model(inp, out), path)


def timed(call, n: int) -> tuple[list[float], float]:
    lat = []
    t0 = time.perf_counter()
    for _ in range(n):
        s = time.perf_counter()
        call()
        lat.append(time.perf_counter() - s)
    return lat, time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=200, help="calls per batch size per round")
    args = p.parse_args()
    import grpc
    import numpy as np
    import requests
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    print(machine())
    tmp = tempfile.mkdtemp(prefix="tfk8s-bench-serving-")
    export(os.path.join(tmp, "m", "1"))
    rest, grpc_port = free_ports(2)
    proc = subprocess.Popen(
        [PYTHON, "-m", "tfk8s_magics.serving.server", "--model-name", "m", "--model-base-path",
         os.path.join(tmp, "m"), "--rest-port", str(rest), "--grpc-port", str(grpc_port),
         "--owner", str(os.getpid())],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        session = requests.Session()
        url = f"http://127.0.0.1:{rest}/v1/models/m"
        deadline = time.monotonic() + 120
        while True:
            try:
                if "AVAILABLE" in session.get(url, timeout=2).text:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the serving process did not become ready")
            time.sleep(0.1)
        fn = tf.saved_model.load(os.path.join(tmp, "m", "1")).signatures["serving_default"]
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        rng = np.random.default_rng(0)
        res: dict[tuple[str, str], list] = {}
        walls: dict[tuple[str, str], float] = {}
        for batch, rows in BATCHES.items():
            x = rng.normal(size=(rows, 32)).astype("float32")
            body = {"instances": x.tolist()}
            req = predict_pb2.PredictRequest()
            req.model_spec.name = "m"
            req.inputs["x"].CopyFrom(tf.make_tensor_proto(x))
            want = fn(x=tf.constant(x))["y"].numpy()
            got = np.asarray(session.post(f"{url}:predict", json=body).json()["predictions"], np.float32)
            assert np.array_equal(got, want), "the endpoint and the model disagree"
            calls = {
                "rest": lambda body=body: session.post(f"{url}:predict", json=body).raise_for_status(),
                "grpc": lambda req=req: stub.Predict(req, timeout=60),
                "in-process": lambda x=x: fn(x=tf.constant(x))["y"].numpy(),
            }
            n = max(10, args.requests // (4 if rows > 1 else 1))
            for call in calls.values():
                timed(call, 5)  # warm-up
            for r in range(args.rounds):
                for how, call in calls.items():
                    lat, wall = timed(call, n)
                    res.setdefault((batch, how), []).extend(lat)
                    walls[(batch, how)] = walls.get((batch, how), 0.0) + wall
                    print(f"round {r + 1}/{args.rounds}  {batch:5s} ({rows} rows)  {how:10s}  "
                          f"p50 {pct(lat, 50) * 1e3:7.2f} ms  p95 {pct(lat, 95) * 1e3:7.2f} ms", flush=True)
        print("\nbatch  rows  path        p50 ms   p95 ms   rows/s     p50 ratio  rows/s ratio")
        for batch, rows in BATCHES.items():
            base = res[(batch, "in-process")]
            base_tput = rows * len(base) / walls[(batch, "in-process")]
            for how in ("rest", "grpc", "in-process"):
                lat = res[(batch, how)]
                tput = rows * len(lat) / walls[(batch, how)]
                print(f"{batch:5s}  {rows:4d}  {how:10s} {pct(lat, 50) * 1e3:8.2f} {pct(lat, 95) * 1e3:8.2f} "
                      f"{tput:9.0f}   {pct(lat, 50) / pct(base, 50):8.2f}   {tput / base_tput:8.3f}")
        channel.close()
    finally:
        killpg([proc])
    assert_clean("the serving bench")
    print("no process left")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    with cleanup_on_exit():
        run(main)
