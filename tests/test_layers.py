"""Dependencies point one way, and no cache outlives its cluster."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tfk8s_magics import api

PKG = Path(__file__).resolve().parent.parent / "tfk8s_magics"

#: Which layers a module may import (by the first part of its path under the package).
#: The front ends (magics, cli) and the views (ui) sit on the API; nothing below imports them.
FORBIDDEN = {
    "ui": {"magics", "cli"},
    "cli": {"magics"},
    "api": {"ui", "magics", "cli"},
    "backends": {"api", "ui", "magics", "cli", "watch", "kernel"},
    # the kernel launcher runs before ipykernel, on the isolation layer only
    "kernel": {"api", "ui", "magics", "cli", "watch", "spec", "runtime", "trainer", "serving", "storage",
               "backends"},
    # isolation sits just above the process primitives (lifeline, ports) and the option registry:
    # the relay, the guard and the kernel launcher load it without the rest of the package
    "isolation": {"api", "ui", "magics", "cli", "watch", "kernel", "backends", "spec", "runtime", "trainer",
                  "serving", "storage", "sidebar", "ingraph", "lifecycle", "taskenv", "scriptcheck", "stall",
                  "records", "tfconfig", "yamltext"},
    "watch": {"api", "ui", "magics", "cli"},
    "spec": {"api", "ui", "magics", "cli", "backends", "watch"},
    "options": {"api", "ui", "magics", "cli", "backends", "watch", "spec"},
    "runtime": {"api", "ui", "magics", "cli", "backends", "watch"},
    # object storage sits just above errors: the spec checks URLs with it, the backends transfer with it
    "storage": {"api", "ui", "magics", "cli", "backends", "watch", "spec", "options", "runtime",
                "trainer", "serving", "scriptcheck"},
}


def _imports(path: Path) -> list[tuple[str, ast.stmt, bool]]:
    """(imported project module, node, inside a function) for every import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = path.relative_to(PKG.parent).with_suffix("").parts
    package = here[:-1] if here[-1] != "__init__" else here[:-1]
    in_function = {
        id(n)
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
        for n in ast.walk(fn)
    }
    never_run = {id(n) for block in ast.walk(tree) if _type_checking_only(block) for n in ast.walk(block)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            module = ".".join([*base, *(node.module or "").split(".")]).strip(".")
            # `from pkg import sub` imports the submodule pkg.sub too (a name that is not a module
            # is only an attribute of pkg)
            subs = [f"{module}.{a.name}" for a in node.names if _module_file(f"{module}.{a.name}")]
            names = [module, *subs] if node.module else [f"{module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        if id(node) in never_run:
            continue
        for name in names:
            if name.startswith("tfk8s_magics"):
                found.append((name, node, id(node) in in_function))
    return found


def _type_checking_only(node: ast.AST) -> bool:
    """An ``if TYPE_CHECKING:`` block: its imports never run."""
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _module_file(module: str) -> Path | None:
    """The file of project module ``module`` (a package's ``__init__.py``), or None (a name)."""
    path = PKG.parent.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _loaded_at_import(module: str) -> set[str]:
    """Every project module that importing ``module`` loads, transitively: the imports run at
    import time (not the deferred ones inside functions), and each module's parent packages."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ first
            current = ".".join(parts[:i])
            path = _module_file(current)
            if path is None or current in seen:
                continue
            seen.add(current)
            for imported, _, in_function in _imports(path):
                if not in_function:
                    todo.append(imported if _module_file(imported) else imported.rpartition(".")[0])
    return seen


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_layers_import_only_downwards():
    wrong = []
    for path in PKG.rglob("*.py"):
        layer = _layer(".".join(path.relative_to(PKG.parent).with_suffix("").parts))
        for module, node, _ in _imports(path):
            if _layer(module) in FORBIDDEN.get(layer, set()):
                wrong.append(f"{path.relative_to(PKG.parent)}:{node.lineno} imports {module}")
    assert not wrong, "\n".join(wrong)


def test_layers_import_only_downwards_transitively():
    """What a module loads when it is imported, not only what it names: a module may not reach a
    forbidden layer through a permitted one (the kernel launcher through a backend package that
    loads the task runtime)."""
    wrong = []
    for path in PKG.rglob("*.py"):
        module = ".".join(path.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__")
        forbidden = FORBIDDEN.get(_layer(module), set())
        reached = sorted(m for m in _loaded_at_import(module) if _layer(m) in forbidden)
        if reached:
            wrong.append(f"{module} loads {', '.join(reached)}")
    assert not wrong, "\n".join(wrong)


def test_the_transitive_check_follows_every_hop():
    """The check sees through permitted hops: the local backend's package reaches the task
    runtime (its progress records) and the isolation layer's network namespaces only through its
    own modules (backend -> pool -> daemon -> netns), and the package itself loads nothing."""
    loaded = _loaded_at_import("tfk8s_magics.backends.local")
    direct = {m for m, _, _ in _imports(PKG / "backends/local/__init__.py")}
    for far in ("tfk8s_magics.runtime.progress", "tfk8s_magics.isolation.netns"):
        assert far in loaded and far not in direct, far
    assert _loaded_at_import("tfk8s_magics") == {"tfk8s_magics"}


#: How many project modules a security component loads (issue 25: 54 and 52 before the isolation
#: layer).  Change a number only on purpose, and say in the commit what the new module is for.
LOADED = {"tfk8s_magics.kernel.sandbox": 13, "tfk8s_magics.isolation.relay": 5,
          "tfk8s_magics.isolation.guard": 11}


@pytest.mark.parametrize("module", sorted(LOADED))
def test_a_security_component_loads_only_what_it_runs(module):
    """Counted in a fresh interpreter, as the component starts (``python -m``), and checked
    against the static count (so the transitive layer test sees what really loads)."""
    probe = (f"import sys, {module}; "
             "print(' '.join(sorted(m for m in sys.modules if m.startswith('tfk8s_magics'))))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         timeout=60)
    loaded = set(out.stdout.split())
    assert len(loaded) == LOADED[module], sorted(loaded)
    assert loaded == _loaded_at_import(module)


def test_project_modules_are_imported_at_the_top_unless_a_comment_says_why():
    """A function-level import is allowed only to defer a heavy third-party import, said so."""
    unexplained = []
    for path in PKG.rglob("*.py"):
        lines = path.read_text(encoding="utf-8").splitlines()
        for module, node, in_function in _imports(path):
            if not in_function:
                continue
            context = "\n".join(lines[max(0, node.lineno - 4): node.lineno])
            if "Deferred" not in context and "deferred" not in context:
                unexplained.append(f"{path.relative_to(PKG.parent)}:{node.lineno} imports {module}")
    assert not unexplained, "\n".join(unexplained)


class _Gone:
    name = "fake"

    def delete(self, name, keep_logs=False):
        return None


def test_the_task_entry_point_starts_without_a_runpy_warning():
    """Tasks run ``python -m tfk8s_magics.runtime.task``; if importing the package already
    imported that module, runpy warns on stderr and the warning is the first line of every
    task's log.  Checked both ways: the module is not pre-imported, and -m runs it silently."""
    probe = "import sys, tfk8s_magics; print('tfk8s_magics.runtime.task' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
    run = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "tfk8s_magics.runtime.task"],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, timeout=120)
    assert "RuntimeWarning" not in run.stderr and "found in sys.modules" not in run.stderr, run.stderr


def test_delete_forgets_the_in_graph_client_of_that_cluster():
    from tfk8s_magics import ingraph
    from tfk8s_magics.backends.base import Coordinator

    for name in ("x", "y"):
        ingraph._clients[("fake", name)] = ingraph._Client({}, Coordinator("127.0.0.1:1", print))
    try:
        api.Cluster("x", _Gone()).delete()
        assert not ingraph.connected("fake", "x")
        assert ingraph.connected("fake", "y")
    finally:
        ingraph._clients.pop(("fake", "y"), None)
