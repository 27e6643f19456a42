"""Checks of a training script before anything is launched.

Two questions, answered from the script's source (``ast``, nothing is run):

* **Does the strategy fit the cluster?**  ``MultiWorkerMirroredStrategy``
  (and TF1's collective strategy) blocks forever when ``TF_CONFIG`` names a
  ``ps`` job (measured: > 300 s, no error).  A script that builds one is
  refused when the cluster has parameter servers.  Where the source cannot
  tell (the strategy is built in another module), the task runtime refuses
  at the constructor instead (:func:`tfk8s_magics.runtime.task.guard_collective_strategy`).
* **Do its imports resolve the way the tasks resolve them?**  A task runs
  the script as ``python path/script.py`` does: the script's own folder
  first (for a cell body, the kernel's working folder), then ``PYTHONPATH``
  (the user's ``--env PYTHONPATH`` in front of the inherited one), then the
  interpreter's own library paths.  The check searches exactly that path.
"""

from __future__ import annotations

import ast
import functools
import importlib.machinery
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from .errors import SpecError

#: Strategies that run collectives over every task in TF_CONFIG and so wait
#: for parameter servers that never join a collective.
COLLECTIVE_STRATEGIES = frozenset({"MultiWorkerMirroredStrategy", "CollectiveAllReduceStrategy"})

#: One sentence per refusal; ``{ps}`` is the parameter-server count.
COLLECTIVE_WITH_PS = (
    "the script builds tf.distribute.{name}, which waits forever when the cluster has "
    "parameter servers (--ps {ps}): launch it with --ps 0, or use parameter servers with "
    "ParameterServerStrategy (--mode in-graph, then tk.connect or tk.resolver)."
)


def collective_strategies(source: str) -> list[str]:
    """The collective strategies ``source`` refers to (by attribute, name or import), in order."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in COLLECTIVE_STRATEGIES:
            found.append(node.attr)
        elif isinstance(node, ast.Name) and node.id in COLLECTIVE_STRATEGIES:
            found.append(node.id)
        elif isinstance(node, ast.ImportFrom):
            found += [a.name for a in node.names if a.name in COLLECTIVE_STRATEGIES]
    return list(dict.fromkeys(found))


def check_strategy(script: str | None, ps: int, between: bool) -> None:
    """Refuse a between-graph script that builds a collective strategy on a cluster with PS tasks."""
    if not between or not ps or not script:
        return
    used = collective_strategies(script)
    if used:
        raise SpecError(COLLECTIVE_WITH_PS.format(name=used[0], ps=ps))


# -- imports ------------------------------------------------------------------


def top_level_imports(source: str) -> list[str]:
    """Top-level modules ``source`` imports at module level (absolute imports only).

    An import inside a ``try`` or a function may be optional, so it is left
    to run time.
    """
    tree = ast.parse(source)
    wanted: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            wanted += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            wanted.append(node.module.split(".")[0])
    return list(dict.fromkeys(wanted))


def split_path(value: str | None) -> list[str]:
    """The entries of a ``PYTHONPATH``-style value, empty ones dropped."""
    return [p for p in (value or "").split(os.pathsep) if p]


def task_pythonpath(user_env: Mapping[str, str], inherited: Mapping[str, str]) -> str | None:
    """The tasks' ``PYTHONPATH``: the user's ``--env PYTHONPATH`` in front of the inherited one."""
    parts = split_path(user_env.get("PYTHONPATH")) + split_path(inherited.get("PYTHONPATH"))
    return os.pathsep.join(dict.fromkeys(parts)) or None


@functools.lru_cache(maxsize=4)
def interpreter_path(executable: str = sys.executable) -> tuple[str, ...]:
    """The library paths ``executable`` starts with, without PYTHONPATH or a script folder.

    Asked of the interpreter itself (once per process): a kernel's own
    ``sys.path`` holds its working folder and whatever the user appended,
    which the tasks do not see.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    try:
        out = subprocess.run(
            [executable, "-c", "import sys, json; print(json.dumps(sys.path[1:]))"],
            env=env, capture_output=True, text=True, timeout=30, check=True,
        ).stdout
        return tuple(json.loads(out))
    except (OSError, subprocess.SubprocessError, ValueError):
        return tuple(p for p in sys.path[1:] if p)


def task_import_path(script_dir: str, pythonpath: str | None) -> list[str]:
    """Where a task looks for modules, in order (see the module docstring).

    Besides these folders, the interpreter's own import hooks (editable
    installs) apply, as they do in the tasks.
    """
    return [script_dir, *split_path(pythonpath), *interpreter_path()]


_FIND = (
    "import importlib.util, json, sys\n"
    "sys.path[0] = sys.argv[1]\n"
    "def found(m):\n"
    "    try:\n"
    "        return importlib.util.find_spec(m) is not None\n"
    "    except (ImportError, ValueError):\n"
    "        return False\n"
    "print(json.dumps([m for m in sys.argv[2:] if not found(m)]))\n"
)


def missing_imports(source: str, script_dir: str, pythonpath: str | None) -> list[str]:
    """Top-level modules ``source`` imports that a task would not find.

    Asked of a fresh interpreter started as the tasks are (``sys.executable``,
    the script's folder first, the tasks' ``PYTHONPATH``): exactly their rules,
    editable installs and ``.pth`` hooks included.  Nothing is imported.
    """
    wanted = [m for m in top_level_imports(source) if m not in sys.builtin_module_names]
    if not wanted:
        return []
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    try:
        out = subprocess.run(
            [sys.executable, "-c", _FIND, script_dir, *wanted],
            env=env, capture_output=True, text=True, timeout=60, check=True,
        ).stdout
        return list(json.loads(out))
    except (OSError, subprocess.SubprocessError, ValueError):
        path = task_import_path(script_dir, pythonpath)
        return [m for m in wanted if importlib.machinery.PathFinder.find_spec(m, path) is None]


def check_imports(
    source: str, script_dir: str, pythonpath: str | None, provided: Sequence[str] = ()
) -> None:
    """Raise :class:`SpecError` naming the paths searched when an import cannot be found.

    ``provided``: names of the files that travel with the script (``--file``).
    """
    given = {Path(f).name for f in provided}
    missing = [m for m in missing_imports(source, script_dir, pythonpath) if f"{m}.py" not in given]
    if not missing:
        return
    names = ", ".join(missing)
    searched = [script_dir, *split_path(pythonpath)]
    raise SpecError(
        f"the training script imports {names}, found neither in {', '.join(searched)} nor in "
        f"the library paths of {sys.executable} ({', '.join(interpreter_path())}): put "
        f"{missing[0]}.py next to the script, add its folder with --env PYTHONPATH=DIR, "
        "or fix the import."
    )


def script_dir(spec) -> str:
    """The folder a spec's script imports from: the script's own, or for a cell body (or
    source given as text) this process's working folder, as the notebook sees it."""
    name = getattr(spec, "script_name", "") or ""
    if name and not name.startswith("<"):
        return str(Path(name).expanduser().resolve().parent)
    return os.getcwd()


def sibling_modules(source: str, script_dir: str) -> list[str]:
    """Modules the script imports that are files in its own folder (``helper`` for ``helper.py``)."""
    folder = Path(script_dir)
    return [m for m in top_level_imports(source) if (folder / f"{m}.py").is_file()]


def check_files_travel(source: str, script_dir: str, files: Sequence[str]) -> None:
    """On a remote backend: refuse a script whose sibling modules were not named with ``--file``."""
    given = {Path(f).name for f in files}
    left = [m for m in sibling_modules(source, script_dir) if f"{m}.py" not in given]
    if left:
        raise SpecError(
            f"the training script imports {', '.join(left)} from its folder {script_dir}, but "
            f"{'that file does' if len(left) == 1 else 'those files do'} not travel with it: "
            f"add --file {Path(script_dir) / (left[0] + '.py')} to the launch."
        )
