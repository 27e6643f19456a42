"""TensorFlow Serving's REST API over :class:`~.models.Models`, as one pure-ish function.

``handle(models, method, path, body)`` returns ``(http_status, json_dict)``:

* ``GET /v1/models/<m>[/versions/<v>]`` → ``GetModelStatusResponse`` as JSON
  (printed from the real proto of ``tensorflow-serving-api`` with default
  fields, as TensorFlow Serving prints it);
* ``POST /v1/models/<m>[/versions/<v>]:predict`` → ``predictions`` /
  ``outputs``;
* anything else → TensorFlow Serving's ``Malformed request`` error; every
  error is ``{"error": <message>}`` with the HTTP status TF Serving maps
  its code to.

The path patterns are TensorFlow Serving's own (``http_rest_api_handler.cc``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from . import predict
from .models import HTTP_STATUS, Models, ServingError, Version

_PREDICT = re.compile(r"(?i)/v1/models/([^/:]+)(?:/versions/(\d+))?:(classify|regress|predict)")
_STATUS = re.compile(r"(?i)/v1/models(?:/([^/:]+))?(?:/versions/(\d+))?")


def handle(models: Models, method: str, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    """Answer one REST request; never raises for a client's mistake."""
    try:
        return 200, _dispatch(models, method, path.split("?", 1)[0], body)
    except ServingError as e:
        return HTTP_STATUS.get(e.code, 500), {"error": e.message}


def _dispatch(models: Models, method: str, path: str, body: bytes) -> dict[str, Any]:
    m = _PREDICT.fullmatch(path)
    if method == "POST" and m:
        name, version, verb = m.group(1), m.group(2), m.group(3).lower()
        if verb != "predict":
            raise ServingError("UNIMPLEMENTED",
                               f"{verb} is not served here: this endpoint answers predict only")
        return predict_json(models, name, int(version) if version else None, body)
    m = _STATUS.fullmatch(path)
    if method == "GET" and m:
        if not m.group(1):
            raise ServingError("INVALID_ARGUMENT", "Missing model name in request.")
        return status_json(models, m.group(1), int(m.group(2)) if m.group(2) else None)
    raise ServingError("INVALID_ARGUMENT", f"Malformed request: {method} {path}")


def predict_json(models: Models, name: str, version: int | None, body: bytes) -> dict[str, Any]:
    """The predict API: parse, run the signature, shape the answer like the request."""
    doc = predict.parse_request(body)
    servable = models.get(name, version).servable(version)
    fn = predict.signature(servable, doc.get("signature_name"))
    arrays, fmt = predict.inputs_from_json(doc, predict.input_specs(fn))
    return predict.outputs_to_json(predict.run(fn, arrays), fmt)


def status_proto(model_name: str, versions: list[Version]):
    """A ``GetModelStatusResponse`` proto for ``versions`` (used by REST and gRPC alike)."""
    from tensorflow_serving.apis import get_model_status_pb2

    response = get_model_status_pb2.GetModelStatusResponse()
    states = get_model_status_pb2.ModelVersionStatus.State
    for v in versions:
        entry = response.model_version_status.add()
        entry.version = v.number
        entry.state = states.Value(v.state)
        entry.status.SetInParent()  # TF Serving always sets it (OK when healthy)
        if v.error:
            entry.status.error_code = 13  # INTERNAL, as TF Serving reports a failed load
            entry.status.error_message = v.error
    return response


def status_json(models: Models, name: str, version: int | None) -> dict[str, Any]:
    """The model-status API: TF Serving prints the proto with its default fields."""
    from google.protobuf import json_format

    if name not in models.models:
        which = "any versions" if version is None else f"version {version}"
        raise ServingError("NOT_FOUND", f"Could not find {which} of model {name}")
    response = status_proto(name, models.models[name].status(version))
    text = json_format.MessageToJson(response, always_print_fields_with_no_presence=True)
    return json.loads(text)
