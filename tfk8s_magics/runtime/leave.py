"""Leave a multi-worker cluster together, so that a succeeded run's logs read as one.

MultiWorkerMirroredStrategy starts TensorFlow's coordination service on the
first worker (or the chief): every coordinated task sends it a heartbeat, and
a task whose heartbeats stop for the heartbeat timeout (10 s) is declared
crashed to every task still running — whose log then shows
``BaseCollectiveExecutor::StartAbort UNAVAILABLE … The following tasks are
unhealthy (stopped sending heartbeats) … The tasks have crashed``.  A task
that ends leaves the service no word: its heartbeats simply stop.  So when one
worker's script returns and its process exits while another worker (often
the chief: a final save or evaluation, a slower step on a loaded machine)
still runs for longer than that timeout, a run in which every script
succeeded ends with a crash message in the survivor's log.

:func:`leave_together` waits, after the script succeeded, until every
coordinated task's script has succeeded too — a barrier of the coordination
service, as TensorFlow advises for a synchronised end — so no task exits
while a peer can still take it for crashed.  A peer that failed ends the wait
(the barrier fails once it is declared unhealthy); a stop (SIGTERM) ends it at
once, as it ends the script.
"""

from __future__ import annotations

import sys
import threading

#: The barrier's name (one per cluster run: every coordinated task passes it once).
BARRIER = "tfk8s-scripts-succeeded"
#: How long a finished task waits for its slowest peer (a chief's final evaluation may be long).
TIMEOUT_MS = 7 * 24 * 3600 * 1000
#: How often the main thread wakes while it waits, so a SIGTERM's handler runs.
POLL = 0.2


def coordinated() -> object | None:
    """This process's TensorFlow context if it is a member of a coordination service (it built a
    MultiWorkerMirroredStrategy of more than one task), else None.  Never imports TensorFlow."""
    module = sys.modules.get("tensorflow.python.eager.context")
    if module is None:
        return None
    ctx = module.context()
    return ctx if getattr(ctx, "coordination_service", None) else None


def leave_together() -> None:
    """Wait until every coordinated task of the cluster has finished its script (see the module
    docstring); return at once in a task that is in no coordination service."""
    ctx = coordinated()
    if ctx is None:
        return

    def wait() -> None:
        try:
            ctx.wait_at_barrier(BARRIER, TIMEOUT_MS)
        except Exception:  # noqa: BLE001 - a peer failed: its end is the supervisor's to handle
            pass

    # In a thread, so the main thread stays where Python runs signal handlers (a stop ends this).
    waiter = threading.Thread(target=wait, name="tfk8s-leave-together", daemon=True)
    waiter.start()
    while waiter.is_alive():
        waiter.join(POLL)
