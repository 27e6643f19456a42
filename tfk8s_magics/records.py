"""Bounded reading of the JSON records the lab keeps on disk and passes between its processes.

Every reader of state (``status.json``, ``cluster.json``, ``events.jsonl``,
progress records, the warm pool's messages) parses through :func:`loads`:
a record larger than its bound or nested deeper than :data:`MAX_DEPTH` is a
:class:`ValueError` like any other bad record, never a ``RecursionError`` or
an unbounded allocation.  Pure: no project imports, so every layer may use it.
"""

from __future__ import annotations

import json
from typing import Any

#: The deepest nesting any record of ours has is 5 (a spec's volume options in ``cluster.json``);
#: a record nested deeper is not one of ours.
MAX_DEPTH = 32


def loads(data: bytes | str, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """Parse ``data`` as JSON, refusing more than ``max_bytes`` or nesting deeper than ``max_depth``.

    Raises :class:`ValueError` (with the cause) for anything that is not such a record.
    """
    if len(data) > max_bytes:
        raise ValueError(f"{len(data)} bytes, more than the {max_bytes} a record may have")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"not UTF-8 ({e.reason} at byte {e.start})") from None
    try:
        value = json.loads(data)
    except RecursionError:  # the C scanner's own guard: deeper than the interpreter's limit
        raise ValueError(f"nested deeper than {max_depth} levels") from None
    if depth(value, max_depth) > max_depth:
        raise ValueError(f"nested deeper than {max_depth} levels")
    return value


def depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """How deeply ``value`` nests lists and dicts (a scalar is 0), counted without recursion and
    only up to ``limit + 1``."""
    deepest = 0
    stack = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        level += 1
        deepest = max(deepest, level)
        if deepest > limit:
            return deepest
        stack.extend((child, level) for child in children)
    return deepest


def number(value: Any) -> float | None:
    """``value`` as a finite float when it is a JSON number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if f == f and abs(f) != float("inf") else None
