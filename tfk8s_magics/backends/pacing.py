"""When to take the next batch of a stream: at once when it is quiet, spaced out under load.

The log follower (reading files) and the feed (handing lines to the views)
both face the same choice.  Taking every line the moment it exists gives
the lowest latency but costs a read, a lock and a widget update per line
in a flood; a fixed window (the lab's first design: 100 ms) bounds that
cost but delays every line of a slow stream by up to the window.
A :class:`Pacer` decides per batch from the stream's pace: what comes
after a quiet spell, or at most one line per ``min_gap`` on average, is
taken at once; faster than that, the stream is busy and batches are
spaced by a gap that doubles while it stays busy, up to ``max_gap``.
The decision looks at the stream's own rate, never at whether lines
beat the current gap, so a slow stream is never held back by the gap a
burst before it left behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Pacer:
    """The gap between batches of one stream, adapted to its pace (module docstring).

    Use: when something is waiting, ask :meth:`delay` with how much, wait
    that long (0: take it at once), take the batch, then call :meth:`took`.  ``clock``
    and ``sleep`` are injectable so the adaptation can be tested without
    wall time; :meth:`sleep` is what the callers wait with.
    """

    def __init__(
        self,
        min_gap: float,
        max_gap: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        if not 0 <= min_gap <= max_gap:
            raise ValueError(f"a pacer needs 0 <= min_gap <= max_gap, got {min_gap} and {max_gap}")
        self.min_gap = min_gap
        self.max_gap = max_gap
        self.gap = min_gap
        self.clock = clock
        self.sleep = sleep
        self._last: float | None = None
        self._busy = False
        #: Batches taken at once / after waiting for the gap (for views and tests).
        self.immediate = 0
        self.delayed = 0

    def delay(self, waiting: int) -> float:
        """Seconds to wait before taking the ``waiting`` lines (or reads) now pending: 0 means at once.

        Busy means: the last batch is less than ``max_gap`` ago and the lines
        waiting came faster than one per ``min_gap`` since then.
        """
        now = self.clock()
        if self._last is None:
            self._busy = False
            return 0.0
        since = now - self._last
        self._busy = since < self.max_gap and waiting * self.min_gap > since
        return max(0.0, self._last + self.gap - now) if self._busy else 0.0

    def took_polled(self, got: int) -> bool:
        """Took ``got`` lines on a timer (a caller that no longer waits for the stream's events
        while it is busy): return whether the stream is still busy, i.e. still faster than one
        line per ``min_gap`` since the last batch; the gap grows or shrinks as in :meth:`took`.

        Unlike :meth:`delay`, the time since the last batch includes the caller's own wait,
        so it is not read as a quiet spell.
        """
        self._busy = self._last is not None and got * self.min_gap > self.clock() - self._last
        return self.took()

    def took(self) -> bool:
        """A batch was just taken (after :meth:`delay`): the gap grows while busy, shrinks when not.

        Returns whether the stream was busy (the batch waited for the gap).
        """
        self._last = self.clock()
        busy, self._busy = self._busy, False
        if busy:
            self.delayed += 1
            self.gap = min(self.max_gap, max(self.gap * 2, self.min_gap))
        else:
            self.immediate += 1
            self.gap = max(self.min_gap, self.gap / 2)
        return busy
