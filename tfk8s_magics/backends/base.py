"""The backend interface and the status types every backend reports.

A backend runs clusters somewhere (processes on this machine, pods on
Kubernetes).  The public API (:mod:`tfk8s_magics.api`), the magics and the
dashboard talk only to this interface, so a new backend is a new module
registered under the ``tfk8s_magics.backends`` entry point group, not an
``if`` in every function.
"""

from __future__ import annotations

import abc
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, ClassVar, NamedTuple

from ..errors import BackendError, SpecError
from ..spec import ClusterSpec
from ..stall import Stall


class Phase:
    """Phases of tasks and clusters (plain strings, so they serialise as-is)."""

    PENDING = "pending"  # accepted, not started (Kubernetes: not scheduled / pulling)
    STARTING = "starting"  # process/container started, not ready yet
    RUNNING = "running"  # ready: server listening, or script running
    SUCCEEDED = "succeeded"  # exited 0 (parameter servers: recycled after the workers)
    FAILED = "failed"  # crashed past the restart budget, or could not start
    STOPPING = "stopping"  # asked to stop; some task has not ended yet (not terminal)
    STOPPED = "stopped"  # ended by the user (stop/delete) or by its owner exiting
    UNKNOWN = "unknown"  # its state cannot be read (the reason says why); not terminal

    TERMINAL = frozenset({SUCCEEDED, FAILED, STOPPED})


@dataclass
class TaskStatus:
    """One task's state as the backend last saw it."""

    name: str
    phase: str = Phase.PENDING
    reason: str = ""
    exit_code: int | None = None
    signal: str | None = None
    restarts: int = 0
    host: str = ""
    started: float | None = None
    finished: float | None = None

    @property
    def role(self) -> str:
        """The task's role: its name without the ``-<index>`` suffix (``worker`` for ``worker-0``)."""
        return self.name.rpartition("-")[0]

    @property
    def index(self) -> int:
        """The task's index within its role: the number after the last ``-``."""
        return int(self.name.rpartition("-")[2])

    @property
    def duration(self) -> float | None:
        """Seconds from start to finish (or to now, while running)."""
        if self.started is None:
            return None
        return (self.finished or time.time()) - self.started


@dataclass
class Progress:
    """Training progress as reported by the script (see :func:`~tfk8s_magics.report_progress`)."""

    step: int
    total: int | None = None
    rate: float | None = None  # steps per second
    metrics: dict[str, float] = field(default_factory=dict)
    task: str = ""
    time: float = 0.0

    @property
    def percent(self) -> float | None:
        """How far along, 0 to 100 (capped at 100), or None when the total is unknown."""
        if not self.total:
            return None
        return min(100.0, 100.0 * self.step / self.total)

    @property
    def eta(self) -> float | None:
        """Seconds left at the current rate, when total and rate are known."""
        if not self.total or not self.rate:
            return None
        return max(0.0, (self.total - self.step) / self.rate)


@dataclass
class Event:
    """Something that happened to a cluster: a restart, a recycle, a scheduling failure."""

    time: float
    task: str
    reason: str
    message: str
    type: str = "Normal"  # or "Warning"


@dataclass(frozen=True)
class LogLocation:
    """Where a cluster's logs and checkpoints are kept.

    ``path`` is the directory as the tasks see it; ``volume`` names the
    PersistentVolumeClaim that holds it (Kubernetes), or is None for a
    directory on this machine (local).  ``str()`` gives one readable form;
    ``Path(location)`` works where it is a directory on this machine.
    """

    path: str
    volume: str | None = None

    def __str__(self) -> str:
        return self.path if self.volume is None else f"{self.path} on volume {self.volume}"

    def __fspath__(self) -> str:
        """The directory, for ``Path(location)`` / ``open`` — only where it is on this machine."""
        if self.volume is not None:
            raise TypeError(
                f"the logs are at {self}, on a Kubernetes volume, not a path on this machine: read "
                "them with %tfcluster logs NAME, or from a pod that mounts the claim."
            )
        return self.path


@dataclass
class ClusterStatus:
    """A cluster as one snapshot: its phase and every task's."""

    name: str
    backend: str
    mode: str
    phase: str
    reason: str = ""
    created: float = 0.0
    finished: float | None = None
    owner: str = ""
    detached: bool = False
    log_dir: LogLocation = field(default_factory=lambda: LogLocation(""))
    tasks: list[TaskStatus] = field(default_factory=list)
    progress: Progress | None = None
    #: Set while the cluster runs but nothing happens (see :mod:`tfk8s_magics.stall`).
    stall: Stall | None = None
    #: Set while the cluster waits for what will not come without a change (an image no node
    #: can pull, pods no node has room for, pods the API refuses): what to do, one sentence.
    cannot_start: str = ""

    @property
    def shown_phase(self) -> str:
        """The phase as views show it: ``stalled`` for a running cluster in which nothing happens."""
        return "stalled" if self.stall is not None and self.phase == Phase.RUNNING else self.phase

    def stall_text(self, now: float | None = None) -> str:
        """How long it has been stalled and each task's last line; empty when it is not."""
        return self.stall.describe(time.time() if now is None else now) if self.stall else ""

    @property
    def terminal(self) -> bool:
        """Whether the cluster has ended (succeeded, failed or stopped)."""
        return self.phase in Phase.TERMINAL

    def restarted_since(self, when: float, role: str = "ps") -> list[str]:
        """The ``role`` tasks restarted after ``when`` (a parameter server's restart loses the
        in-graph coordinator's variables and connection; a worker's the coordinator survives)."""
        return [t.name for t in self.tasks
                if t.name.startswith(f"{role}-") and t.restarts and (t.started or 0) > when]

    @property
    def ready(self) -> bool:
        """Whether every task is running (or already done)."""
        return bool(self.tasks) and all(
            t.phase in (Phase.RUNNING, Phase.SUCCEEDED) for t in self.tasks
        )

    def task(self, name: str) -> TaskStatus:
        """The status of the task called ``name``; raises KeyError if there is none."""
        for t in self.tasks:
            if t.name == name:
                return t
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """This status as plain dicts and lists (nested dataclasses included), ready for JSON."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ClusterStatus:
        """Rebuild a status from :meth:`to_dict`'s output."""
        d = dict(d)
        known = {f.name for f in dataclasses.fields(TaskStatus)}
        d["tasks"] = [TaskStatus(**{k: v for k, v in t.items() if k in known}) for t in d.get("tasks", [])]
        if isinstance(d.get("log_dir"), Mapping):
            d["log_dir"] = LogLocation(**d["log_dir"])
        if d.get("progress"):
            d["progress"] = Progress(**d["progress"])
        d["stall"] = Stall.from_dict(d.get("stall"))
        return cls(**d)


def overwritten(text: str) -> str:
    r"""What a terminal (and Jupyter) shows of a line that carriage returns rewrote: the text after
    the last ``\r`` that has any (a progress bar's last state)."""
    if "\r" not in text:
        return text
    for part in reversed(text.split("\r")):
        if part:
            return part
    return ""


class LogLine(NamedTuple):
    """One line a task printed (stdout and stderr are merged, as kubectl logs does).

    Immutable, like the other records here, but a named tuple rather than a
    frozen dataclass: a flood of output makes hundreds of thousands of them
    a second, and a tuple of strings and a float is built at a fraction of
    the cost and left alone by the garbage collector after its first pass
    (a dataclass instance is tracked for life), which keeps the kernel's
    collections short while logs stream (``bench/logs.py``).
    """

    task: str
    text: str
    time: float = 0.0

    @classmethod
    def many(cls, task: str, texts: list[str], time: float) -> list[LogLine]:
        """One line per text, all of ``task`` at ``time``, built without a Python call per line."""
        return list(map(tuple.__new__, repeat(cls), zip(repeat(task), texts, repeat(time))))


class LogChunk(NamedTuple):
    """Lines one task printed that were read together (``Backend.follow_log_batches``).

    The texts travel as plain strings until a view takes them: strings are
    not tracked by the garbage collector, and :class:`LogLine` objects made
    just before they are handed out die young (a flood's lines kept waiting
    for their batch as objects would be promoted and make full collections
    pause the kernel).
    """

    task: str
    texts: list[str]
    time: float

    def lines(self) -> list[LogLine]:
        """The chunk as :class:`LogLine` objects."""
        return LogLine.many(self.task, self.texts, self.time)


@dataclass(frozen=True)
class TensorBoardInfo:
    """A TensorBoard serving a cluster's log dir."""

    port: int
    url: str
    logdir: str
    reused: bool
    pid: int | None = None


@dataclass(frozen=True)
class Coordinator:
    """What an in-graph client (this process, as the cluster's chief) gets from its backend.

    ``address`` is where it listens, reachable from the cluster's servers;
    ``progress`` receives its progress records (one JSON line each), so
    :func:`~tfk8s_magics.report_progress` called here shows in the
    cluster's status; ``task`` is the name those records carry;
    ``connected(when)`` is called once a strategy is built on the servers, so
    the backend can say when a later server restart cut that connection.
    """

    address: str
    progress: Callable[[str], None]
    task: str = "chief-0"
    connected: Callable[[float], None] = lambda when: None


class WarmPool(abc.ABC):
    """A backend's warm pool of task processes (the optional capability ``pool``).

    Processes that have imported TensorFlow already wait to become a task, so a launch starts in a
    second instead of several.  The pool belongs to the processes that launch (a user's notebook
    kernels share one).
    """

    @abc.abstractmethod
    def configure(self, size: int | None, idle: float | None = None) -> None:
        """Set this process's pool settings: its size (None: the ``pool_size`` option's default; 0:
        this process uses no pool) and idle time (None: the ``pool_idle`` option's default)."""

    @abc.abstractmethod
    def resize(self, size: int) -> None:
        """Set the size of the pool this process uses (every process sharing it sees the new size)."""

    @abc.abstractmethod
    def start(self) -> None:
        """Start this process's pool now (a launch starts it otherwise), at the configured size."""

    @abc.abstractmethod
    def status_text(self) -> str:
        """This process's pool as text (``%tfcluster pool``), or what its size setting means."""

    @abc.abstractmethod
    def memory_line(self) -> str:
        """One line on what every pool of this user holds (``%tfcluster list``); "" for none."""

    @abc.abstractmethod
    def describe_all(self) -> list[str]:
        """Every running pool of this user, one text each (``tfk8s pool``)."""


#: The optional capabilities a backend may declare in :attr:`Backend.capabilities`, each with the
#: methods it must then define (and must not define without declaring it).
CAPABILITIES: Mapping[str, tuple[str, ...]] = {
    "render": ("render",),
    "serving": ("serve", "serving", "stop_serving"),
    "pool": ("warm_pool",),
    "in_graph": ("coordinator",),
}
#: Methods needed by a pair of capabilities together: a backend that renders and serves renders
#: its serving objects too.
_TOGETHER: Mapping[tuple[str, str], tuple[str, ...]] = {("render", "serving"): ("render_serving",)}


def check_backend(cls: Any, entry: str = "") -> None:
    """Raise :class:`~tfk8s_magics.errors.BackendError` in one sentence unless ``cls`` keeps the
    Backend contract: a :class:`Backend` subclass with a ``name``, every abstract method defined,
    and exactly the methods of the optional :data:`~tfk8s_magics.backends.CAPABILITIES` it declares.

    :func:`~tfk8s_magics.backends.get_backend` calls it when it loads a backend (``entry``: the entry
    point's value), so a backend's author learns there what it lacks, not at a user's first call.
    """
    where = f"backend {entry or getattr(cls, '__qualname__', cls)!r}"
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise BackendError(f"{where} is not a subclass of tfk8s_magics.backends.Backend: "
                           "subclass it and define its abstract methods.")
    problems = []
    if not isinstance(getattr(cls, "name", None), str):
        problems.append("a `name` (the string users give with --backend)")
    if cls.__abstractmethods__:
        problems.append(", ".join(sorted(cls.__abstractmethods__)))
    caps = cls.capabilities
    unknown = sorted(set(caps) - set(CAPABILITIES))
    if unknown:
        raise BackendError(f"{where} declares the unknown capability {unknown[0]!r}: declare only "
                           f"{', '.join(sorted(CAPABILITIES))}.")
    needed = {cap: methods for cap, methods in CAPABILITIES.items()}
    needed.update({" and ".join(pair): methods for pair, methods in _TOGETHER.items()})
    declared = set(caps) | {" and ".join(pair) for pair in _TOGETHER if set(pair) <= set(caps)}
    extra = []
    for cap, methods in needed.items():
        defined = [m for m in methods if getattr(cls, m) is not getattr(Backend, m)]
        if cap in declared:
            problems += [f"{m} (for {cap})" for m in methods if m not in defined]
        elif defined:
            extra.append(f"{', '.join(defined)} without declaring {cap!r}")
    if problems:
        raise BackendError(f"{where} lacks {'; '.join(problems)}: define them (see the Backend "
                           "contract in the API reference), or leave the capability out of `capabilities`.")
    if extra:
        raise BackendError(f"{where} defines {'; '.join(extra)}: add it to `capabilities`, or remove "
                           "the method so the contract's answer (not supported) is given.")


class Backend(abc.ABC):
    """Where clusters run.  Implementations: ``local``, ``kubernetes``.

    Every method that takes a cluster name raises
    :class:`~tfk8s_magics.errors.ClusterNotFound` for an unknown one.
    A launch that fails part-way rolls back what it created and raises
    :class:`~tfk8s_magics.errors.LaunchFailed`.

    The abstract methods are required.  The rest is optional, in capabilities a backend
    declares in :attr:`capabilities` (see :data:`~tfk8s_magics.backends.CAPABILITIES`); a method
    of a capability the backend does not declare answers for it (one sentence saying the backend
    cannot, or "nothing").  Callers ask
    :meth:`supports`, never ``hasattr`` or the backend's name.
    """

    #: The name users give with ``--backend``.
    name: ClassVar[str]
    #: The optional capabilities this backend has (keys of :data:`~tfk8s_magics.backends.CAPABILITIES`).
    capabilities: ClassVar[frozenset[str]] = frozenset()
    #: With ``serving``: whether a model server lives only as long as the process that started it
    #: (a command-line ``serve`` then waits until Ctrl-C instead of returning).
    serving_ends_with_caller: ClassVar[bool] = False

    @classmethod
    def supports(cls, capability: str) -> bool:
        """Whether this backend has the optional ``capability`` (a key of
        :data:`~tfk8s_magics.backends.CAPABILITIES`)."""
        if capability not in CAPABILITIES:
            raise ValueError(f"unknown capability {capability!r}: one of {', '.join(sorted(CAPABILITIES))}")
        return capability in cls.capabilities

    @abc.abstractmethod
    def launch(self, spec: ClusterSpec, *, detach: bool = False) -> ClusterStatus:
        """Create the cluster and start its tasks; return at once (not ready yet).

        Unless ``detach`` is true, the cluster is stopped when the calling
        process (the notebook kernel) exits.
        """

    @abc.abstractmethod
    def status(self, name: str) -> ClusterStatus:
        """The cluster's current status."""

    @abc.abstractmethod
    def list_clusters(self) -> list[ClusterStatus]:
        """Every cluster this backend knows (for this user), newest first."""

    @abc.abstractmethod
    def spec(self, name: str) -> ClusterSpec:
        """The spec the cluster was launched with."""

    @abc.abstractmethod
    def watch(self, name: str, stop: threading.Event) -> Iterator[ClusterStatus]:
        """Yield the status now and at every change, until it is terminal or ``stop`` is set."""

    @abc.abstractmethod
    def read_logs(self, name: str, task: str | None = None, tail: int | None = None) -> list[LogLine]:
        """The kept log of one task (or all, task by task); the last ``tail`` lines of each."""

    @abc.abstractmethod
    def follow_logs(
        self,
        name: str,
        stop: threading.Event,
        tasks: list[str] | None = None,
        from_start: bool = True,
    ) -> Iterator[LogLine]:
        """Stream log lines as tasks print them, including tasks not started yet.

        Ends when the cluster is terminal and every log is drained, or when
        ``stop`` is set.
        """

    def follow_log_batches(
        self,
        name: str,
        stop: threading.Event,
        tasks: list[str] | None = None,
        from_start: bool = True,
    ) -> Iterator[LogChunk]:
        """:meth:`follow_logs` in chunks: lines of one task that arrived together.

        The live views' path: a backend that reads many lines at once (the
        local one reads files) hands them over as one chunk instead of one
        object per line.  By default, each line is a chunk of its own.
        """
        for line in self.follow_logs(name, stop, tasks, from_start):
            yield LogChunk(line.task, [line.text], line.time)

    @abc.abstractmethod
    def events(self, name: str) -> list[Event]:
        """What happened to the cluster, oldest first."""

    @abc.abstractmethod
    def stop(self, name: str) -> ClusterStatus:
        """End every task; keep the record and the logs."""

    def check_exists(self, name: str) -> None:
        """Raise ClusterNotFound (naming the known clusters) unless cluster ``name`` exists."""
        self.spec(name)

    @abc.abstractmethod
    def delete(self, name: str, keep_logs: bool = False, force: bool = False) -> LogLocation | None:
        """Stop and remove the cluster and all it created; its logs too, unless ``keep_logs``.

        ``force`` also removes a cluster whose state cannot be read (a backend whose state is
        always readable ignores it).  Returns where the logs were kept (``keep_logs``), else None.
        """

    def retire_for_rerun(self, name: str) -> Any:
        """Remove ended cluster ``name`` so a launch of the same name can run; return what of its
        logs :meth:`attach_previous` hands to the new run (None: nothing kept)."""
        self.delete(name)
        return None

    def attach_previous(self, name: str, kept: Any) -> None:
        """Make ``kept`` (from :meth:`retire_for_rerun`) the previous run of new cluster ``name``."""
        return None  # nothing was kept by the default retire_for_rerun

    def read_previous_logs(self, name: str, task: str | None = None,
                           tail: int | None = None) -> list[LogLine] | None:
        """The previous run's logs of cluster ``name`` (None: no previous run is kept)."""
        return None

    @abc.abstractmethod
    def addresses(self, name: str) -> dict[str, list[str]]:
        """The cluster's servers, role → ``host:port``, as a coordinator dials them."""

    @abc.abstractmethod
    def tensorboard(self, name: str) -> TensorBoardInfo:
        """Start (or reuse) a TensorBoard on the cluster's log dir."""

    # -- optional: render -------------------------------------------------------
    def render(self, spec: ClusterSpec, tensorboard: bool = False) -> list[dict[str, Any]]:
        """``render``: the objects :meth:`launch` would create for ``spec``, without touching any
        cluster.  Backends that create no declarative objects have nothing to render."""
        raise SpecError(
            f"the {self.name} backend has nothing to render (it creates no objects from a spec); "
            "use --backend kubernetes."
        )

    def render_serving(self, spec: ClusterSpec, model: str, **serving: Any) -> list[dict[str, Any]]:
        """``render`` and ``serving``: the objects that would serve ``model`` of ``spec``."""
        raise SpecError(f"the {self.name} backend has nothing to render; use --backend kubernetes.")

    # -- optional: serving ------------------------------------------------------
    def serve(self, name: str, model: str | None = None, **serving: Any) -> Any:
        """``serving``: serve cluster ``name``'s newest exported ``model`` with TensorFlow Serving's
        REST and gRPC APIs; return a :class:`~tfk8s_magics.serving.ServingInfo`."""
        raise SpecError(f"the {self.name} backend cannot serve models; use local or kubernetes.")

    def serving(self, name: str) -> Any:
        """``serving``: what cluster ``name`` serves now (a ServingInfo), or None."""
        self.check_exists(name)
        return None

    def stop_serving(self, name: str) -> bool:
        """``serving``: stop serving cluster ``name``'s model; return whether a server was running."""
        raise SpecError(f"the {self.name} backend cannot serve models; use local or kubernetes.")

    # -- optional: the warm pool --------------------------------------------------
    def warm_pool(self) -> WarmPool:
        """``pool``: this process's warm pool of task processes."""
        raise SpecError(f"the {self.name} backend keeps no warm pool of task processes; "
                        "use --backend local.")

    # -- optional: in-graph ---------------------------------------------------------
    def coordinator(self, name: str) -> Coordinator:
        """``in_graph``: what this process needs to be the in-graph client (chief) of ``name``.

        Backends that cannot reach their servers from here raise
        :class:`~tfk8s_magics.errors.BackendError` saying so.
        """
        raise BackendError(
            f"the {self.name} backend cannot host an in-graph client: launch the cluster "
            "--mode between-graph, or use a backend that supports in-graph clusters."
        )

    def attach(self, name: str) -> None:
        """Check that cluster ``name`` exists, for a process that takes it over.

        No backend runs a cluster's lifecycle in its caller: the local supervisor and the
        Kubernetes JobSet run it whether or not a client is attached, and reading a cluster
        (:meth:`status`, :meth:`watch`, logs) never acts on it.  A backend that did need a
        client process would take the cluster over here.
        """
        self.spec(name)

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing
        """Release clients and threads held by this backend object."""
