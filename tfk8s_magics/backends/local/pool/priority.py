"""The CPU priority of a pooled process's import: refills import at low priority (their session's
autogroup), and a process sets it back before it runs a task.
"""

from __future__ import annotations

import time

#: Autogroup nice of a refill's import (``/proc/PID/autogroup``: any user may raise it and set it
#: back to 0, unlike a thread's nice); a pooled process resets it to 0 before its task.
REFILL_NICE = 10


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
