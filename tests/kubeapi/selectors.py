"""Label and field selectors of the fake Kubernetes API server (a TEST DOUBLE).

Grammar as in ``k8s.io/apimachinery/pkg/labels``: requirements separated by
commas (commas inside ``in (...)`` belong to the set), each one of
``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k``, ``!k``.
Field selectors support ``=``, ``==`` and ``!=`` on the labels a kind allows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import bad_request
from .resources import ResourceKind

_SET_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")
_OP_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|!=|=)\s*([A-Za-z0-9_.-]*)\s*$")


@dataclass(frozen=True)
class Requirement:
    """One parsed requirement: ``op`` is one of ``= != in notin exists !``."""

    key: str
    op: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict[str, str]) -> bool:
        """Whether a label map satisfies this requirement (real semantics: ``!=``
        and ``notin`` also match objects that lack the key)."""
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "=":
            return present and value in self.values
        if self.op == "!=":
            return not present or value not in self.values
        if self.op == "in":
            return present and value in self.values
        if self.op == "notin":
            return not present or value not in self.values
        if self.op == "exists":
            return present
        return not present  # "!"


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts, depth, current = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p for p in (s.strip() for s in parts) if p]


def parse_label_selector(text: str | None) -> list[Requirement]:
    """Parse a labelSelector query string; raises 400 BadRequest when malformed."""
    if not text:
        return []
    reqs = []
    for part in _split_top_level(text):
        m = _OP_RE.match(part)
        if m:
            op = "=" if m.group(2) in ("=", "==") else "!="
            reqs.append(Requirement(m.group(1), op, frozenset({m.group(3)})))
            continue
        m = _SET_RE.match(part)
        if m and not (m.group(1) and m.group(3)):
            neg, key, setop, values = m.groups()
            if setop:
                vals = frozenset(v.strip() for v in values.split(",") if v.strip())
                reqs.append(Requirement(key, setop, vals))
            else:
                reqs.append(Requirement(key, "!" if neg else "exists"))
            continue
        raise bad_request(f"unable to parse requirement: {part!r} in labelSelector {text!r}")
    return reqs


def labels_match(reqs: list[Requirement], labels: dict[str, str] | None) -> bool:
    """Whether every requirement matches ``labels``."""
    labels = labels or {}
    return all(r.matches(labels) for r in reqs)


def _field_value(obj: dict, path: str) -> str:
    node = obj
    for part in path.split("."):
        if not isinstance(node, dict):
            return ""
        node = node.get(part)
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def parse_field_selector(text: str | None, kind: ResourceKind) -> list[Requirement]:
    """Parse a fieldSelector; unsupported field labels are 400 like the real server."""
    if not text:
        return []
    reqs = []
    for part in _split_top_level(text):
        m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*?)\s*$", part)
        if not m:
            raise bad_request(f"invalid field selector: {part!r}")
        key, op, value = m.groups()
        if not kind.supports_field(key):
            raise bad_request(f"field label not supported: {key}")
        reqs.append(Requirement(key, "!=" if op == "!=" else "=", frozenset({value})))
    return reqs


def fields_match(reqs: list[Requirement], obj: dict) -> bool:
    """Whether every field requirement matches ``obj``."""
    for r in reqs:
        value = _field_value(obj, r.key)
        if (r.op == "=") != (value in r.values):
            return False
    return True
