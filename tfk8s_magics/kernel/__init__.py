"""How the lab starts a notebook kernel: :mod:`.sandbox` puts it in a private network namespace."""

#: Internal: nothing here is public API (the public API is ``tfk8s_magics.__all__``).
__all__: list[str] = []
