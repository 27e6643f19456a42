"""Where a cluster's tasks run: its isolation plan performed, and the warm pool's processes claimed.

Before any task starts, the supervisor performs the cluster's
:class:`~tfk8s_magics.isolation.plan.IsolationPlan` (:meth:`Placement.isolate`):
it enters a private network namespace — the warm pool's spare one when the pool
has it (its processes imported TensorFlow inside it, and a pooled process
never changes namespace after its import), else a new one — or stays where the
plan says, and ``status.json`` says which and why.  Each task then comes from
the owner's warm pool when it can (:meth:`Placement.claim`), else starts cold
with an event saying why.  The decisions are the plan's and the pool's; this
module only performs them for one supervisor.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ... import options
from ...isolation import netns
from ...isolation.plan import IsolationPlan, Platform, plan_cluster
from . import pool

if TYPE_CHECKING:
    from .supervisor import Supervisor
    from .taskproc import TaskRun


class Placement:
    """One supervisor's isolation and warm-pool claims (see the module docstring)."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        #: How this cluster is kept from other users (see :meth:`isolate`), for status.json.
        self.isolation: dict = {"mode": netns.NONE, "reason": "not isolated yet", "netns": None}
        #: The plan it performs (:mod:`tfk8s_magics.isolation.plan`), once :meth:`isolate` made it.
        self.plan: IsolationPlan | None = None
        #: The warm pool's namespace this cluster adopted (its id; see :meth:`isolate`), or None
        #: and why not (then its tasks start cold).
        self.pool_ns: str | None = None
        self.pool_why = "no warm pool"
        #: A wait for a warm process ended early (a stop, the owner's exit): start nothing more.
        self.claim_interrupted = False

    @property
    def sock(self) -> str | None:
        """The owner's warm pool (its socket), or None."""
        return self.sup.record.get("pool")

    # -- isolation (decided by tfk8s_magics.isolation.plan) --------------------------------
    def isolate(self) -> None:
        """Perform the cluster's isolation plan before any task starts (the tasks inherit it):
        enter a private network namespace (the warm pool's spare, else a new one), or stay
        where the plan says; where the kernel refuses a namespace, the plan's fallback, and
        ``status.json`` says why."""
        sup = self.sup
        plan = plan_cluster(Platform.here(sup.record.get("loopback_shim")), options.get("isolation"),
                            in_graph=not sup.policy.success_roles, streams=bool(sup.storage.streams))
        self.plan = plan
        if not plan.private:
            self.isolation = plan.status()
            return
        try:
            mode = self._adopt_pool_namespace() or netns.enter_private_network()
        except netns.IsolationError as e:
            self.plan = plan.refused(e.strerror)
            self.isolation = self.plan.status()
            print(f"tfk8s: {self.isolation['reason']}", flush=True)
            return
        self.isolation = plan.status(mode, f"/proc/{os.getpid()}/ns/net")

    def _adopt_pool_namespace(self) -> str | None:
        """Enter the warm pool's spare namespace, where its processes imported TensorFlow (their
        every thread is in it); return the mode, or None (no pool or spare: make a new one)."""
        sock, tasks = self.sock, self.sup.procs.tasks
        if not sock or not tasks:
            return None
        env = self.sup.procs.env(next(iter(tasks.values())))  # the tasks' import-time env is one
        ns, fds, why = pool.adopt(sock, {k: v for k, v in env.items() if k != "TFK8S_READY_FD"})
        if ns is None:
            self.pool_why = why
            return None
        try:
            mode = netns.join_namespace(fds)
        except netns.IsolationError as e:
            pool.release(sock, ns)
            self.pool_why = f"cannot enter the pool's namespace ({e.strerror})"
            return None  # nothing changed (a refused first setns): a namespace of our own
        finally:
            for fd in fds:
                os.close(fd)
        self.pool_ns = ns
        return mode

    # -- the warm pool -------------------------------------------------------------------------
    def warm_count(self, tasks: int) -> int:
        """How many of ``tasks`` tasks can come from the pool (namespaced without the pool's
        namespace: none; each then starts cold with an event saying why)."""
        sock = self.sock
        if sock and self.isolation["netns"] and not self.pool_ns:
            return tasks
        return pool.available(sock, self.pool_ns)

    def claim(self, t: TaskRun, env: dict[str, str], log_fd: int, ready_fd: int,
              wait: bool) -> pool.PooledProcess | None:
        """Hand the task to a process of the owner's warm pool; None (and an event saying why) if
        it must start cold."""
        sock = self.sock
        if not sock:
            return None
        if self.isolation["netns"] and not self.pool_ns:
            # A pooled process never changes namespace after its import (its threads would not follow).
            proc, why = None, self.pool_why
        else:
            # A stop or the owner's exit ends a wait (the refill may still be importing); only
            # start_all waits, and it turns such an end into the stop.
            stops = [key.fd for key in self.sup.sel.get_map().values()
                     if key.data[0] in ("signal", "owner")] if wait else []
            proc, why = pool.claim(sock, {k: v for k, v in env.items() if k != "TFK8S_READY_FD"},
                                   self.sup.record["workdir"], log_fd, ready_fd, wait, self.pool_ns, stops)
        if why == pool.INTERRUPTED:
            self.claim_interrupted = True
        elif proc is None:
            self.sup.event(t.task.name, "StartedCold", f"not from the warm pool: {why}")
        return proc

    def release_namespace(self) -> None:
        """The adopted namespace's processes that no task took end now (after the status)."""
        if self.pool_ns:
            self.sup.write_status()
            pool.release(self.sock, self.pool_ns)

