"""The Backend contract: optional capabilities declared, checked when a backend is loaded, and
the front ends (API, magic, command line) reaching a backend only through it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tfk8s_magics import api, backends
from tfk8s_magics.backends import CAPABILITIES, Backend, WarmPool, check_backend
from tfk8s_magics.errors import BackendError, SpecError

PKG = Path(__file__).resolve().parent.parent / "tfk8s_magics"


class Minimal(Backend):
    """Every required method and no optional capability (what a new backend starts from)."""

    name = "minimal"

    def launch(self, spec, *, detach=False):
        raise NotImplementedError

    def status(self, name):
        raise NotImplementedError

    def list_clusters(self):
        return []

    def spec(self, name):
        return None  # every name exists: enough for the contract's answers

    def watch(self, name, stop):
        return iter(())

    def read_logs(self, name, task=None, tail=None):
        return []

    def follow_logs(self, name, stop, tasks=None, from_start=True):
        return iter(())

    def events(self, name):
        return []

    def stop(self, name):
        raise NotImplementedError

    def delete(self, name, keep_logs=False, force=False):
        return None

    def addresses(self, name):
        return {}

    def tensorboard(self, name):
        raise NotImplementedError


class HalfServing(Minimal):
    """Declares serving but cannot stop it."""

    name = "half"
    capabilities = frozenset({"serving"})

    def serve(self, name, model=None, **serving):
        return None

    def serving(self, name):
        return None


class Undeclared(Minimal):
    """Has a pool without saying so."""

    name = "undeclared"

    def warm_pool(self):
        raise NotImplementedError


class NoLaunch(Backend):
    """Forgot most of the required methods."""

    name = "nolaunch"


def test_the_builtin_backends_keep_the_contract():
    from tfk8s_magics.backends.kubernetes import KubernetesBackend
    from tfk8s_magics.backends.local import LocalBackend

    for cls in (LocalBackend, KubernetesBackend, Minimal):
        check_backend(cls)
    assert LocalBackend.supports("pool") and LocalBackend.supports("serving")
    assert not LocalBackend.supports("render") and LocalBackend.serving_ends_with_caller
    assert KubernetesBackend.supports("render") and KubernetesBackend.supports("serving")
    assert not KubernetesBackend.supports("pool") and not KubernetesBackend.serving_ends_with_caller
    assert isinstance(LocalBackend.__new__(LocalBackend).warm_pool(), WarmPool)


@pytest.mark.parametrize(("cls", "said"), [
    (HalfServing, "lacks stop_serving (for serving)"),
    (Undeclared, "defines warm_pool without declaring 'pool'"),
    (NoLaunch, "lacks addresses, delete, events, follow_logs, launch"),
    (dict, "is not a subclass of tfk8s_magics.backends.Backend"),
])
def test_a_backend_that_breaks_the_contract_is_told_what_it_lacks_in_one_sentence(cls, said):
    with pytest.raises(BackendError) as e:
        check_backend(cls, "pkg.mod:Cls")
    sentence = str(e.value)
    assert said in sentence and "pkg.mod:Cls" in sentence
    assert sentence.count(". ") == 0 and sentence.endswith(".")


def test_an_unknown_capability_is_refused():
    class Wishful(Minimal):
        capabilities = frozenset({"teleport"})

    with pytest.raises(BackendError, match="unknown capability 'teleport': declare only in_graph, pool"):
        check_backend(Wishful)
    with pytest.raises(ValueError, match="unknown capability"):
        Minimal.supports("teleport")


def test_registration_checks_an_entry_point_backend_before_any_call(monkeypatch):
    monkeypatch.setitem(backends._BUILTIN, "half", f"{__name__}:HalfServing")
    monkeypatch.setitem(backends._BUILTIN, "minimal", f"{__name__}:Minimal")
    with pytest.raises(BackendError, match=f"backend '{__name__}:HalfServing' lacks stop_serving"):
        backends.get_backend("half")
    assert isinstance(backends.get_backend("minimal"), Minimal)
    assert backends.backend_class("minimal") is Minimal


def test_a_backend_without_a_capability_answers_for_it_through_the_contract():
    be = Minimal()
    cluster = api.Cluster("c", be)
    with pytest.raises(SpecError, match="the minimal backend cannot serve models"):
        cluster.serve()
    with pytest.raises(SpecError, match="the minimal backend cannot serve models"):
        cluster.serve(stop=True)
    assert cluster.serving() is None
    with pytest.raises(SpecError, match="the minimal backend keeps no warm pool"):
        api.warm_pool(be)
    with pytest.raises(SpecError, match="the minimal backend has nothing to render"):
        api.render_serving(None, "m", be)
    with pytest.raises(BackendError, match="cannot host an in-graph client"):
        be.coordinator("c")
    assert set(CAPABILITIES) == {"render", "serving", "pool", "in_graph"}


FRONT_ENDS = ("api.py", "magics.py", "cli.py")


def test_the_front_ends_reach_a_backend_only_through_the_contract():
    """No import of a backend's internals, no probing with hasattr/getattr, no branch on a
    backend's name in the API, the magic and the command line."""
    wrong = []
    for file in FRONT_ENDS:
        tree = ast.parse((PKG / file).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.ImportFrom) and node.level
                    and (node.module or "").startswith("backends.")):
                wrong.append(f"{file}:{node.lineno} imports backends.{node.module.partition('.')[2]}")
            if isinstance(node, ast.Import) and any(a.name.startswith("tfk8s_magics.backends.")
                                                    for a in node.names):
                wrong.append(f"{file}:{node.lineno} imports a backend module")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("hasattr", "getattr") and node.args
                    and "backend" in ast.unparse(node.args[0]) + ast.unparse(node.args[1:2])):
                wrong.append(f"{file}:{node.lineno} probes a backend with {node.func.id}")
            if isinstance(node, ast.Compare) and any(
                    isinstance(side, ast.Attribute) and side.attr == "name"
                    and "backend" in ast.unparse(side.value)
                    for side in (node.left, *node.comparators)):
                wrong.append(f"{file}:{node.lineno} branches on a backend's name")
    assert not wrong, "\n".join(wrong)


def test_every_package_says_what_it_offers():
    """Each package's ``__init__`` has an explicit ``__all__`` (empty: internal only), and every
    name in it exists, so what is public is written down, not guessed from leading underscores."""
    import importlib

    missing, wrong = [], []
    for init in sorted(PKG.rglob("__init__.py")):
        package = ".".join(init.relative_to(PKG.parent).parent.parts)
        tree = ast.parse(init.read_text(encoding="utf-8"))
        if not any(isinstance(n, ast.Assign | ast.AnnAssign)
                   and "__all__" in ast.unparse(n.targets[0] if isinstance(n, ast.Assign) else n.target)
                   for n in tree.body):
            missing.append(package)
            continue
        module = importlib.import_module(package)
        wrong += [f"{package}.{name}" for name in module.__all__ if not hasattr(module, name)]
    assert not missing, f"packages without __all__: {missing}"
    assert not wrong, f"__all__ names that do not exist: {wrong}"
