"""Keep local tasks' servers on loopback.

TensorFlow's gRPC servers listen on every interface whatever address
TF_CONFIG gives (measured: ``*:PORT``).  On the local backend every task
is on this machine, so nothing needs them reachable from elsewhere: the
supervisor preloads a tiny shim (``loopback_bind.c``) into each task that
turns a ``bind()`` to a wildcard address into a bind to loopback.

The shim is compiled once (into ``$XDG_CACHE_HOME/tfk8s``, by default
``~/.cache/tfk8s``) with the system C compiler
(``cc``/``gcc``; the lab's images and Debian have it).  Without a compiler,
or with ``TFK8S_LOOPBACK_ONLY=0``, tasks run without it and their ports are
reachable from the network, as TensorFlow makes them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("loopback_bind.c")


def enabled() -> bool:
    """Whether tasks should be confined to loopback (``$TFK8S_LOOPBACK_ONLY``, default on)."""
    return os.environ.get("TFK8S_LOOPBACK_ONLY", "1").strip().lower() not in ("0", "false", "no")


def cache_dir() -> Path:
    """Where built artefacts are cached: ``$XDG_CACHE_HOME/tfk8s`` or ``~/.cache/tfk8s``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "tfk8s"


def shim_path(cache: Path | None = None) -> Path | None:
    """The compiled shim, built on first use; None if disabled or it cannot be built."""
    if not enabled():
        return None
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:12]
    lib = (cache or cache_dir()) / f"libtfk8s_loopback_bind-{digest}.so"
    if lib.exists():
        return lib
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    lib.parent.mkdir(parents=True, exist_ok=True)
    tmp = lib.with_suffix(f".{os.getpid()}.tmp")
    try:
        subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(SOURCE), "-ldl"],
            check=True, capture_output=True, timeout=60,
        )
        os.replace(tmp, lib)  # atomic: concurrent launches never see half a library
    except (OSError, subprocess.SubprocessError):
        tmp.unlink(missing_ok=True)
        return None
    return lib


def preload_env(env: dict[str, str], lib: str | None) -> None:
    """Add ``lib`` in front of ``LD_PRELOAD`` in ``env`` (a task's environment)."""
    if lib:
        env["LD_PRELOAD"] = " ".join(p for p in (lib, env.get("LD_PRELOAD", "")) if p)
