"""Schema and name validation of the fake Kubernetes API server (a TEST DOUBLE).

Every created or replaced object is checked against the official OpenAPI
schema of the configured Kubernetes version with ``kubernetes-validate`` in
strict mode, so an unknown or misspelt field is a 422 here. (A real apiserver
only rejects unknown fields when the client asks for
``fieldValidation=Strict``; by default it warns and drops them. Being
stricter in tests catches manifest typos that would silently do nothing in
production.) On top of the schema, the checks the schema cannot express and
that manifests builders most often get wrong: object names, label keys and
values, and pod hostname/subdomain/container names.
"""

from __future__ import annotations

import functools
import re

import jsonschema
import kubernetes_validate
from kubernetes_validate import utils as kv_utils
from referencing import Registry, Resource

from tests import jobset_schema as crd

from . import errors
from .resources import ResourceKind, lookup

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")

_LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
              "'-', and must start and end with an alphanumeric character")
_SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                  "characters, '-' or '.', and must start and end with an alphanumeric character")
_DNS1035_MSG = ("a DNS-1035 label must consist of lower case alphanumeric characters or '-', "
                "start with an alphabetic character, and end with an alphanumeric character")

# Kinds whose names must be DNS labels (everything else: DNS subdomain).
_NAME_RULES = {"Namespace": "label", "Service": "dns1035"}


def _check_dns(value: str, rule: str, field: str) -> list[tuple[str, str]]:
    if rule == "label":
        ok, msg, limit = _DNS1123_LABEL.match(value), _LABEL_MSG, 63
    elif rule == "dns1035":
        ok, msg, limit = _DNS1035_LABEL.match(value), _DNS1035_MSG, 63
    else:
        ok, msg, limit = _DNS1123_SUBDOMAIN.match(value), _SUBDOMAIN_MSG, 253
    problems = []
    if len(value) > limit:
        problems.append((field, f'Invalid value: "{value}": must be no more than {limit} '
                                f"characters"))
    if not ok:
        problems.append((field, f'Invalid value: "{value}": {msg}'))
    return problems


def _check_labels(labels: dict, field: str) -> list[tuple[str, str]]:
    problems = []
    for key, value in (labels or {}).items():
        prefix, _, name = key.rpartition("/")
        if (prefix and not _DNS1123_SUBDOMAIN.match(prefix)) or not _QUALIFIED_NAME.match(name) \
                or len(name) > 63:
            problems.append((field, f'Invalid value: "{key}": name part must consist of '
                                    "alphanumeric characters, '-', '_' or '.', and must start "
                                    "and end with an alphanumeric character"))
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            problems.append((f"{field}", f'Invalid value: "{value}": a valid label must be an '
                                         "empty string or consist of alphanumeric characters, "
                                         "'-', '_' or '.', and must start and end with an "
                                         "alphanumeric character (at most 63 characters)"))
    return problems


def _pod_spec_problems(spec: dict, field: str) -> list[tuple[str, str]]:
    problems = []
    for attr in ("hostname", "subdomain"):
        if spec.get(attr):
            problems += _check_dns(spec[attr], "label", f"{field}.{attr}")
    for group in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(group) or []):
            if container.get("name"):
                problems += _check_dns(container["name"], "label", f"{field}.{group}[{i}].name")
    return problems


#: ``core.MaxSecretSize``: what ConfigMap and Secret data may total (``ValidateConfigMap``).
MAX_DATA_BYTES = 1024 * 1024


def _data_size_problems(kind: ResourceKind, obj: dict) -> list[tuple[str, str]]:
    """A ConfigMap's (or Secret's) values over 1 MiB in total: 422 ``Too long``."""
    if kind.kind not in ("ConfigMap", "Secret"):
        return []
    total = sum(len(str(v).encode("utf-8")) for v in (obj.get("data") or {}).values())
    total += sum(len(str(v)) * 3 // 4 for v in (obj.get("binaryData") or {}).values())
    if total > MAX_DATA_BYTES:
        field = "[]" if kind.kind == "ConfigMap" else "data"
        return [(field, f"Too long: must have at most {MAX_DATA_BYTES} bytes")]
    return []


@functools.cache
def _definitions(schema_dir: str, version: str) -> Resource:
    """The shared ``_definitions.json`` of one schema directory, parsed once."""
    return Resource.from_contents(kv_utils.schema_contents(
        f"kubernetes-json-schema/{schema_dir}/_definitions.json", version))


@functools.cache
def _schema_validator(version: str, strict: bool, kind: str, api_version: str):
    """A compiled validator for one kind, built from kubernetes-validate's schema files.

    ``kubernetes_validate.validate`` re-reads and re-parses the 1 MB definitions
    file on every call (~10-80 ms); caching the compiled validator keeps the
    fake server fast. Schema selection follows ``kubernetes_validate.validate``.
    """
    wanted = kv_utils.major_minor(version)
    if wanted > kv_utils.latest_version():
        raise kubernetes_validate.utils.VersionNotSupportedError(version=wanted)
    resolved = [v for v in kv_utils.all_versions() if kv_utils.major_minor(v) <= wanted][-1]
    schema_dir = f"v{resolved}-local" + ("-strict" if strict else "")
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = kv_utils.schema_contents(
            f"kubernetes-json-schema/{schema_dir}/{kind.lower()}-{group_version}.json", version)
    except FileNotFoundError as exc:
        raise kubernetes_validate.SchemaNotFoundError(kind=kind, version=wanted,
                                                      api_version=api_version) from exc
    registry = _definitions(schema_dir, version) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


class Validator:
    """Validates manifests as the configured Kubernetes version would."""

    def __init__(self, kubernetes_version: str = "1.29", strict: bool = True):
        self.kubernetes_version = kubernetes_version
        self.strict = strict

    def validate(self, kind: ResourceKind, obj: dict) -> None:
        """Raise 422 Invalid (``errors.ApiError``) when ``obj`` is not acceptable."""
        meta = obj.get("metadata") or {}
        name = meta.get("name") or meta.get("generateName") or ""
        problems: list[tuple[str, str]] = []
        if crd.is_custom(obj.get("apiVersion", ""), obj.get("kind", "")):
            self._validate_custom(kind, obj, name)
            return
        try:
            validator = _schema_validator(self.kubernetes_version, self.strict,
                                          obj.get("kind", ""), obj.get("apiVersion", ""))
            error = jsonschema.exceptions.best_match(validator.iter_errors(obj))
            if error is not None:
                problems.append((".".join(str(p) for p in error.path), error.message))
        except kubernetes_validate.SchemaNotFoundError as exc:
            problems.append(("", exc.message))
        if not meta.get("name") and not meta.get("generateName"):
            problems.append(("metadata.name", "Required value: name or generateName is required"))
        elif meta.get("name"):
            problems += _check_dns(meta["name"], _NAME_RULES.get(kind.kind, "subdomain"),
                                   "metadata.name")
        problems += _check_labels(meta.get("labels"), "metadata.labels")
        problems += _data_size_problems(kind, obj)
        spec = obj.get("spec") or {}
        if kind.kind == "Pod":
            problems += _pod_spec_problems(spec, "spec")
        template = spec.get("template") if isinstance(spec, dict) else None
        if isinstance(template, dict):
            problems += _check_labels((template.get("metadata") or {}).get("labels"),
                                      "spec.template.metadata.labels")
            problems += _pod_spec_problems(template.get("spec") or {}, "spec.template.spec")
        if problems:
            raise errors.invalid(kind, name, problems)

    def _validate_custom(self, kind: ResourceKind, obj: dict, name: str) -> None:
        """A custom resource: its CRD schema, strictly; a JobSet's templates as Jobs."""
        problems = crd.problems(obj)
        meta = obj.get("metadata") or {}
        if not meta.get("name"):
            problems.append(("metadata.name", "Required value: name or generateName is required"))
        else:
            problems += _check_dns(meta["name"], "dns1035" if kind.kind == "JobSet" else
                                   "subdomain", "metadata.name")
        problems += _check_labels(meta.get("labels"), "metadata.labels")
        if problems:
            # A CRD's 422 names the kind with its group, as the real server does.
            raise errors.invalid(kind, name, problems, qualified=True)
        if kind.kind == "JobSet":
            for rjob in obj.get("spec", {}).get("replicatedJobs") or []:
                template = rjob.get("template") or {}
                self.validate(lookup("jobs"), {
                    "apiVersion": "batch/v1", "kind": "Job",
                    "metadata": {**(template.get("metadata") or {}),
                                 "name": f"{meta['name']}-{rjob.get('name')}-0",
                                 "namespace": meta.get("namespace", "default")},
                    "spec": template.get("spec") or {},
                })
