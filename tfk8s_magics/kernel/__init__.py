"""How the lab starts a notebook kernel: :mod:`.sandbox` puts it in a private network namespace."""
