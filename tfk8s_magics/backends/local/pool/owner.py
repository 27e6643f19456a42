"""The owner's side of the warm pool: join this user's pool (starting it if none runs), size it,
leave it, and show it.

An owner is a process that launches clusters (a notebook kernel).  Every
launch calls :func:`ensure`, which attaches the process to the pool of its
task environment (:func:`~.protocol.pool_key`), starting the daemon under a
lock if none answers; the daemon ends with its last owner.  The module keeps
which pool this process uses (one at a time) and its settings.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .... import ingraph, options
from ....isolation.plan import Platform, plan_cluster
from ....lifeline import open_pidfd, pid_alive
from .. import logtail
from .compat import base_env, pool_shim
from .protocol import (
    DAEMON_ENTRY,
    HOST,
    NS,
    REQUEST_TIMEOUT,
    _request,
    info,
    pool_key,
    runtime_dir,
    socket_path,
)


# -- this user's pools, as text ------------------------------------------------------------
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
        if not _NEW.fullmatch(sock.stem):
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            try:
                s.connect(str(sock))
            except ConnectionRefusedError:
                sock.unlink(missing_ok=True)
            except OSError:
                pass
    for d in root.glob("pool-*-*"):
        key, _, rest = d.name[len("pool-"):].partition("-")
        if not d.is_dir():
            continue
        if _NEW.fullmatch(f"pool-{key}"):  # pool-KEY-RANDOM: its daemon writes daemon.pid at start
            try:
                pid = int((d / "daemon.pid").read_text())
            except (OSError, ValueError):
                pid = None  # under the lock, a folder whose daemon never started
        else:  # pool-OWNER-RANDOM of a per-kernel pool (an older version): gone with its owner
            pid = int(key) if key.isdigit() else os.getpid()
        if not pid_alive(pid):
            shutil.rmtree(d, ignore_errors=True)


#: A pool's socket stem and the prefix of its folder: ``pool-KEY`` (:func:`~.protocol.pool_key`).
_NEW = re.compile(r"pool-[0-9a-f]{16}")


@contextlib.contextmanager
def _start_lock():
    """This user's pool start lock (``flock`` on :func:`runtime_dir`): two kernels starting at
    once find one pool, not two.  A daemon removes the directory (emptied) under the same lock;
    a lock taken on a directory removed meanwhile is taken again on the new one."""
    while True:
        path = runtime_dir()
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    yield path
                    return
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


# -- joining, starting and leaving the pool ------------------------------------------------
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
    return NS if plan_cluster(Platform(), options.get("isolation"), in_graph=in_graph).private else HOST


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
            [sys.executable, "-c", DAEMON_ENTRY, str(pool_dir), str(ready_w)],
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
    once; tasks it handed out get :data:`REQUEST_TIMEOUT` seconds to end, then the daemon is
    killed, and they with it)."""
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
        # Closing (this was its last owner): it ends once the tasks it handed out have ended, which
        # get REQUEST_TIMEOUT seconds (as a kernel's own pool always gave them).
        if answer.get("closing") and not select.select([pidfd], [], [], REQUEST_TIMEOUT)[0]:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    finally:
        os.close(pidfd)
