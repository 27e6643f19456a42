"""The local TF-Serving-compatible server against TensorFlow Serving's documented REST and gRPC shapes.

Real TensorFlow: real SavedModels, served in this process on 127.0.0.1; the
REST requests and responses are the ones TensorFlow Serving's REST API
document shows (``api_rest.md``), the status JSON is the proto printed with
default fields, errors are ``{"error": ...}`` with TF Serving's HTTP codes,
and gRPC is exercised with ``tensorflow-serving-api``'s own stubs.
"""

from __future__ import annotations

import base64
import json
import math
import os

import numpy as np
import pytest
import requests

from tests.conftest import wait_for

pytestmark = pytest.mark.slow

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def _save_dense(path, seed: int) -> None:
    """A one-input, one-output Keras model: x (3 floats) -> y (2 floats)."""
    import tensorflow as tf

    tf.random.set_seed(seed)
    inp = tf.keras.Input((3,), name="x")
    out = tf.keras.layers.Dense(2, name="y")(inp)
    tf.saved_model.save(tf.keras.Model(inp, out), str(path))


def _save_multi(path) -> None:
    """Two named inputs, two named outputs, a second signature, and a binary string output."""
    import tensorflow as tf

    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="a"),
                                      tf.TensorSpec([None], tf.float32, name="b")])
        def serve(self, a, b):
            return {"sum": a + b, "prod": a * b}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="data")])
        def echo(self, data):
            return {"data_bytes": data}

    m = M()
    tf.saved_model.save(m, str(path), signatures={"serving_default": m.serve, "echo": m.echo})


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from tfk8s_magics.ports import free_ports
    from tfk8s_magics.serving.models import Model, Models
    from tfk8s_magics.serving.server import ServingServer

    root = tmp_path_factory.mktemp("models")
    _save_dense(root / "dense" / "1", seed=1)
    _save_multi(root / "multi" / "1")
    models = {n: Model(n, root / n) for n in ("dense", "multi")}
    for m in models.values():
        m.refresh()
    rest, grpc_port = free_ports(2)
    server = ServingServer(Models(models), rest, grpc_port, poll_seconds=0.2).start()
    yield {"url": f"http://127.0.0.1:{rest}", "grpc": f"127.0.0.1:{grpc_port}", "root": root,
           "models": models}
    server.close()


def in_process(path, x):
    """What the SavedModel itself answers, called in this process."""
    import tensorflow as tf

    fn = tf.saved_model.load(str(path)).signatures["serving_default"]
    return fn(x=tf.constant(x, tf.float32))["y"].numpy()


X = [[1.0, 2.0, 3.0], [0.5, -1.0, 4.25]]


def test_model_status_is_tf_servings_json(served):
    r = requests.get(f"{served['url']}/v1/models/dense")
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "application/json"
    assert r.json() == {"model_version_status": [
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]}
    assert requests.get(f"{served['url']}/v1/models/dense/versions/1").json() == r.json()


def test_status_errors(served):
    r = requests.get(f"{served['url']}/v1/models/dense/versions/7")
    assert (r.status_code, r.json()) == (404, {"error": "Could not find version 7 of model dense"})
    r = requests.get(f"{served['url']}/v1/models/nope")
    assert (r.status_code, r.json()) == (404, {"error": "Could not find any versions of model nope"})
    r = requests.get(f"{served['url']}/v1/models")
    assert (r.status_code, r.json()) == (400, {"error": "Missing model name in request."})
    r = requests.get(f"{served['url']}/v1/foo")
    assert (r.status_code, r.json()) == (400, {"error": "Malformed request: GET /v1/foo"})


def test_predict_row_and_columnar_equal_the_model(served):
    want = in_process(served["root"] / "dense" / "1", X)
    r = requests.post(f"{served['url']}/v1/models/dense:predict", json={"instances": X})
    assert r.status_code == 200, r.text
    assert set(r.json()) == {"predictions"}
    assert np.array_equal(np.asarray(r.json()["predictions"], np.float32), want)
    r = requests.post(f"{served['url']}/v1/models/dense/versions/1:predict", json={"inputs": X})
    assert set(r.json()) == {"outputs"}
    assert np.array_equal(np.asarray(r.json()["outputs"], np.float32), want)
    # Row objects naming the single input work too.
    r = requests.post(f"{served['url']}/v1/models/dense:predict",
                      json={"instances": [{"x": row} for row in X]})
    assert np.array_equal(np.asarray(r.json()["predictions"], np.float32), want)


def test_named_inputs_and_outputs(served):
    url = f"{served['url']}/v1/models/multi:predict"
    r = requests.post(url, json={"instances": [{"a": 1.0, "b": 2.0}, {"a": 3.0, "b": 4.0}]})
    assert r.json() == {"predictions": [{"prod": 2.0, "sum": 3.0}, {"prod": 12.0, "sum": 7.0}]}
    r = requests.post(url, json={"inputs": {"a": [1.0, 3.0], "b": [2.0, 4.0]}})
    assert r.json() == {"outputs": {"prod": [2.0, 12.0], "sum": [3.0, 7.0]}}
    r = requests.post(url, json={"instances": [1.0, 2.0]})
    assert r.status_code == 400
    assert r.json()["error"].startswith("instances is a plain list, but expecting list of objects")


def test_signature_name_and_binary_values(served):
    url = f"{served['url']}/v1/models/multi:predict"
    blob = base64.b64encode(b"\x00\x01\xfe").decode()
    r = requests.post(url, json={"signature_name": "echo", "instances": [{"b64": blob}]})
    assert r.status_code == 200, r.text
    assert r.json() == {"predictions": [{"b64": blob}]}
    r = requests.post(url, json={"signature_name": "nope", "instances": [1.0]})
    assert (r.status_code, r.json()) == (
        400, {"error": 'Serving signature name: "nope" not found in signature def'})


def test_predict_errors_have_tf_servings_shape_and_codes(served):
    url = f"{served['url']}/v1/models/dense:predict"
    cases = [
        (b"", 400, "JSON Parse error: The document is empty"),
        (b"{nope", 400, "JSON Parse error"),
        (b"[1, 2]", 400, "JSON Value: [1, 2] Is not object"),
        (json.dumps({"instances": X, "inputs": X}).encode(), 400,
         "Not formatted correctly expecting only one of 'inputs' or 'instances' keys to exist"),
        (b"{}", 400, "Missing 'inputs' or 'instances' key"),
        (json.dumps({"instances": []}).encode(), 400, "No values in 'instances' array"),
        (json.dumps({"instances": [[1.0, 2.0]]}).encode(), 400, "input 'x' has shape [1, 2]"),
        (json.dumps({"instances": [["a", "b", "c"]]}).encode(), 400, "cannot convert input to float32"),
    ]
    for body, code, start in cases:
        r = requests.post(url, data=body)
        assert r.status_code == code, (body, r.text)
        assert r.headers["Content-Type"] == "application/json"
        assert set(r.json()) == {"error"} and r.json()["error"].startswith(start), (body, r.json())
    r = requests.post(f"{served['url']}/v1/models/nope:predict", json={"instances": X})
    assert (r.status_code, r.json()) == (404, {"error": "Servable not found for request: Latest(nope)"})
    r = requests.post(f"{served['url']}/v1/models/dense/versions/9:predict", json={"instances": X})
    assert (r.status_code, r.json()) == (404, {"error": "Servable not found for request: Specific(dense, 9)"})


def test_nan_and_infinity_are_accepted_as_tf_serving_accepts_them(served):
    body = b'{"instances": [[NaN, 1.0, 2.0], [Infinity, -Infinity, 0.0]]}'
    r = requests.post(f"{served['url']}/v1/models/dense:predict", data=body)
    assert r.status_code == 200, r.text
    preds = json.loads(r.text)["predictions"]
    assert all(math.isnan(v) for v in preds[0])


def test_grpc_predict_and_status_with_tf_servings_own_stubs(served):
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import (
        get_model_status_pb2,
        model_service_pb2_grpc,
        predict_pb2,
        prediction_service_pb2_grpc,
    )

    with grpc.insecure_channel(served["grpc"]) as channel:
        predict = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        req = predict_pb2.PredictRequest()
        req.model_spec.name = "dense"
        req.inputs["x"].CopyFrom(tf.make_tensor_proto(np.asarray(X, np.float32)))
        resp = predict.Predict(req, timeout=30)
        assert resp.model_spec.version.value == 1
        assert resp.model_spec.signature_name == "serving_default"
        want = in_process(served["root"] / "dense" / "1", X)
        assert np.array_equal(tf.make_ndarray(resp.outputs["y"]), want)

        req.model_spec.signature_name = "nope"
        with pytest.raises(grpc.RpcError) as err:
            predict.Predict(req, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        req.model_spec.name, req.model_spec.signature_name = "missing", ""
        with pytest.raises(grpc.RpcError) as err:
            predict.Predict(req, timeout=30)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert err.value.details() == "Servable not found for request: Latest(missing)"

        models = model_service_pb2_grpc.ModelServiceStub(channel)
        sreq = get_model_status_pb2.GetModelStatusRequest()
        sreq.model_spec.name = "dense"
        status = models.GetModelStatus(sreq, timeout=30)
        (only,) = status.model_version_status
        assert only.version == 1
        assert only.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
        sreq.model_spec.name = "missing"
        with pytest.raises(grpc.RpcError) as err:
            models.GetModelStatus(sreq, timeout=30)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_new_version_is_served_without_restart(served):
    """Last: it changes the served model. TF Serving's latest-1 policy: v2 serves, v1 ends."""
    _save_dense(served["root"] / "dense" / "2", seed=2)
    url = served["url"]
    wait_for(lambda: requests.get(f"{url}/v1/models/dense/versions/2").status_code == 200
             and requests.get(f"{url}/v1/models/dense/versions/2").json()["model_version_status"][0]["state"]
             == "AVAILABLE", timeout=60, what="version 2 to be loaded by the poll")
    listed = requests.get(f"{url}/v1/models/dense").json()["model_version_status"]
    states = {s["version"]: s["state"] for s in listed}
    assert states == {"2": "AVAILABLE", "1": "END"}
    want = in_process(served["root"] / "dense" / "2", X)
    r = requests.post(f"{url}/v1/models/dense:predict", json={"instances": X})
    assert np.array_equal(np.asarray(r.json()["predictions"], np.float32), want)
    r = requests.post(f"{url}/v1/models/dense/versions/1:predict", json={"instances": X})
    assert r.status_code == 404
