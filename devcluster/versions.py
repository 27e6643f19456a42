"""The pinned versions of the test cluster, read from ``versions.env`` (their one home)."""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent


def versions() -> dict[str, str]:
    """``{"KUBERNETES": "v1.36.3", ...}`` from ``versions.env`` (``KEY=value`` lines, ``#`` comments)."""
    out: dict[str, str] = {}
    for line in (HERE / "versions.env").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def cache_root() -> Path:
    """Where built binaries and the running cluster's state live: outside the work tree."""
    return Path(os.environ.get("TFK8S_CACHE") or Path.home() / ".cache" / "tfk8s") / "devcluster"
