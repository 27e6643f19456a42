"""Where a local cluster keeps its files.

::

    <state_dir>/clusters/<name>/
        cluster.json     the record: spec, ports, owner (written once at launch; schema_version)
        status.json      phases of the cluster and its tasks (the supervisor rewrites it)
        events.jsonl     what happened, one JSON object per line
        script.py        the training script (between-graph)
        supervisor.log   the supervisor's own output
        tensorboard.json the TensorBoard serving this cluster, if any
        progress/<task>.jsonl  progress records (see runtime.progress)
        logs/            the default log dir: tasks/<task>.log, checkpoints/, summaries
        data/            the default data dir

A log or data dir the user names lives where the user said and is never
deleted by us.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import options


def default_state_dir() -> Path:
    """Option ``state_dir``: ``$TFK8S_STATE_DIR``, else ``$XDG_DATA_HOME/tfk8s``."""
    return Path(options.get("state_dir")).expanduser()


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that a reader sees the old file or the new one, never half."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


#: The version of ``cluster.json`` this code writes.  Readers take the keys they need and
#: ignore the rest, so a new key needs no new version; raise it only when a reader of the
#: previous version would misread a record.  (The spec inside carries its own version.)
RECORD_SCHEMA_VERSION = 1


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Write a cluster's record (``cluster.json``), stamped with :data:`RECORD_SCHEMA_VERSION`."""
    write_json_atomic(path, {"schema_version": RECORD_SCHEMA_VERSION, **record})


def read_json(path: Path) -> Any:
    """Read a JSON file (None when it does not exist)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


@dataclass(frozen=True)
class ClusterDir:
    """The paths of one local cluster."""

    root: Path

    @property
    def name(self) -> str:
        """The cluster's name (its directory's name)."""
        return self.root.name

    @property
    def record(self) -> Path:
        """The cluster's record (``cluster.json``), written at launch."""
        return self.root / "cluster.json"

    @property
    def status(self) -> Path:
        """The supervisor's status snapshot (``status.json``), rewritten at every change."""
        return self.root / "status.json"

    @property
    def events(self) -> Path:
        """The cluster's events (``events.jsonl``), one JSON object per line."""
        return self.root / "events.jsonl"

    @property
    def script(self) -> Path:
        """The copy of the training script the tasks run (``script.py``)."""
        return self.root / "script.py"

    @property
    def files(self) -> Path:
        """The files that travel with the script (``--file``), importable in its tasks."""
        return self.root / "files"

    @property
    def supervisor_log(self) -> Path:
        """The supervisor's own output (``supervisor.log``)."""
        return self.root / "supervisor.log"

    @property
    def tensorboard(self) -> Path:
        """The pid and port of the cluster's TensorBoard (``tensorboard.json``)."""
        return self.root / "tensorboard.json"

    @property
    def progress_dir(self) -> Path:
        """Where the tasks write their progress records (``progress/``)."""
        return self.root / "progress"

    @property
    def default_log_dir(self) -> Path:
        """The log dir used when the spec gives none (``logs/``)."""
        return self.root / "logs"

    @property
    def default_data_dir(self) -> Path:
        """The data dir used when the spec gives none (``data/``)."""
        return self.root / "data"

    def progress_file(self, task: str) -> Path:
        """Where ``task`` appends its progress records (``progress/<task>.jsonl``)."""
        return self.progress_dir / f"{task}.jsonl"


def task_log_path(log_dir: str | Path, task: str) -> Path:
    """Where a task's output is kept: ``<log_dir>/tasks/<task>.log``."""
    return Path(log_dir) / "tasks" / f"{task}.log"
