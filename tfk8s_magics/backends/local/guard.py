"""Nothing of a cluster outlives it: the supervisor's guard, from before the first task to its end.

Before any task starts (:meth:`Guard.start`) the supervisor becomes a child
subreaper (a task's orphaned descendants become its children: :mod:`.taskproc`
ends them with the task), forks its :mod:`.watchdog` (its own session: when the
supervisor ends, however it ends, it kills every process marked with the
cluster's id) and watches the owner (the notebook kernel) with a pidfd, unless
the cluster was launched detached.  When every task has ended
(:meth:`Guard.finish`) the backup runs, then whatever a task started in another
session is killed by its mark, and the scratch folders a multi-worker Keras
``fit`` cut short leaves are removed.  A supervisor whose dir was replaced
(:meth:`Guard.abandon`) kills its own and writes nothing; one that crashed
(:meth:`Guard.crashed`) kills its tasks and says so in the status.
"""

from __future__ import annotations

import contextlib
import selectors
import signal
import traceback
from typing import TYPE_CHECKING

from ...lifeline import become_subreaper, kill_marked, open_pidfd
from ..base import Phase
from .clusterfiles import say
from .kerastemp import remove_keras_temp_dirs
from .watchdog import CLUSTER_ID_ENV, fork_watchdog

if TYPE_CHECKING:
    from .supervisor import Supervisor


class Guard:
    """One supervisor's guard (see the module docstring)."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup

    def start(self) -> None:
        """Before any task: become a subreaper, fork the watchdog, watch the owner."""
        sup = self.sup
        become_subreaper()
        if sup.cluster_id:  # forked before any task or thread exists
            sup.watchdog_pid = fork_watchdog(sup.cluster_id)
        owner = sup.record.get("owner_pid")
        if owner and not sup.record.get("detached"):
            fd = open_pidfd(owner)
            if fd is None:
                sup.request_stop(f"its owner (pid {owner}) had already exited")
            else:
                sup.sel.register(fd, selectors.EVENT_READ, ("owner", owner))

    def finish(self) -> None:
        """Every task has ended: the backup, then nothing of the cluster is left; the last status."""
        sup = self.sup
        sup.storage.after_tasks()  # the backup, before what is left of the cluster is killed
        sup.procs.reap_orphans()
        if sup.cluster_id:  # whatever a task started in another session dies with the cluster
            kill_marked(CLUSTER_ID_ENV, sup.cluster_id, exclude=frozenset({sup.watchdog_pid or 0}))
        # A fit cut short leaves Keras's scratch folders (a stray TensorBoard run): nothing writes now.
        removed = remove_keras_temp_dirs(sup.record["log_dir"])
        if removed:
            sup.event("", "TempRemoved", "removed what Keras leaves when a multi-worker fit does not "
                      "return: " + ", ".join(str(p) for p in removed))
        sup.write_status(done=True)

    def abandon(self, why: str) -> None:
        """Our dir is gone or another cluster's: kill our own tasks (and all they started) and write
        nothing, so a new cluster of the same name is left alone."""
        sup = self.sup
        say(f"tfk8s: {why}; stopping this cluster's tasks and exiting")
        for t in sup.tasks.values():
            if t.running:
                sup.procs.signal(t, signal.SIGKILL)
                t.proc.wait()
        sup.procs.reap_orphans()
        if sup.cluster_id:
            kill_marked(CLUSTER_ID_ENV, sup.cluster_id)

    def crashed(self) -> None:
        """The supervisor itself failed: its tasks are killed, every row says so, the last status."""
        sup = self.sup
        with contextlib.suppress(OSError):  # the log may be on a full disk
            traceback.print_exc()
        sup.procs.kill_all()
        sup.phase, sup.reason = Phase.FAILED, "the supervisor crashed; see supervisor.log"
        for t in sup.tasks.values():
            if t.status.phase not in Phase.TERMINAL:
                t.status.phase, t.status.reason, t.status.pid = Phase.FAILED, "the supervisor crashed", None
        sup.write_status(done=True)
