"""Dict-in, dict-out access to the few API calls the backend makes.

Wraps the official ``kubernetes`` client's typed APIs with
``_preload_content=False``, so the backend handles the API's own JSON
(what the pure builders and :mod:`.state` work with), and every call
carries a timeout.
"""

from __future__ import annotations

import json
import re
import socket
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

Manifest = dict[str, Any]

_GROUP_API = {
    "v1": k8s.CoreV1Api,
    "apps/v1": k8s.AppsV1Api,
    "networking.k8s.io/v1": k8s.NetworkingV1Api,
}


#: What asks the API server for an object's metadata only (``meta.k8s.io/v1`` PartialObjectMetadata).
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"

#: Custom resources, served through ``CustomObjectsApi``: apiVersion → plural.
_CUSTOM = {"jobset.x-k8s.io/v1alpha2": "jobsets",
           # Kueue's LocalQueue, the only Kueue kind read here (newest version first)
           "kueue.x-k8s.io/v1beta2": "localqueues", "kueue.x-k8s.io/v1beta1": "localqueues"}
#: Kueue's API versions, newest first.
KUEUE_API_VERSIONS = ("kueue.x-k8s.io/v1beta2", "kueue.x-k8s.io/v1beta1")


def _snake(kind: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", kind).lower()


class Api:
    """The calls the backend makes, in one namespace, with one timeout."""

    def __init__(self, api_client: k8s.ApiClient, namespace: str, timeout: float = 30.0):
        self.api_client = api_client
        self.namespace = namespace
        self.timeout = timeout
        self.core = k8s.CoreV1Api(api_client)
        self.custom = k8s.CustomObjectsApi(api_client)

    def _typed(self, api_version: str):
        return _GROUP_API[api_version](self.api_client)

    @staticmethod
    def _gvp(api_version: str) -> tuple[str, str, str]:
        group, version = api_version.split("/")
        return group, version, _CUSTOM[api_version]

    def serves(self, api_version: str) -> bool:
        """Whether the cluster serves ``api_version`` (discovery: one request)."""
        group, version = api_version.split("/")
        try:
            self.custom.get_api_resources(group, version, _request_timeout=self.timeout)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    @staticmethod
    def _json(response) -> Any:
        return json.loads(response.data or b"{}")

    def create(self, manifest: Manifest) -> Manifest:
        """Create ``manifest`` in the namespace; return the created object."""
        if manifest["apiVersion"] in _CUSTOM:
            # Strict: a field the cluster's CRD does not know is an error, not silently
            # dropped (an older JobSet would run without the policy it was given).
            return self._json(self.custom.create_namespaced_custom_object(
                *self._gvp(manifest["apiVersion"])[:2], self.namespace,
                _CUSTOM[manifest["apiVersion"]], manifest, field_validation="Strict",
                _preload_content=False, _request_timeout=self.timeout))
        api = self._typed(manifest["apiVersion"])
        method = getattr(api, f"create_namespaced_{_snake(manifest['kind'])}")
        return self._json(
            method(self.namespace, manifest, _preload_content=False,
                   _request_timeout=self.timeout)
        )

    def get(self, api_version: str, kind: str, name: str) -> Manifest | None:
        """The object, or ``None`` if it does not exist."""
        try:
            if api_version in _CUSTOM:
                group, version, plural = self._gvp(api_version)
                return self._json(self.custom.get_namespaced_custom_object(
                    group, version, self.namespace, plural, name, _preload_content=False,
                    _request_timeout=self.timeout))
            method = getattr(self._typed(api_version), f"read_namespaced_{_snake(kind)}")
            return self._json(
                method(name, self.namespace, _preload_content=False,
                       _request_timeout=self.timeout)
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def secret_metadata(self, name: str) -> Manifest | None:
        """The metadata of Secret ``name`` (None: it does not exist), never its data.

        The request asks the API server for ``PartialObjectMetadata``: the
        Secret's values are not sent to this process at all.
        """
        try:
            response = self.core.read_namespaced_secret(
                name, self.namespace, _headers={"Accept": METADATA_ONLY}, _preload_content=False,
                _request_timeout=self.timeout)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        data = self._json(response)
        return {"metadata": data.get("metadata") or {}}

    def list_objects(self, api_version: str, kind: str, label_selector: str = "") -> Manifest:
        """The list object (``items`` and ``metadata.resourceVersion``)."""
        if api_version in _CUSTOM:
            group, version, plural = self._gvp(api_version)
            return self._json(self.custom.list_namespaced_custom_object(
                group, version, self.namespace, plural, label_selector=label_selector,
                _preload_content=False, _request_timeout=self.timeout))
        method = getattr(self._typed(api_version), f"list_namespaced_{_snake(kind)}")
        return self._json(
            method(self.namespace, label_selector=label_selector, _preload_content=False,
                   _request_timeout=self.timeout)
        )

    def delete(self, api_version: str, kind: str, name: str,
               propagation: str = "Background") -> bool:
        """Delete one object (its dependents as ``propagation`` says); ``False`` if it was gone."""
        try:
            if api_version in _CUSTOM:
                group, version, plural = self._gvp(api_version)
                self.custom.delete_namespaced_custom_object(
                    group, version, self.namespace, plural, name,
                    propagation_policy=propagation, _preload_content=False,
                    _request_timeout=self.timeout)
                return True
            method = getattr(self._typed(api_version), f"delete_namespaced_{_snake(kind)}")
            method(name, self.namespace, propagation_policy=propagation,
                   _preload_content=False, _request_timeout=self.timeout)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    def patch(self, api_version: str, kind: str, name: str, body: Manifest) -> Manifest:
        """Merge-patch one object."""
        if api_version in _CUSTOM:
            group, version, plural = self._gvp(api_version)
            return self._json(self.custom.patch_namespaced_custom_object(
                group, version, self.namespace, plural, name, body, _preload_content=False,
                _request_timeout=self.timeout))
        method = getattr(self._typed(api_version), f"patch_namespaced_{_snake(kind)}")
        return self._json(
            method(name, self.namespace, body, _preload_content=False,
                   _request_timeout=self.timeout)
        )

    def pod_log(self, name: str, *, tail: int | None = None, timestamps: bool = False,
                container: str | None = None) -> str:
        """The pod's log (of ``container``, for a pod of several) as text."""
        kwargs: dict[str, Any] = {"_preload_content": False, "_request_timeout": self.timeout}
        if container:
            kwargs["container"] = container
        if tail is not None:
            kwargs["tail_lines"] = tail
        if timestamps:
            kwargs["timestamps"] = True
        resp = self.core.read_namespaced_pod_log(name, self.namespace, **kwargs)
        return resp.data.decode("utf-8", "replace")

    def follow_log(self, name: str, *, since: str | None = None, tail: int | None = None,
                   container: str | None = None):
        """The raw streaming response of the pod's log, followed, every line stamped.

        The request has a connect timeout only: a quiet task sends nothing for
        as long as it is quiet, and a read timeout would end the stream (the
        client turns one number into ``urllib3.Timeout(total=...)``).  ``since``
        (an RFC 3339 time, the last stamp read) re-opens a stream where it
        stopped; the typed client has no ``sinceTime``, so the request is
        built here with the client's own serialiser and authentication.
        """
        query: list[tuple[str, str]] = [("follow", "true"), ("timestamps", "true")]
        if container:
            query.append(("container", container))
        if tail is not None:
            query.append(("tailLines", str(tail)))
        if since:
            query.append(("sinceTime", since))
        request = self.api_client.param_serialize(
            "GET", "/api/v1/namespaces/{namespace}/pods/{name}/log",
            path_params={"namespace": self.namespace, "name": name}, query_params=query,
            # "text/plain" is what the stream is, but the API server refuses it as an Accept
            # (406: only its serializers' media types are negotiable); "*/*" is what kubectl sends
            header_params={"Accept": "*/*"}, auth_settings=["BearerToken"])
        resp = self.api_client.call_api(*request, _request_timeout=(self.timeout, None))
        if not 200 <= resp.status <= 299:
            resp.read()
            raise ApiException.from_response(http_resp=resp, body=None, data=None)
        return resp.response


def api_reason(e: ApiException) -> str:
    """The API's own message for a failed request (its Status ``message``), or its reason."""
    try:
        body = json.loads(e.body or "{}")
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return message or f"{e.status} {e.reason}"


def abort(response: Any) -> None:
    """End a streaming response another thread is blocked reading (a watch, a log follow).

    ``response.close()`` would wait for the reader's lock, i.e. for the next
    byte; shutting the socket down wakes the reader at once.
    """
    conn = getattr(response, "_connection", None) or getattr(response, "connection", None)
    sock = getattr(conn, "sock", None)
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed
