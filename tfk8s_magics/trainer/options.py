"""The Trainer's options: a typed, frozen dataclass made from the options registry.

Each option (``steps``, ``batch_size``, ``sync``, ``checkpoint_every``,
``summary_every``, ``model_name``, ``export``, ``use_gpu``) is defined ONCE,
as an :class:`~tfk8s_magics.options.Option` in :mod:`tfk8s_magics.options`:
its type, default, help, check and flag.  The magic's ``--steps`` …, the
``tfk8s`` command line, ``tk.launch(..., steps=...)`` and this dataclass all
derive from that entry.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import options as registry
from ..errors import SpecError

SYNC, ASYNC = "sync", "async"
#: The registry options that make up :class:`TrainerOptions`, in order.
NAMES = ("steps", "batch_size", "sync", "checkpoint_every", "summary_every", "model_name", "export",
         "use_gpu")


def _post_init(self) -> None:
    for name in NAMES:
        value = getattr(self, name)
        opt = registry.OPTIONS[name]
        if isinstance(value, str) and opt.type is registry.parse_bool:
            try:
                value = opt.type(value)
            except ValueError as e:
                raise SpecError(f"{opt.option_string} {value!r} is not valid: {e}.") from None
        object.__setattr__(self, name, opt.validate(value))


def _to_dict(self) -> dict[str, Any]:
    """The options as plain JSON-ready values."""
    return dataclasses.asdict(self)


def _from_dict(cls, data: dict[str, Any]):
    """Options from a dict (None: the default); an unknown key is one sentence naming the known ones."""
    unknown = sorted(set(data) - set(NAMES))
    if unknown:
        raise SpecError(f"unknown Trainer option {unknown[0]!r}: use one of {', '.join(sorted(NAMES))}.")
    return cls(**{k: v for k, v in data.items() if v is not None})


TrainerOptions = dataclasses.make_dataclass(
    "TrainerOptions",
    [(n, Any, dataclasses.field(default=registry.OPTIONS[n].builtin_default(),
                                metadata={"help": registry.OPTIONS[n].help})) for n in NAMES],
    frozen=True,
    namespace={
        "__doc__": "What the platform needs to run a Trainer; every field is an option of the "
                   "registry (tfk8s_magics.options), checked when the object is made.",
        "__post_init__": _post_init,
        "to_dict": _to_dict,
        "from_dict": classmethod(_from_dict),
    },
)
TrainerOptions.__module__ = __name__
