"""``Status`` failures of the fake Kubernetes API server (a TEST DOUBLE).

Each error renders as the ``metav1.Status`` body a real apiserver sends, so
the official client raises ``ApiException`` with the same ``.status``,
``.reason`` and JSON body a backend would see in production.
"""

from __future__ import annotations

from .resources import ResourceKind


class ApiError(Exception):
    """A request failure carrying the HTTP code and the ``Status`` fields."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict:
        """The ``Status`` object, as the real server serialises it."""
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(kind: ResourceKind, name: str | None, **extra) -> dict:
    details = {"kind": kind.plural, **extra}
    if name:
        details["name"] = name
    if kind.group:
        details["group"] = kind.group
    return details


def not_found(kind: ResourceKind, name: str) -> ApiError:
    """404 ``pods "x" not found``."""
    return ApiError(404, "NotFound", f'{kind.qualified_resource} "{name}" not found',
                    _details(kind, name))


def already_exists(kind: ResourceKind, name: str) -> ApiError:
    """409 ``pods "x" already exists``."""
    return ApiError(409, "AlreadyExists", f'{kind.qualified_resource} "{name}" already exists',
                    _details(kind, name))


def conflict(kind: ResourceKind, name: str) -> ApiError:
    """409 Conflict for a stale ``metadata.resourceVersion`` (optimistic locking)."""
    return ApiError(
        409, "Conflict",
        f'Operation cannot be fulfilled on {kind.qualified_resource} "{name}": the object has '
        "been modified; please apply your changes to the latest version and try again",
        _details(kind, name),
    )


def invalid(kind: ResourceKind, name: str, causes: list[tuple[str, str]],
            qualified: bool = False) -> ApiError:
    """422 Invalid; ``causes`` are ``(field, message)`` pairs.

    ``qualified``: name the kind with its group (``JobSet.jobset.x-k8s.io``),
    as the server does for custom resources.
    """
    text = "; ".join(f"{f}: {m}" if f else m for f, m in causes)
    what = f"{kind.kind}.{kind.group}" if qualified and kind.group else kind.kind
    return ApiError(
        422, "Invalid", f'{what} "{name}" is invalid: {text}',
        {"name": name, "group": kind.group, "kind": kind.kind,
         "causes": [{"reason": "FieldValueInvalid", "message": m, "field": f}
                    for f, m in causes]},
    )


def forbidden(kind: ResourceKind, name: str | None, why: str,
              subresource: str | None = None) -> ApiError:
    """403 Forbidden, worded like ``admission.NewForbidden`` / the RBAC authorizer."""
    subject = f'{kind.qualified_resource} "{name}"' if name else kind.qualified_resource
    return ApiError(403, "Forbidden", f"{subject} is forbidden: {why}", _details(kind, name))


def bad_request(message: str) -> ApiError:
    """400 BadRequest (unparsable selector, container not ready for logs, ...)."""
    return ApiError(400, "BadRequest", message)


def gone(message: str) -> ApiError:
    """410 Expired: a resourceVersion older than the retained event history."""
    return ApiError(410, "Expired", message)


def method_not_allowed(message: str) -> ApiError:
    """405 MethodNotAllowed (e.g. POST on a subresource we do not serve)."""
    return ApiError(405, "MethodNotAllowed", message)


def unsupported_media_type(content_type: str) -> ApiError:
    """415 for patch types we do not implement (server-side apply)."""
    return ApiError(415, "UnsupportedMediaType",
                    f"the body of the request was in an unknown format - accepted media types "
                    f"include: application/json-patch+json, application/merge-patch+json, "
                    f"application/strategic-merge-patch+json (got {content_type})")
