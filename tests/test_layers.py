"""Dependencies point one way, and no cache outlives its cluster."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tfk8s_magics import api

PKG = Path(__file__).resolve().parent.parent / "tfk8s_magics"

#: Which layers a module may import (by the first part of its path under the package).
#: The front ends (magics, cli) and the views (ui) sit on the API; nothing below imports them.
FORBIDDEN = {
    "ui": {"magics", "cli"},
    "cli": {"magics"},
    "api": {"ui", "magics", "cli"},
    "backends": {"api", "ui", "magics", "cli", "watch", "kernel"},
    # the kernel launcher runs before ipykernel, on the backends' isolation primitives only
    "kernel": {"api", "ui", "magics", "cli", "watch", "spec", "runtime", "trainer", "serving", "storage"},
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
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            module = ".".join([*base, *(node.module or "").split(".")]).strip(".")
            names = [module] if node.module else [f"{module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if name.startswith("tfk8s_magics"):
                found.append((name, node, id(node) in in_function))
    return found


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
