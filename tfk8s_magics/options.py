"""Every option of tfk8s, defined once: name, type, default, help, environment variable, check.

One :class:`Option` entry is the whole definition of a setting.  Everything
else derives from this registry, so adding a flag is one entry here plus the
code that consumes it:

* the ``%tfcluster`` and ``tfk8s`` argument parsers (:func:`build_parser`,
  typed: ``--workers`` is an ``int`` from the first hop);
* the magic's traitlets (``c.TFClusterMagics.default_workers``,
  :func:`defaults_class`), whose default is :func:`get` of the option;
* the Python API's keyword arguments (``tk.launch(name, workers=3)``):
  a keyword left out, or ``None``, resolves with :func:`get`;
* the Kubernetes backend's settings and the hub's environment for the
  extension (:attr:`Option.hub_trait`).

Resolution order, as ``dask.config.get(key, override_with=value)``: an
explicit value, else the option's environment variable (what an
administrator or the hub sets), else its built-in default.  A traitlet set
in an IPython config file is an explicit value.  Checks (ranges, spellings)
run once, when a :class:`~tfk8s_magics.spec.ClusterSpec` is built or a
traitlet is set; the parsers only convert types.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import SpecError

# -- values every layer agrees on ------------------------------------------

#: Replication modes.  ``between``: every worker runs the script.
#: ``in-graph``: only servers run; the notebook kernel is the client.
BETWEEN = "between"
IN_GRAPH = "in-graph"
_MODE_ALIASES = {
    "between": BETWEEN,
    "between-graph": BETWEEN,
    "between_graph": BETWEEN,
    "in-graph": IN_GRAPH,
    "in_graph": IN_GRAPH,
    "ingraph": IN_GRAPH,
}

#: Task roles, in the order tasks are listed and started.
ROLES = ("chief", "ps", "worker", "evaluator")

#: A Kubernetes resource quantity (``500m``, ``4Gi``, ``10``).
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")
#: A DNS-1123 label: the name of most Kubernetes objects (at most 63 characters).
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: A DNS-1123 subdomain: a PersistentVolumeClaim's name.
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$")

#: The task image used when neither the spec nor ``$TFK8S_IMAGE`` names one.
DEFAULT_IMAGE = "tfk8s/tensorflow-task:0.1.0"
#: The task image of roles that ask for GPUs (the task image's tensorflow[and-cuda] variant).
DEFAULT_GPU_IMAGE = "tfk8s/tensorflow-task-gpu:0.1.0"
DEFAULT_STORAGE_CLASS = "glusterfs"
_SA_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


def normalize_mode(mode: str) -> str:
    """Map a user's spelling of a mode to ``between`` or ``in-graph``."""
    key = str(mode).strip().lower()
    if key not in _MODE_ALIASES:
        raise SpecError(
            f"unknown mode {mode!r}: use 'between' (every worker runs the script) "
            f"or 'in-graph' (servers only; this kernel is the client)."
        )
    return _MODE_ALIASES[key]


def in_kubernetes_pod() -> bool:
    """Whether this process runs in a pod with a mounted service account."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and _SA_TOKEN.exists()


# -- converters (text → value) and checks (value → value or SpecError) --------


def parse_bool(text: str) -> bool:
    """``1/true/yes/on`` → True, ``0/false/no/off`` → False; anything else is an error."""
    key = str(text).strip().lower()
    if key in ("1", "true", "yes", "on"):
        return True
    if key in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{text!r} is not a yes/no value: use 1 or 0")


def _whole(text: str) -> int:
    try:
        return int(str(text), 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def per_role(inner: Callable[[str], Any]) -> Callable[[str], Any]:
    """A converter: ``VALUE`` (every role) or ``ROLE=VALUE[,ROLE=VALUE...]`` (``worker=1,ps=0``)."""

    def convert(text: str) -> Any:
        if "=" not in text:
            return inner(text)
        out = {}
        for part in str(text).split(","):
            role, sep, value = part.partition("=")
            if not sep or role.strip() not in ROLES:
                raise argparse.ArgumentTypeError(
                    f"{part!r} is not ROLE=VALUE with a role among {', '.join(ROLES)}")
            out[role.strip()] = inner(value.strip())
        return out

    return convert


def each_role(check: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    """A check applied to one value, or to every value of a role → value mapping."""

    def checked(flag: str, value: Any) -> Any:
        if isinstance(value, Mapping):
            unknown = [r for r in value if r not in ROLES]
            if unknown:
                raise SpecError(f"{flag} names unknown role {unknown[0]!r}: use one of "
                                f"{', '.join(ROLES)}, e.g. {flag} worker=1.")
            return {role: check(flag, v) for role, v in value.items()}
        return check(flag, value)

    return checked


def by_role(value: Any) -> dict[str, Any]:
    """``value`` for every role, or the mapping given (roles left out: None)."""
    if isinstance(value, Mapping):
        return {role: value.get(role) for role in ROLES}
    return dict.fromkeys(ROLES, value)


def _placement(text: str) -> tuple[str, str]:
    role, sep, requirement = text.partition(":")
    if not sep or not requirement:
        raise argparse.ArgumentTypeError(f"{text!r} is not ROLE:REQUIREMENT (e.g. ps:!gpu)")
    return role, requirement


def count(low: int, high: int) -> Callable[[str, Any], int]:
    """A check: a whole number from ``low`` to ``high``, named by its flag in errors."""

    def check(flag: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            try:
                value = int(str(value), 10)
            except ValueError:
                raise SpecError(
                    f"{flag} {value!r} is not a whole number: give a count from {low} to {high}."
                ) from None
        if not low <= value <= high:
            raise SpecError(f"{flag} {value} is out of range: give a count from {low} to {high}.")
        return value

    return check


def _optional(check: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    """``check``, letting ``None`` (not set) through."""
    return lambda flag, value: None if value is None else check(flag, value)


def seconds(high: float, zero_means: str) -> Callable[[str, Any], float]:
    """A check: seconds from 0 to ``high``."""

    def check(flag: str, value: Any) -> float:
        try:
            number = float(value)
            shown = f"{number:g}"
        except (TypeError, ValueError):
            number, shown = -1.0, repr(value)
        if not 0 <= number <= high:
            raise SpecError(
                f"{flag} {shown} is not valid: give seconds from 0 ({zero_means}) to {high:g}."
            )
        return number

    return check


def quantity(flag: str, value: Any) -> str | None:
    """A check: a Kubernetes quantity, or None."""
    if value is not None and not QUANTITY.match(str(value)):
        example = "500m or 2" if "cpu" in flag else "512Mi or 4Gi"
        raise SpecError(f"{flag} {value!r} is not a Kubernetes quantity: use e.g. {example}.")
    return value if value is None else str(value)


def claim(flag: str, value: Any) -> str | None:
    """A check: the name of a PersistentVolumeClaim, or None."""
    if value is not None and not DNS_SUBDOMAIN.match(str(value)):
        raise SpecError(
            f"{flag} {value!r} is not a valid PersistentVolumeClaim name: use lowercase "
            "letters, digits, '-' and '.'."
        )
    return value


def claim_like(kind: str) -> Callable[[str, Any], str | None]:
    """A check: the name of a Kubernetes object of ``kind`` (a DNS-1123 subdomain), or None."""

    def check(flag: str, value: Any) -> str | None:
        if value is not None and (not DNS_SUBDOMAIN.match(str(value)) or len(str(value)) > 253):
            raise SpecError(f"{flag} {value!r} is not a valid {kind} name: use lowercase letters, "
                            "digits, '-' and '.'.")
        return value

    return check


def _mode(flag: str, value: Any) -> str:
    return normalize_mode(value)


def _sync(flag: str, value: Any) -> str:
    """A check: ``sync`` or ``async`` (the Trainer's strategy family)."""
    mode = {"true": "sync", "false": "async"}.get(str(value).strip().lower(), str(value).strip().lower())
    if mode not in ("sync", "async"):
        raise SpecError(f"{flag} {value!r} is not valid: use 'sync' (all-reduce) or 'async' "
                        "(parameter servers).")
    return mode


def _model_name(flag: str, value: Any) -> str | None:
    """A check: a model name (a directory under ``<log dir>/models`` and a Kubernetes name), or None."""
    if value is not None and (not DNS_LABEL.match(str(value)) or len(str(value)) > 63):
        raise SpecError(f"{flag} {value!r} is not a valid model name: use lowercase letters, digits "
                        "and '-' (it names a directory and Kubernetes objects).")
    return value


def _backend_default() -> str:
    return "kubernetes" if in_kubernetes_pod() else "local"


def _state_dir_default() -> str:
    base = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return str(Path(base) / "tfk8s")


def _user_default() -> str:
    return os.environ.get("USER", "")


# -- the registry -------------------------------------------------------------

#: The subcommands a cluster spec is built by.
SPEC_COMMANDS = ("launch", "render")


@dataclass(frozen=True)
class Option:
    """One setting: how it is named, typed, defaulted, documented and checked.

    ``name`` is the keyword of :func:`tfk8s_magics.launch` and the attribute
    of parsed arguments.  ``flag`` is its command-line spelling (``None``:
    ``--name`` with dashes; ``""``: positional; no ``commands``: no flag).
    ``type`` converts text (a flag or an environment variable).  ``default``
    is a value or a zero-argument callable.  ``env`` is the environment
    variable that overrides the default.  ``trait`` names the
    ``c.TFClusterMagics`` traitlet, ``hub_trait`` the ``c.LabSettings``
    traitlet whose value the hub passes to every notebook as ``env``.
    ``check(flag, value)`` normalises a value or raises one SpecError sentence.
    """

    name: str
    type: Callable[[str], Any]
    default: Any
    help: str
    flag: str | None = None
    env: str | None = None
    trait: str | None = None
    hub_trait: str | None = None
    check: Callable[[str, Any], Any] | None = None
    commands: tuple[str, ...] = ()
    action: str = "store"
    nargs: str | None = None
    metavar: str | None = None
    aliases: tuple[str, ...] = ()

    @property
    def option_string(self) -> str:
        """How a user spells it on a command line (``--restarts``), for messages."""
        if self.flag == "":
            return self.name
        return self.flag or "--" + self.name.replace("_", "-")

    def builtin_default(self) -> Any:
        """The default when nothing (no value, no environment variable) is given."""
        return self.default() if callable(self.default) else self.default

    def from_env(self) -> Any:
        """The environment's value (typed), else the built-in default."""
        text = os.environ.get(self.env, "").strip() if self.env else ""
        if not text:
            return self.builtin_default()
        try:
            return self.type(text)
        except (ValueError, argparse.ArgumentTypeError) as e:
            raise SpecError(
                f"environment variable {self.env}={text!r} is not valid for "
                f"{self.option_string} ({e}): fix or unset it."
            ) from None

    def validate(self, value: Any) -> Any:
        """``value`` normalised by this option's check (unchanged without one)."""
        return self.check(self.option_string, value) if self.check else value

    def to_env(self, value: Any) -> str:
        """``value`` as the text of its environment variable."""
        if isinstance(value, bool):
            return "1" if value else "0"
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        return str(value)


_OPTIONS = (
    # -- the cluster spec (launch, render; keywords of tk.launch / make_spec) --
    Option("name", str, None, "cluster name (a DNS-1123 label, e.g. mnist)", flag="",
           commands=("launch", "render", "connect", "resolver", "status", "wait", "tensorboard",
                     "stop", "delete", "events", "dashboard", "logs", "serve")),
    Option("mode", str, BETWEEN, "between (every worker runs the script) | in-graph (servers only)",
           trait="default_mode", check=_mode, commands=SPEC_COMMANDS),
    Option("workers", _whole, 2, "worker tasks", trait="default_workers",
           check=count(0, 256), commands=SPEC_COMMANDS, metavar="N"),
    Option("ps", _whole, 0, "parameter-server tasks (0 for between-graph "
           "MultiWorkerMirroredStrategy; in-graph needs at least 1)",
           trait="default_ps", check=count(0, 256), commands=SPEC_COMMANDS, metavar="N"),
    Option("chief", _whole, 0, "chief task (0 or 1)", check=count(0, 1), commands=SPEC_COMMANDS,
           metavar="N"),
    Option("evaluator", _whole, 0, "evaluator task (0 or 1)", check=count(0, 1),
           commands=SPEC_COMMANDS, metavar="N"),
    Option("script_path", str, None, "path or URL (s3://, gs://, https://, ...) of the training script "
           "(instead of the cell body); a URL is fetched once per cluster",
           flag="--script", commands=SPEC_COMMANDS, metavar="PATH"),
    Option("env", _env_pair, None, "environment variable of every task (repeatable; "
           "--env PYTHONPATH=DIR extends the inherited path)",
           commands=SPEC_COMMANDS, action="append", metavar="KEY=VALUE"),
    Option("files", str, None, "a file (path or URL) that travels with the script, importable beside it "
           "(repeatable; on Kubernetes the modules next to the script must be named so)",
           flag="--file", commands=SPEC_COMMANDS, action="append", metavar="PATH"),
    Option("restart_budget", _whole, 2, "restarts a cluster may spend on crashed tasks",
           flag="--restarts", env="TFK8S_RESTARTS", trait="restart_budget",
           hub_trait="restart_budget", check=count(0, 100), commands=SPEC_COMMANDS, metavar="N"),
    Option("ps_grace_period", _seconds, 30.0,
           "seconds parameter servers live on after the workers finish (0: stop them at once)",
           flag="--ps-grace", env="TFK8S_PS_GRACE", trait="ps_grace_period",
           hub_trait="ps_grace_period", check=seconds(86400, "stop parameter servers at once"),
           commands=SPEC_COMMANDS, metavar="S"),
    Option("legacy_keras", parse_bool, True,
           "run tasks and the in-graph client with tf-keras (TF_USE_LEGACY_KERAS=1), which "
           "TensorFlow's distributed tutorials need under TF 2.21; --no-legacy-keras: Keras 3",
           flag="--no-legacy-keras", env="TFK8S_LEGACY_KERAS", trait="legacy_keras",
           hub_trait="legacy_keras", commands=SPEC_COMMANDS, action="store_false"),
    Option("log_dir", str, None, "log dir (TensorBoard, checkpoints, task logs); a URL "
           "(s3://bucket/run) means --backup URL with the default log dir",
           commands=SPEC_COMMANDS),
    Option("data_dir", str, None, "data dir, or a URL (s3://, gs://, abfs://, hdfs://, https://): "
           "copied into the data dir first with --data-sync, else given to the script as "
           "$TFK8S_DATA_URL", commands=SPEC_COMMANDS),
    Option("data_sync", parse_bool, False, "copy the --data-dir URL into the data dir (/data) before "
           "the tasks start", commands=SPEC_COMMANDS, action="store_true"),
    Option("backup_url", str, None, "upload checkpoints and exported models to this URL when the "
           "cluster succeeds (best effort when stopped)", flag="--backup", commands=SPEC_COMMANDS,
           metavar="URL"),
    Option("credentials_secret", str, None, "Kubernetes Secret holding the storage credentials "
           "(kubernetes; locally they come from your environment or fsspec's config)",
           check=claim_like("Secret"), commands=(*SPEC_COMMANDS, "serve"), metavar="NAME"),
    Option("log_claim", str, None, "existing PVC for /log (kubernetes)", check=claim,
           commands=SPEC_COMMANDS),
    Option("data_claim", str, None, "existing PVC for /data (kubernetes)", check=claim,
           commands=SPEC_COMMANDS),
    Option("image", str, None, "task image (kubernetes; default: $TFK8S_IMAGE)",
           commands=SPEC_COMMANDS),
    Option("cpu", per_role(str), None, "CPU per task, e.g. 2 or 500m, or per role: "
           "worker=2,ps=1 (kubernetes)", check=each_role(quantity), commands=SPEC_COMMANDS),
    Option("memory", per_role(str), None, "memory per task, e.g. 4Gi, or per role: "
           "worker=8Gi,ps=2Gi (kubernetes)", check=each_role(quantity), commands=SPEC_COMMANDS),
    Option("gpus", per_role(_whole), 0, "GPUs per task, or per role: worker=1 so parameter "
           "servers take none (kubernetes; GPU tasks get the nvidia.com/gpu toleration)",
           check=each_role(count(0, 64)), commands=SPEC_COMMANDS, metavar="N|ROLE=N"),
    Option("queue", str, None, "Kueue LocalQueue: the cluster is admitted as one gang "
           "(kueue.x-k8s.io/queue-name; kubernetes)", commands=SPEC_COMMANDS, metavar="NAME"),
    Option("priority", str, None, "PriorityClass of every task pod (Kueue's workload priority; "
           "kubernetes)", commands=SPEC_COMMANDS, metavar="CLASS"),
    Option("scheduler", str, None, "schedulerName of every task pod, e.g. volcano (kubernetes)",
           commands=SPEC_COMMANDS, metavar="NAME"),
    Option("active_deadline", _seconds, None, "seconds a run may last before the cluster fails "
           "(kubernetes)", commands=SPEC_COMMANDS, metavar="S"),
    Option("ttl", _seconds, None, "seconds JobSet keeps a finished cluster's pods and JobSet before "
           "deleting them (ttlSecondsAfterFinished; the record and volumes stay; kubernetes)",
           env="TFK8S_TTL", hub_trait="default_ttl", check=_optional(seconds(
               365 * 86400, "delete at once")), commands=SPEC_COMMANDS, metavar="S"),
    Option("detached_ttl", _seconds, 86400.0, "the --ttl of a --detach'ed launch that gives none, so "
           "finished detached runs do not pile up (an administrator's default; kubernetes)",
           env="TFK8S_DETACHED_TTL", hub_trait="detached_ttl", check=seconds(
               365 * 86400, "delete at once")),
    Option("spread", str, None, "spread this role's pods across nodes (repeatable; kubernetes)",
           commands=SPEC_COMMANDS, action="append", metavar="ROLE"),
    Option("node_affinity", _placement, None, "a node label this role needs: ROLE:key=value, "
           "ROLE:key!=value, ROLE:key or ROLE:!key, e.g. ps:!nvidia.com/gpu.present "
           "(repeatable; kubernetes)", commands=SPEC_COMMANDS, action="append",
           metavar="ROLE:REQ"),
    # -- the Trainer (tfk8s_magics.trainer: TrainerOptions is made of these) ----
    Option("trainer", str, None, "name of the tfk8s_magics.Trainer subclass the cell defines: the "
           "platform runs it with the options below", commands=SPEC_COMMANDS, metavar="CLASS"),
    Option("steps", _whole, 100, "Trainer: training steps in total (global batches)",
           check=count(1, 10**9), commands=SPEC_COMMANDS, metavar="N"),
    Option("batch_size", _whole, 64, "Trainer: global batch size (split across the replicas)",
           check=count(1, 10**7), commands=SPEC_COMMANDS, metavar="N"),
    Option("sync", str, "sync", "Trainer: sync (MultiWorkerMirroredStrategy, all-reduce) or async "
           "(ParameterServerStrategy coordinated by the chief, or in-graph by this kernel)",
           check=_sync, commands=SPEC_COMMANDS, metavar="sync|async"),
    Option("checkpoint_every", _whole, 50, "Trainer: steps between checkpoints (0: only at the end)",
           check=count(0, 10**9), commands=SPEC_COMMANDS, metavar="N"),
    Option("summary_every", _whole, 10, "Trainer: steps between TensorBoard summaries",
           check=count(1, 10**9), commands=SPEC_COMMANDS, metavar="N"),
    Option("model_name", str, None, "Trainer: name of the exported model (default: the cluster's)",
           check=_model_name, commands=SPEC_COMMANDS, metavar="NAME"),
    Option("export", parse_bool, True, "Trainer: export a SavedModel on the chief after training "
           "(--no-export: do not)", flag="--no-export", commands=SPEC_COMMANDS, action="store_false"),
    Option("use_gpu", parse_bool, True, "Trainer: let TensorFlow use GPUs (--no-gpu: CPU only)",
           flag="--no-gpu", commands=SPEC_COMMANDS, action="store_false"),
    # -- serving (serve; render --serve) -----------------------------------------
    Option("model", str, None, "model under <log dir>/models to serve (default: the cluster's)",
           check=_model_name, commands=("serve",)),
    Option("replicas", _whole, 1, "serving replicas (kubernetes)", check=count(1, 50),
           commands=("serve",), metavar="N"),
    Option("serving_cpu", str, None, "CPU per serving replica, e.g. 500m (kubernetes)", flag="--cpu",
           check=quantity, commands=("serve",)),
    Option("serving_memory", str, None, "memory per serving replica, e.g. 1Gi (kubernetes)",
           flag="--memory", check=quantity, commands=("serve",)),
    Option("stop_serving", parse_bool, False, "stop serving and remove the server", flag="--stop",
           commands=("serve",), action="store_true"),
    Option("source_url", str, None, "serve from this URL instead of the log dir: a --backup URL "
           "(its models/) or a models dir holding <model>/<version>/ (kubernetes: fetched by an init "
           "container, with --credentials-secret)", flag="--from", commands=("serve", "render"),
           metavar="URL"),
    Option("serve_model", str, None, "include TF Serving of MODEL (Deployment + Service)",
           flag="--serve", check=_model_name, commands=("render",), metavar="MODEL"),
    # -- how a launch runs ----------------------------------------------------
    Option("detach", parse_bool, False, "keep running after this kernel exits",
           commands=("launch",), action="store_true"),
    Option("show_dashboard", parse_bool, True,
           "show the live dashboard (without widgets: a streaming log view) under the launch cell",
           flag="--no-dashboard", aliases=("--no-follow",), trait="show_dashboard",
           commands=("launch",), action="store_false"),
    Option("replace", parse_bool, False,
           "with --force: delete a running cluster of the same name first (an ended one is always "
           "replaced, its logs kept as the previous run)",
           commands=("launch",), action="store_true"),
    Option("force", parse_bool, False, "launch --replace: replace a running cluster too; delete: "
           "remove a cluster whose state is unreadable", commands=("launch", "delete"), action="store_true"),
    Option("shards", _whole, None, "split each variable over N parameter servers "
           "(a FixedShardsPartitioner)", check=count(1, 4096), commands=("connect",), metavar="N"),
    Option("min_shard_bytes", _whole, None, "split variables into shards of at least B bytes "
           "(a MinSizePartitioner; --shards caps their number)", check=count(1, 2**62),
           commands=("connect",), metavar="B"),
    Option("output_dir", str, None, "write one YAML file per object here", commands=("render",)),
    Option("tensorboard", parse_bool, False, "include a TensorBoard Deployment",
           commands=("render",), action="store_true"),
    Option("timeout", _seconds, None, "seconds to wait (default: ready_timeout for connect, "
           "no limit for wait)", commands=("connect", "resolver", "wait"), metavar="S"),
    Option("keep_logs", parse_bool, False, "keep the log dir", commands=("delete",),
           action="store_true"),
    Option("task", str, None, "one task, e.g. worker-1 (default: all)", flag="",
           commands=("logs",), nargs="?"),
    Option("tail", _whole, None, "only the last N lines (per task)", check=count(0, 10**6),
           commands=("logs",), metavar="N"),
    Option("follow", parse_bool, False, "keep streaming new lines", commands=("logs",),
           action="store_true", aliases=("-f",)),
    Option("previous", parse_bool, False, "the run this one replaced (a re-run launch keeps it)",
           commands=("logs",), action="store_true", aliases=("-p",)),
    # -- where (every subcommand) ---------------------------------------------
    Option("backend", str, _backend_default,
           "backend: 'local' (processes on 127.0.0.1) or 'kubernetes' (default: $TFK8S_BACKEND, "
           "else 'kubernetes' inside a pod with a service account, else 'local')",
           env="TFK8S_BACKEND", trait="default_backend", hub_trait="default_backend",
           commands=("*",)),
    # -- the notebook's views (traitlets only) --------------------------------
    Option("log_lines", _whole, 500,
           "most log lines a live log view holds in the notebook (the files keep all)",
           trait="log_lines", check=count(0, 10**7)),
    Option("ready_timeout", _seconds, 300.0,
           "seconds `launch --mode in-graph` and `connect` wait for the servers to be ready",
           trait="ready_timeout", check=seconds(86400, "do not wait")),
    # -- backend settings (environment only) ---------------------------------
    Option("state_dir", str, _state_dir_default, "where the local backend keeps its clusters",
           env="TFK8S_STATE_DIR"),
    Option("namespace", str, None, "Kubernetes namespace of the clusters (default: the pod's "
           "own, else the kubeconfig context's, else 'default')", env="TFK8S_NAMESPACE"),
    Option("default_image", str, DEFAULT_IMAGE, "task image when a launch names none",
           env="TFK8S_IMAGE", hub_trait="task_image"),
    Option("gpu_image", str, DEFAULT_GPU_IMAGE,
           "task image of roles that ask for GPUs (--gpus) when a launch names none: "
           "TensorFlow for CUDA (the CPU image cannot use GPUs)",
           env="TFK8S_GPU_IMAGE", hub_trait="task_gpu_image"),
    Option("storage_class", str, DEFAULT_STORAGE_CLASS,
           "StorageClass of the volumes the Kubernetes backend creates",
           env="TFK8S_STORAGE_CLASS", hub_trait="storage_class"),
    Option("user", str, _user_default, "the user owning the clusters (labels, records)",
           env="JUPYTERHUB_USER"),
    Option("quiet", parse_bool, True,
           "hide TensorFlow's C++ INFO/WARNING lines and CUDA probing in tasks and the kernel "
           "(TFK8S_QUIET=0 shows them)", env="TFK8S_QUIET"),
    Option("pool_size", _whole, 2,
           "warm task processes (TensorFlow already imported) the local backend keeps ready in "
           "this user's pool, which every kernel of the user shares; 0: this kernel's tasks start "
           "cold", env="TFK8S_POOL_SIZE", trait="pool_size", check=count(0, 64)),
    Option("pool_idle", _seconds, 600.0,
           "seconds without a local launch after which the warm pool ends its waiting processes "
           "(the next launch refills it); 0: never", env="TFK8S_POOL_IDLE", trait="pool_idle",
           check=seconds(7 * 86400, "never")),
    Option("warm_kernel", parse_bool, True,
           "when this kernel's warm pool starts, the kernel imports TensorFlow in the background "
           "too, so an in-graph connect after a warm launch waits for no import (~250 MiB PSS in "
           "the kernel); 0: only an in-graph launch starts that import", env="TFK8S_WARM_KERNEL"),
    Option("size", _whole, None, "set the size of this user's warm pool (shared by the user's "
           "kernels) and start it now; 0 ends its waiting processes and this kernel's use of it",
           commands=("pool",), check=count(0, 64), metavar="N"),
    Option("isolation", str, "netns",
           "how local clusters and their TensorBoards are kept from other users: netns (a private "
           "network namespace each, the default), loopback (only the loopback shim: other hosts are "
           "kept out, local users are not) or off", env="TFK8S_ISOLATION"),
    Option("stall_timeout", _seconds, 120.0,
           "seconds with every task running and no log line, progress or exit before a cluster "
           "is called stalled (0: never)", env="TFK8S_STALL_TIMEOUT"),
)

#: Every option by name.
OPTIONS: Mapping[str, Option] = {o.name: o for o in _OPTIONS}


def get(name: str, override_with: Any = None) -> Any:
    """The value of option ``name``: ``override_with`` unless None, else its env var, else its default.

    Like ``dask.config.get(key, override_with=...)``.  The value is not
    checked here: checks run once, where a spec is built.
    """
    if override_with is not None:
        return override_with
    return OPTIONS[name].from_env()


def for_command(command: str) -> list[Option]:
    """The options (flags and positionals) of one subcommand, in registry order."""
    return [o for o in _OPTIONS if command in o.commands or "*" in o.commands]


def spec_options() -> list[Option]:
    """The options that build a cluster spec (the keywords of :func:`tfk8s_magics.make_spec`)."""
    return [o for o in for_command("launch") if "render" in o.commands and o.name != "name"]


def hub_options() -> list[Option]:
    """The options the hub sets for every notebook (``LabSettings.<hub_trait>`` → ``env``)."""
    return [o for o in _OPTIONS if o.hub_trait]


# -- subcommands and the parser ---------------------------------------------


@dataclass(frozen=True)
class Command:
    """One subcommand of ``%tfcluster`` and ``tfk8s``: name, help, its own defaults."""

    name: str
    help: str
    takes_cell: bool = False
    defaults: Mapping[str, Any] = field(default_factory=dict)


COMMANDS: Mapping[str, Command] = {
    c.name: c
    for c in (
        Command("launch", "launch a cluster (cell body = training script)", takes_cell=True),
        Command("render", "print the Kubernetes YAML without applying it", takes_cell=True,
                defaults={"backend": "kubernetes"}),
        Command("connect", "make this kernel the client of an in-graph cluster"),
        Command("resolver", "a ClusterResolver of an in-graph cluster with this kernel as chief"),
        Command("list", "list clusters"),
        Command("status", "show a cluster's tasks and progress"),
        Command("logs", "show a cluster's logs"),
        Command("wait", "wait until a cluster ends"),
        Command("tensorboard", "start or reuse TensorBoard on a cluster's log dir"),
        Command("stop", "stop a cluster's tasks (logs are kept)"),
        Command("delete", "delete a cluster and what it created"),
        Command("events", "show what happened to a cluster"),
        Command("dashboard", "show a live dashboard of a cluster"),
        Command("pool", "show (or size) the local backend's warm pool of task processes"),
        Command("serve", "serve a cluster's newest exported model (TensorFlow Serving's REST + "
                "gRPC APIs); --stop removes the server"),
    )
}


class SuggestingParser(argparse.ArgumentParser):
    """argparse whose mistakes are one sentence naming the closest flag or subcommand
    ("did you mean --workers?") and where to read the rest (``PROG SUBCOMMAND --help``).

    :meth:`error` raises or prints: front ends override :meth:`fail` (the magic raises a
    ``UsageError``, the CLI prints ``tfk8s: ...`` and exits 2, with no usage block).
    """

    commands: dict[str, argparse.ArgumentParser]
    root: str = ""

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """Parse ``args``; a word no subcommand takes is :meth:`fail`'s one sentence."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            self.fail(self._unknown(getattr(ns, "cmd", None), extras))
        return ns

    def _unknown(self, cmd: str | None, extras: list[str]) -> str:
        sub = getattr(self, "commands", {}).get(cmd) if cmd else None
        flags = [f for a in (sub or self)._actions for f in a.option_strings]
        where = f"{self.root or self.prog} {cmd}" if cmd else (self.root or self.prog)
        for token in extras:
            if token.startswith("-"):
                flag = token.split("=", 1)[0]
                # Compared without the dashes, which every flag shares ("--bogus" is not "--gpus").
                names = {f.lstrip("-"): f for f in flags}
                close = difflib.get_close_matches(flag.lstrip("-"), list(names), n=1, cutoff=0.75)
                hint = f"; did you mean {names[close[0]]}?" if close else ""
                return f"{where}: unknown option {flag}{hint} ({where} --help lists its options)"
        return (f"{where}: unexpected argument {extras[0]!r} ({where} --help shows what it takes)")

    def error(self, message: str) -> None:  # type: ignore[override]
        """argparse's own mistakes, as one sentence (an unknown subcommand names the closest)."""
        m = re.search(r"invalid choice: '([^']*)'", message)
        if m and "SUBCOMMAND" in message:
            self.fail(unknown_subcommand(m.group(1), getattr(self, "commands", {}), self.root or self.prog))
        where = self.prog
        self.fail(f"{where}: {message} ({self.root or self.prog} {self._cmd_name()}--help shows how)")

    def _cmd_name(self) -> str:
        root = self.root or self.prog
        rest = self.prog[len(root):].strip() if self.prog.startswith(root) else ""
        return f"{rest} " if rest else ""

    def fail(self, sentence: str) -> None:
        """Report ``sentence`` (one sentence, no usage block) and end the parse."""
        self.exit(2, f"{sentence}\n")


def unknown_subcommand(word: str, commands: Iterable[str], prog: str) -> str:
    """The sentence for a subcommand that does not exist (with the closest one, if any)."""
    names = list(commands)
    close = difflib.get_close_matches(word, names, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"unknown subcommand {word!r}{hint} The subcommands: {', '.join(names)} ({prog} --help)"


def add_option(parser: argparse.ArgumentParser, opt: Option, default: Any) -> None:
    """Add ``opt`` to ``parser`` with ``default`` (typed by ``opt.type``)."""
    kwargs: dict[str, Any] = {"help": opt.help}
    if opt.flag == "":
        if opt.nargs:
            kwargs.update(nargs=opt.nargs, default=default)
        parser.add_argument(opt.name, **kwargs)
        return
    kwargs.update(dest=opt.name, action=opt.action)
    if opt.action in ("store_true", "store_false"):
        kwargs["default"] = default
    else:
        kwargs.update(type=opt.type, default=default, metavar=opt.metavar)
        if default is not None and opt.action == "store" and "default" not in opt.help:
            kwargs["help"] += " (default: %(default)s)"
    parser.add_argument(opt.option_string, *opt.aliases, **kwargs)


def build_parser(
    prog: str,
    defaults: Mapping[str, Any],
    parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser,
    commands: Iterable[str] | None = None,
    extra: Iterable[Option] = (),
) -> argparse.ArgumentParser:
    """The parser of ``prog``'s subcommands, every flag from the registry.

    ``defaults`` maps option names to the defaults this front end shows
    (see :func:`defaults`); an option not in it defaults to None.
    ``commands`` limits the subcommands; ``extra`` are options only this
    front end has.
    """
    parser = parser_class(prog=prog, description="Launch and manage TensorFlow clusters.",
                          epilog=f"`{prog} SUBCOMMAND --help` lists a subcommand's options.")
    sub = parser.add_subparsers(dest="cmd", metavar="SUBCOMMAND", parser_class=parser_class)
    if isinstance(parser, SuggestingParser):
        parser.commands, parser.root = {}, prog
    for cmd in COMMANDS.values():
        if commands is not None and cmd.name not in commands:
            continue
        sp = sub.add_parser(cmd.name, help=cmd.help)
        if isinstance(parser, SuggestingParser):
            parser.commands[cmd.name] = sp
            sp.root = prog
        for opt in [*for_command(cmd.name), *(o for o in extra if cmd.name in o.commands)]:
            add_option(sp, opt, cmd.defaults.get(opt.name, defaults.get(opt.name, opt.builtin_default())))
    return parser


def defaults(overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every option's current default: ``overrides`` (e.g. traitlets), else :func:`get`."""
    overrides = overrides or {}
    return {name: get(name, overrides.get(name)) for name in OPTIONS}


#: The traitlets type of each option type.
_TRAIT_TYPES = {_whole: "Int", _seconds: "Float", parse_bool: "Bool", str: "Unicode"}


def defaults_class(class_name: str, doc: str, attr: str = "trait", read_env: bool = True) -> type:
    """A traitlets ``Configurable`` with one config trait per option that has ``attr`` set.

    ``attr="trait"`` gives the magic's traits, ``attr="hub_trait"`` the
    hub's.  With ``read_env``, a trait's default is :meth:`Option.from_env`
    (read when first used, not at import); otherwise the built-in default.
    Setting a trait runs the option's check, so
    ``c.TFClusterMagics.default_ps = -1`` fails with the same sentence as
    ``--ps -1``.
    """
    # Deferred: traitlets' config machinery costs every task process a third of a second
    # at start, and only the magic and the hub build trait classes.
    import traitlets
    from traitlets.config import Configurable

    namespace: dict[str, Any] = {"__doc__": doc}
    for opt in _OPTIONS:
        trait = getattr(opt, attr)
        if not trait:
            continue
        kind = getattr(traitlets, _TRAIT_TYPES[opt.type])
        text = opt.help[:1].upper() + opt.help[1:] + (f" (${opt.env})." if opt.env else ".")
        # An option without a default (None: not set) is a trait that may be None.
        namespace[trait] = kind(help=text, allow_none=opt.default is None).tag(config=True)
        namespace[f"_default_{trait}"] = traitlets.default(trait)(
            lambda self, o=opt: o.from_env() if read_env else o.builtin_default()
        )
        namespace[f"_validate_{trait}"] = traitlets.validate(trait)(
            lambda self, proposal, o=opt: _trait_check(o, proposal["value"])
        )
    return type(Configurable)(class_name, (Configurable,), namespace)


def _trait_check(opt: Option, value: Any) -> Any:
    import traitlets  # deferred, see defaults_class

    try:
        return opt.validate(value)
    except SpecError as e:
        raise traitlets.TraitError(str(e)) from None


def trait_values(configurable: Any) -> dict[str, Any]:
    """Option name → value of every option trait of ``configurable`` (see :func:`defaults_class`)."""
    return {o.name: getattr(configurable, o.trait) for o in _OPTIONS if o.trait}
