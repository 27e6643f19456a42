"""The cluster spec: one typed, validated description of a TensorFlow cluster.

Every backend builds from a :class:`ClusterSpec` and nothing else, so a
spec that validates here is a cluster every backend can run.  Validation
happens once, when the spec is made, and each failure is one
:class:`~tfk8s_magics.errors.SpecError` sentence saying what was wrong, the
value given and what to do instead.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import SpecError, TaskNotFound
from .options import BETWEEN, IN_GRAPH, OPTIONS, ROLES
from .scriptcheck import check_strategy
from .storage.urls import check_url, is_url

#: A cluster name must leave room for ``-evaluator-0`` style suffixes in a
#: 63-character Kubernetes name, so it is shorter than a DNS label.
MAX_NAME_LENGTH = 40
#: A DNS-1035 label: task names also serve as hostnames, which must start with a letter.
_CLUSTER_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Set by the platform for every task; a user may not override them.
RESERVED_ENV = frozenset(
    {
        "TF_CONFIG",
        "TFK8S_TASK",
        "TFK8S_CLUSTER",
        "TFK8S_LOG_DIR",
        "TFK8S_DATA_DIR",
        "TFK8S_DATA_URL",
        "TFK8S_CHECKPOINT_DIR",
        "TFK8S_PROGRESS_FILE",
        "TFK8S_READY_FD",
        "TFK8S_ROLE",
        "TFK8S_CLUSTER_DEF",
        "JOB_COMPLETION_INDEX",
        "TFK8S_SCRIPT",
        "TFK8S_SCRIPT_DIR",
        "TFK8S_FILES_DIR",
    }
)
_FILE_NAME = re.compile(r"^[A-Za-z0-9_][-._A-Za-z0-9]*$")
#: A ConfigMap holds at most 1 MiB; leave room for the spec and metadata.
MAX_FILES_BYTES = 900 * 1024
#: A Kueue queue, a PriorityClass, a scheduler: DNS-1123 subdomain names that
#: also fit a label value (the queue name is one).
_SCHEDULING_NAME = re.compile(r"^(?=.{1,63}$)[a-z0-9]([-.a-z0-9]*[a-z0-9])?$")
_LABEL_KEY = r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
#: A node label requirement: key=value, key!=value, key, !key.
_NODE_REQUIREMENT = re.compile(
    rf"^(!?{_LABEL_KEY}|{_LABEL_KEY}!?=([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?)$"
)


@dataclass(frozen=True, order=True)
class Task:
    """One task of a cluster: a role and an index, named ``worker-1``."""

    role: str
    index: int

    @property
    def name(self) -> str:
        """The task's name, ``<role>-<index>``: ``ps-0``, ``worker-1``."""
        return f"{self.role}-{self.index}"

    @classmethod
    def parse(cls, name: str) -> Task:
        """Parse ``worker-1`` into ``Task("worker", 1)``."""
        role, sep, index = name.rpartition("-")
        if not sep or role not in ROLES or not index.isdigit():
            raise SpecError(
                f"{name!r} is not a task name: use <role>-<index> with a role among "
                f"{', '.join(ROLES)}, for example 'worker-0' or 'ps-1'."
            )
        return cls(role, int(index))

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Resources:
    """What one task asks for.  Used by the Kubernetes backend; the local
    backend records it but cannot enforce it."""

    cpu: str | None = None
    memory: str | None = None
    gpus: int = 0

    def __post_init__(self) -> None:
        for what in ("cpu", "memory", "gpus"):
            object.__setattr__(self, what, OPTIONS[what].validate(getattr(self, what)))

    def to_dict(self) -> dict[str, Any]:
        """These resources as a plain dict."""
        return dataclasses.asdict(self)


def validate_name(name: str) -> str:
    """Check that ``name`` is a DNS-1123 label short enough for task names."""
    if not isinstance(name, str) or not name:
        raise SpecError("a cluster needs a name: give one such as 'mnist'.")
    if len(name) > MAX_NAME_LENGTH or not _CLUSTER_NAME.match(name):
        raise SpecError(
            f"cluster name {name!r} is not valid: use at most {MAX_NAME_LENGTH} "
            "lowercase letters, digits and '-', starting with a letter and not "
            "ending with '-' (for example 'mnist-2')."
        )
    return name


def check_script(source: str, filename: str = "<cell>") -> None:
    """Raise :class:`SpecError` if ``source`` does not compile."""
    if "\0" in source:  # compile() says so without a line (Python 3.11.4+: SyntaxError, lineno None)
        line = source.count("\n", 0, source.index("\0")) + 1
        raise SpecError(f"the training script contains a NUL byte at {filename} line {line}: "
                        "remove it and launch again.")
    try:
        compile(source, filename, "exec")
    except SyntaxError as e:
        raise SpecError(
            f"the training script does not compile: {e.msg} at {filename} line "
            f"{e.lineno}; fix the script and launch again."
        ) from None
    except ValueError as e:  # e.g. null bytes
        raise SpecError(f"the training script cannot be read as Python: {e}.") from None


#: The spec fields checked by their option's check (see :mod:`.options`).
_CHECKED = ("mode", "workers", "ps", "chief", "evaluator", "restart_budget", "ps_grace_period",
            "log_claim", "data_claim", "credentials_secret", "data_size", "log_size")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class ClusterSpec:
    """A validated description of one TensorFlow cluster.

    ``replicas`` maps each role (``chief``, ``ps``, ``worker``,
    ``evaluator``) to its task count.  ``script`` is the training script's
    source: required for between-graph, forbidden for in-graph (there the
    notebook is the client).  Construction validates everything and raises
    :class:`SpecError` with one actionable sentence.
    """

    name: str
    mode: str = OPTIONS["mode"].default
    workers: int = OPTIONS["workers"].default
    ps: int = OPTIONS["ps"].default
    chief: int = OPTIONS["chief"].default
    evaluator: int = OPTIONS["evaluator"].default
    script: str | None = None
    script_name: str = "<cell>"
    env: Mapping[str, str] = field(default_factory=dict)
    #: Files that travel with the script (``--file``): name → text; importable beside it.
    files: Mapping[str, str] = field(default_factory=dict)
    resources: Mapping[str, Resources] = field(default_factory=dict)
    image: str | None = None
    log_dir: str | None = None
    data_dir: str | None = None
    log_claim: str | None = None
    data_claim: str | None = None
    #: Sizes of the ``/data`` and ``/log`` claims a launch creates (None: the backend's settings).
    data_size: str | None = None
    log_size: str | None = None
    restart_budget: int = OPTIONS["restart_budget"].default
    ps_grace_period: float = OPTIONS["ps_grace_period"].default
    legacy_keras: bool = OPTIONS["legacy_keras"].default
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    ttl_after_finished: float | None = None
    owner: str | None = None
    # Kubernetes scheduling (the local backend records these and ignores them).
    #: Kueue LocalQueue (``kueue.x-k8s.io/queue-name``): admitted as one gang.
    queue: str | None = None
    #: PriorityClass of every task pod (Kueue reads it as the workload's priority).
    priority: str | None = None
    #: ``schedulerName`` of every task pod (e.g. Volcano, coscheduling).
    scheduler: str | None = None
    #: Seconds a run may last before it fails (None: no limit).
    active_deadline: float | None = None
    #: Roles whose pods prefer distinct nodes (pod anti-affinity on the node).
    spread: tuple[str, ...] = ()
    #: Role → node label requirements its pods need: ``key=value``,
    #: ``key!=value``, ``key`` (exists) or ``!key`` (does not exist).
    node_affinity: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Object storage (tfk8s_magics.storage); URLs never carry credentials (checked below).
    #: ``--data-dir URL``: synced into the data dir before the tasks start (``data_sync``), else
    #: handed to the script as ``$TFK8S_DATA_URL``.  A URL given as ``data_dir`` moves here.
    data_url: str | None = None
    data_sync: bool = False
    #: ``--backup URL`` (or ``--log-dir URL``): checkpoints and exported models are uploaded there
    #: when the cluster succeeds (best effort when it is stopped).
    backup_url: str | None = None
    #: A Kubernetes Secret with the storage credentials (``--credentials-secret``); Kubernetes only.
    credentials_secret: str | None = None
    #: What was fetched from URLs: ``script.py`` (the script) and each ``--file`` name →
    #: ``{"url", "size", "sha256"}``; the texts themselves are ``script`` and ``files``.
    sources: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise in place once
        set_(self, "name", validate_name(self.name))
        for name in _CHECKED:
            set_(self, name, OPTIONS[name].validate(getattr(self, name)))
        self._validate_shape()
        self._validate_env()
        self._validate_files()
        self._validate_resources()
        self._validate_scheduling()
        self._validate_storage()
        if self.ttl_after_finished is not None:
            ttl = float(self.ttl_after_finished)
            if ttl < 0:
                raise SpecError(f"ttl {ttl} must be ≥ 0 seconds.")
            set_(self, "ttl_after_finished", ttl)
        set_(self, "tolerations", tuple(dict(t) for t in self.tolerations))
        set_(self, "node_selector", dict(self.node_selector))

    def _validate_shape(self) -> None:
        if self.mode == IN_GRAPH:
            if self.script is not None:
                raise SpecError(
                    "an in-graph launch takes no cell body or --script: it starts only "
                    "the servers, and this kernel is the client; run the training code "
                    "in a normal cell after `%tfcluster connect NAME`."
                )
            if self.ps < 1 or self.workers < 1:
                raise SpecError(
                    f"an in-graph cluster needs at least 1 ps and 1 worker, got "
                    f"--ps {self.ps} --workers {self.workers} (--ps defaults to 0, which suits "
                    "between-graph): give e.g. --ps 1 --workers 2."
                )
            if self.chief or self.evaluator:
                raise SpecError(
                    "an in-graph cluster has no chief or evaluator task: the notebook "
                    "kernel is the chief; drop --chief/--evaluator."
                )
        else:
            if self.script is None or not str(self.script).strip():
                raise SpecError(
                    "a between-graph launch needs a training script: put it in the cell "
                    "body of %%tfcluster launch, or give --script PATH."
                )
            if self.workers < 1 and not self.chief:
                raise SpecError(
                    f"--workers {self.workers}: a between-graph cluster needs at least "
                    "1 worker (or a chief) to run the script."
                )
            check_script(self.script, self.script_name)
            check_strategy(self.script, self.ps, between=True)

    def _validate_env(self) -> None:
        env = {}
        for key, value in dict(self.env).items():
            if not isinstance(key, str) or not _ENV_NAME.match(key):
                raise SpecError(
                    f"environment variable name {key!r} is not valid: use letters, "
                    "digits and '_', not starting with a digit."
                )
            if key in RESERVED_ENV:
                raise SpecError(
                    f"{key} is set by tfk8s for every task and cannot be overridden; "
                    "remove it from --env."
                )
            env[key] = str(value)
        object.__setattr__(self, "env", env)

    def _validate_files(self) -> None:
        files = dict(self.files)
        for name, text in files.items():
            if not _FILE_NAME.match(str(name)) or name in ("script.py", "spec.json"):
                raise SpecError(
                    f"--file {name!r}: a file that travels with the script needs a plain name of "
                    "letters, digits, '.', '_' or '-' (not script.py or spec.json); rename it."
                )
            if not isinstance(text, str):
                raise SpecError(f"--file {name!r} must be text (a Python module or data file).")
        if self.mode == IN_GRAPH and files:
            raise SpecError("--file goes with a training script; an in-graph launch runs none.")
        size = sum(len(t.encode()) for t in files.values()) + len((self.script or "").encode())
        if size > MAX_FILES_BYTES:
            raise SpecError(
                f"the script and its --file files are {size} bytes, more than the {MAX_FILES_BYTES} "
                "a Kubernetes ConfigMap holds: put large files on the data volume instead."
            )
        object.__setattr__(self, "files", files)

    def _validate_resources(self) -> None:
        out = {}
        for role, res in dict(self.resources).items():
            if role not in ROLES:
                raise SpecError(
                    f"resources given for unknown role {role!r}: use one of {', '.join(ROLES)}."
                )
            out[role] = res if isinstance(res, Resources) else Resources(**dict(res))
        object.__setattr__(self, "resources", out)

    def _validate_scheduling(self) -> None:
        for what, value in (("--queue", self.queue), ("--priority", self.priority),
                            ("--scheduler", self.scheduler)):
            if value is not None and not _SCHEDULING_NAME.match(str(value)):
                raise SpecError(
                    f"{what} {value!r} is not a valid name: use at most 63 lowercase letters, "
                    "digits, '-' and '.', starting and ending with a letter or digit."
                )
        if self.active_deadline is not None:
            try:
                deadline = float(self.active_deadline)
            except (TypeError, ValueError):
                deadline = 0.0
            if deadline < 1:
                raise SpecError(
                    f"--active-deadline {self.active_deadline!r} is not valid: give whole "
                    "seconds ≥ 1 (a run still going after that many seconds fails)."
                )
            object.__setattr__(self, "active_deadline", float(int(deadline)))
        spread = tuple(dict.fromkeys(self.spread))
        affinity = {role: tuple(reqs) for role, reqs in dict(self.node_affinity).items()}
        for role in (*spread, *affinity):
            if role not in ROLES:
                raise SpecError(
                    f"placement given for unknown role {role!r}: use one of {', '.join(ROLES)}."
                )
        for role, reqs in affinity.items():
            for req in reqs:
                if not _NODE_REQUIREMENT.match(req):
                    raise SpecError(
                        f"node requirement {req!r} for {role} is not valid: use key=value, "
                        "key!=value, key (the label exists) or !key (it does not), e.g. "
                        "ps:!nvidia.com/gpu.present."
                    )
        object.__setattr__(self, "spread", spread)
        object.__setattr__(self, "node_affinity", affinity)

    def _validate_storage(self) -> None:
        set_ = object.__setattr__
        if is_url(self.data_dir):  # --data-dir URL: the data dir itself stays the default one
            if self.data_url not in (None, self.data_dir):
                raise SpecError("give the data URL once: as --data-dir URL (data_url), not both.")
            set_(self, "data_url", self.data_dir)
            set_(self, "data_dir", None)
        if is_url(self.log_dir):  # --log-dir URL: logs stay local, and are backed up there
            if self.backup_url not in (None, self.log_dir):
                raise SpecError(f"--log-dir {self.log_dir!r} is a URL, which means --backup "
                                f"{self.log_dir!r}; it differs from --backup {self.backup_url!r}: give one.")
            set_(self, "backup_url", self.log_dir)
            set_(self, "log_dir", None)
        if self.data_url is not None:
            check_url("--data-dir", self.data_url)
        if self.backup_url is not None:
            check_url("--backup", self.backup_url, writable=True)
        set_(self, "data_sync", bool(self.data_sync))
        if self.data_sync and self.data_url is None:
            raise SpecError("--data-sync copies a --data-dir URL into the data dir before the tasks start: "
                            "give --data-dir s3://bucket/path with it, or drop --data-sync.")
        sources = {}
        for name, src in dict(self.sources).items():
            if name != "script.py" and name not in self.files:
                raise SpecError(f"source {name!r} names neither the script (script.py) nor a --file.")
            src = dict(src)
            check_url("--script" if name == "script.py" else "--file", str(src.get("url")))
            if not _SHA256.match(str(src.get("sha256"))) or not isinstance(src.get("size"), int):
                raise SpecError(f"source {name!r} needs a whole size and a sha256 (64 hex digits).")
            sources[name] = {"url": src["url"], "size": src["size"], "sha256": src["sha256"]}
        set_(self, "sources", sources)
        if self.credentials_secret and not (self.data_url or self.backup_url or sources):
            raise SpecError(
                f"--credentials-secret {self.credentials_secret!r} goes with a URL (--script, --file, "
                "--data-dir or --backup): give one, or drop it."
            )

    # -- derived views -------------------------------------------------
    def replicas(self) -> dict[str, int]:
        """Task count per role, roles with no task left out."""
        counts = {
            "chief": self.chief,
            "ps": self.ps,
            "worker": self.workers,
            "evaluator": self.evaluator,
        }
        return {role: n for role, n in counts.items() if n}

    def tasks(self) -> list[Task]:
        """Every task, chief first, then ps, worker, evaluator."""
        return [Task(role, i) for role, n in self.replicas().items() for i in range(n)]

    def runs_script(self, task: Task) -> bool:
        """Whether ``task`` runs the training script (otherwise it is a server)."""
        return self.mode == BETWEEN and task.role in ("chief", "worker", "evaluator")

    def resources_for(self, role: str) -> Resources:
        """The resources asked for ``role`` (empty when none were given)."""
        return self.resources.get(role, Resources())

    def task(self, name: str) -> Task:
        """Look up a task by name; raise :class:`TaskNotFound` if it is not in the cluster."""
        task = Task.parse(name)
        if task not in self.tasks():
            raise TaskNotFound(
                f"cluster {self.name!r} has no task {name!r}: its tasks are "
                f"{', '.join(t.name for t in self.tasks())}."
            )
        return task

    # -- (de)serialisation --------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record, stamped with :data:`SCHEMA_VERSION`; :meth:`from_dict` reads it."""
        d = dataclasses.asdict(self)
        d["resources"] = {r: res.to_dict() for r, res in self.resources.items()}
        d["tolerations"] = [dict(t) for t in self.tolerations]
        d["schema_version"] = SCHEMA_VERSION
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClusterSpec:
        """Read a record written by :meth:`to_dict`, leniently and without re-validating it.

        As TensorBoard's ``manager._info_from_string``: keys this version
        does not know are ignored (a newer writer never crashes an older
        reader), a missing key takes its default (an older writer), and only
        the types a reader relies on are checked.  The script is not
        compiled again: the spec was validated when it was made.
        """
        wrong = [
            f"{key!r} is {type(data[key]).__name__}, not {getattr(kind, '__name__', 'a number')}"
            for key, kind in _RECORD_TYPES.items()
            if key in data and data[key] is not None and not isinstance(data[key], kind)
        ]
        if not isinstance(data.get("name"), str) or wrong:
            raise SpecError(
                f"the record of cluster {data.get('name')!r} cannot be read "
                f"({'; '.join(wrong) or 'it has no name'}): delete the cluster and launch it again."
            )
        spec = object.__new__(cls)
        for f in dataclasses.fields(cls):
            if f.name in data:
                value = data[f.name]
            elif f.default is not dataclasses.MISSING:
                value = f.default
            else:
                value = f.default_factory()  # type: ignore[misc]
            object.__setattr__(spec, f.name, value)
        set_ = object.__setattr__
        set_(spec, "resources", {r: Resources(**res) for r, res in dict(spec.resources).items()})
        set_(spec, "tolerations", tuple(dict(t) for t in spec.tolerations))
        set_(spec, "spread", tuple(spec.spread))
        set_(spec, "node_affinity", {r: tuple(v) for r, v in dict(spec.node_affinity).items()})
        return spec


#: The version of the record :meth:`ClusterSpec.to_dict` writes.  Raise it only when a
#: reader of the previous version would misread the new one; new keys need no new version.
SCHEMA_VERSION = 1
#: What a reader of a record relies on (anything else is taken as written).
_RECORD_TYPES = {"mode": str, "workers": int, "ps": int, "chief": int, "evaluator": int,
                 "script": str, "env": dict, "resources": dict, "restart_budget": int,
                 "ps_grace_period": (int, float), "legacy_keras": bool, "sources": dict,
                 "data_sync": bool}
