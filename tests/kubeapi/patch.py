"""PATCH bodies for the fake API server (a TEST DOUBLE).

JSON merge patch (RFC 7386) and JSON patch (RFC 6902). Strategic merge patch
is applied as a JSON merge patch: lists are replaced, not merged by key
(``containers`` by ``name`` etc.), and ``$patch``/``$retainKeys`` directives
are not understood. Patch labels, annotations, replicas and other maps
freely; send whole lists when patching lists. Server-side apply is not
supported (415).
"""

from __future__ import annotations

import copy

from . import errors


def merge_patch(target, patch):
    """Apply an RFC 7386 merge patch: dicts merge recursively, ``null`` deletes."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _walk(doc, pointer: str):
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:]]
    if not parts:
        raise errors.ApiError(422, "Invalid", "the root of the document cannot be patched")
    node = doc
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node, parts[-1]


def json_patch(doc: dict, ops: list) -> dict:
    """Apply an RFC 6902 JSON patch (add/remove/replace/test/copy/move)."""
    doc = copy.deepcopy(doc)
    try:
        for op in ops:
            kind, path = op["op"], op["path"]
            if kind in ("copy", "move"):
                src_parent, src_key = _walk(doc, op["from"])
                value = copy.deepcopy(src_parent[int(src_key)] if isinstance(src_parent, list)
                                      else src_parent[src_key])
                if kind == "move":
                    del src_parent[int(src_key) if isinstance(src_parent, list) else src_key]
                kind, op = "add", {**op, "value": value}
            parent, key = _walk(doc, path)
            if kind == "add":
                if isinstance(parent, list):
                    parent.insert(len(parent) if key == "-" else int(key), op["value"])
                else:
                    parent[key] = op["value"]
            elif kind == "remove":
                del parent[int(key) if isinstance(parent, list) else key]
            elif kind == "replace":
                idx = int(key) if isinstance(parent, list) else key
                if not isinstance(parent, list) and key not in parent:
                    raise KeyError(key)
                parent[idx] = op["value"]
            elif kind == "test":
                current = parent[int(key)] if isinstance(parent, list) else parent[key]
                if current != op["value"]:
                    raise errors.ApiError(422, "Invalid",
                                          f"the server rejected our request due to an error in "
                                          f"our request: test failed at {path}")
            else:
                raise errors.bad_request(f"unknown JSON patch op {kind!r}")
    except (KeyError, IndexError, ValueError, TypeError) as exc:
        raise errors.ApiError(422, "Invalid",
                              f"the server rejected our request due to an error in our "
                              f"request: {exc!r}") from exc
    return doc


def apply_patch(current: dict, body, content_type: str) -> dict:
    """Dispatch on the PATCH Content-Type."""
    ctype = (content_type or "").split(";")[0].strip()
    if ctype == "application/json-patch+json":
        if not isinstance(body, list):
            raise errors.bad_request("a JSON patch must be a list of operations")
        return json_patch(current, body)
    if ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
        if not isinstance(body, dict):
            raise errors.bad_request("a merge patch must be a JSON object")
        return merge_patch(current, body)
    raise errors.unsupported_media_type(ctype)
