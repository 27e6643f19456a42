"""TensorFlow Serving's gRPC API (``PredictionService.Predict``, ``ModelService.GetModelStatus``).

Built on the protos and service definitions of the PyPI package
``tensorflow-serving-api`` (TensorFlow Serving's own), so any TF Serving
client — its generated stubs included — talks to this server unchanged.
"""

from __future__ import annotations

from concurrent import futures

import grpc

from . import predict
from .models import Models, ServingError
from .rest import status_proto


def _abort(context, err: ServingError):
    context.abort(getattr(grpc.StatusCode, err.code, grpc.StatusCode.UNKNOWN), err.message)


def _version(spec) -> int | None:
    return spec.version.value if spec.HasField("version") else None


def make_servicers(models: Models):
    """The two servicers (prediction, model) answering from ``models``."""
    import tensorflow as tf
    from tensorflow_serving.apis import (
        model_service_pb2_grpc,
        predict_pb2,
        prediction_service_pb2_grpc,
    )

    class Prediction(prediction_service_pb2_grpc.PredictionServiceServicer):
        """``Predict``: inputs and outputs as TensorProtos; other methods are UNIMPLEMENTED."""

        def Predict(self, request, context):  # noqa: N802 - the proto's method name
            try:
                version = _version(request.model_spec)
                servable = models.get(request.model_spec.name, version).servable(version)
                fn = predict.signature(servable, request.model_spec.signature_name or None)
                arrays = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
                outputs = predict.run(fn, arrays)
            except ServingError as e:
                return _abort(context, e)
            wanted = list(request.output_filter) or list(outputs)
            unknown = [n for n in wanted if n not in outputs]
            if unknown:
                return _abort(context, ServingError(
                    "INVALID_ARGUMENT", f"output tensor alias not found in signature: {unknown[0]}"))
            response = predict_pb2.PredictResponse()
            response.model_spec.name = request.model_spec.name
            response.model_spec.version.value = servable.number
            response.model_spec.signature_name = request.model_spec.signature_name or "serving_default"
            for name in wanted:
                response.outputs[name].CopyFrom(tf.make_tensor_proto(outputs[name]))
            return response

    class Model(model_service_pb2_grpc.ModelServiceServicer):
        """``GetModelStatus``; reloading the config is not offered here."""

        def GetModelStatus(self, request, context):  # noqa: N802 - the proto's method name
            name, version = request.model_spec.name, _version(request.model_spec)
            if name not in models.models:
                which = "any versions" if version is None else f"version {version}"
                return _abort(context, ServingError("NOT_FOUND", f"Could not find {which} of model {name}"))
            try:
                versions = models.models[name].status(version)
            except ServingError as e:
                return _abort(context, e)
            return status_proto(name, versions)

    return Prediction(), Model()


def start_grpc(models: Models, address: str, workers: int = 4) -> grpc.Server:
    """Start a gRPC server on ``address`` (``127.0.0.1:PORT``) answering both services."""
    from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    prediction, model = make_servicers(models)
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(prediction, server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(model, server)
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot listen on {address}")
    server.start()
    return server
