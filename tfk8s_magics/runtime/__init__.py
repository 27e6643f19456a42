"""Code that runs inside every task (a local process or a pod)."""

#: Internal: nothing here is public API (the public API is ``tfk8s_magics.__all__``).
__all__: list[str] = []
