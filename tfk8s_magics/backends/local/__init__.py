"""The local backend: tasks as processes on 127.0.0.1 (see :mod:`.backend`)."""

from .backend import LocalBackend

__all__ = ["LocalBackend"]
