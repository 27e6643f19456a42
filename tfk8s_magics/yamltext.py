"""Objects as YAML text: the one dumper every backend and front end renders with.

Kept apart from any backend so the API, the magic and the command line print what a backend
renders without importing that backend's internals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml


def dump_yaml(objects: Sequence[Mapping[str, Any]]) -> str:
    """Objects as one multi-document YAML string, keys in the order built."""
    return yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False)
