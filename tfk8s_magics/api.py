"""The public Python API: everything ``%tfcluster`` does, without IPython.

>>> import tfk8s_magics as tk
>>> c = tk.launch("mnist", workers=2, script=open("train.py").read())  # doctest: +SKIP
>>> c.wait()                                                                  # doctest: +SKIP
>>> print(c.logs("worker-0", tail=20))                                        # doctest: +SKIP
>>> c.delete()                                                                # doctest: +SKIP

In-graph: ``tk.launch("ig", mode="in-graph", ps=2, workers=2)`` then
``strategy = tk.connect("ig")`` makes this process the coordinator.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import ingraph, options, storage
from .backends import (
    Backend,
    ClusterStatus,
    Event,
    LogLine,
    Phase,
    TensorBoardInfo,
    WarmPool,
    get_backend,
)
from .errors import (
    BackendError,
    ClusterExists,
    ClusterNotFound,
    ClusterTimeout,
    LaunchFailed,
    NoPreviousRun,
    SpecError,
)
from .runtime.progress import end_redirect, redirect_progress
from .spec import IN_GRAPH, MAX_FILES_BYTES, ROLES, ClusterSpec, Resources
from .trainer import TrainerOptions
from .trainer import launch as trainer_launch
from .trainer import runtime as trainer_runtime
from .trainer.options import NAMES
from .watch import ClusterFeed, announce_deleted
from .yamltext import dump_yaml

_backends: dict[str, Backend] = {}
_lock = threading.Lock()


def resolve_backend(backend: str | Backend | None = None) -> Backend:
    """The backend object named ``backend`` (default: option ``backend``), one per process and name."""
    if isinstance(backend, Backend):
        return backend
    name = options.get("backend", backend)
    with _lock:
        if name not in _backends:
            _backends[name] = get_backend(name)
        return _backends[name]


#: Spec fields make_spec sets itself.
_NOT_KEYWORDS = {"name", "script", "script_name", "env"}
#: Options that are spec fields under the same name.
_SPEC_FIELDS = ("mode", "workers", "ps", "chief", "evaluator", "restart_budget", "ps_grace_period",
                "legacy_keras", "image", "log_dir", "data_dir", "log_claim", "data_claim", "data_sync",
                "backup_url", "credentials_secret", "data_size", "log_size")


def make_spec(name: str, *, script: str | None = None, **values: Any) -> ClusterSpec:
    """Build a validated :class:`ClusterSpec` from launch options.

    Every keyword is an option of :mod:`tfk8s_magics.options` (listed
    below) or a further :class:`ClusterSpec` field.  ``ttl`` is the spec's
    ``ttl_after_finished``.  Four fields are API-only, on purpose:
    ``resources`` (whole :class:`Resources` per role; ``--cpu``/``--memory``/
    ``--gpus`` are its command-line form), ``node_selector`` and
    ``tolerations`` (``--node-affinity`` is the command-line form of placement;
    tolerations are structured objects, and GPU tasks get theirs on their own),
    and ``owner`` (the hub's user, ``$JUPYTERHUB_USER``: a command line that
    named another owner would file a run under someone else's name).
    A keyword left out or ``None`` takes the option's default: its
    environment variable, else its built-in value.  ``script_path`` reads
    the script from a file; ``cpu``/``memory``/``gpus`` apply to every
    role, or per role as a mapping (``gpus={"worker": 1}``); ``resources=``
    gives whole :class:`Resources` per role.
    """
    known = {o.name for o in options.spec_options()}
    given = {k: values.pop(k) for k in list(values) if k in known}
    extra = set(values) - (set(ClusterSpec.__dataclass_fields__) - _NOT_KEYWORDS - known)
    if extra:
        raise SpecError(
            f"unknown launch option {sorted(extra)[0]!r}: use one of {', '.join(sorted(known))}."
        )
    resolved = {name: options.get(name, given.get(name)) for name in known}
    sources: dict[str, dict] = {}
    script, script_name = _script(script, resolved["script_path"], sources)
    trainer_options, script = _with_trainer(resolved, script)
    if resolved["files"]:
        values["files"] = _read_files(resolved["files"], sources)
    if sources:
        values.setdefault("sources", sources)
    if "resources" not in values:
        cpu, memory, gpus = (options.by_role(resolved[k]) for k in ("cpu", "memory", "gpus"))
        per_role = {role: Resources(cpu=cpu[role], memory=memory[role], gpus=gpus[role] or 0)
                    for role in ROLES}
        if any(res != Resources() for res in per_role.values()):
            values["resources"] = per_role
    for key in ("queue", "priority", "scheduler", "active_deadline"):
        values.setdefault(key, resolved[key])
    values.setdefault("ttl_after_finished", resolved["ttl"])
    values.setdefault("spread", tuple(resolved["spread"] or ()))
    affinity: dict[str, tuple[str, ...]] = {}
    for role, requirement in resolved["node_affinity"] or ():
        affinity[role] = (*affinity.get(role, ()), requirement)
    values.setdefault("node_affinity", affinity)
    return _checked(trainer_options, ClusterSpec(
        name=name,
        script=script,
        script_name=script_name,
        env=dict(resolved["env"] or {}),  # argparse gives --env as a list of pairs
        **{field: resolved[field] for field in _SPEC_FIELDS},
        **values,
    ))


def _with_trainer(resolved: dict[str, Any], script: str | None):
    """``(TrainerOptions, script)`` with ``trainer`` given: its options and the script that runs it."""
    if resolved.get("trainer") is None:
        return None, script
    trainer_options = trainer_launch.options_from({n: resolved[n] for n in NAMES})
    if options.normalize_mode(resolved["mode"]) == IN_GRAPH:
        trainer_launch.check_shape(IN_GRAPH, 0, 0, 0, trainer_options)
    return trainer_options, trainer_launch.trainer_script(resolved["trainer"], trainer_options, script)


def _checked(trainer_options, spec: ClusterSpec) -> ClusterSpec:
    """``spec``, once the Trainer (if any) is known to be able to train on its shape."""
    if trainer_options is not None:
        trainer_launch.check_shape(spec.mode, spec.workers, spec.ps, spec.chief, trainer_options)
    return spec


def _script(script: str | None, script_path: str | None, sources: dict[str, dict]) -> tuple[str | None, str]:
    if script_path is None:
        return script, "<cell>"
    if script is not None:
        raise SpecError("give the training script as a cell body or as --script, not both.")
    if storage.is_url(script_path):  # fetched once, here; the tasks get the text like a local script
        fetched = storage.fetch_text(script_path, MAX_READ_BYTES, "--script")
        sources["script.py"] = fetched.source()
        return fetched.text, f"<{script_path}>"
    path = Path(script_path).expanduser()
    text = _read_text(path, "--script", script_path, "a Python file", "a Python file")
    # The absolute path: its folder is importable in every task.
    return text, str(path.resolve())


#: The largest file ``--script``/``--file`` reads: the spec refuses more than this in all anyway.
MAX_READ_BYTES = MAX_FILES_BYTES


def _read_text(path: Path, flag: str, given: str, wanted: str, kind: str) -> str:
    """The text of ``path``, or a SpecError naming ``flag`` and what to give instead.

    Only a regular file under :data:`MAX_READ_BYTES` is read: ``/dev/zero``
    would be read until memory ran out, and a FIFO would block forever
    (it is opened non-blocking and refused).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SpecError(f"{flag} {given!r} does not exist: give the path of {wanted}.") from None
    except OSError as e:
        raise SpecError(f"{flag} {given!r} cannot be read as {kind}: {e.strerror}.") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = "a directory" if stat.S_ISDIR(mode) else "not a regular file (a device, FIFO or socket)"
        raise SpecError(f"{flag} {given!r} is {what}: give the path of {wanted}.")
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_READ_BYTES + 1)
    if len(data) > MAX_READ_BYTES:
        raise SpecError(f"{flag} {given!r} is larger than {MAX_READ_BYTES} bytes: give {wanted} under "
                        "that size (put data in --data-dir instead).")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(f"{flag} {given!r} cannot be read as {kind}: {e}.") from None


def _read_files(paths: list[str] | dict[str, str], sources: dict[str, dict]) -> dict[str, str]:
    """``--file`` paths or URLs → name → text (the files travel with the script, beside it)."""
    if isinstance(paths, dict):
        return dict(paths)  # already name → text
    out = {}
    for given in paths:
        if storage.is_url(given):
            fetched = storage.fetch_text(given, MAX_READ_BYTES, "--file")
            name = given.split("?")[0].rstrip("/").rpartition("/")[2]
            out[name] = fetched.text
            sources[name] = fetched.source()
            continue
        path = Path(given).expanduser()
        out[path.name] = _read_text(path, "--file", given, "a file next to the script", "a text file")
    return out


def launch(
    name_or_spec: str | ClusterSpec,
    *,
    backend: str | Backend | None = None,
    detach: bool = False,
    wait_ready: float | None = None,
    replace: bool = False,
    force: bool = False,
    prepare_client: bool = True,
    **spec_fields: Any,
) -> Cluster:
    """Launch a cluster and return its handle.

    ``name_or_spec`` is a cluster name (the other keyword arguments build
    the spec, see :func:`make_spec`) or a ready :class:`ClusterSpec`.
    ``backend`` is a backend name or object (default: option ``backend``).
    Unless ``detach``, the cluster is stopped when this process exits.
    With ``wait_ready`` (seconds), also wait until every task is ready.
    An ended cluster of the same name (succeeded, failed, stopped) is always
    replaced, its logs kept as the new run's previous run, so a launch cell can
    be re-run; ``replace`` with ``force`` deletes a running one first.
    An in-graph launch starts importing TensorFlow in the background, as this
    process is likely to become the cluster's client; ``prepare_client=False``
    skips that in a process that never connects (the Jupyter server's sidebar).
    """
    if isinstance(name_or_spec, ClusterSpec):
        if spec_fields:
            raise SpecError(
                f"launch got a ClusterSpec and options ({', '.join(sorted(spec_fields))}): "
                "give one or the other."
            )
        spec = name_or_spec
    else:
        spec = make_spec(name_or_spec, **spec_fields)
    be = resolve_backend(backend)
    if force and not replace:
        raise SpecError("--force only goes with --replace: add --replace to replace a running cluster.")
    kept = _retire_previous_run(spec.name, be, replace, force)
    if spec.mode == IN_GRAPH and prepare_client:
        ingraph.preimport(spec.legacy_keras)  # this process will be the client: import TF meanwhile
    try:
        be.launch(spec, detach=detach)
    except ClusterExists:
        # Another launch took the name between our check and our own (two launches at once): advice
        # for the state that cluster is in now, not for the one we checked.
        raise ClusterExists(_taken_meanwhile(spec.name, be)) from None
    cluster = Cluster(spec.name, be)
    be.attach_previous(spec.name, kept)
    if wait_ready is not None:
        cluster.wait_ready(wait_ready)
    return cluster


#: Seconds a re-run launch waits for a cluster stopped a moment ago to end.
_STOPPING_WAIT = 120.0


def _retire_previous_run(name: str, be: Backend, replace: bool, force: bool) -> Any:
    """Make way for a launch of cluster ``name``: an ended cluster of that name (succeeded,
    failed, stopped) is replaced — re-running a launch cell just works — and its logs are kept as
    the new run's previous run; a running one is refused unless ``replace`` and ``force``."""
    try:
        old = Cluster(name, be)
        st = old.status()
    except ClusterNotFound:
        return None
    if st.phase == Phase.UNKNOWN:  # unreadable (e.g. an interrupted launch's empty dir): the backend decides
        return None
    if st.phase == Phase.STOPPING and not (replace and force):
        st = old.wait(_STOPPING_WAIT)  # stopped a moment ago, its tasks still ending: let them
    if not st.terminal and not (replace and force):
        raise ClusterExists(
            f"cluster {name!r} is still {st.phase}: stop it first (%tfcluster stop {name}) and run "
            f"the launch again, or add --replace --force to replace it while it runs."
        )
    if not st.terminal:
        old.delete()
        return None
    return be.retire_for_rerun(name)


def _taken_meanwhile(name: str, be: Backend) -> str:
    """The sentence for the loser of a race for cluster name ``name``: what works in the state the
    winner's cluster is in now (starting or running, already ended, being created, gone again)."""
    try:
        st = Cluster(name, be).status()
    except ClusterNotFound:
        return f"another launch of cluster {name!r} ran at the same moment and is gone already: launch again."
    if st.phase == Phase.UNKNOWN:
        return (f"another launch of cluster {name!r} is creating it at this moment ({st.reason}): see it "
                f"with %tfcluster status {name}, or remove it with %tfcluster delete {name} --force and "
                "launch again.")
    if st.terminal:
        return (f"another launch of cluster {name!r} ran at the same moment and has already {st.phase}: "
                "launch again, which replaces it (its logs are kept as the previous run).")
    return (f"another launch of cluster {name!r} ran at the same moment and it is {st.phase} now: stop it "
            f"first (%tfcluster stop {name}) and launch again, or add --replace --force to replace it "
            "while it runs.")


def get(name: str, backend: str | Backend | None = None) -> Cluster:
    """The handle of an existing cluster (raises ClusterNotFound)."""
    be = resolve_backend(backend)
    be.check_exists(name)  # raises ClusterNotFound with the known names
    return Cluster(name, be)


def list_clusters(backend: str | Backend | None = None) -> list[ClusterStatus]:
    """The status of every cluster of this user on the backend, newest first."""
    return resolve_backend(backend).list_clusters()


def connect(name: str, backend: str | Backend | None = None, timeout: float | None = None,
            **strategy_kwargs):
    """Make this process the client (chief) of in-graph cluster ``name``.

    Waits (``timeout`` seconds, default: option ``ready_timeout``) until its
    servers are ready and returns a ``tf.distribute.ParameterServerStrategy``:
    variables created in its scope live on the parameter servers, and
    ``tf.distribute.coordinator.ClusterCoordinator(strategy).schedule``
    runs functions on the workers.  From then on :func:`report_progress`
    in this process reports the cluster's progress (as ``chief-0``).
    """
    return get(name, backend).connect(timeout=timeout, **strategy_kwargs)


def resolver(name: str, backend: str | Backend | None = None, timeout: float | None = None):
    """A ``ClusterResolver`` for in-graph cluster ``name`` with this process as its chief.

    For code that builds its own strategy, as TensorFlow's parameter-server
    tutorial does: replace its in-process cluster line with
    ``cluster_resolver = tk.resolver("ig")`` and the rest runs unchanged.
    """
    return get(name, backend).resolver(timeout=timeout)


def render_objects(
    spec: ClusterSpec, backend: str | Backend = "kubernetes", tensorboard: bool = False
) -> list[dict]:
    """The objects a backend would apply for ``spec``, without touching any cluster."""
    return resolve_backend(backend).render(spec, tensorboard=tensorboard)


def render(spec: ClusterSpec, backend: str | Backend = "kubernetes", tensorboard: bool = False) -> str:
    """The YAML a backend would apply for ``spec`` (see :func:`render_objects`)."""
    return dump_yaml(render_objects(spec, backend, tensorboard))


def serving_secret_apart(spec_kwargs: dict[str, Any], source_url: str | None) -> tuple[dict, dict]:
    """For ``render --serve M --from URL``: (the spec's keywords, the serving's).  The
    ``--credentials-secret`` is the serving fetch's; the spec keeps it too when one of its own
    URLs (script, files, data dir, backup) needs it, else it would refuse it as unused."""
    secret = spec_kwargs.get("credentials_secret")
    if not (source_url and secret):
        return spec_kwargs, {"source_url": source_url} if source_url else {}
    urls = [spec_kwargs.get(k) for k in ("script_path", "data_dir", "log_dir", "backup_url")]
    urls += list(spec_kwargs.get("files") or [])
    own = any(storage.is_url(u) for u in urls)
    keep = spec_kwargs if own else {**spec_kwargs, "credentials_secret": None}
    return keep, {"source_url": source_url, "credentials_secret": secret}


def render_serving(spec: ClusterSpec, model: str, backend: str | Backend = "kubernetes",
                   **serving: Any) -> list[dict]:
    """The objects that would serve ``model`` of ``spec`` (TF Serving Deployment + Service)."""
    return resolve_backend(backend).render_serving(spec, model, **serving)


def serve(name: str, backend: str | Backend | None = None, *, model: str | None = None,
          stop: bool = False, **serving: Any):
    """Serve cluster ``name``'s newest exported model with TensorFlow Serving's REST and gRPC APIs.

    Returns a :class:`~tfk8s_magics.serving.ServingInfo` (endpoint, model,
    version); ``stop=True`` removes the server instead and returns whether
    one was running.  Kubernetes options: ``replicas``, ``cpu``, ``memory``, ``credentials_secret``
    (for ``source_url``; default: the cluster's).  ``source_url``: serve from object storage, e.g.
    the cluster's ``--backup`` URL, instead of its log dir (on Kubernetes an init container fetches it).
    """
    return get(name, backend).serve(model=model, stop=stop, **serving)


def warm_pool(backend: str | Backend | None = None) -> WarmPool:
    """This process's warm pool of task processes on ``backend`` (default: option ``backend``);
    a SpecError saying so for a backend that keeps none."""
    return resolve_backend(backend).warm_pool()


def train(name: str, trainer: type, backend: str | Backend | None = None, timeout: float | None = None,
          **trainer_options: Any):
    """Train ``trainer`` from this process on in-graph cluster ``name`` (asynchronous: this process
    coordinates its parameter servers and workers); return the Trainer after training."""
    opts = trainer_launch.options_from({**trainer_options, "sync": "async"})
    return get(name, backend).train(trainer, opts, timeout=timeout)


class Cluster:
    """A handle on one cluster: status, logs, wait, TensorBoard, stop, delete."""

    def __init__(self, name: str, backend_obj: Backend) -> None:
        self.name = name
        self.backend = backend_obj

    def __repr__(self) -> str:
        try:
            st = self.status()
        except Exception as e:  # noqa: BLE001 - a repr must not raise
            return f"<Cluster {self.name!r} ({self.backend.name}): {e}>"
        return f"<Cluster {self.name!r} ({st.backend}, {st.mode}): {st.phase}>"

    @property
    def spec(self) -> ClusterSpec:
        """The spec it was launched with."""
        return self.backend.spec(self.name)

    def status(self) -> ClusterStatus:
        """Its current status (phase, tasks, progress)."""
        return self.backend.status(self.name)

    def events(self) -> list[Event]:
        """What happened to it, oldest first."""
        return self.backend.events(self.name)

    def watch(self, stop: threading.Event | None = None) -> Iterator[ClusterStatus]:
        """Yield its status at every change until it has ended."""
        return self.backend.watch(self.name, stop or threading.Event())

    def wait(self, timeout: float | None = None) -> ClusterStatus:
        """Wait until it has succeeded, failed or been stopped; return the final status.

        A failed or stopped cluster is waited for until every task has ended too (its peers are
        still being stopped when the failure is written); after a success, parameter servers
        run on for their grace period and are not waited for.  ``timeout`` is seconds ≥ 0;
        None or an infinite value waits without a limit.
        """
        st = self._wait(_ended, _check_timeout(timeout), "end", give_up=True)
        if st.cannot_start and not st.terminal:  # it would wait for ever: say why now
            raise LaunchFailed(f"cluster {self.name!r} {st.cannot_start}.")
        return st

    def wait_ready(self, timeout: float | None = 180.0) -> ClusterStatus:
        """Wait until every task is ready; raise LaunchFailed if the cluster ends first."""
        st = self._wait(lambda st: st.ready or st.terminal, _check_timeout(timeout), "be ready",
                        give_up=True)
        if st.cannot_start and not st.ready:  # it would wait for ever: say why now
            raise LaunchFailed(f"cluster {self.name!r} {st.cannot_start}.")
        if not st.ready:
            bad = [t for t in st.tasks if t.phase == Phase.FAILED]
            details = ""
            if bad:
                lines = self.backend.read_logs(self.name, bad[0].name, tail=15)
                details = f"last lines of {bad[0].name}:\n" + "\n".join(line.text for line in lines)
            raise LaunchFailed(
                f"cluster {self.name!r} {st.phase} before all its tasks were ready: {st.reason}.",
                details,
            )
        return st

    def _wait(self, done, timeout: float | None, what: str, give_up: bool = False) -> ClusterStatus:
        """Wait until ``done(status)``; with ``give_up``, also once the cluster cannot start
        (``status.cannot_start``: it would wait for ever)."""
        stop = threading.Event()
        timer = threading.Timer(timeout, stop.set) if timeout is not None else None
        if timer:
            timer.daemon = True
            timer.start()
        try:
            last = None
            for st in self.backend.watch(self.name, stop):
                last = st
                if done(st) or (give_up and st.cannot_start):
                    return st
            last = self.status()
            if done(last) or (done is _ended and last.terminal):  # the backend has nothing more to say
                return last
        finally:
            if timer:
                timer.cancel()
        raise ClusterTimeout(
            f"cluster {self.name!r} did not {what} within {timeout:g} s "
            f"(it is {last.phase if last else '?'}); "
            f"look at %tfcluster status {self.name} and its logs, or wait longer."
        )

    def logs(self, task: str | None = None, tail: int | None = None, previous: bool = False) -> str:
        """Its kept log: one task's, or every task's with a ``[task]`` prefix.  ``previous``: the
        log of the run this one replaced (a re-run launch keeps it)."""
        lines = self._previous_logs(task, tail) if previous else self.backend.read_logs(self.name, task, tail)
        if task:
            return "\n".join(line.text for line in lines)
        return "\n".join(f"[{line.task}] {line.text}" for line in lines)

    def _previous_logs(self, task: str | None, tail: int | None) -> list:
        lines = self.backend.read_previous_logs(self.name, task, tail)
        if lines is None:
            raise NoPreviousRun(
                f"cluster {self.name!r} keeps no previous run: a launch that replaces an ended "
                "cluster of the same name keeps its logs (not one that used its own --log-dir)."
            )
        return lines

    def logs_by_task(self, tail: int | None = None, previous: bool = False) -> dict[str, str]:
        """Every task's kept log (the last ``tail`` lines of each), task by task, in task order;
        ``previous``: the replaced run's."""
        out: dict[str, list[str]] = {} if previous else {t.name: [] for t in self.spec.tasks()}
        lines = self._previous_logs(None, tail) if previous else self.backend.read_logs(self.name, None, tail)
        for line in lines:
            out.setdefault(line.task, []).append(line.text)
        return {task: "\n".join(lines) for task, lines in out.items()}

    def follow(self, stop: threading.Event | None = None, tasks: list[str] | None = None,
               from_start: bool = True) -> Iterator[LogLine]:
        """Yield log lines as tasks print them, until it ends (or ``stop`` is set)."""
        return self.backend.follow_logs(self.name, stop or threading.Event(), tasks, from_start)

    def tensorboard(self) -> TensorBoardInfo:
        """Start or reuse a TensorBoard on its log dir (see :func:`tfk8s_magics.ui.show_tensorboard`)."""
        return self.backend.tensorboard(self.name)

    def stop(self) -> ClusterStatus:
        """End its tasks; the record and logs stay (this process lets go of its servers first)."""
        ingraph.disconnect(self.backend.name, self.name)
        return self.backend.stop(self.name)

    def delete(self, keep_logs: bool = False, force: bool = False):
        """Remove it and all it created (its logs too, unless ``keep_logs``); ``force`` also removes a
        cluster whose state is unreadable (local backend)."""
        ingraph.disconnect(self.backend.name, self.name)
        ClusterFeed.forget(self.backend, self.name)
        end_redirect((self.backend.name, self.name))
        extra = {"force": True} if force else {}
        kept = self.backend.delete(self.name, keep_logs=keep_logs, **extra)
        announce_deleted(self.backend, self.name)  # every view in this process, at once
        return kept

    def serve(self, model: str | None = None, stop: bool = False, **serving: Any):
        """Serve (or, with ``stop``, stop serving) its newest exported model; see :func:`serve`."""
        if stop:
            return self.backend.stop_serving(self.name)
        return self.backend.serve(self.name, model=model,
                                  **{k: v for k, v in serving.items() if v is not None})

    def serving(self):
        """What it serves now (a ServingInfo), or None."""
        return self.backend.serving(self.name)

    def train(self, trainer: type, trainer_options=None, timeout: float | None = None):
        """In-graph: train ``trainer`` with this process as the coordinator; return the Trainer."""
        trainer_options = trainer_options or TrainerOptions(sync="async")
        strategy = self.connect(timeout=timeout)
        settings = {"cluster": self.name}
        where = self.status().log_dir
        if where.path and where.volume is None:  # a directory this process can write to
            settings.update(log_dir=where.path, checkpoint_dir=f"{where.path}/checkpoints")
        return trainer_runtime.train(trainer(trainer_options, **settings), {}, strategy=strategy)

    def connect(self, timeout: float | None = None, **strategy_kwargs):
        """Return a ParameterServerStrategy with this process as the coordinator (in-graph only).

        ``strategy_kwargs`` go to the strategy (``variable_partitioner=``).  The
        same options again return the same strategy; other options build a new
        one; after a relaunch of the cluster it connects to the new servers.
        """
        addresses = self._in_graph_addresses(timeout)
        try:
            strategy = ingraph.strategy(self, addresses, strategy_kwargs,
                                        ready=lambda left: self.wait_ready(max(left, 1.0)))
        except ingraph.ConnectFailed as e:
            raise BackendError(f"connect: {e}.") from e
        coordinator = ingraph.coordinator(self, addresses)
        # report_progress() in this kernel now shows in the cluster's status.
        redirect_progress(coordinator.progress, coordinator.task, key=(self.backend.name, self.name))
        return strategy

    def resolver(self, timeout: float | None = None):
        """A ``ClusterResolver`` of this in-graph cluster, this process as chief (:func:`resolver`)."""
        return ingraph.resolver(self, self._in_graph_addresses(timeout))

    def _in_graph_addresses(self, timeout: float | None) -> dict[str, list[str]]:
        spec = self.spec
        if spec.mode != IN_GRAPH:
            raise SpecError(
                f"cluster {self.name!r} is between-graph: its workers run the script themselves. "
                "connect and resolver work on clusters launched with --mode in-graph."
            )
        self.wait_ready(options.get("ready_timeout", timeout))
        return self.backend.addresses(self.name)


make_spec.__doc__ += "\n    Options:\n\n" + "\n".join(
    f"    * ``{o.name}``: {o.help}" for o in options.spec_options()
)


def _ended(st: ClusterStatus) -> bool:
    """The cluster ended, and after a failure or a stop so did every task (nothing runs on)."""
    if not st.terminal:
        return False
    return st.phase == Phase.SUCCEEDED or all(t.phase in Phase.TERMINAL for t in st.tasks)


def _check_timeout(timeout: float | None) -> float | None:
    """A wait's ``timeout``: seconds ≥ 0; an infinite one (or one no timer can hold) is no limit."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout != timeout or timeout < 0:
        raise SpecError(f"timeout must be a number of seconds ≥ 0, not {timeout!r}; leave it out (or give "
                        "inf) to wait without a limit.")
    return None if timeout >= threading.TIMEOUT_MAX else float(timeout)
