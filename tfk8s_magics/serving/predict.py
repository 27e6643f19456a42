"""Run a SavedModel signature on named inputs: the part REST and gRPC share.

The JSON side follows TensorFlow Serving's REST API ("row" ``instances``
and "columnar" ``inputs`` requests; ``predictions`` / ``outputs``
responses; ``{"b64": …}`` for binary strings; ``NaN``/``Infinity``
accepted), with TensorFlow Serving's error wording where it has one.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from .models import DEFAULT_SIGNATURE, ServingError, Version

ROW, COLUMNAR = "row", "columnar"


def signature(version: Version, name: str | None):
    """The concrete function of signature ``name`` (default ``serving_default``)."""
    signame = name or DEFAULT_SIGNATURE
    fn = version.signatures.get(signame)
    if fn is None:
        raise ServingError(
            "INVALID_ARGUMENT", f'Serving signature name: "{signame}" not found in signature def'
        )
    return fn


def input_specs(fn) -> dict[str, Any]:
    """Input name → ``tf.TensorSpec`` of a signature (signatures take keyword arguments only)."""
    return dict(fn.structured_input_signature[1])


def run(fn, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Call the signature; a bad shape or type is INVALID_ARGUMENT with TensorFlow's message."""
    import tensorflow as tf

    specs = input_specs(fn)
    missing = [n for n in specs if n not in arrays]
    if missing:
        raise ServingError("INVALID_ARGUMENT", f"Missing named input: {missing[0]}")
    extra = [n for n in arrays if n not in specs]
    if extra:
        raise ServingError(
            "INVALID_ARGUMENT",
            f"input tensor alias not found in signature: {extra[0]}. Inputs expected to be in the set "
            f"{{{','.join(sorted(specs))}}}.",
        )
    try:
        feeds = {n: tf.convert_to_tensor(arrays[n], dtype=specs[n].dtype) for n in specs}
        for n, t in feeds.items():
            if not specs[n].shape.is_compatible_with(t.shape):
                raise ServingError(
                    "INVALID_ARGUMENT",
                    f"input {n!r} has shape {t.shape.as_list()}, but the signature expects "
                    f"{specs[n].shape.as_list()} (None: any size)",
                )
        out = fn(**feeds)
    except ServingError:
        raise
    except (TypeError, ValueError, tf.errors.InvalidArgumentError) as e:
        raise ServingError("INVALID_ARGUMENT", str(e).strip().splitlines()[0]) from None
    return {k: v.numpy() for k, v in out.items()}


# -- JSON (REST) ----------------------------------------------------------------
def _is_b64(value: Any) -> bool:
    """Whether a JSON value is TF Serving's encoding of binary data, ``{"b64": "..."}``."""
    return isinstance(value, dict) and set(value) == {"b64"}


def _decode_b64(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) != {"b64"} or not isinstance(value["b64"], str):
            raise ServingError("INVALID_ARGUMENT", f"JSON Value: {json.dumps(value)} Is not a b64 object")
        try:
            return base64.b64decode(value["b64"], validate=True)
        except ValueError:
            raise ServingError("INVALID_ARGUMENT", "Unable to base64 decode") from None
    if isinstance(value, list):
        return [_decode_b64(v) for v in value]
    return value


def _array(value: Any, spec) -> np.ndarray:
    """A JSON value as an array of the input's dtype."""
    try:
        if spec.dtype.name == "string":
            value = _decode_b64(value)
            return np.asarray(value, dtype=object)
        return np.asarray(value, dtype=spec.dtype.as_numpy_dtype)
    except (TypeError, ValueError) as e:
        raise ServingError("INVALID_ARGUMENT", f"cannot convert input to {spec.dtype.name}: {e}") from None


def parse_request(body: bytes) -> dict[str, Any]:
    """Parse a predict body: a JSON object (``NaN``/``Infinity`` allowed, as TF Serving allows)."""
    if not body:
        raise ServingError("INVALID_ARGUMENT", "JSON Parse error: The document is empty")
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise ServingError("INVALID_ARGUMENT", f"JSON Parse error: {e}") from None
    if not isinstance(doc, dict):
        raise ServingError("INVALID_ARGUMENT", f"JSON Value: {json.dumps(doc)[:200]} Is not object")
    sig = doc.get("signature_name")
    if sig is not None and not isinstance(sig, str):
        raise ServingError("INVALID_ARGUMENT", "'signature_name' key must be a string value.")
    return doc


def _named(values: dict[str, Any], specs: dict[str, Any]) -> dict[str, np.ndarray]:
    # An unknown name is kept (as is) so that run() reports it in TF Serving's words.
    return {n: _array(v, specs[n]) if n in specs else np.asarray(v) for n, v in values.items()}


def _single(specs: dict[str, Any], value: Any, why: str) -> dict[str, np.ndarray]:
    """An unnamed value: the signature's one input (an error when it has several)."""
    if len(specs) > 1:
        raise ServingError("INVALID_ARGUMENT", why)
    (name, spec), = specs.items()
    return {name: _array(value, spec)}


def _rows(rows: Any, specs: dict[str, Any]) -> dict[str, np.ndarray]:
    """The row format: a list of values, or of objects naming every input."""
    if not isinstance(rows, list):
        raise ServingError("INVALID_ARGUMENT", "Expecting 'instances' to be an list/array")
    if not rows:
        raise ServingError("INVALID_ARGUMENT", "No values in 'instances' array")
    if not isinstance(rows[0], dict) or _is_b64(rows[0]):
        return _single(specs, rows, "instances is a plain list, but expecting list of objects as multiple "
                       "input tensors required as per tensorinfo_map")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ServingError("INVALID_ARGUMENT", f"Expecting object but got list at item {i} of input list")
        missing = [name for name in specs if name not in row]
        if missing:
            raise ServingError("INVALID_ARGUMENT", f"Missing named input: {missing[0]} in item {i}")
    return _named({n: [r.get(n) for r in rows] for n in rows[0]}, specs)


def _columns(cols: Any, specs: dict[str, Any]) -> dict[str, np.ndarray]:
    """The columnar format: one value, or an object of named values."""
    if isinstance(cols, dict) and not _is_b64(cols):
        return _named(cols, specs)
    return _single(specs, cols, f"the signature has {len(specs)} inputs ({', '.join(sorted(specs))}): "
                   "give 'inputs' as an object of named tensors")


def inputs_from_json(doc: dict[str, Any], specs: dict[str, Any]) -> tuple[dict[str, np.ndarray], str]:
    """Named input arrays from a row (``instances``) or columnar (``inputs``) request, and the format."""
    has_rows, has_cols = "instances" in doc, "inputs" in doc
    if has_rows and has_cols:
        raise ServingError(
            "INVALID_ARGUMENT",
            "Not formatted correctly expecting only one of 'inputs' or 'instances' keys to exist",
        )
    if has_rows:
        return _rows(doc["instances"], specs), ROW
    if has_cols:
        return _columns(doc["inputs"], specs), COLUMNAR
    raise ServingError("INVALID_ARGUMENT", "Missing 'inputs' or 'instances' key")


def _json_value(name: str, arr: np.ndarray) -> Any:
    if arr.dtype == object or arr.dtype.kind == "S":
        binary = name.endswith("_bytes")

        def conv(x):
            if isinstance(x, list):
                return [conv(v) for v in x]
            if binary:
                return {"b64": base64.b64encode(x).decode("ascii")}
            return x.decode("utf-8", "replace") if isinstance(x, bytes) else x

        return conv(arr.tolist())
    return arr.tolist()


def outputs_to_json(outputs: dict[str, np.ndarray], fmt: str) -> dict[str, Any]:
    """``{"predictions": …}`` for a row request, ``{"outputs": …}`` for a columnar one."""
    if not outputs:
        raise ServingError("INVALID_ARGUMENT", "Cannot convert empty tensor map to JSON")
    if fmt == COLUMNAR:
        if len(outputs) == 1:
            (name, arr), = outputs.items()
            return {"outputs": _json_value(name, arr)}
        return {"outputs": {n: _json_value(n, a) for n, a in sorted(outputs.items())}}
    batch = {n: (a.shape[0] if a.ndim else None) for n, a in outputs.items()}
    sizes = set(batch.values())
    if None in sizes or len(sizes) != 1:
        raise ServingError(
            "INVALID_ARGUMENT",
            f"Tensor name: {next(iter(outputs))} has inconsistent batch size: {batch}; "
            "use the columnar 'inputs' format",
        )
    if len(outputs) == 1:
        (name, arr), = outputs.items()
        return {"predictions": _json_value(name, arr)}
    names = sorted(outputs)
    cols = {n: _json_value(n, outputs[n]) for n in names}
    return {"predictions": [{n: cols[n][i] for n in names} for i in range(sizes.pop())]}
