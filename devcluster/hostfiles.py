"""What the cluster's host-side components share: a free port to listen on, a file only root reads."""

from __future__ import annotations

import socket
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the caller binds it next)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, mode 0600 before any byte is written (passwords, keys)."""
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(text)
