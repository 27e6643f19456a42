"""This process as the in-graph client (the chief) of a cluster.

:func:`resolver` hands out a ``ClusterResolver`` for code that builds its
own strategy (TensorFlow's parameter-server tutorial does:
``ParameterServerStrategy(cluster_resolver, variable_partitioner=...)``);
:func:`strategy` builds the ``ParameterServerStrategy`` for ``connect``.

Rules, because TensorFlow keeps one eager context per process:

* this process listens as ``chief`` on one address per launch of a
  cluster, so every resolver of it names the same chief; TensorFlow cannot
  listen on that port again, so a relaunched cluster gets a new one;
* ``connect`` with the options of the strategy it already built returns
  that strategy — unless a parameter server restarted since it was built
  (its variables and the connection are gone): then it lets the old one go
  and builds a fresh one on a new chief port; with other options it builds a new one (TensorFlow allows
  it for the same servers); after a relaunch (new addresses) it connects
  to the new servers;
* before a connected cluster's servers go away (stop, delete), its
  coordinator's threads are stopped, the eager context is reset, and the
  old context no longer asks the (dead) servers to drop the functions
  traced under it, so the kernel does not spend its exit failing to reach
  them ("Failed to remove function remotely … Connection refused").
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from .backends.base import Coordinator
from .taskenv import import_tensorflow, quiet_enabled
from .tfconfig import coordinator_cluster_def

_lock = threading.Lock()


@dataclass
class _Client:
    """What this process holds for one cluster: the servers it dialled, its chief address,
    the resolvers it handed out and the strategy ``connect`` built last."""

    addresses: dict[str, list[str]]
    coordinator: Coordinator
    resolvers: list = field(default_factory=list)
    options: tuple | None = None
    strategy: Any = None
    built: float = 0.0  # when the strategy was built: a server restarted later cut it off


#: (backend name, cluster name) → this process's client state for that cluster.
_clients: dict[tuple[str, str], _Client] = {}


#: The background import started by :func:`preimport` (None: not started).
_preimport: threading.Thread | None = None


def preimport(legacy_keras: bool | None) -> None:
    """Start importing TensorFlow in a background thread, once, so ``connect`` finds it imported.

    Called at an in-graph launch (``legacy_keras``: the spec's; the 3-5 s import then
    overlaps the cluster's own start) and when this process's warm pool starts (None:
    nothing is set, as no spec is known yet; a warm launch is then ready before the
    import would be, so it must come first).  ``TF_USE_LEGACY_KERAS`` is read at the first
    ``tf.keras``, not at the import, so :func:`prepare_tensorflow` still sets it in time.
    """
    global _preimport
    with _lock:
        if "tensorflow" in sys.modules or _preimport is not None:
            return
        if legacy_keras:
            os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # before the import, as below
        _preimport = threading.Thread(target=_import_in_background, name="tfk8s-import-tensorflow",
                                      daemon=True)
        _preimport.start()


def preimported(timeout: float | None = None) -> bool:
    """Wait up to ``timeout`` s for a background import; whether TensorFlow is imported now."""
    if _preimport is not None:
        _preimport.join(timeout)
    return "tensorflow" in sys.modules and (_preimport is None or not _preimport.is_alive())


def _import_in_background() -> None:
    try:
        import_tensorflow()
    except Exception:  # noqa: BLE001 - the caller's own import (prepare_tensorflow) reports it
        pass


def prepare_tensorflow(legacy_keras: bool) -> Any:
    """Set what must be set before TensorFlow's first import and first ``tf.keras``; import it."""
    if legacy_keras:
        # Read at the first use of tf.keras, so it must be set before that.
        os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    if _preimport is not None:
        _preimport.join()  # a failed background import is retried (and raises) right here
    return import_tensorflow()


def _client(cluster, addresses: dict[str, list[str]]) -> _Client:
    """This process's client of ``cluster``; a relaunched cluster (new addresses) gets a new one.

    TensorFlow cannot listen again on a port this process's chief used, so
    after a relaunch the old client is let go and the chief gets a new port.
    """
    key = (cluster.backend.name, cluster.name)
    with _lock:
        current = _clients.get(key)
    if current is not None and current.addresses == addresses:
        return current
    if current is not None:
        disconnect(*key)
    fresh = _Client(addresses, cluster.backend.coordinator(cluster.name))
    with _lock:
        _clients[key] = fresh
    return fresh


def resolver(cluster, addresses: dict[str, list[str]]):
    """A ``SimpleClusterResolver`` for ``cluster``'s servers with this process as ``chief``."""
    spec = cluster.spec
    tf = prepare_tensorflow(spec.legacy_keras)
    client = _client(cluster, addresses)
    layout = coordinator_cluster_def(spec, addresses, client.coordinator.address)
    made = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(layout), task_type="chief", task_id=0, rpc_layer="grpc"
    )
    client.resolvers.append(weakref.ref(made))
    return made


def coordinator(cluster, addresses: dict[str, list[str]]) -> Coordinator:
    """What the backend gave this process to be ``cluster``'s chief (address, progress sink)."""
    return _client(cluster, addresses).coordinator


def options_key(options: dict[str, Any]) -> tuple:
    """A comparable form of strategy options: a partitioner compares by type and settings."""
    out = []
    for key, value in sorted(options.items()):
        state = vars(value) if hasattr(value, "__dict__") else value
        settings = sorted(state.items()) if isinstance(state, dict) else state
        out.append((key, type(value).__qualname__, repr(settings)))
    return tuple(out)


def strategy(cluster, addresses: dict[str, list[str]], options: dict[str, Any]):
    """The ``ParameterServerStrategy`` for ``cluster`` with ``options``: the one built already
    when the servers and options are the same, else a new one."""
    wanted = options_key(options)
    client = _client(cluster, addresses)
    if client.strategy is not None and cluster.status().restarted_since(client.built):
        # A parameter server restarted under the strategy: its variables and the eager
        # context's connection are gone; only a new client (new chief port) can go on.
        disconnect(cluster.backend.name, cluster.name)
        client = _client(cluster, addresses)
    if client.strategy is not None and client.options == wanted:
        return client.strategy
    tf = prepare_tensorflow(cluster.spec.legacy_keras)
    built_at = time.time()
    # The strategy starts this process's chief server in this process's network namespace,
    # where its gRPC threads live: TensorFlow's threads are process-wide and keep the namespace
    # they were made in, so the tasks share it (the supervisor stays there for in-graph): the
    # sandboxed kernel's own private one (tfk8s_magics.kernel.sandbox), else the host's.
    with _tensorflow_info_hidden():
        built = tf.distribute.ParameterServerStrategy(resolver(cluster, addresses), **options)
    client.strategy, client.options, client.built = built, wanted, built_at
    client.coordinator.connected(built_at)
    return built


@contextlib.contextmanager
def _tensorflow_info_hidden():
    """Hide the INFO lines TensorFlow's logger prints while the strategy is built (six lines on
    stderr for a 1-PS cluster: the cluster spec, twice the devices, twice "Number of GPUs"), when
    the lab is quiet (option ``quiet``); warnings and errors still show."""
    logger = logging.getLogger("tensorflow")
    old = logger.level
    if quiet_enabled() and logger.getEffectiveLevel() < logging.WARNING:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(old)


def connected(backend_name: str, name: str) -> bool:
    """Whether this process is a client of that cluster (and has not let it go)."""
    with _lock:
        return (backend_name, name) in _clients


def disconnect(backend_name: str, name: str) -> bool:
    """Let go of that cluster before its servers go: stop its coordinators' threads and reset
    TensorFlow's eager context.  Returns whether there was anything to let go of."""
    with _lock:
        client = _clients.pop((backend_name, name), None)
    if client is None:
        return False
    ours = {id(r()) for r in client.resolvers if r() is not None}
    for coordinator in _coordinators():
        resolver_of = getattr(getattr(coordinator, "strategy", None), "_cluster_resolver", None)
        if id(resolver_of) in ours:
            _stop_coordinator(coordinator)
    _reset_eager_context()
    return True


def _coordinators() -> list:
    """Every ``ClusterCoordinator`` alive in this process (user code may have made its own)."""
    module = sys.modules.get("tensorflow.python.distribute.coordinator.cluster_coordinator")
    cls = getattr(module, "ClusterCoordinator", None)
    if cls is None:
        return []
    return [o for o in gc.get_objects() if isinstance(o, cls)]


def _stop_coordinator(coordinator: Any) -> None:
    """End the coordinator's worker threads (private TensorFlow API; best effort)."""
    cluster = getattr(coordinator, "_cluster", None)
    stop = getattr(cluster, "stop", None)
    if callable(stop):
        try:
            stop()
        except Exception:  # noqa: BLE001 - shutting down: nothing may stop the delete
            pass


def _reset_eager_context() -> None:
    """Forget the remote cluster in this process's eager context (private TensorFlow API)."""
    if "tensorflow" not in sys.modules:
        return  # no TensorFlow here: no context to reset
    try:
        from tensorflow.python.eager import context
    except ImportError:
        return
    old = context.context_safe()
    if old is not None:
        # Functions traced under the old context stay bound to it and, when garbage-collected
        # (at the latest at exit), would ask the dead servers to drop them: one error each.
        old.remove_function = lambda name: None
    try:
        context._reset_context()  # noqa: SLF001 - the only way to drop a server def
    except Exception:  # noqa: BLE001 - shutting down: best effort
        pass

