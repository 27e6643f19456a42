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

import errno
import json
import os
import secrets
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import options


def default_state_dir() -> Path:
    """Option ``state_dir``: ``$TFK8S_STATE_DIR``, else ``$XDG_DATA_HOME/tfk8s``."""
    return Path(options.get("state_dir")).expanduser()


def write_json_atomic(path: Path, data: Any, dir_fd: int | None = None) -> None:
    """Write JSON so that a reader sees the old file or the new one, never half (mode 0600).

    With ``dir_fd`` (a handle on ``path``'s directory) the file is written in
    that directory whatever its path names now: a supervisor whose dir was
    replaced cannot write into the new one.
    """
    if dir_fd is None:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        tmp_name, where = tmp, {}
    else:
        tmp_name = f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp_name, flags, 0o600, dir_fd=dir_fd)
        where = {"src_dir_fd": dir_fd, "dst_dir_fd": dir_fd}
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp_name, path.name if where else path, **where)
    except BaseException:
        try:
            os.unlink(tmp_name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        raise


def open_private_append(name: str, dir_fd: int):
    """Open ``name`` in the directory ``dir_fd`` for appending (binary), created 0600.

    Never through a symlink (``O_NOFOLLOW``: ELOOP), and only a regular file
    of ours with one link: a file planted in a shared dir (a hard link to
    someone's secret, a FIFO) is refused with EPERM naming it.
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != os.geteuid():
        os.close(fd)
        raise OSError(errno.EPERM, "not a regular file of ours with a single link (refused)", name)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "ab")


#: The version of ``cluster.json`` this code writes.  Readers take the keys they need and
#: ignore the rest, so a new key needs no new version; raise it only when a reader of the
#: previous version would misread a record.  (The spec inside carries its own version.)
RECORD_SCHEMA_VERSION = 1


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Write a cluster's record (``cluster.json``), stamped with :data:`RECORD_SCHEMA_VERSION`."""
    write_json_atomic(path, {"schema_version": RECORD_SCHEMA_VERSION, **record})


#: The largest state file read (a record carries the script and its files: < 1 MiB each).
MAX_STATE_BYTES = 8 * 1024 * 1024


class UnreadableState(ValueError):
    """A state file exists but cannot be read as what it should be; the message says why."""


def read_json(path: Path) -> Any:
    """Read a JSON file (None when it does not exist).

    Raises :class:`UnreadableState` (naming the file and the cause) for a
    file that is not a regular file, too big, unreadable, or not JSON.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UnreadableState(f"{path.name}: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_STATE_BYTES:
            raise UnreadableState(f"{path.name} is not a regular file under {MAX_STATE_BYTES} bytes")
        try:
            return json.loads(f.read(MAX_STATE_BYTES + 1).decode("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise UnreadableState(f"{path.name} is not valid JSON ({e})") from None


def read_mapping(path: Path) -> dict | None:
    """:func:`read_json` for a file that must hold a JSON object (None when absent)."""
    data = read_json(path)
    if data is not None and not isinstance(data, dict):
        raise UnreadableState(f"{path.name} holds a JSON {type(data).__name__}, not an object")
    return data


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
    def coordinator(self) -> Path:
        """Who connected as the in-graph coordinator, and when (``{"pid", "connected"}``)."""
        return self.root / "coordinator.json"

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
