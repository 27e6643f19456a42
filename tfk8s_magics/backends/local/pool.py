"""The warm pool: task processes that have already imported TensorFlow, waiting for a task.

A cold task spends almost all of its start importing TensorFlow (3–5 s on
two cores).  The pool keeps ``pool_size`` (``$TFK8S_POOL_SIZE``) whole
processes that did that ahead of time; a launch hands each one its task and
it starts at once, and the pool starts replacements in the background.

Who owns what:

* the **pool daemon** (``python -m tfk8s_magics.backends.local.pool daemon``)
  belongs to this user: one per task environment (:func:`pool_key`), so every
  kernel of a lab user shares one.  Each process that launches (a notebook
  kernel, or any other owner) joins it (:func:`ensure`: the first one starts
  it); it holds a pidfd of each owner and ends with the last one.  It listens
  on a unix socket in a 0700 directory of this user (and checks the peer's
  uid), is no owner's child (it forks once more at start), and is the
  *parent* of every pooled process, so it reaps them and knows their true exit
  status.  It keeps ``pool_size`` processes and ends them after ``pool_idle``
  seconds unused; the next launch refills it.
* a **pooled process** (``... pool worker FD``) is started with exactly
  the environment a task of a default launch gets (:func:`base_env`,
  loopback shim included), in its own session (process group), with a
  parent-death signal on the daemon.  It imports what a task imports before
  user code (TensorFlow, through the same quiet import, and the task
  runtime), says ``idle`` and waits for one assignment: the task's
  environment, working folder, log file and ready pipe.  It then runs
  :func:`tfk8s_magics.runtime.task.main` exactly as a cold task does and
  exits: it never runs two tasks.  No fork happens after TensorFlow is
  imported.
* the cluster's **supervisor** claims processes (:func:`claim`) for the
  tasks it starts.  It sends the log file, the ready pipe and a *status
  pipe* (SCM_RIGHTS); the daemon writes the task's wait status into the
  status pipe when it reaps it, so the supervisor sees the same exit code or
  signal as for a child of its own (:class:`PooledProcess`).  The daemon
  watches the claiming supervisor with a pidfd and kills the task's process
  group when it dies, as the parent-death signal does for a cold task.

A task runs cold when its import-time environment differs from the pool's
(:func:`mismatch`): TensorFlow and Keras read variables such as
``TF_CPP_MIN_LOG_LEVEL``, ``TF_USE_LEGACY_KERAS`` or ``OMP_NUM_THREADS``
once, at import, so a pooled process could not honour a different value.
Detached clusters always run cold (the pool dies with its owner).  The loopback
shim is the one exception to "same value or cold": tasks behind it (in-graph
clusters) need it preloaded at exec, tasks in a private network namespace have
none, so a pooled process preloads it and a namespaced task switches it off
(every ``bind()`` passes through; :func:`shim_off`): one pool serves both.

**Namespaces** (issue 16: a pooled task trains as fast as a cold one).  A
process that imports TensorFlow on the host and joins a cluster's private
network namespace afterwards keeps the threads the import made in the host's
namespace (and another user's multithreaded process cannot join a user
namespace at all).  So a pooled process never changes namespace after its
import: the pool keeps a **spare namespace** (:func:`isolation.make_namespace`,
held by descriptors, no process) and starts its processes for namespaced
clusters *inside* it, before they import anything.  A namespaced launch's
supervisor **adopts** the spare (:func:`adopt`: it enters that namespace
instead of making a new one, and claims the processes in it; tasks beyond
them start cold, inside it too); the namespace is then that cluster's alone,
its unclaimed processes are ended (:func:`release`), and the pool makes a
fresh spare for its refill.  Processes for in-graph and ``loopback``
clusters stay in the host's namespace.  Which kind the pool keeps follows its
launches: the kind the owner names at start (``ensure(kind)``), then the kind
of the last launch that asked (a claim on the host, or an adoption), one
replacement at a time.  Refills (everything after the first fill) import at
low CPU priority (autogroup nice :data:`REFILL_NICE`; the process sets 0 again
before it runs its task), so they do not slow the clusters that are running.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import re
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ... import ingraph, options, records, taskenv
from ...lifeline import open_pidfd, pid_alive, set_parent_death_signal
from ...runtime import task
from . import isolation, logtail
from .layout import read_bounded

#: Largest message on the pool's sockets (an assignment carries the task's environment).
MAX_MESSAGE = 1 << 20
#: Seconds a claim waits for a pooled process that is still importing TensorFlow.
CLAIM_TIMEOUT = 60.0
#: Seconds after the last claim before the pool starts replacements: a refill imports
#: TensorFlow, which would compete with the just-launched cluster's first steps for CPU.
REFILL_DELAY = 3.0
#: While tasks it handed out still run, the pool waits this long after the last claim before
#: refilling (it refills as soon as they end): training gets the CPU first.
REFILL_BUSY_DELAY = 30.0
#: Seconds an owner-side request waits for the daemon's answer.
REQUEST_TIMEOUT = 10.0
#: Pooled processes that die before they are idle, in a row, before the pool stops refilling
#: (a broken environment would otherwise restart them forever).
MAX_START_FAILURES = 3
#: Autogroup nice of a refill's import (``/proc/PID/autogroup``: any user may raise it and set it
#: back to 0, unlike a thread's nice); a pooled process resets it to 0 before its task.
REFILL_NICE = 10
#: The two kinds of pooled process: in the host's network namespace, or in the pool's spare one.
HOST, NS = "host", "ns"
#: ``available(ns=ANY)``: count processes of either kind that are not reserved for a cluster.
ANY = "*"
#: How the owner and the daemon start processes of this module (``-c``, not ``-m``: the
#: package imports this module first, which ``-m`` warns about in every task's output).
ENTRY = "import sys; from tfk8s_magics.backends.local.pool import main; sys.exit(main())"

#: Variables every task gets its own value of, read after start-up (never at import).
LATE = frozenset({
    "TF_CONFIG", "TFK8S_TASK", "TFK8S_CLUSTER", "TFK8S_LOG_DIR", "TFK8S_DATA_DIR",
    "TFK8S_CHECKPOINT_DIR", "TFK8S_PROGRESS_FILE", "TFK8S_SCRIPT", "TFK8S_SCRIPT_DIR",
    "TFK8S_FILES_DIR", "TFK8S_READY_FD", "TFK8S_CLUSTER_ID", "TFK8S_TERMINATION_FILE",
    "TFK8S_SCRIPT_IS_CELL",
})
#: Variables a task may add (``--env``) that something could read at interpreter start or at
#: ``import tensorflow``: such a task runs cold unless the pool has the same value.
IMPORT_TIME = re.compile(
    r"^(TF_|TENSORFLOW|KERAS|CUDA|NVIDIA|OMP_|MKL|KMP_|XLA|GLOG|ABSL|PYTHON|LD_|GRPC|TPU|"
    r"OPENBLAS|NCCL|HIP_|ROCM|MALLOC|TCMALLOC|JAX|TFK8S_|LC_|LANG|TZ$|HOME$|TMP|TEMP)"
)


# -- what a pooled process is compatible with --------------------------------------
def pool_shim() -> str | None:
    """The loopback shim a pooled process preloads (None: isolation is off or no shim here).

    Tasks behind the shim (in-graph clusters, ``TFK8S_ISOLATION=loopback``, a refused
    namespace) need it preloaded at exec, which a pooled process cannot do after the fact;
    tasks in a private network namespace have none, and a pooled process switches it off for
    them (:func:`shim_off`), so one pool serves both.
    """
    if isolation.wanted() == "off":
        return None
    shim = isolation.shim_path()
    return str(shim) if shim else None


def base_env(source: Mapping[str, str] | None = None, shim: str | None = None) -> dict[str, str]:
    """The environment of a pooled process: what a task of a default launch gets, minus its
    identity, with ``shim`` (:func:`pool_shim`) preloaded."""
    source = os.environ if source is None else source
    env = taskenv.build(source, {}, {}, options.OPTIONS["legacy_keras"].default)
    isolation.preload_env(env, shim)
    return env


def _without_shim(preload: str | None, shim: str) -> str | None:
    """``LD_PRELOAD`` ``preload`` without ``shim`` (None when nothing is left)."""
    rest = [p for p in (preload or "").split(" ") if p and p != shim]
    return " ".join(rest) or None


def shim_off(pool: Mapping[str, str], task: Mapping[str, str], shim: str | None) -> bool:
    """Whether a task must run with the pool's preloaded ``shim`` switched off (its own
    ``LD_PRELOAD`` does not have it: a task in a private network namespace)."""
    return bool(shim) and shim in (pool.get("LD_PRELOAD") or "").split(" ") and (
        shim not in (task.get("LD_PRELOAD") or "").split(" "))


def mismatch(pool: Mapping[str, str], task: Mapping[str, str], shim: str | None = None) -> str:
    """Why a task with environment ``task`` cannot run in a process started with ``pool`` ("" if it can).

    ``shim``: the loopback shim the pool preloads; a task whose ``LD_PRELOAD`` is
    the pool's without it runs with the shim switched off (:func:`shim_off`).
    """
    for key, value in pool.items():
        if key in LATE:
            continue
        if key == "LD_PRELOAD" and shim_off(pool, task, shim) and (
                _without_shim(value, shim) == task.get("LD_PRELOAD")):
            continue
        if key not in task:
            return f"{key} is unset for the task but {value!r} in the pool"
        if task[key] != value:
            return f"{key} is {task[key]!r} for the task but {value!r} in the pool"
    for key in task:
        if key not in pool and key not in LATE and IMPORT_TIME.match(key):
            return f"{key} is set for the task and may be read at start-up; the pool has none"
    return ""


def switch_shim_off(shim: str) -> None:
    """Make the preloaded loopback shim pass every ``bind()`` through (``loopback_bind.c``)."""
    ctypes.c_int.in_dll(ctypes.CDLL(shim), "tfk8s_loopback_bind_off").value = 1


# -- where pools live -----------------------------------------------------------
def runtime_dir() -> Path:
    """This user's 0700 directory of pool sockets (``$XDG_RUNTIME_DIR`` or the temp dir)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    base = base if base and os.path.isdir(base) else tempfile.gettempdir()
    path = Path(base) / f"tfk8s-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = path.lstat()
    if not path.is_dir() or path.is_symlink() or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"{path} is not a private directory of this user (mode 0700)")
    return path


def pool_key(env: Mapping[str, str], shim: str | None) -> str:
    """Which pool of this user serves processes whose tasks get ``env``: kernels with the same
    task environment (all the kernels of one lab) share one pool; a kernel whose environment
    differs (its tasks could not run in that pool's processes) gets its own."""
    text = json.dumps({"env": dict(sorted(env.items())), "shim": shim, "python": sys.executable})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def socket_path(key: str) -> str:
    """The socket of this user's pool ``key`` (:func:`pool_key`) in :func:`runtime_dir`."""
    return str(runtime_dir() / f"pool-{key}.sock")


def _remove_runtime_dir_if_empty(path: Path) -> None:
    """Remove this user's pool directory (:func:`runtime_dir`) once nothing is in it: a stopped
    lab leaves no folder behind."""
    if path.name == f"tfk8s-{os.getuid()}":
        with contextlib.suppress(OSError):  # not empty (another pool is there), or gone
            path.rmdir()


def _message(data: bytes) -> dict:
    """A pool message or record (a JSON object of at most :data:`MAX_MESSAGE` bytes, nested at most
    :data:`records.MAX_DEPTH` deep); ValueError for anything else."""
    message = records.loads(data, MAX_MESSAGE)
    if not isinstance(message, dict):
        raise ValueError("a pool message is not a JSON object")
    return message


class Interrupted(Exception):
    """One of the caller's interrupt descriptors became readable before the pool answered."""


def _request(sock_path: str, message: dict, fds: list[int] = (), timeout: float = REQUEST_TIMEOUT,
             interrupt: Sequence[int] = ()) -> dict:
    """Send one request to a pool daemon and return its answer; raise :class:`Interrupted` (the
    connection closed: the daemon drops the request) if a descriptor of ``interrupt`` becomes
    readable first (it is not read: its owner reads it)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.settimeout(timeout)
        s.connect(sock_path)
        socket.send_fds(s, [json.dumps(message).encode()], list(fds))
        if interrupt:
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("timed out")
                readable, _, _ = select.select([s, *interrupt], [], [], left)
                if s in readable:
                    break
                if readable:
                    raise Interrupted()
        data = s.recv(MAX_MESSAGE)
    if not data:
        raise ConnectionError("the pool closed the connection without answering")
    return _message(data)


def info(sock_path: str, with_memory: bool = True) -> dict | None:
    """A pool's size, its processes and (``with_memory``) their memory; None if it is not running."""
    try:
        return _request(sock_path, {"op": "info", "memory": with_memory})
    except (OSError, ValueError):
        return None


def pools() -> list[dict]:
    """Every running pool of this user (one per task environment, :func:`pool_key`), with
    :func:`info`'s fields."""
    out = []
    try:
        root = runtime_dir()
    except OSError:
        return out
    for sock in sorted(root.glob("pool-*.sock")):
        found = info(str(sock))
        if found is not None:
            out.append(found)
    return out


def _sweep(root: Path) -> None:
    """Remove what pool daemons killed with SIGKILL left: sockets nobody listens on, folders of
    daemons that are gone.  Called with the start lock held (no pool is starting meanwhile)."""
    for sock in root.glob("pool-*.sock"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            try:
                s.connect(str(sock))
            except ConnectionRefusedError:
                sock.unlink(missing_ok=True)
            except OSError:
                pass
    for d in root.glob("pool-*"):
        if not d.is_dir():
            continue
        try:
            pid = int((d / "daemon.pid").read_text())
        except (OSError, ValueError):
            pid = None
        if not pid_alive(pid):
            shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def _start_lock():
    """This user's pool start lock (``flock`` on :func:`runtime_dir`): two kernels starting at
    once find one pool, not two."""
    fd = os.open(runtime_dir(), os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield Path(os.readlink(f"/proc/self/fd/{fd}"))
    finally:
        os.close(fd)


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else plural or word + 's'}"


def describe(found: dict) -> str:
    """One pool as text: size, owners, processes by state, idle memory per process and in total."""
    procs = found["processes"]
    states = {s: sum(1 for p in procs if p["state"] == s) for s in ("idle", "starting", "busy")}
    owners = found.get("owners") or [found["owner"]]
    idle_after = found.get("idle_timeout") or 0
    lines = [f"warm pool of this user (daemon {found['pid']}, shared by {_plural(len(owners), 'kernel')}: "
             f"pids {', '.join(map(str, owners))}): size {found['size']}; "
             f"{states['idle']} idle, {states['starting']} starting, {states['busy']} running a task; "
             f"{found['claimed']} handed out so far"
             + (f"; empties after {idle_after:g} s unused" if idle_after else "; never empties when unused")
             + ("; emptied (unused), refills at the next launch" if found.get("shrunk") else "")
             + ("; closing" if found.get("closing") else "")]
    idle = [p for p in procs if p["state"] == "idle" and "pss" in p]
    if idle:
        pss = sum(p["pss"] for p in idle)
        rss = sum(p["rss"] for p in idle)
        lines.append(f"  idle memory: {pss / len(idle) / 2**20:.0f} MiB PSS ({rss / len(idle) / 2**20:.0f} "
                     f"MiB RSS) per process, {pss / 2**20:.0f} MiB PSS in total")
    return "\n".join(lines)


def memory_line(found: list[dict] | None = None) -> str:
    """One line for ``%tfcluster list``: what this user's warm pool holds (shared by its kernels),
    in processes and PSS; "" when there is none."""
    found = pools() if found is None else found
    if not found:
        return ""
    procs = [p for f in found for p in f["processes"] if p["state"] in ("idle", "starting")]
    pss = sum(p.get("pss", 0) for p in procs)
    owners = {o for f in found for o in (f.get("owners") or [f["owner"]])}
    mine = current()
    shared = "this kernel's included" if any(f.get("socket") == mine for f in found) else "not this kernel's"
    waiting = _plural(len(procs), "TensorFlow process", "TensorFlow processes")
    return (f"warm pool of this user: {waiting} waiting, "
            f"{pss / 2**20:.0f} MiB PSS, shared by {_plural(len(owners), 'kernel')} ({shared}); "
            "%tfcluster pool --size N sets its size (0 frees it)")


def status_text() -> str:
    """``%tfcluster pool``: this user's pool as this process uses it, or what its size setting means."""
    sock, size = current(), pool_size()
    found = info(sock) if sock else None
    if found is not None:
        return describe(found)
    if size == 0:
        return "no warm pool: pool_size is 0 (every task starts cold); %tfcluster pool --size N starts one"
    return (f"warm pool: size {size}, not running yet (it starts, or this kernel joins this user's, at "
            "the first local launch, or now with %tfcluster pool --size N)")


# -- the owner's side: one pool per user, joined by each owner process ----------------
@dataclass
class _Handle:
    sock: str
    key: str
    pid: int  # the daemon's


_handle: _Handle | None = None
_size_override: int | None = None
_idle_override: float | None = None


def configure(size: int | None, idle: float | None = None) -> None:
    """Set this process's pool settings (the magic's ``pool_size`` and ``pool_idle`` traits; None:
    ``$TFK8S_POOL_SIZE``, ``$TFK8S_POOL_IDLE``).  Size 0: this process leaves the pool (its tasks
    start cold).  The size of a running pool changes only with :func:`resize`."""
    global _size_override, _idle_override
    if size is not None:
        options.OPTIONS["pool_size"].validate(size)
    if idle is not None:
        options.OPTIONS["pool_idle"].validate(idle)
    _size_override, _idle_override = size, idle
    if pool_size() == 0:
        shutdown()


def resize(size: int) -> None:
    """Set the size of this user's pool that this process uses (every kernel sharing it sees it)."""
    options.OPTIONS["pool_size"].validate(size)
    if _handle is not None:
        with contextlib.suppress(OSError, ValueError):
            _request(_handle.sock, {"op": "resize", "size": size})


def pool_size() -> int:
    """How many warm processes a pool this process starts keeps (0: it uses none)."""
    return int(options.get("pool_size", override_with=_size_override))


def pool_idle() -> float:
    """Seconds without a launch after which a pool this process starts ends its idle processes
    (0: never); the next launch refills it."""
    return float(options.get("pool_idle", override_with=_idle_override))


def current() -> str | None:
    """The socket of the pool this process uses, or None."""
    if _handle is None or not pid_alive(_handle.pid):
        return None
    return _handle.sock


def daemon_pid() -> int | None:
    """The pid of the daemon of the pool this process uses, or None."""
    return _handle.pid if _handle is not None else None


def default_kind(in_graph: bool = False) -> str:
    """The kind of pooled process a launch needs: :data:`NS` for a cluster in a private network
    namespace (between-graph, ``isolation`` netns), :data:`HOST` for in-graph and the others."""
    return NS if isolation.wanted(options.get("isolation")) == "netns" and not in_graph else HOST


def _join(sock: str, kind: str) -> dict | None:
    """Join a running pool as one of its owners (and wake it if it emptied itself); its
    :func:`info` without memory, or None if no pool answers there or it is closing."""
    try:
        found = _request(sock, {"op": "attach", "kind": kind, "memory": False})
    except (OSError, ValueError):
        return None
    return None if found.get("closing") or "pid" not in found else found


def ensure(kind: str | None = None) -> str | None:
    """Join this user's pool, starting it if none runs; return its socket (None: size 0 or unusable).

    Every launch calls it: it makes this process one of the pool's owners
    (the pool ends when the last one is gone) and refills a pool that emptied
    itself after :func:`pool_idle` seconds unused.  ``kind``: which processes
    a new or emptied pool starts (:data:`NS` or :data:`HOST`; default
    :func:`default_kind`); a running pool follows its launches.  Processes
    whose task environment differs (:func:`pool_key`) use another pool.
    """
    global _handle
    size = pool_size()
    if size <= 0:
        shutdown()
        return None
    kind = kind or default_kind()
    shim = pool_shim()
    env = base_env(shim=shim)
    key = pool_key(env, shim)
    if _handle is not None and _handle.key != key:
        shutdown()  # this process's environment changed: its tasks need another pool
    first = _handle is None
    try:
        sock = socket_path(key)
        found = _join(sock, kind)
        if found is None:
            with _start_lock() as root:
                found = _join(sock, kind)  # another process may have started it meanwhile
                if found is None:
                    _sweep(root)
                    found = {"pid": _start(sock, size, env, shim, kind)}
    except OSError as e:
        print(f"tfk8s: the warm pool could not start ({e}); tasks start cold.", file=sys.stderr)
        return None
    _handle = _Handle(sock, key, int(found["pid"]))
    if first and options.get("warm_kernel"):
        # The owner is the client of its in-graph clusters: warm too, or connect after a
        # sub-second warm launch would wait seconds for its own import of TensorFlow.
        ingraph.preimport(None)
    return sock


def _start(sock: str, size: int, env: dict[str, str], shim: str | None, kind: str) -> int:
    """Start a pool daemon listening on ``sock`` with this process as its first owner; its pid."""
    pool_dir = Path(tempfile.mkdtemp(prefix=Path(sock).stem + "-", dir=runtime_dir()))
    config = pool_dir / "config.json"
    config.write_text(json.dumps({"env": env, "size": size, "owner": os.getpid(), "shim": shim,
                                  "kind": kind, "socket": sock, "idle": pool_idle()}))
    ready_r, ready_w = os.pipe()
    with open(pool_dir / "pool.log", "ab") as log:
        # The daemon forks once more and this child exits at once: the daemon is no process's
        # child that would have to reap it (it serves every owner, and outlives the first).
        proc = subprocess.Popen(
            [sys.executable, "-c", ENTRY, "daemon", str(pool_dir), str(ready_w)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            pass_fds=(ready_w,), start_new_session=True, cwd=pool_dir,
        )
    os.close(ready_w)
    with os.fdopen(ready_r, "rb") as r:
        ok = r.read(32)  # the daemon writes its pid once its socket listens (or exits: EOF)
    proc.wait()
    if not ok.startswith(b"ok "):
        log = "\n".join(logtail.tail_lines(pool_dir / "pool.log", 20))
        shutil.rmtree(pool_dir, ignore_errors=True)
        raise OSError(f"the pool daemon exited at start (code {proc.returncode}): {log}")
    return int(ok.split()[1])


def shutdown() -> None:
    """Leave this user's pool: when this process was its last owner it ends (idle processes at
    once; tasks it handed out run on until they end, then the daemon exits)."""
    global _handle
    if _handle is None:
        return
    handle, _handle = _handle, None
    pidfd = open_pidfd(handle.pid)
    if pidfd is None:
        return
    try:
        try:
            answer = _request(handle.sock, {"op": "detach", "memory": False})
        except (OSError, ValueError):
            return
        busy = any(p["state"] == "busy" for p in answer.get("processes", []))
        # Closing (this was its last owner) with no task running: it ends within moments.
        if answer.get("closing") and not busy and not select.select([pidfd], [], [], REQUEST_TIMEOUT)[0]:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    finally:
        os.close(pidfd)


# -- the supervisor's side ------------------------------------------------------
class PooledProcess:
    """A claimed pooled process, seen by the supervisor like a ``subprocess.Popen`` child.

    ``returncode`` follows Popen (negative: killed by that signal).  The
    status comes from the pool daemon (the process's parent) through
    ``status_fd``; if the daemon itself died, the task was killed with it.
    """

    def __init__(self, pid: int, status_fd: int) -> None:
        self.pid = pid
        self.status_fd = status_fd
        self.returncode: int | None = None

    def wait(self) -> int:
        """Block until the daemon reports the exit status; return it."""
        if self.returncode is not None:
            return self.returncode
        data = b""
        os.set_blocking(self.status_fd, True)
        while chunk := os.read(self.status_fd, 64):  # the supervisor closes the fd (its "pidfd")
            data += chunk
        text = data.decode().strip()
        self.returncode = int(text) if text else -signal.SIGKILL
        return self.returncode

    def poll(self) -> int | None:
        """The return code if the status was reported, else None (never blocks)."""
        return self.returncode


def available(sock_path: str | None, ns: str | None = ANY) -> int:
    """How many processes a pool can hand out now or soon (idle or importing); 0 without a pool.

    ``ns``: those in the namespace a supervisor adopted (:func:`adopt`), None: those on the
    host's network, :data:`ANY`: every one not reserved for a cluster."""
    found = info(sock_path, with_memory=False) if sock_path else None
    if not found or found.get("closing"):
        return 0
    return sum(1 for p in found["processes"] if p["state"] in ("idle", "starting") and (
        p.get("ns") == ns if ns != ANY else not p.get("reserved")))


def adopt(sock_path: str, env: Mapping[str, str]) -> tuple[str | None, list[int], str]:
    """Take the pool's spare network namespace for a cluster whose tasks get environment ``env``:
    (its id, descriptors for :func:`isolation.join_namespace`, "") or (None, [], why not, e.g.
    :func:`mismatch`'s reason).  The processes in it are this caller's alone from now on
    (:func:`claim` with ``ns``)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        try:
            s.settimeout(REQUEST_TIMEOUT)
            s.connect(sock_path)
            s.send(json.dumps({"op": "adopt", "env": dict(env)}).encode())
            data, fds, _, _ = socket.recv_fds(s, MAX_MESSAGE, 2)
            answer = _message(data)
        except (OSError, ValueError) as e:
            return None, [], f"the pool did not answer ({e})"
    if "ns" not in answer or len(fds) != answer.get("fds"):
        for fd in fds:
            os.close(fd)
        return None, [], answer.get("cold", "the pool has no spare namespace")
    return answer["ns"], fds, ""


def release(sock_path: str, ns: str) -> None:
    """Tell the pool a cluster claimed all it will from its adopted namespace: the rest end."""
    with contextlib.suppress(OSError, ValueError):
        _request(sock_path, {"op": "release", "ns": ns, "memory": False})


#: What :func:`claim` says when its wait was interrupted (the caller is stopping: start nothing).
INTERRUPTED = "interrupted while waiting for a warm process"


def claim(sock_path: str, env: Mapping[str, str], cwd: str, log_fd: int, ready_fd: int,
          wait: bool = True, ns: str | None = None,
          interrupt: Sequence[int] = ()) -> tuple[PooledProcess | None, str]:
    """Hand a task to a pooled process: (the process, "") or (None, why it must start cold).

    With ``wait``, a pooled process still importing TensorFlow is waited
    for (it started earlier than a cold one would); without, only an idle one is taken.
    ``ns``: the namespace the caller adopted (:func:`adopt`); None: a process on the host's network.
    ``interrupt``: descriptors that end the wait when readable (a stop signal's wakeup pipe, the
    owner's pidfd): then (None, :data:`INTERRUPTED`), and the pool keeps its process.
    """
    status_r, status_w = os.pipe()
    try:
        mask = os.umask(0o077)
        os.umask(mask)  # the claimer's (the supervisor's): a cold task would inherit it
        message = {"op": "claim", "env": dict(env), "cwd": cwd, "wait": wait, "ns": ns, "umask": mask}
        answer = _request(sock_path, message, [log_fd, ready_fd, status_w], CLAIM_TIMEOUT + REQUEST_TIMEOUT,
                          interrupt)
    except Interrupted:
        os.close(status_r)
        return None, INTERRUPTED
    except (OSError, ValueError) as e:
        os.close(status_r)
        return None, f"the pool did not answer ({e})"
    finally:
        os.close(status_w)
    if "pid" not in answer:
        os.close(status_r)
        return None, answer.get("cold", "the pool refused")
    return PooledProcess(int(answer["pid"]), status_r), ""


# -- memory ------------------------------------------------------------------------
def memory(pid: int) -> dict[str, int]:
    """``rss`` and ``pss`` of a process in bytes (``/proc/PID/smaps_rollup``), {} if gone."""
    out = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Rss", "Pss"):
                    out[key.lower()] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return out


# -- the daemon ----------------------------------------------------------------------
@dataclass(eq=False)
class _Namespace:
    """A network namespace of the pool (:func:`isolation.make_namespace`): the spare, or one a
    cluster's supervisor adopted (``adopter``: its pid; the processes in it are its own)."""
    id: str
    fds: list[int]
    adopter: int | None = None
    adopter_fd: int | None = None

    def close(self) -> None:
        """Drop the pool's hold (what runs in it, and its adopter, keep it alive)."""
        for fd in self.fds:
            os.close(fd)
        self.fds = []


@dataclass
class _Worker:
    proc: subprocess.Popen
    sock: socket.socket
    pidfd: int
    ns: _Namespace | None = None  # None: the host's network namespace
    state: str = "starting"  # starting -> idle -> busy (or retired: ended by the pool, unused)
    started: float = field(default_factory=time.time)
    status_fd: int | None = None
    supervisor_fd: int | None = None

    @property
    def kind(self) -> str:
        return HOST if self.ns is None else NS

    @property
    def reserved(self) -> bool:
        """In a namespace a cluster adopted: for that cluster's supervisor only."""
        return self.ns is not None and self.ns.adopter is not None


@dataclass
class _Claim:
    conn: socket.socket
    message: dict
    fds: list[int]
    deadline: float


def _autogroup_nice(nice: int, pid: int | str = "self") -> bool:
    """Set the autogroup nice of ``pid``'s session (``/proc/PID/autogroup``); whether it took."""
    for _ in range(50):  # the kernel takes one change per 100 ms from an unprivileged process
        try:
            with open(f"/proc/{pid}/autogroup", "w", encoding="ascii") as f:
                f.write(str(nice))
            return True
        except BlockingIOError:
            time.sleep(0.02)
        except OSError:
            return False
    return False


def autogroup_nice(pid: int | str = "self") -> int | None:
    """The autogroup nice of ``pid``'s session, None where there is no autogroup."""
    try:
        with open(f"/proc/{pid}/autogroup", encoding="ascii") as f:
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


class Daemon:
    """The pool daemon's loop: keep ``size`` processes warm, hand them out, report their ends."""

    def __init__(self, pool_dir: Path) -> None:
        config = _message(read_bounded(pool_dir / "config.json", MAX_MESSAGE) or b"")
        self.dir = pool_dir
        self.env: dict[str, str] = config["env"]
        self.shim: str | None = config.get("shim")
        #: Where pooled processes import TensorFlow (a folder of the pool's own, so nothing of a
        #: kernel's working folder shadows a module); each task then runs in its own.
        self.cwd: str = config.get("cwd") or str(pool_dir)
        self.size: int = int(config["size"])
        #: The first owner (the process that started the pool); :attr:`owners` holds them all.
        self.owner: int = int(config["owner"])
        #: The owners (pid -> pidfd): the processes that launch with this pool; it ends with the last.
        self.owners: dict[int, int] = {}
        self.sock_path = str(config.get("socket") or pool_dir / "sock")
        #: Seconds unused (no launch, claim or owner joining) after which the pool ends its spare
        #: processes (0: never); the next launch or claim refills it.
        self.idle: float = float(config.get("idle") or 0)
        self.last_use = time.monotonic()
        self.shrunk = False  # emptied for being unused; refills when woken
        self.waking = False  # woken: the next refill starts every missing process at once
        #: The kind of process refills make (:data:`NS` or :data:`HOST`): the last launch's.
        self.kind: str = config.get("kind") or HOST
        #: The spare namespace NS processes start in (made when the first one is needed).
        self.spare: _Namespace | None = None
        #: Why the kernel refused a namespace (then every process is HOST), "" if it did not.
        self.no_ns = ""
        self.sel = selectors.DefaultSelector()
        self.workers: dict[int, _Worker] = {}
        self.pending: list[_Claim] = []
        self.closing = False
        self.claimed = 0
        self.adopted = 0  # namespaces handed to clusters
        self.last_claim = 0.0
        self.start_failures = 0
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(self.sock_path)
        os.chmod(self.sock_path, 0o600)
        self.listener.listen(64)
        self.sel.register(self.listener, selectors.EVENT_READ, ("listen", None))

    # -- namespaces --------------------------------------------------------------
    def spare_ns(self) -> _Namespace | None:
        """The spare namespace, made now if there is none (None: the kernel refuses them)."""
        if self.spare is None and not self.no_ns:
            try:
                _mode, fds = isolation.make_namespace()
            except OSError as e:
                self.no_ns = f"no private network namespace here ({e.strerror or e})"
                self.kind = HOST
                print(f"tfk8s pool: {self.no_ns}; every pooled process is on the host's network",
                      file=sys.stderr, flush=True)
                return None
            self.spare = _Namespace(os.readlink(f"/proc/self/fd/{fds[-1]}"), fds)
        return self.spare

    def on_adopt(self, conn: socket.socket, peer: int, env: Mapping[str, str]) -> None:
        """A namespaced launch's supervisor takes the spare namespace with the processes in it
        (not if its tasks could not use them: they stay for the next launch)."""
        why = mismatch(self.env, env, self.shim)
        self.last_use = time.monotonic()
        if not why:
            self.kind = NS if not self.no_ns else HOST  # what the next refills make
            self.last_claim = time.monotonic()  # a launch is starting: no refill competes with it
            self.adopted += 1
        ns = None if self.closing or why else self.spare
        if ns is None or not any(w.ns is ns and w.state in ("idle", "starting") for w in self.spares()):
            # Without a warm process in it a spare is no use: the supervisor makes its own.
            why = why or ("the pool is closing" if self.closing
                          else self.no_ns or "no warm process is in the spare namespace")
            self.answer(conn, {"cold": why})
            return
        ns.adopter, ns.adopter_fd = peer, open_pidfd(peer)
        self.spare = None
        if ns.adopter_fd is None:
            self.retire_reserved(ns)
            self.answer(conn, {"cold": "the supervisor exited"})
            return
        self.sel.register(ns.adopter_fd, selectors.EVENT_READ, ("adopter", ns))
        with contextlib.suppress(OSError):
            socket.send_fds(conn, [json.dumps({"ns": ns.id, "fds": len(ns.fds)}).encode()], ns.fds)
        conn.close()
        ns.close()  # the processes in it and its supervisor hold it from now on

    def retire_reserved(self, ns: _Namespace) -> None:
        """End the processes of an adopted namespace that its cluster did not claim."""
        for w in self.workers.values():
            if w.ns is ns and w.state in ("idle", "starting"):
                self.retire(w)
        if ns.adopter_fd is not None:
            self.sel.unregister(ns.adopter_fd)
            os.close(ns.adopter_fd)
            ns.adopter_fd = None

    def release(self, ns_id: str, peer: int) -> None:
        """The adopter claimed what it will: its namespace's unclaimed processes end."""
        for ns in {w.ns for w in self.workers.values() if w.ns is not None}:
            if ns.id == ns_id and ns.adopter == peer:
                self.retire_reserved(ns)

    def retire(self, w: _Worker) -> None:
        """End an unused pooled process (reaped by :meth:`on_worker_exit`)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(w.proc.pid, signal.SIGKILL)
        w.state = "retired"

    # -- pooled processes -----------------------------------------------------
    def spawn(self, kind: str, nice: bool) -> None:
        """Start one pooled process of ``kind`` (it imports TensorFlow, then says idle); a
        :data:`NS` one enters the spare namespace first; with ``nice``, at low CPU priority."""
        ns = self.spare_ns() if kind == NS else None
        fds = list(ns.fds) if ns is not None else []
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        me = os.getpid()

        def before_exec() -> None:  # in the child, one thread, before anything is imported
            if fds:
                isolation.join_namespace(fds)
            if nice:
                _autogroup_nice(REFILL_NICE)  # its own session: its own autogroup
            set_parent_death_signal(signal.SIGKILL, me)

        try:
            with open(self.dir / "workers.log", "ab") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-c", ENTRY, "worker", str(theirs.fileno())],
                    env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, pass_fds=(theirs.fileno(),), start_new_session=True,
                    preexec_fn=before_exec,
                )
        except (OSError, subprocess.SubprocessError) as e:
            mine.close()
            self.start_failures += 1
            print(f"tfk8s pool: a {kind} process could not start ({e})", file=sys.stderr, flush=True)
            return
        finally:
            theirs.close()
        w = _Worker(proc, mine, os.pidfd_open(proc.pid), ns)
        self.workers[proc.pid] = w
        self.sel.register(mine, selectors.EVENT_READ, ("worker", w))
        self.sel.register(w.pidfd, selectors.EVENT_READ, ("exit", w))

    def count(self, state: str, key: str | None = ANY) -> int:
        """How many pooled processes are in ``state`` (``key``: in that adopted namespace's id,
        None: on the host, :data:`ANY`: all)."""
        return sum(1 for w in self.workers.values() if w.state == state and self.serves(w, key))

    @staticmethod
    def serves(w: _Worker, key: str | None) -> bool:
        """Whether ``w`` may serve a claim for ``key`` (an adopted namespace's id, None: host)."""
        if key == ANY:
            return True
        return w.ns is None if key is None else (w.reserved and w.ns.id == key)

    def spares(self) -> list[_Worker]:
        """Processes not yet handed out nor reserved for a cluster (idle or importing)."""
        return [w for w in self.workers.values() if w.state in ("idle", "starting") and not w.reserved]

    def refill(self, now: float) -> float | None:
        """Start replacements when due; return seconds until the next refill is due (None: none)."""
        if self.closing or self.shrunk or self.start_failures >= MAX_START_FAILURES:
            return None
        missing = self.size - sum(1 for w in self.spares() if w.kind == self.kind)
        if missing <= 0:
            return None
        delay = REFILL_BUSY_DELAY if self.count("busy") else REFILL_DELAY
        # Woken after emptying itself, it fills as a new pool does: a launch waits for it.
        served = (self.claimed or self.adopted) and not self.waking
        if served and now < self.last_claim + delay:
            return self.last_claim + delay - now  # (a task's end wakes the loop before that)
        # The first fill starts every process at once; later ones one at a time, so a
        # refill takes at most one core (at low priority) from the clusters that are running.
        limit = missing if not served else max(0, 1 - sum(w.state == "starting" for w in self.spares()))
        for _ in range(min(missing, limit)):
            other = [w for w in self.spares() if w.kind != self.kind]
            if other and len(self.spares()) >= self.size:  # the launches changed kind: convert one
                self.retire(min(other, key=lambda w: w.state == "idle"))
            self.spawn(self.kind, nice=bool(served))
        self.waking = False
        return None

    def on_worker_message(self, w: _Worker) -> None:
        """A pooled process said idle (or its socket closed)."""
        try:
            data = w.sock.recv(64)
        except OSError:
            data = b""
        if data == b"idle" and w.state == "starting":
            w.state = "idle"
            self.start_failures = 0
            self.last_use = time.monotonic()  # the idle time counts from the last fill too
            self.serve_pending()
        self.sel.unregister(w.sock)

    def on_worker_exit(self, w: _Worker) -> None:
        """Reap a pooled process; report a task's status to its supervisor."""
        rc = w.proc.wait()
        if w.state == "starting" and not self.closing:
            self.start_failures += 1
            print(f"tfk8s pool: process {w.proc.pid} exited ({rc}) before it was ready; see "
                  "workers.log", file=sys.stderr, flush=True)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(w.proc.pid, signal.SIGKILL)  # nothing of its group outlives it
        for fd in (w.pidfd, w.supervisor_fd):
            if fd is not None:
                self.sel.unregister(fd)
                os.close(fd)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(w.sock)
        w.sock.close()
        if w.status_fd is not None:
            with contextlib.suppress(OSError):
                os.write(w.status_fd, f"{rc}\n".encode())
            os.close(w.status_fd)
        del self.workers[w.proc.pid]
        self.serve_pending()

    def on_supervisor_exit(self, w: _Worker) -> None:
        """The supervisor that claimed ``w`` died: its task dies too (as a cold task's would)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(w.proc.pid, signal.SIGKILL)
        self.sel.unregister(w.supervisor_fd)
        os.close(w.supervisor_fd)
        w.supervisor_fd = None

    # -- requests ---------------------------------------------------------------
    def on_connect(self) -> None:
        """Answer one request on the pool's socket (only from this user's processes)."""
        conn, _ = self.listener.accept()
        conn.settimeout(REQUEST_TIMEOUT)
        fds: list[int] = []
        try:
            data, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 3)
            message = _message(data)
            pid, uid, _gid = array.array("i", conn.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, 12)).tolist()
        except (OSError, ValueError):
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        if uid != os.getuid():
            self.answer(conn, {"cold": "the request came from another user"}, fds)
            return
        op = message.get("op")
        if op == "claim":
            message["peer"] = pid
            self.claim(_Claim(conn, message, fds, time.monotonic() + CLAIM_TIMEOUT))
            return
        if op == "adopt":
            for fd in fds:
                os.close(fd)
            self.on_adopt(conn, pid, message.get("env") or {})
            return
        if op == "release":
            self.release(str(message.get("ns")), pid)
        elif op == "attach":
            if not self.closing:
                self.add_owner(pid)
                self.wake(message.get("kind") if message.get("kind") in (HOST, NS) else None)
        elif op == "detach":
            self.remove_owner(pid)
        elif op == "resize":
            self.size = max(0, int(message.get("size", self.size)))
            self.trim()
        elif op == "close":
            self.close()
        self.answer(conn, self.describe(bool(message.get("memory", True))), fds)

    def answer(self, conn: socket.socket, reply: dict, fds: list[int] = ()) -> None:
        """Send ``reply`` and close the connection and the descriptors it brought."""
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            conn.send(json.dumps(reply).encode())
        conn.close()

    def describe(self, with_memory: bool = True) -> dict:
        """The pool as ``%tfcluster pool`` shows it."""
        procs = [{"pid": pid, "state": w.state, "since": w.started, "kind": w.kind,
                  "ns": w.ns.id if w.reserved else None if w.ns is None else "spare",
                  "reserved": w.reserved, **(memory(pid) if with_memory else {})}
                 for pid, w in sorted(self.workers.items())]
        return {"pid": os.getpid(), "owner": self.owner, "owners": sorted(self.owners),
                "size": self.size, "closing": self.closing, "idle_timeout": self.idle, "shrunk": self.shrunk,
                "socket": self.sock_path, "dir": str(self.dir), "claimed": self.claimed,
                "waiting": len(self.pending),
                "processes": procs,
                "kind": self.kind, "no_namespace": self.no_ns}

    @staticmethod
    def key(c: _Claim) -> str | None:
        """Which processes can serve claim ``c``: its adopted namespace's id, or None (host)."""
        return c.message.get("ns") or None

    def idle_for(self, c: _Claim) -> _Worker | None:
        """An idle process that may serve ``c`` (in its adopter's namespace, or on the host)."""
        key = self.key(c)
        return next((w for w in self.workers.values() if w.state == "idle" and self.serves(w, key)
                     and (key is None or w.ns.adopter == c.message["peer"])), None)

    def claim(self, c: _Claim) -> None:
        """Hand a task to an idle process, wait for a starting one, or answer "cold" and why."""
        why = "" if len(c.fds) == 3 else "a claim must carry a log, a ready pipe and a status pipe"
        why = why or ("the pool is closing" if self.closing else "")
        why = why or mismatch(self.env, c.message.get("env") or {}, self.shim)
        if why:
            self.answer(c.conn, {"cold": why}, c.fds)
            return
        key = self.key(c)
        if key is None and self.kind != HOST:  # a launch on the host's network: refills follow it
            self.kind, self.last_claim = HOST, time.monotonic()
        if self.shrunk:  # emptied for being unused: refill now, and this claim waits for it
            self.wake(None)
            self.refill(time.monotonic())
        self.last_use = time.monotonic()
        idle = self.idle_for(c)
        if idle is not None:
            self.assign(idle, c)
        elif c.message.get("wait") and self.count("starting", key) > sum(
                self.key(p) == key for p in self.pending):
            self.wait_for(c)
            self.hurry(key)
        else:
            self.answer(c.conn, {"cold": "no warm process is free"}, c.fds)

    def hurry(self, key: str | None) -> None:
        """A launch now waits for the processes still importing that may serve it: a refill's low
        priority would make that wait longer than a cold start, so they import at normal priority."""
        for w in self.workers.values():
            if w.state == "starting" and self.serves(w, key) and autogroup_nice(w.proc.pid) not in (None, 0):
                _autogroup_nice(0, w.proc.pid)

    def wait_for(self, c: _Claim) -> None:
        """Queue claim ``c`` and watch its connection: a claimer that gives up (a stop while it
        waits) hangs up, and its claim is dropped rather than handed a process."""
        self.pending.append(c)
        self.sel.register(c.conn, selectors.EVENT_READ, ("claim", c))

    def serve_pending(self) -> None:
        """Give idle processes to waiting claims; release every claim nothing can serve any more:
        past its deadline (wherever it is in the queue), or more claims than processes importing;
        drop the claims whose claimer hung up."""
        now = time.monotonic()
        waiting, self.pending = self.pending, []
        for c in waiting:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(c.conn)  # watched again (wait_for) only if it still waits
            if select.select([c.conn], [], [], 0)[0]:  # a claimer sends nothing more: it hung up
                for fd in c.fds:
                    os.close(fd)
                c.conn.close()
                continue
            idle = self.idle_for(c)
            if idle is not None:
                self.assign(idle, c)
                continue
            key = self.key(c)
            ahead = sum(self.key(p) == key for p in self.pending)
            if self.closing or c.deadline <= now or ahead >= self.count("starting", key):
                self.answer(c.conn, {"cold": "no warm process became free in time"}, c.fds)
            else:
                self.wait_for(c)

    def next_timeout(self, due: float | None) -> float | None:
        """Seconds the loop may sleep: until the first pending claim's deadline or ``due``."""
        deadlines = [c.deadline - time.monotonic() for c in self.pending]
        deadlines += [due] if due is not None else []
        return max(0.0, min(deadlines)) if deadlines else None

    def assign(self, w: _Worker, c: _Claim) -> None:
        """Send the task to ``w``; tell the claimer its pid; watch the claimer's life."""
        log_fd, ready_fd, status_fd = c.fds
        off = shim_off(self.env, c.message["env"], self.shim)
        payload = json.dumps({"env": c.message["env"], "cwd": c.message.get("cwd") or self.cwd,
                              "umask": c.message.get("umask"), "shim_off": self.shim if off else None})
        try:
            socket.send_fds(w.sock, [payload.encode()], [log_fd, ready_fd])
            w.sock.settimeout(REQUEST_TIMEOUT)
            ack = w.sock.recv(512).decode(errors="replace")  # "ok" once it is ready to run the task
        except OSError:
            ack = "cold:the warm process had just exited"
        finally:
            os.close(log_fd)
            os.close(ready_fd)
        if ack != "ok":
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(w.proc.pid, signal.SIGKILL)  # it ran nothing; reaped as a spare
            w.state = "refused"
            self.answer(c.conn, {"cold": ack.partition(":")[2] or "the warm process did not answer"},
                        [status_fd])
            return
        w.state, w.status_fd = "busy", status_fd
        w.supervisor_fd = open_pidfd(c.message["peer"])
        if w.supervisor_fd is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(w.proc.pid, signal.SIGKILL)
        else:
            self.sel.register(w.supervisor_fd, selectors.EVENT_READ, ("supervisor", w))
        self.claimed += 1
        self.last_claim = time.monotonic()
        self.answer(c.conn, {"pid": w.proc.pid})

    def trim(self) -> None:
        """End spare processes beyond the size (all of them when closing, reserved ones too)."""
        keep = 0 if self.closing else self.size
        spare = [w for w in self.workers.values() if w.state in ("idle", "starting") and (
            self.closing or not w.reserved)]
        for w in spare[keep:]:
            self.retire(w)

    def terminate(self) -> None:
        """SIGTERM: close, and pass it on to the tasks handed out (the daemon exits once they end)."""
        self.close()
        for w in self.workers.values():
            if w.state == "busy":
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(w.proc.pid, signal.SIGTERM)

    # -- owners and idleness -------------------------------------------------------
    def add_owner(self, pid: int) -> None:
        """Make ``pid`` (a process of this user that launches with the pool) one of its owners."""
        if pid in self.owners:
            return
        fd = open_pidfd(pid)
        if fd is not None:
            self.owners[pid] = fd
            self.sel.register(fd, selectors.EVENT_READ, ("owner", pid))

    def remove_owner(self, pid: int) -> None:
        """``pid`` left the pool or exited; the pool closes when it was the last owner."""
        fd = self.owners.pop(pid, None)
        if fd is not None:
            self.sel.unregister(fd)
            os.close(fd)
        if not self.owners:
            self.close()

    def wake(self, kind: str | None) -> None:
        """A launch is coming (an owner joined or launched, a claim arrived): a pool that emptied
        itself refills at once, with ``kind`` processes if given."""
        self.last_use = time.monotonic()
        if self.shrunk:
            self.shrunk, self.waking = False, True
            self.start_failures = 0
            if kind is not None and not (kind == NS and self.no_ns):
                self.kind = kind

    def idle_due(self, now: float) -> float | None:
        """Seconds until the pool empties itself for being unused (None: it will not)."""
        if not self.idle or self.shrunk or self.closing or self.pending:
            return None
        if any(w.state == "starting" for w in self.spares()):
            return None  # still filling: the idle time counts from when it is full
        return max(0.0, self.last_use + self.idle - now)

    def shrink(self) -> None:
        """Unused for :attr:`idle` seconds: end the spare processes (reserved and busy ones stay)."""
        self.shrunk = True
        for w in self.spares():
            self.retire(w)
        print(f"tfk8s pool: unused for {self.idle:g} s; its spare processes ended (the next launch "
              "refills it)", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Stop handing out processes; end the idle ones; exit once handed-out tasks have ended."""
        if not self.closing:  # no new owner finds a closing pool: the next one starts a new pool
            with contextlib.suppress(OSError):
                os.unlink(self.sock_path)
        self.closing = True
        self.trim()
        self.serve_pending()
        if self.spare is not None:
            self.spare.close()
            self.spare = None

    # -- the loop -------------------------------------------------------------------
    def dispatch(self, kind: str, obj) -> None:
        """Handle one ready descriptor of the loop."""
        if kind == "listen":
            self.on_connect()
        elif kind == "worker":
            self.on_worker_message(obj)
        elif kind == "exit":
            self.on_worker_exit(obj)
        elif kind == "supervisor":
            self.on_supervisor_exit(obj)
        elif kind == "adopter":
            self.retire_reserved(obj)  # its supervisor died before it released them
        elif kind == "signal":
            with contextlib.suppress(BlockingIOError):
                os.read(obj, 64)
            self.terminate()
        # "claim": a waiting claimer hung up; serve_pending, after every wake-up, drops it

    def run(self, ready_fd: int) -> int:
        """Fill the pool, tell the first owner we listen, serve until the last owner is gone and
        the tasks handed out have ended."""
        self.add_owner(self.owner)
        if not self.owners:
            self.close()
        else:
            (self.dir / "daemon.pid").write_text(str(os.getpid()))
        # SIGTERM (the lab stopping a user's processes) ends the pool as its last owner's exit
        # does, and its tasks too: what it leaves is removed, not left to the next start's sweep.
        if threading.current_thread() is threading.main_thread():  # (a test runs it in a thread)
            wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            signal.set_wakeup_fd(wake_w)
            signal.signal(signal.SIGTERM, lambda *_: None)
            self.sel.register(wake_r, selectors.EVENT_READ, ("signal", wake_r))
        due = self.refill(time.monotonic())
        os.write(ready_fd, f"ok {os.getpid()}".encode())
        os.close(ready_fd)
        while not (self.closing and not self.workers):
            now = time.monotonic()
            idle = self.idle_due(now)
            if idle is not None and idle <= 0:
                self.shrink()
                continue
            for key, _ in self.sel.select(self.next_timeout(min((d for d in (due, idle) if d is not None),
                                                                default=None))):
                kind, obj = key.data
                if kind == "owner":
                    self.remove_owner(obj)
                else:
                    self.dispatch(kind, obj)
            self.serve_pending()
            due = self.refill(time.monotonic())
        self.listener.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        _remove_runtime_dir_if_empty(Path(self.sock_path).parent)
        return 0


# -- a pooled process ------------------------------------------------------------------
def worker(fd: int) -> int:
    """Import what a task imports, wait for one assignment, run it as a cold task runs, exit."""
    sock = socket.socket(fileno=fd)
    before = dict(os.environ)
    taskenv.import_tensorflow()  # exactly the cold task's import (quiet filter, device probe)
    # What the import itself did to the environment (TensorFlow sets TF2_BEHAVIOR and others):
    # a cold task's import does the same to its environment, so it is replayed on the task's.
    added = {k: v for k, v in os.environ.items() if before.get(k) != v}
    removed = [k for k in before if k not in os.environ]
    sock.send(b"idle")
    data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 2)
    if not data or len(fds) != 2:
        return 0  # the pool closed: nothing was assigned
    try:
        assignment = _message(data)
    except ValueError:
        return 0  # not an assignment: nothing was assigned
    log_fd, ready_fd = fds
    # A refill imported at low priority (its session's autogroup): a task runs at the cold one's.
    if autogroup_nice() not in (None, 0) and not _autogroup_nice(0):
        sock.send(b"cold:cannot set the warm process's CPU priority back to normal")
        return 0
    if assignment.get("shim_off"):
        # A cold task of this cluster has no shim: binds must pass through untouched.
        try:
            switch_shim_off(assignment["shim_off"])
        except (OSError, ValueError) as e:
            sock.send(f"cold:cannot switch the loopback shim off ({e})".encode())
            return 0
    sock.send(b"ok")
    sock.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    os.environ.clear()
    os.environ.update(assignment["env"])
    os.environ.update(added)
    for key in removed:
        os.environ.pop(key, None)
    os.environ["TFK8S_READY_FD"] = str(ready_fd)
    if assignment.get("umask") is not None:
        os.umask(int(assignment["umask"]))
    os.chdir(assignment["cwd"])
    sys.path[0] = os.getcwd()  # what `python -m` puts first: the task's working folder
    sys.argv = [task.__file__]
    return task.main()


def main(argv: list[str] | None = None) -> int:
    """``daemon POOL_DIR READY_FD`` or ``worker FD``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        import atexit

        rc = worker(int(argv[1]))
        # As the cold task's entry point: exit handlers, then no thread joins (gRPC can hang them).
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    if argv[:1] == ["daemon"]:
        # Fork once more; the starter reaps this child at once.  The daemon serves every owner
        # and outlives the first: it must be no owner's child, or it would be a zombie there.
        if os.fork():
            os._exit(0)
        return Daemon(Path(argv[1])).run(int(argv[2]))
    print("usage: pool daemon POOL_DIR READY_FD | pool worker FD", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
