"""The tokens of the user's Kubernetes TensorBoards, kept in the user's own files.

A cluster's TensorBoard (a Deployment in the user's namespace) answers only requests carrying
its token (:mod:`tfk8s_magics.runtime.tensorboard`).  The notebook kernel draws the token, puts
it in a Secret for TensorBoard and here, in a file only the user can read
(``$XDG_DATA_HOME/tfk8s/tensorboard-tokens/<host>``, 0600 in a 0700 folder, on the home volume);
the notebook server's proxy (:mod:`tfk8s_magics.sidebar.tbproxy`) reads it here and adds it to
each request it forwards.  Neither reads a Secret back from the API.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

#: A Service host name as the proxy is asked for it (``<service>.<namespace>.svc``).
_HOST = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def folder() -> Path:
    """Where the tokens are kept."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "tfk8s" / "tensorboard-tokens"


def _path(host: str) -> Path:
    if not _HOST.match(host) or len(host) > 253:
        raise ValueError(f"not a Service host name: {host!r}")
    return folder() / host


def save(host: str, secret: str, token: str) -> None:
    """Keep ``token`` (held by the Secret ``secret``) for TensorBoard at ``host``, owner-only."""
    path = _path(host)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"secret": secret, "token": token}, f)
    os.replace(tmp, path)


def load(host: str) -> tuple[str, str] | None:
    """(Secret name, token) kept for ``host``, or None (none kept, or not a host name)."""
    try:
        record = json.loads(_path(host).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # ValueError: not a host name, or not JSON
        return None
    if not isinstance(record, dict):
        return None
    secret, token = record.get("secret"), record.get("token")
    return (secret, token) if isinstance(secret, str) and isinstance(token, str) and token else None
