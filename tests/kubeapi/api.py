"""Request semantics of the fake Kubernetes API server (a TEST DOUBLE).

Transport-independent: :class:`KubeAPI` takes a parsed :class:`Request` and
returns a :class:`Response` (a JSON/text body or a stream of chunks). It
routes the REST path, authorizes and records the request, then runs the
verb: get, list, watch, create, update, patch, delete, deletecollection,
plus ``pods/log``. The HTTP layer is ``server.py``.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from . import admission, errors, patch, selectors
from .kubelet import SimulatedKubelet
from .rbac import RequestAttributes, RoleAuthorizer
from .resources import KINDS, ResourceKind, kind_for_path
from .store import Store, WatchEvent
from .validation import Validator

#: Bearer token that bypasses RBAC (the harness's admin client sends it).
ADMIN_TOKEN = "kubeapi-test-double-admin"
#: The apiserver's ``MaxRequestBodyBytes`` (3 MiB): a bigger body is a 413 before decoding.
MAX_REQUEST_BODY = 3 * 1024 * 1024
# Real apiservers pick 30-60 min for watches without timeoutSeconds.
DEFAULT_WATCH_TIMEOUT = 1800.0


@dataclass
class Request:
    """A parsed HTTP request."""

    method: str
    path: str
    query: dict[str, str]
    body: bytes = b""
    content_type: str = ""
    token: str | None = None
    internal: bool = False  # harness shortcut: no RBAC, not recorded
    accept: str = ""


@dataclass
class Response:
    """A JSON/text answer, or a chunk iterator for watch and ``follow=true`` logs."""

    code: int
    body: object = None
    content_type: str = "application/json"
    stream: Iterator[bytes] | None = None


@dataclass
class RecordedRequest:
    """One request as the harness records it for assertions (RBAC, namespaces, rate)."""

    time: float
    method: str
    path: str
    query: dict[str, str]
    verb: str | None
    group: str | None
    resource: str | None
    subresource: str | None
    namespace: str | None
    name: str | None
    user: str
    allowed: bool
    code: int | None = None
    extra: dict = field(default_factory=dict)

    @property
    def resource_path(self) -> str | None:
        """``pods`` or ``pods/log``, as RBAC rules spell it."""
        if self.resource and self.subresource:
            return f"{self.resource}/{self.subresource}"
        return self.resource


@dataclass(frozen=True)
class Route:
    """What a REST path addresses."""

    kind: ResourceKind
    namespace: str | None
    name: str | None
    subresource: str | None


_NOT_FOUND_PATH = errors.ApiError(404, "NotFound", "the server could not find the requested "
                                                   "resource", {})


def parse_route(path: str) -> Route:
    """Map ``/api/v1/...`` or ``/apis/G/V/...`` to a :class:`Route` (404 if unknown)."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise _NOT_FOUND_PATH
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        inner = kind_for_path(group, version, rest[2])
        if inner is not None and inner.namespaced:
            namespace, rest = rest[1], rest[2:]
    if not rest:
        raise _NOT_FOUND_PATH
    kind = kind_for_path(group, version, rest[0])
    if kind is None or kind.namespaced != (namespace is not None) or len(rest) > 3:
        raise _NOT_FOUND_PATH
    name = rest[1] if len(rest) >= 2 else None
    sub = rest[2] if len(rest) == 3 else None
    if sub is not None and sub not in kind.subresources:
        raise _NOT_FOUND_PATH
    return Route(kind, namespace, name, sub)


def _verb(method: str, route: Route, query: dict[str, str]) -> str:
    watching = query.get("watch") in ("true", "1")
    if method == "GET":
        if watching:
            return "watch"
        return "get" if route.name else "list"
    if method == "DELETE":
        return "delete" if route.name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def _list_item(obj: dict) -> dict:
    # Items of a real List carry no apiVersion/kind of their own.
    return {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}


#: Where SelfSubjectAccessReviews are created.
SSAR_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


class KubeAPI:
    """The API server's brain: routing, authorization, admission, verbs."""

    def __init__(self, store: Store, kubelet: SimulatedKubelet, validator: Validator):
        self.store = store
        self.kubelet = kubelet
        self.validator = validator
        self.authorizer: RoleAuthorizer | None = None
        self.requests: list[RecordedRequest] = []
        self._requests_lock = threading.Lock()
        self.stopping = threading.Event()
        self.log_epoch = 0  # bumped by drop_log_streams(): followed logs end

    # -- entry point -------------------------------------------------------

    def handle(self, req: Request) -> Response:
        """Serve one request; every failure becomes a ``Status`` response."""
        record = None
        try:
            if req.path in ("/version", "/version/"):
                return Response(200, {"major": "1", "minor": self.validator.kubernetes_version
                                      .split(".")[1], "gitVersion":
                                      f"v{self.validator.kubernetes_version}.0-kubeapi-fake",
                                      "platform": "linux/amd64"})
            if req.path in ("/healthz", "/readyz", "/livez"):
                return Response(200, "ok", "text/plain")
            listing = self._discovery(req)
            if listing is not None:
                return listing
            if req.method == "POST" and req.path.rstrip("/") == SSAR_PATH:
                return self._self_review(req)
            if len(req.body) > MAX_REQUEST_BODY:
                raise errors.ApiError(413, "RequestEntityTooLarge",
                                      f"Request entity too large: limit is {MAX_REQUEST_BODY}")
            route = parse_route(req.path)
            verb = _verb(req.method, route, req.query)
            attrs = RequestAttributes(verb, route.kind.group, route.kind.plural,
                                      route.subresource, route.namespace, route.name)
            if not req.internal:
                record = self._authorize(req, route.kind, attrs)
            response = self._dispatch(req, route, verb)
        except errors.ApiError as exc:
            response = Response(exc.code, exc.status())
        if record is not None:
            record.code = response.code
        return response

    def _self_review(self, req: Request) -> Response:
        """A SelfSubjectAccessReview: "may I?" answered by the authorizer, for the asker.

        Every authenticated user may create one (``system:basic-user``); it is not a
        resource request, so it is neither authorized nor recorded.
        """
        review = json.loads(req.body or b"{}")
        ra = (review.get("spec") or {}).get("resourceAttributes") or {}
        attrs = RequestAttributes(ra.get("verb", ""), ra.get("group", ""), ra.get("resource", ""),
                                  ra.get("subresource") or None, ra.get("namespace") or None,
                                  ra.get("name") or None)
        admin = req.token == ADMIN_TOKEN or self.authorizer is None
        allowed = admin or self.authorizer.allows(attrs)
        return Response(201, {**review, "status": {"allowed": allowed}})

    def _discovery(self, req: Request) -> Response | None:
        """``GET /apis`` (APIGroupList) and ``GET /apis/G/V`` (APIResourceList), or None.

        Discovery is open to every authenticated user (``system:discovery``), so
        it is neither authorized nor recorded.
        """
        parts = [p for p in req.path.split("/") if p]
        if req.method != "GET" or parts[:1] != ["apis"] or len(parts) not in (1, 3):
            return None
        served = [k for k in KINDS if k.group]
        if len(parts) == 1:
            groups: dict[str, list[str]] = {}
            for k in served:
                groups.setdefault(k.group, []).append(k.version)
            return Response(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v}
                                         for v in dict.fromkeys(vs)],
                 "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}}
                for g, vs in groups.items()]})
        kinds = [k for k in served if (k.group, k.version) == (parts[1], parts[2])]
        if not kinds:
            raise _NOT_FOUND_PATH
        resources = []
        for k in kinds:
            resources.append({"name": k.plural, "singularName": k.singular, "namespaced":
                              k.namespaced, "kind": k.kind, "verbs": [
                                  "create", "delete", "deletecollection", "get", "list",
                                  "patch", "update", "watch"]})
            resources += [{"name": f"{k.plural}/{sub}", "singularName": "", "namespaced":
                           k.namespaced, "kind": k.kind, "verbs": ["get", "patch", "update"]}
                          for sub in sorted(k.subresources)]
        return Response(200, {"kind": "APIResourceList", "apiVersion": "v1",
                              "groupVersion": f"{parts[1]}/{parts[2]}", "resources": resources})

    def _authorize(self, req: Request, kind: ResourceKind,
                   attrs: RequestAttributes) -> RecordedRequest:
        admin = req.token == ADMIN_TOKEN or self.authorizer is None
        user = "system:admin" if admin else self.authorizer.username
        allowed = admin or self.authorizer.allows(attrs)
        record = RecordedRequest(time.time(), req.method, req.path, dict(req.query), attrs.verb,
                                 attrs.group, attrs.resource, attrs.subresource, attrs.namespace,
                                 attrs.name, user, allowed)
        with self._requests_lock:
            self.requests.append(record)
        if not allowed:
            record.code = 403
            raise errors.forbidden(kind, attrs.name, self.authorizer.denial(attrs))
        return record

    def _dispatch(self, req: Request, route: Route, verb: str) -> Response:
        if route.subresource == "log":
            if verb != "get":
                raise errors.method_not_allowed(f"{req.method} is not supported on pods/log")
            return self._log(route, req.query)
        handler = {
            "get": self._get, "list": self._list, "watch": self._watch,
            "create": self._create, "update": self._update, "patch": self._patch,
            "delete": self._delete, "deletecollection": self._delete_collection,
        }.get(verb)
        if handler is None or (route.subresource and verb not in ("get", "update", "patch")):
            raise errors.method_not_allowed(f"the server does not allow this method on the "
                                            f"requested resource ({req.method} {req.path})")
        if verb == "create" and route.name:
            raise errors.method_not_allowed("POST to a named resource is not allowed")
        return handler(req, route)

    # -- helpers ---------------------------------------------------------------

    @staticmethod
    def _body(req: Request):
        try:
            return json.loads(req.body or b"null")
        except ValueError as exc:
            raise errors.bad_request(f"the request body is not valid JSON: {exc}") from exc

    def _object_body(self, req: Request, route: Route) -> dict:
        obj = self._body(req)
        if not isinstance(obj, dict):
            raise errors.bad_request("the request body must be a JSON object")
        kind = route.kind
        # A missing apiVersion/kind defaults from the URL, as the real decoder does.
        obj.setdefault("apiVersion", kind.api_version)
        obj.setdefault("kind", kind.kind)
        if (obj["apiVersion"], obj["kind"]) != (kind.api_version, kind.kind):
            raise errors.bad_request(
                f"the API version in the data ({obj['apiVersion']}) does not match the expected "
                f"API version ({kind.api_version}) or kind {obj['kind']} is not {kind.kind}")
        meta = obj.setdefault("metadata", {})
        if kind.namespaced:
            if meta.get("namespace") not in (None, "", route.namespace):
                raise errors.bad_request("the namespace of the provided object does not match "
                                         "the namespace sent on the request")
            meta["namespace"] = route.namespace
        if route.name and meta.get("name") != route.name:
            raise errors.bad_request(f"the name of the object ({meta.get('name')}) does not "
                                     f"match the name on the URL ({route.name})")
        return obj

    def _selectors(self, route: Route, query: dict[str, str]):
        labels = selectors.parse_label_selector(query.get("labelSelector"))
        fields = selectors.parse_field_selector(query.get("fieldSelector"), route.kind)
        return labels, fields

    @staticmethod
    def _matches(obj: dict, labels, fields) -> bool:
        return (selectors.labels_match(labels, obj["metadata"].get("labels"))
                and selectors.fields_match(fields, obj))

    def _existing(self, route: Route) -> dict:
        obj = self.store.get(route.kind, route.namespace, route.name)
        if obj is None:
            raise errors.not_found(route.kind, route.name)
        return obj

    # -- verbs -------------------------------------------------------------------

    def _get(self, req: Request, route: Route) -> Response:
        obj = self._existing(route)
        if "as=PartialObjectMetadata" in req.accept:
            # The server's metadata-only answer (Accept: ...;as=PartialObjectMetadata;g=meta.k8s.io;v=v1):
            # a Secret's data never leaves it.
            return Response(200, {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                  "metadata": obj["metadata"]})
        return Response(200, obj)

    def _list(self, req: Request, route: Route) -> Response:
        labels, fields = self._selectors(route, req.query)
        with self.store.lock:
            rv = self.store.resource_version
            items = [o for o in self.store.objects(route.kind, route.namespace)
                     if self._matches(o, labels, fields)]
        meta = {"resourceVersion": str(rv)}
        limit = int(req.query.get("limit") or 0)
        start = int(req.query.get("continue") or 0)
        if limit:
            # Offset continue tokens: good enough for a test double (no snapshot).
            if start + limit < len(items):
                meta["continue"] = str(start + limit)
                meta["remainingItemCount"] = len(items) - start - limit
            items = items[start:start + limit]
        return Response(200, {"kind": f"{route.kind.kind}List",
                              "apiVersion": route.kind.api_version, "metadata": meta,
                              "items": [_list_item(o) for o in items]})

    def _create(self, req: Request, route: Route) -> Response:
        obj = self._object_body(req, route)
        self.validator.validate(route.kind, obj)
        with self.store.lock:
            uid = admission.admit_create(self.store, route.kind, route.namespace, obj)
            if req.query.get("dryRun") == "All":
                return Response(201, obj)
            created = self.store.create(route.kind, obj, uid=uid)
        return Response(201, created)

    def _update(self, req: Request, route: Route) -> Response:
        obj = self._object_body(req, route)
        return self._replace(req, route, obj, check_version=True)

    def _replace(self, req: Request, route: Route, obj: dict, check_version: bool) -> Response:
        with self.store.lock:
            current = self._existing(route)
            if route.subresource == "status":
                candidate = {**current, "status": obj.get("status", {})}
            else:
                candidate = obj
            self.validator.validate(route.kind, candidate)
            if req.query.get("dryRun") == "All":
                return Response(200, candidate)
            updated = self.store.update(route.kind, obj, subresource=route.subresource,
                                        check_version=check_version)
        return Response(200, updated)

    def _patch(self, req: Request, route: Route) -> Response:
        body = self._body(req)
        with self.store.lock:
            current = self._existing(route)
            patched = patch.apply_patch(current, body, req.content_type)
            patched.setdefault("metadata", {})
            for fixed in ("name", "namespace"):
                if fixed in current["metadata"]:
                    patched["metadata"][fixed] = current["metadata"][fixed]
            # Only a resourceVersion the patch itself carries is a precondition.
            given = ((body or {}).get("metadata") or {}).get("resourceVersion") \
                if isinstance(body, dict) else None
            patched["metadata"]["resourceVersion"] = given or current["metadata"][
                "resourceVersion"]
            return self._replace(req, route, patched, check_version=True)

    def _delete_options(self, req: Request) -> tuple[str, int | None]:
        body = self._body(req) if req.body else {}
        body = body if isinstance(body, dict) else {}
        policy = req.query.get("propagationPolicy") or body.get("propagationPolicy") \
            or "Background"
        grace = req.query.get("gracePeriodSeconds", body.get("gracePeriodSeconds"))
        return policy, int(grace) if grace is not None else None

    def _delete(self, req: Request, route: Route) -> Response:
        policy, _grace = self._delete_options(req)
        # Deleted at once whatever the grace period (unless the harness holds running
        # pods Terminating, or a Foreground owner waits for its dependents).
        with self.store.lock:
            gone = self.store.delete(route.kind, route.namespace, route.name,
                                     propagation=policy)
            pending = self.store.get(route.kind, route.namespace, route.name) is not None
        if route.kind.returns_deleted_object or pending:
            # Still there (a Foreground owner, a Terminating pod): the object, as real.
            return Response(200, gone)
        details = {"name": route.name, "kind": route.kind.plural,
                   "uid": gone["metadata"]["uid"]}
        if route.kind.group:
            details["group"] = route.kind.group
        return Response(200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                              "status": "Success", "details": details})

    def _delete_collection(self, req: Request, route: Route) -> Response:
        policy, _grace = self._delete_options(req)
        labels, fields = self._selectors(route, req.query)
        with self.store.lock:
            for obj in self.store.objects(route.kind, route.namespace):
                if self._matches(obj, labels, fields) and self.store.get(
                        route.kind, route.namespace, obj["metadata"]["name"]) is not None:
                    self.store.delete(route.kind, route.namespace, obj["metadata"]["name"],
                                      propagation=policy)
        return Response(200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                              "status": "Success"})

    # -- watch -------------------------------------------------------------------

    def _watch(self, req: Request, route: Route) -> Response:
        labels, fields = self._selectors(route, req.query)
        if route.name:
            fields = fields + selectors.parse_field_selector(f"metadata.name={route.name}",
                                                             route.kind)
        timeout = float(req.query.get("timeoutSeconds") or DEFAULT_WATCH_TIMEOUT)
        rv = req.query.get("resourceVersion") or ""
        with self.store.lock:
            if rv in ("", "0"):
                start = self.store.resource_version
                initial = [o for o in self.store.objects(route.kind, route.namespace)
                           if self._matches(o, labels, fields)]
            else:
                try:
                    start = int(rv)
                except ValueError as exc:
                    raise errors.bad_request(f"invalid resourceVersion {rv!r}") from exc
                initial = []
        return Response(200, stream=self._watch_stream(route, labels, fields, start, initial,
                                                       timeout))

    def _translate(self, event: WatchEvent, route: Route, labels, fields) -> dict | None:
        """Map a store event onto what this watch sees, honouring selector transitions."""
        if event.kind is not route.kind:
            return None
        if route.namespace and event.obj["metadata"].get("namespace") != route.namespace:
            return None
        now_in = self._matches(event.obj, labels, fields)
        was_in = event.old is not None and self._matches(event.old, labels, fields)
        if event.type == "ADDED":
            kind = "ADDED" if now_in else None
        elif event.type == "DELETED":
            kind = "DELETED" if was_in or now_in else None
        elif now_in and was_in:
            kind = "MODIFIED"
        elif now_in:
            kind = "ADDED"
        elif was_in:
            kind = "DELETED"
        else:
            kind = None
        return {"type": kind, "object": event.obj} if kind else None

    def _watch_stream(self, route: Route, labels, fields, start: int, initial: list[dict],
                      timeout: float) -> Iterator[bytes]:
        deadline = time.monotonic() + timeout
        for obj in initial:
            yield json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n"
        last = start
        while not self.stopping.is_set():
            try:
                events = self.store.events_after(last)
            except errors.ApiError as exc:
                yield json.dumps({"type": "ERROR", "object": exc.status()}).encode() + b"\n"
                return
            for event in events:
                last = event.seq
                out = self._translate(event, route, labels, fields)
                if out is not None:
                    yield json.dumps(out).encode() + b"\n"
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.store.closed:
                return
            self.store.wait_for_change(last, min(remaining, 1.0))

    # -- logs --------------------------------------------------------------------

    def _log(self, route: Route, query: dict[str, str]) -> Response:
        pod = self._existing(route)
        name = route.name
        names = [c["name"] for c in pod["spec"].get("containers") or []]
        init_names = [c["name"] for c in pod["spec"].get("initContainers") or []]
        container = query.get("container")
        if not container:
            if len(names) != 1:
                raise errors.bad_request(
                    f"a container name must be specified for pod {name}, choose one of: "
                    f"[{' '.join(names)}]" + (f" or one of the init containers: "
                                              f"[{' '.join(init_names)}]" if init_names else ""))
            container = names[0]
        elif container not in names + init_names:
            raise errors.bad_request(f"container {container} is not valid for pod {name}")
        previous = query.get("previous") in ("true", "1")
        uid = pod["metadata"]["uid"]
        found = self.kubelet.log_lines(uid, container, previous)
        state = self._container_state(pod, container)
        if previous and found is None:
            raise errors.bad_request(f'previous terminated container "{container}" in pod '
                                     f'"{name}" not found')
        waiting = state.get("waiting") if state else {"reason": "ContainerCreating"}
        if not previous and waiting and not (found and waiting.get("reason") ==
                                             "CrashLoopBackOff"):
            reason = waiting.get("reason", "ContainerCreating")
            if reason in ("ImagePullBackOff", "ErrImagePull"):
                reason = "trying and failing to pull image"
            raise errors.bad_request(f'container "{container}" in pod "{name}" is waiting to '
                                     f"start: {reason}")
        lines, segment = found if found else ([], 0)
        tail = query.get("tailLines")
        shown = lines[-int(tail):] if tail is not None and int(tail) > 0 else (
            [] if tail is not None else lines)
        since = query.get("sinceTime")
        if since:
            # The API server hands sinceTime on to the kubelet as RFC 3339 to the second
            # (registry/core/pod/strategy.go LogLocation), and the kubelet shows the lines
            # stamped at or after it: a re-opened stream repeats the rest of that second.
            try:
                floor = dt.datetime.fromisoformat(since.replace("Z", "+00:00")[:19] + "+00:00")
            except ValueError:
                raise errors.bad_request(f"invalid sinceTime {since!r}") from None
            shown = [e for e in shown
                     if dt.datetime.fromisoformat(e[0][:19] + "+00:00") >= floor]
        stamps = query.get("timestamps") in ("true", "1")
        limit = int(query["limitBytes"]) if query.get("limitBytes") else None

        def render(entries) -> bytes:
            return "".join(f"{ts} {text}\n" if stamps else f"{text}\n"
                           for ts, text in entries).encode()

        if query.get("follow") not in ("true", "1") or previous:
            body = render(shown)
            return Response(200, body[:limit] if limit else body, "text/plain")
        return Response(200, stream=self._follow(route, uid, container, segment, len(lines),
                                                 render(shown), render),
                        content_type="text/plain")

    @staticmethod
    def _container_state(pod: dict, container: str) -> dict | None:
        status = pod.get("status") or {}
        for cs in (status.get("containerStatuses") or []) + \
                (status.get("initContainerStatuses") or []):
            if cs["name"] == container:
                return cs.get("state") or {}
        return None

    def drop_log_streams(self) -> None:
        """End every followed log stream now (a connection the network or a restart cut)."""
        self.log_epoch += 1

    def _follow(self, route: Route, uid: str, container: str, segment: int, seen: int,
                first: bytes, render) -> Iterator[bytes]:
        epoch = self.log_epoch
        if first:
            yield first
        while not self.stopping.is_set() and self.log_epoch == epoch:
            found = self.kubelet.log_lines(uid, container)
            lines, current = found if found else ([], segment)
            if current != segment:
                return  # the container restarted: this instance's stream is over
            if len(lines) > seen:
                yield render(lines[seen:])
                seen = len(lines)
            pod = self.store.get(route.kind, route.namespace, route.name)
            if pod is None or pod["metadata"]["uid"] != uid:
                return
            state = self._container_state(pod, container) or {}
            if "terminated" in state or "CrashLoopBackOff" == (state.get("waiting") or {}).get(
                    "reason"):
                found = self.kubelet.log_lines(uid, container)
                if found and len(found[0]) > seen:
                    yield render(found[0][seen:])
                return
            self.kubelet.wait_for_log(uid, container, segment, seen, 1.0)


def copy_request_records(api: KubeAPI) -> list[RecordedRequest]:
    """A snapshot of the recorded requests (safe to iterate while the server runs)."""
    with api._requests_lock:
        return [copy.copy(r) for r in api.requests]
