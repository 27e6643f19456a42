"""Turning a Trainer class into a cluster's script, and refusing shapes that cannot train.

``%%tfcluster launch NAME --trainer MyTrainer``: the cell defines the class;
the script is the cell plus two lines that call :func:`.runtime.run`.
``tk.launch(NAME, trainer=MyTrainer)``: the class's source is taken from its
module (imported by name when the module is importable in the task; else
copied, with the modules and helpers it names from its module).
"""

from __future__ import annotations

import ast
import inspect
import json
import types
from typing import Any

from ..errors import SpecError
from ..spec import IN_GRAPH
from .base import Trainer
from .options import ASYNC, TrainerOptions

_FOOTER = (
    "\n\n# -- added by tfk8s: run the Trainer as this task's part of the cluster --\n"
    "import tfk8s_magics.trainer as _tfk8s_trainer\n"
    "_tfk8s_trainer.run({name}, {options!r})\n"
)


def check_shape(mode: str, workers: int, ps: int, chief: int, options: TrainerOptions) -> None:
    """Refuse, in one sentence, a cluster shape the chosen strategy cannot train on."""
    if mode == IN_GRAPH:
        raise SpecError(
            "--trainer runs between-graph; for an in-graph cluster, train from this kernel with "
            "tk.train(NAME, MyTrainer) after launching it."
        )
    if options.sync == ASYNC:
        if not ps or not workers:
            raise SpecError(f"--sync async trains with parameter servers: it needs --ps ≥ 1 and "
                            f"--workers ≥ 1, "
                            f"got --ps {ps} --workers {workers}.")
        if not chief:
            raise SpecError("--sync async between-graph needs a chief to coordinate the workers: "
                            "add --chief 1 "
                            "(or launch --mode in-graph and train from this kernel with tk.train).")
    elif ps:
        raise SpecError(f"--sync sync (MultiWorkerMirroredStrategy) cannot use parameter servers — "
                        f"it hangs when "
                        f"the cluster has a ps job: launch with --ps 0 (got {ps}), or use --sync async.")


def _needed_globals(cls: type, module: types.ModuleType | None) -> list[str]:
    """Lines that recreate the module-level names the class's source uses."""
    if module is None:
        return []
    source = inspect.getsource(cls)
    names = {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
    names |= {n.value.id for n in ast.walk(ast.parse(source))
              if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    lines = []
    for name in sorted(names):
        value = getattr(module, name, None)
        if isinstance(value, types.ModuleType):
            lines.append(f"import {value.__name__} as {name}" if value.__name__ != name else f"import {name}")
        elif isinstance(value, type | types.FunctionType) and value.__module__ == module.__name__ \
                and value is not cls:
            lines.append(inspect.getsource(value))
        elif isinstance(value, int | float | str | bool) and not isinstance(value, type):
            lines.append(f"{name} = {value!r}")
        elif isinstance(value, type) and value.__module__ != module.__name__:
            lines.append(f"from {value.__module__} import {value.__qualname__} as {name}")
    return lines


#: What the platform calls on a Trainer, with the arguments it passes (besides ``self``).
CALLED = {"build_model": (), "dataset": ("input_context",), "compute_loss": ("labels", "predictions"),
          "after_train": ("model",), "train": ("model", "optimizer")}
#: What a Trainer must override.
REQUIRED = ("build_model", "dataset")


def _wrong_signature(cls_name: str, method: str, shown: str) -> SpecError:
    wanted = ", ".join(("self", *CALLED[method]))
    return SpecError(f"{cls_name}.{method}{shown} does not take what the platform passes it: define it as "
                     f"{method}({wanted}).")


def check_trainer_class(cls: type) -> None:
    """Refuse (one sentence, before anything is created) a Trainer that leaves ``build_model`` or
    ``dataset`` unimplemented, or overrides a method with a signature the platform cannot call."""
    for method in REQUIRED:
        if getattr(cls, method, None) is getattr(Trainer, method):
            raise SpecError(f"{cls.__name__} does not override {method}(): a Trainer must define "
                            f"{method}({', '.join(('self', *CALLED[method]))}).")
    for method, args in CALLED.items():
        fn = getattr(cls, method, None)
        if fn is None or fn is getattr(Trainer, method):
            continue
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            continue
        try:
            sig.bind(None, *args)
        except TypeError:
            raise _wrong_signature(cls.__name__, method, str(sig)) from None


def _ast_signature_fits(f: ast.FunctionDef | ast.AsyncFunctionDef, args: tuple) -> str | None:
    """None when ``f`` accepts ``self`` + ``args``; else its parameters, shown as ``(a, b)``."""
    a = f.args
    positional = [*a.posonlyargs, *a.args]
    required = len(positional) - len(a.defaults)
    given = 1 + len(args)  # self + what the platform passes
    if given < required or (given > len(positional) and a.vararg is None):
        names = [p.arg for p in positional] + ([f"*{a.vararg.arg}"] if a.vararg else [])
        return "(" + ", ".join(names) + ")"
    return None


def check_trainer_source(cell: str, name: str) -> None:
    """:func:`check_trainer_class` on the source of a cell that defines class ``name``: its
    methods' parameters are read from the syntax tree (the class is not run here)."""
    tree = ast.parse(cell)
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if node is None:
        return  # an assignment (Trainer = ...): nothing to read
    methods = {f.name: f for f in node.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
    for method, args in CALLED.items():
        shown = _ast_signature_fits(methods[method], args) if method in methods else None
        if shown is not None:
            raise _wrong_signature(name, method, shown)
    bases = {b.id for b in node.bases if isinstance(b, ast.Name)} | {
        b.attr for b in node.bases if isinstance(b, ast.Attribute)}
    missing = [m for m in REQUIRED if m not in methods] if "Trainer" in bases else []
    if missing:
        method = missing[0]
        raise SpecError(f"{name} does not override {method}(): a Trainer must define "
                        f"{method}({', '.join(('self', *CALLED[method]))}).")


def trainer_script(trainer: str | type, options: TrainerOptions, cell: str | None = None) -> str:
    """The script every task runs: the class's definition, then the call of the Trainer runtime."""
    if isinstance(trainer, str):
        if not trainer.isidentifier():
            raise SpecError(f"--trainer {trainer!r} is not a class name: give the name of the Trainer "
                            "subclass the cell defines.")
        if cell is None or not cell.strip():
            raise SpecError(f"--trainer {trainer} needs the cell that defines class {trainer}.")
        tree = ast.parse(cell)
        classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
        assigned = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
                    if isinstance(t, ast.Name)}
        if trainer not in classes | assigned:
            raise SpecError(f"--trainer {trainer}: the cell defines no class {trainer} "
                            f"(its classes: {', '.join(sorted(classes)) or 'none'}); check the name.")
        check_trainer_source(cell, trainer)
        return cell + _FOOTER.format(name=trainer, options=json.dumps(options.to_dict()))
    if not (isinstance(trainer, type) and issubclass(trainer, Trainer)):
        raise SpecError(f"trainer={trainer!r} is not a subclass of tfk8s_magics.Trainer: subclass it and "
                        "override build_model() and dataset().")
    check_trainer_class(trainer)
    name = trainer.__name__
    module_name = trainer.__module__
    if cell is not None:
        head = cell
    elif module_name not in ("__main__", "builtins") and not module_name.startswith("__"):
        head = f"from {module_name} import {name}\n"
    else:
        import sys

        try:
            needed = _needed_globals(trainer, sys.modules.get(module_name))
            head = "\n".join([*needed, inspect.getsource(trainer)])
        except (OSError, TypeError) as e:
            raise SpecError(f"the source of {name} cannot be found ({e}): define it in a file and import it, "
                            f"or use %%tfcluster launch NAME --trainer {name} in the cell that defines "
                            "it.") from None
    return head + _FOOTER.format(name=name, options=json.dumps(options.to_dict()))


def options_from(values: dict[str, Any] | TrainerOptions | None) -> TrainerOptions:
    """TrainerOptions from a dict of given options (or as is)."""
    if isinstance(values, TrainerOptions):
        return values
    return TrainerOptions.from_dict({k: v for k, v in (values or {}).items() if v is not None})
