"""The local warm pool as the Backend contract shows it (:class:`~tfk8s_magics.backends.base.WarmPool`).

The pool itself (owner, protocol, daemon, pooled worker) is :mod:`.pool`; this is only the face
the magic and the command line see through :meth:`LocalBackend.warm_pool`.
"""

from __future__ import annotations

from ..base import WarmPool
from . import pool


class LocalWarmPool(WarmPool):
    """This process's warm pool of TensorFlow task processes (one per owner process)."""

    def configure(self, size: int | None) -> None:
        """Set this process's pool size (the magic's ``pool_size`` trait); None: ``$TFK8S_POOL_SIZE``."""
        pool.configure(size)

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
        """Every running pool of this user (one per kernel), one text each."""
        return [pool.describe(found) for found in pool.pools()]
