"""The sidebar's launch form, derived from the options registry (:mod:`tfk8s_magics.options`).

:func:`form_fields` describes one field per ``launch`` option (same name, type, default and
help as ``%tfcluster launch``); :func:`parse_form` turns what the form sent back into the
command line the magic would have parsed and parses it with the registry's own parser, so a
value is converted and checked exactly as ``--workers x`` typed into the magic is, and a
mistake is the same one sentence.  Pure: no I/O, no launch.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from .. import options
from ..errors import SpecError

#: Launch options the form does not show: the name and script have their own fields, a form
#: launch is always detached (the server is not its owner), and a form has no dashboard.
SKIPPED = frozenset({"name", "script_path", "detach", "show_dashboard"})
#: The form's kinds of field, by the option's converter.
_KINDS = {options._whole: "int", options._seconds: "float", options.parse_bool: "bool"}


class _FormParser(argparse.ArgumentParser):
    """The registry's parser, with a mistake raised as one SpecError sentence instead of an exit."""

    def error(self, message: str) -> None:  # type: ignore[override]
        # the magic's own sentence (options.ArgumentParser.error), so the form says what it says
        raise SpecError(f"{self.prog}: {message} ({self.prog} --help shows how)")

    def exit(self, status: int = 0, message: str | None = None) -> None:  # type: ignore[override]
        raise SpecError((message or f"{self.prog}: cannot parse the form.").strip())


def _plain(value: Any) -> Any:
    """A default as JSON: scalars as they are, anything else as its text."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def field_of(opt: options.Option, default: Any) -> dict[str, Any]:
    """One form field of option ``opt`` showing ``default``."""
    if opt.action in ("store_true", "store_false"):
        kind = "bool"
    elif opt.action == "append":
        kind = "list"
    else:
        kind = _KINDS.get(opt.type, "text")
    if opt.action == "store_false":
        default = True if default is None else default  # a --no-X flag: the box shows X itself
    return {
        "name": opt.name,
        "flag": opt.option_string,
        "kind": kind,
        "default": _plain(default),
        "help": opt.help,
        "metavar": opt.metavar or "",
    }


def form_fields(defaults: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every field of the launch form, in the registry's order, with the current defaults."""
    defaults = options.defaults() if defaults is None else defaults
    return [field_of(o, defaults.get(o.name, o.builtin_default()))
            for o in options.for_command("launch") if o.name not in SKIPPED]


def form_argv(name: str, script: str, values: Mapping[str, Any]) -> list[str]:
    """The ``launch`` command line the form's ``values`` stand for (only what differs from empty)."""
    known = {o.name: o for o in options.for_command("launch") if o.name not in SKIPPED}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise SpecError(
            f"the launch form has no option {unknown[0]!r}: use one of {', '.join(sorted(known))}."
        )
    argv = ["launch", str(name), "--script", str(script)]
    for key, opt in known.items():
        if key not in values:
            continue
        value = values[key]
        flag = opt.option_string
        if opt.action in ("store_true", "store_false"):
            if not isinstance(value, bool):
                raise SpecError(f"{flag} is a yes/no option, got {value!r}: send true or false.")
            if value == (opt.action == "store_true"):
                argv.append(flag)
        elif opt.action == "append":
            items = value.splitlines() if isinstance(value, str) else list(value or [])
            for item in items:
                if str(item).strip():
                    argv += [flag, str(item).strip()]
        elif value is None or (isinstance(value, str) and not value.strip()):
            continue
        elif isinstance(value, bool):
            argv += [flag, "1" if value else "0"]
        else:
            argv += [flag, str(value).strip()]
    return argv


def parse_form(name: str, script: str, values: Mapping[str, Any]) -> argparse.Namespace:
    """The form's values parsed as ``%tfcluster launch`` parses its line (raises SpecError)."""
    if not str(name).strip():
        raise SpecError("the cluster has no name: type one, e.g. mnist.")
    # Named as the magic's parser, so a mistake reads exactly as it does under %tfcluster.
    parser = options.build_parser("%tfcluster", options.defaults(), parser_class=_FormParser,
                                  commands=["launch"])
    return parser.parse_args(form_argv(name, script, values))
