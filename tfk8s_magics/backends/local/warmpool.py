"""The local warm pool as the Backend contract shows it (:class:`~tfk8s_magics.backends.base.WarmPool`).

The pool itself (owner, protocol, daemon, pooled worker) is :mod:`.pool`; this is only the face
the magic and the command line see through :meth:`LocalBackend.warm_pool`.
"""

from __future__ import annotations

from ..base import WarmPool
from . import pool


class LocalWarmPool(WarmPool):
    """This user's warm pool of TensorFlow task processes (shared by their kernels)."""

    def configure(self, size: int | None, idle: float | None = None) -> None:
        """Set this process's pool settings (the magic's ``pool_size`` and ``pool_idle`` traits);
        None: ``$TFK8S_POOL_SIZE``, ``$TFK8S_POOL_IDLE``."""
        pool.configure(size, idle)

    def resize(self, size: int) -> None:
        """Set the size of this user's pool (every kernel sharing it sees it)."""
        pool.resize(size)

    def start(self) -> None:
        """Start the pool now at the configured size (size 0 stops it)."""
        pool.ensure()

    def status_text(self) -> str:
        """This process's pool, or what its size setting means."""
        return pool.status_text()

    def memory_line(self) -> str:
        """What this user's warm pools hold, in processes and PSS; "" when there is none."""
        return pool.memory_line()

    def describe_all(self) -> list[str]:
        """Every running pool of this user (one per task environment), one text each."""
        return [pool.describe(found) for found in pool.pools()]
