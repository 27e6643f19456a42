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
from .lifeline import process_state
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
    #: Runs one step through ``strategy`` on every worker (see :func:`_prober`); raises if it cannot.
    check: Any = None
    built: float = 0.0  # when the strategy was built: a server restarted later cut it off


#: A connection try that timed out inside TensorFlow (a stopped task never answered) and still
#: runs: TensorFlow's context is not touched again until it has ended (concurrent use crashes).
_stuck: threading.Thread | None = None

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
        # Not a daemon: a process that exits while TensorFlow is still being imported (a short
        # launch, wait, logs, delete) first lets the import finish, as the interpreter joins such
        # threads before its exit handlers run.  Torn down under a half-done import, or finishing
        # it inside an exit handler, the process segfaults at exit (exit 139).
        _preimport = threading.Thread(target=_import_in_background, name="tfk8s-import-tensorflow",
                                      daemon=False)
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


#: Seconds ``connect`` keeps trying to reach every server before it gives up with one sentence.
#: After a parameter server restarts, the workers' gRPC channels to it wait out their reconnect
#: backoff (1 s, then ×1.6 per failed try) before they see it back: measured 0–5 s here.
RECONNECT_TIMEOUT = 60.0
#: Seconds between two tries of a connection that failed.
RECONNECT_PAUSE = 0.5


class ConnectFailed(Exception):
    """``connect`` could not reach every server of the cluster in time (the message says which)."""


def strategy(cluster, addresses: dict[str, list[str]], options: dict[str, Any],
             timeout: float | None = None, ready=None):
    """The ``ParameterServerStrategy`` for ``cluster`` with ``options``: the one built already
    when the servers and options are the same, else a new one that has run a step.

    A new strategy is returned only once every worker has read a variable on every parameter
    server through it (:func:`_prober`): after a parameter server's restart the workers' channels
    to it are still in gRPC's reconnect backoff for a few seconds, and a strategy handed out then
    fails at its first step.  A try that fails is let go (a new chief port) and tried again, after
    ``ready()`` (the cluster's tasks are ready again), until ``timeout`` (default
    :data:`RECONNECT_TIMEOUT`); then :class:`ConnectFailed`.  The connection is recorded only once
    the step ran, so the status says it is lost until a step has succeeded.
    """
    wanted = options_key(options)
    timeout = RECONNECT_TIMEOUT if timeout is None else timeout
    deadline = time.monotonic() + timeout
    _refuse_stopped(cluster)
    _wait_stuck(cluster, deadline)
    client = _client(cluster, addresses)
    if client.strategy is not None and cluster.status().restarted_since(client.built):
        # A parameter server restarted under the strategy: its variables and the eager
        # context's connection are gone; only a new client (new chief port) can go on.
        disconnect(cluster.backend.name, cluster.name)
        client = _client(cluster, addresses)
    tf = prepare_tensorflow(cluster.spec.legacy_keras)
    if client.strategy is not None and client.options == wanted:
        try:  # right after a server's end its restart may not show yet: the step tells
            client.check(min(deadline, time.monotonic() + 10.0))
            return client.strategy
        except Exception:  # noqa: BLE001 - cut off: build a new one below
            disconnect(cluster.backend.name, cluster.name)
            client = _client(cluster, addresses)
    return _connect_new(tf, cluster, addresses, options, (timeout, deadline), ready)


def _connect_new(tf: Any, cluster, addresses: dict[str, list[str]], options: dict[str, Any],
                 bound: tuple[float, float], ready):
    """Build, check and keep a new strategy (see :func:`strategy`); ``bound`` is (timeout, deadline)."""
    timeout, deadline = bound
    wanted = options_key(options)
    client = _client(cluster, addresses)
    tries = 0
    while True:
        tries += 1
        built_at = time.time()
        try:
            # Bounded: a stopped task never answers TensorFlow's connection calls.
            built, check = _run_bounded(lambda: _build(tf, cluster, addresses, options, deadline), deadline)
        except TimeoutError as e:
            # The try still waits inside TensorFlow: its context is not touched until it ends
            # (:func:`_wait_stuck`); a new connect() starts from a new client, on a new chief port.
            with _lock:
                _clients.pop((cluster.backend.name, cluster.name), None)
            raise ConnectFailed(
                f"could not reach every server of {cluster.name!r} within {timeout:g} s ({tries} tries; "
                f"last: {e}); look at %tfcluster status {cluster.name} and its events, then connect() again"
            ) from e
        except Exception as e:  # noqa: BLE001 - TensorFlow's errors: retried, then one sentence
            disconnect(cluster.backend.name, cluster.name)  # the half-made connection goes
            left = deadline - time.monotonic()
            if left <= 0 or not _retryable(tf, e):
                raise ConnectFailed(
                    f"could not reach every server of {cluster.name!r} within {timeout:g} s "
                    f"({tries} tries; last: {type(e).__name__}: {_first_line(e)}); look at "
                    f"%tfcluster status {cluster.name} and its events, then connect() again"
                ) from e
            time.sleep(min(RECONNECT_PAUSE * 1.6 ** min(tries, 5), left))  # each try is a chief server
            if ready is not None:
                ready(max(0.0, deadline - time.monotonic()))
            client = _client(cluster, addresses)
            continue
        client.strategy, client.options, client.built, client.check = built, wanted, built_at, check
        client.coordinator.connected(time.time())  # a step ran: the connection is whole again
        return built


def _refuse_stopped(cluster) -> None:
    """A task whose process is stopped (SIGSTOP, a debugger) never answers TensorFlow: say so
    instead of waiting for it (local tasks carry their pid)."""
    for t in cluster.status().tasks:
        pid = getattr(t, "pid", None)
        if pid and process_state(pid) in ("T", "t"):
            raise ConnectFailed(f"{t.name} of {cluster.name!r} is stopped (pid {pid}, SIGSTOP or a debugger) "
                                f"and cannot answer; continue it (kill -CONT {pid}) or restart the cluster, "
                                "then connect() again")


def _wait_stuck(cluster, deadline: float) -> None:
    """Wait (until ``deadline``) for a timed-out try still inside TensorFlow, then reset the context
    it may have changed; ConnectFailed if it is still there."""
    global _stuck
    if _stuck is None:
        return
    _stuck.join(max(0.0, deadline - time.monotonic()))
    if _stuck.is_alive():
        raise ConnectFailed(f"an earlier connect() of {cluster.name!r} is still waiting inside TensorFlow "
                            "for a server that does not answer; when every task runs again, connect() again")
    _stuck = None
    _reset_eager_context()


def _retryable(tf: Any, e: BaseException) -> bool:
    """Whether a failed connection may work when tried again (a server not reachable yet)."""
    # Any error of TensorFlow's on the probe's own variables means a server is not (yet) there.
    return isinstance(e, tf.errors.OpError | TimeoutError)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else ""


class _CoordinatorInfoFilter(logging.Filter):
    """Drops the INFO lines of TensorFlow's distributed coordinator ("Stopping cluster, starting
    with failure handler", "ClusterCoordinator destructor: ..."), which it prints when a
    coordinator is garbage-collected: after connect() returned, or at the kernel's exit; and
    those of its cross-device reductions ("Reduce to /device:CPU:0 then broadcast to ...", up to
    ten per process), which a Keras ``fit`` under the strategy prints as it starts."""

    #: The modules whose INFO lines are dropped (paths inside TensorFlow's distribute package).
    NOISY = ("coordinator", "/distribute/cross_device_ops")

    def filter(self, record: logging.LogRecord) -> bool:
        path = record.pathname.replace("\\", "/")
        return record.levelno >= logging.WARNING or not any(part in path for part in self.NOISY)


_COORDINATOR_FILTER = _CoordinatorInfoFilter()


@contextlib.contextmanager
def _tensorflow_info_hidden():
    """Hide the INFO lines TensorFlow's logger prints while the strategy is built (six lines on
    stderr for a 1-PS cluster: the cluster spec, twice the devices, twice "Number of GPUs"), when
    the lab is quiet (option ``quiet``); warnings and errors still show."""
    logger = logging.getLogger("tensorflow")
    old = logger.level
    if quiet_enabled():
        if _COORDINATOR_FILTER not in logger.filters:
            logger.addFilter(_COORDINATOR_FILTER)  # stays: the destructors' lines come later
        if logger.getEffectiveLevel() < logging.WARNING:
            logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(old)


def _build(tf: Any, cluster, addresses: dict[str, list[str]], options: dict[str, Any], deadline: float):
    """A new strategy and its :func:`_prober` check, which has passed."""
    # The strategy starts this process's chief server in this process's network namespace, where
    # its gRPC threads live: TensorFlow's threads are process-wide and keep the namespace they were
    # made in, so the tasks share it (the supervisor stays there for in-graph): the sandboxed
    # kernel's own private one (tfk8s_magics.kernel.sandbox), else the host's.
    with _tensorflow_info_hidden():
        built = tf.distribute.ParameterServerStrategy(resolver(cluster, addresses), **options)
    check = _prober(tf, built, addresses)
    check(deadline)
    return built, check


def _prober(tf: Any, built: Any, addresses: dict[str, list[str]]):
    """A check that every worker reads a variable on every parameter server through ``built`` (one
    variable per server, made once, so the strategy's round-robin placement of the user's variables
    is unchanged).  ``check(deadline)`` raises what TensorFlow raised, or TimeoutError when it did
    not answer by ``deadline`` (a monotonic time)."""
    n_ps = len(addresses.get("ps", []))
    with built.scope():
        probes = [tf.Variable(0, dtype=tf.int64, trainable=False, name="tfk8s_connect_probe")
                  for _ in range(n_ps)]

    @tf.function
    def touch():
        return tf.add_n([p.read_value() for p in probes]) if probes else tf.constant(0, tf.int64)

    def check(deadline: float) -> None:
        _run_bounded(lambda: [_on(tf, i, touch) for i in range(len(addresses.get("worker", [])))],
                     deadline)

    return check


def _on(tf: Any, worker: int, fn) -> None:
    with tf.device(f"/job:worker/replica:0/task:{worker}"):
        fn().numpy()


def _run_bounded(fn, deadline: float) -> Any:
    """Run ``fn`` in a thread until ``deadline``: return what it returned, raise what it raised, or
    raise TimeoutError."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = e

    global _stuck
    probe = threading.Thread(target=run, name="tfk8s-connect-probe", daemon=True)
    probe.start()
    probe.join(max(0.1, deadline - time.monotonic()))
    if probe.is_alive():
        _stuck = probe
        raise TimeoutError("a server did not answer (is a task stopped?)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


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

