"""Strict validation of custom resources against their CRD schema (pure: no server involved).

A real API server validates a custom resource against the CRD's
``openAPIV3Schema`` (types, enums, required fields: a violation is 422
Invalid) and then silently *prunes* every field the schema does not
declare — the JobSet CRD never sets ``additionalProperties: false``.  A
misspelt field would therefore vanish without a word on a real cluster.
Here both are refused: :func:`problems` returns the schema violations and
every undeclared field (except under ``x-kubernetes-preserve-unknown-fields``).
The builder tests call it on every JobSet we make; the real API server and JobSet's
CRD prove the same objects are accepted (``tests/test_k8s_defects_real.py``).

Not evaluated: the CRD's CEL rules (``x-kubernetes-validations``, e.g.
"Value is immutable" on update) and JobSet's validating webhook.  The pod
and Job templates inside a JobSet are also validated as ``batch/v1`` Jobs
by the callers (``kubernetes_validate --strict``), as the Jobs JobSet creates
from them would be.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema

SCHEMA_DIR = Path(__file__).with_name("schemas")
#: (apiVersion, kind) → schema file; one line per CRD.
SCHEMAS = {("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset-v1alpha2.schema.json"}


@functools.cache
def schema(api_version: str, kind: str) -> dict:
    """The ``openAPIV3Schema`` of one custom kind."""
    return json.loads((SCHEMA_DIR / SCHEMAS[(api_version, kind)]).read_text())


@functools.cache
def _validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(schema(api_version, kind))


_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object",
          list: "array", type(None): "null"}


def _path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out.lstrip(".")


def undeclared(obj: Any, node: dict, path: str = "") -> list[str]:
    """The paths of every field of ``obj`` that ``node`` (a schema) does not declare."""
    if isinstance(obj, dict):
        if node.get("x-kubernetes-preserve-unknown-fields"):
            return []
        props = node.get("properties")
        if props is not None:
            out = []
            for key, value in obj.items():
                where = f"{path}.{key}" if path else key
                out += [where] if key not in props else undeclared(value, props[key], where)
            return out
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            return [p for k, v in obj.items() for p in undeclared(v, extra, f"{path}.{k}")]
        return []
    if isinstance(obj, list) and isinstance(node.get("items"), dict):
        return [p for i, v in enumerate(obj) for p in undeclared(v, node["items"], f"{path}[{i}]")]
    return []


def problems(obj: dict) -> list[tuple[str, str]]:
    """``(field, message)`` for every schema violation and undeclared field of ``obj``.

    Messages are worded like the API server's for a CRD: ``Invalid value:
    "x": spec.foo in body must be of type integer: "string"``.
    """
    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    out = []
    errors = sorted(_validator(api_version, kind).iter_errors(obj), key=lambda e: list(e.path))
    for error in errors:
        where = _path(error.path)
        if error.validator == "type":
            actual = _TYPES.get(type(error.instance), "object")
            message = (f"Invalid value: {json.dumps(error.instance)[:60]}: {where} in body must "
                       f'be of type {error.validator_value}: "{actual}"')
        elif error.validator == "required":
            missing = error.message.split("'")[1] if "'" in error.message else error.message
            where = f"{where}.{missing}" if where else missing
            message = "Required value"
        elif error.validator == "enum":
            allowed = ", ".join(json.dumps(v) for v in error.validator_value)
            message = f"Unsupported value: {json.dumps(error.instance)}: supported values: {allowed}"
        else:
            message = f"Invalid value: {json.dumps(error.instance)[:60]}: {error.message}"
        out.append((where, message))
    for where in undeclared(obj, schema(api_version, kind)):
        out.append((where, "field not declared in schema"))
    return out


def is_custom(api_version: str, kind: str) -> bool:
    """Whether ``kind`` is validated from a CRD schema here."""
    return (api_version, kind) in SCHEMAS
