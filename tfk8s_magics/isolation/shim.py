"""The loopback shim: a task's ``bind()`` to a wildcard address becomes a bind to loopback.

The fallback where a private network namespace is not used (the kernel refuses namespaces,
``TFK8S_ISOLATION=loopback``, an in-graph cluster on the host): the supervisor preloads a tiny
library (``loopback_bind.c``) into each task, so other hosts are kept out — other local users
are not.  It is compiled once (into ``$XDG_CACHE_HOME/tfk8s``, by default ``~/.cache/tfk8s``) with
the system C compiler (``cc``/``gcc``; the lab's images and Debian have it).  Without a compiler,
or with ``TFK8S_LOOPBACK_ONLY=0``, there is no shim.  Whether it is used is the
:class:`~.plan.IsolationPlan`'s decision.
"""

from __future__ import annotations

import ctypes
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


def switch_off(shim: str) -> None:
    """Make the preloaded loopback shim pass every ``bind()`` through (``loopback_bind.c``)."""
    ctypes.c_int.in_dll(ctypes.CDLL(shim), "tfk8s_loopback_bind_off").value = 1
