"""The pool daemon: keeps ``size`` pooled processes warm, hands them out, reports their ends.

One per user and task environment (see the package's docstring); it is the
parent of every pooled process, holds a pidfd of each owner and ends with the
last, and speaks :mod:`.protocol` on its socket.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ....isolation import netns
from ....lifeline import open_pidfd, set_parent_death_signal
from ..layout import read_bounded
from .compat import mismatch, shim_off
from .envmark import exec_env
from .priority import REFILL_NICE, _autogroup_nice, autogroup_nice
from .protocol import (
    ANY,
    CLAIM_TIMEOUT,
    HOST,
    MAX_MESSAGE,
    NS,
    REQUEST_TIMEOUT,
    WORKER_ENTRY,
    _message,
    _remove_runtime_dir_if_empty,
)

#: Seconds after the last claim before the pool starts replacements: a refill imports
#: TensorFlow, which would compete with the just-launched cluster's first steps for CPU.
REFILL_DELAY = 3.0

#: While tasks it handed out still run, the pool waits this long after the last claim before
#: refilling (it refills as soon as they end): training gets the CPU first.
REFILL_BUSY_DELAY = 30.0

#: Pooled processes that die before they are idle, in a row, before the pool stops refilling
#: (a broken environment would otherwise restart them forever).
MAX_START_FAILURES = 3


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


@dataclass(eq=False)
class _Namespace:
    """A network namespace of the pool (:func:`~tfk8s_magics.isolation.netns.make_namespace`): the
    spare, or one a cluster's supervisor adopted (``adopter``: its pid; the processes in it are its own)."""
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
                _mode, fds = netns.make_namespace()
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
                netns.join_namespace(fds)
            if nice:
                _autogroup_nice(REFILL_NICE)  # its own session: its own autogroup
            set_parent_death_signal(signal.SIGKILL, me)

        try:
            with open(self.dir / "workers.log", "ab") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-c", WORKER_ENTRY, str(theirs.fileno())],
                    env=exec_env(self.env), cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=log,
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


def main(argv: list[str] | None = None) -> int:
    """``POOL_DIR READY_FD``: run a pool daemon (:data:`~.protocol.DAEMON_ENTRY`)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: pool daemon POOL_DIR READY_FD", file=sys.stderr)
        return 2
    # Fork once more; the starter reaps this child at once.  The daemon serves every owner
    # and outlives the first: it must be no owner's child, or it would be a zombie there.
    if os.fork():
        os._exit(0)
    return Daemon(Path(argv[0])).run(int(argv[1]))
