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

from ... import options, records


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


def overwrite_json(path: Path, data: Any, dir_fd: int) -> None:
    """Write JSON over the existing file ``path`` in place, padded with spaces to its old length,
    for a disk too full for :func:`write_json_atomic`'s new file: it reuses the blocks the file
    has (no new one while the text fits in them), and a reader sees old text, new text, or new
    text with trailing spaces, never a truncated document.  Raises OSError if it cannot."""
    fd = os.open(path.name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        text = json.dumps(data).encode()
        old = os.fstat(fd).st_size
        os.pwrite(fd, text + b" " * max(0, old - len(text)), 0)
    finally:
        os.close(fd)


def open_private_append(name: str, dir_fd: int, readable: bool = False):
    """Open ``name`` in the directory ``dir_fd`` for appending (binary), created 0600.

    Never through a symlink (``O_NOFOLLOW``: ELOOP), and only a regular file
    of ours with one link: a file planted in a shared dir (a hard link to
    someone's secret, a FIFO) is refused with EPERM naming it.  ``readable``
    opens it for reading too (the supervisor reads its tasks' logs through the
    descriptor it holds, never by name).
    """
    flags = os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    flags |= os.O_RDWR if readable else os.O_WRONLY
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


class NotOurFile(OSError):
    """A path the cluster reads is not a regular file of ours (a symlink, FIFO, device, hard link)."""


def open_for_reading(path: str | os.PathLike, dir_fd: int | None = None) -> int:
    """Open a file of the cluster's for reading the way it was written: never through a symlink,
    never waiting on a FIFO or a device (``O_NOFOLLOW | O_NONBLOCK``), and only a regular file of
    ours with one link (``fstat``).  Returns a blocking descriptor; raises FileNotFoundError when
    there is no file, :class:`NotOurFile` (naming the path and what it is) for anything else there.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as e:
        what = "a symlink (not followed)" if e.errno == errno.ELOOP else (e.strerror or str(e))
        raise NotOurFile(e.errno, what, str(path)) from None
    try:
        check_ours(fd, path)
    except BaseException:
        os.close(fd)
        raise
    os.set_blocking(fd, True)
    return fd


def check_ours(fd: int, path: str | os.PathLike) -> os.stat_result:
    """``fstat`` ``fd``: raise :class:`NotOurFile` unless it is a regular file of ours with one link."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode)
                or stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a file")
        raise NotOurFile(errno.EPERM, f"{kind}, not a regular file (not read)", str(path))
    if st.st_nlink != 1 or st.st_uid != os.geteuid():
        raise NotOurFile(errno.EPERM, "not a file of this user's with a single link (not read)", str(path))
    return st


def read_bounded(path: str | os.PathLike, limit: int) -> bytes | None:
    """At most ``limit + 1`` bytes of a file of ours (:func:`open_for_reading`); None when absent."""
    try:
        fd = open_for_reading(path)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(limit + 1)


def read_json(path: Path) -> Any:
    """Read a JSON file (None when it does not exist).

    Raises :class:`UnreadableState` (naming the file and the cause) for a
    file that is not a regular file of ours, too big, nested too deep, unreadable, or not JSON.
    """
    found, data = _load(path)
    return data if found else None


def _load(path: Path) -> tuple[bool, Any]:
    """(whether the file exists, its JSON value); UnreadableState for anything unreadable."""
    try:
        raw = read_bounded(path, MAX_STATE_BYTES)
    except OSError as e:
        raise UnreadableState(f"{path.name}: {e.strerror or e}") from None
    if raw is None:
        return False, None
    try:
        return True, records.loads(raw, MAX_STATE_BYTES)
    except ValueError as e:
        what = "valid JSON" if isinstance(e, json.JSONDecodeError) else "a record of ours"
        raise UnreadableState(f"{path.name} is not {what} ({str(e)[:200]})") from None


_JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}


def read_mapping(path: Path) -> dict | None:
    """:func:`read_json` for a file that must hold a JSON object (None when absent; a file holding
    anything else, ``null`` included, is :class:`UnreadableState`)."""
    found, data = _load(path)
    if found and not isinstance(data, dict):
        kind = _JSON_TYPES.get(type(data), "value")
        raise UnreadableState(f"{path.name} holds a JSON {kind}, not an object")
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
