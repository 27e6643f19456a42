"""Helpers shared by the live views: the end-state enum, a coalescing render
thread, a bounded log output, cell identity.

Feeds call views back on their own threads, as often as things change.
A view does not redraw on every call: it marks itself dirty and pokes its
:class:`Throttle`, whose one thread redraws at most every ``interval``
seconds (plus, optionally, a slow periodic ``tick`` for clocks such as a
task's running duration).  The thread ends when the view is closed or its
``finished`` predicate becomes true, so a view of a deleted cluster leaves
no thread behind.  See :mod:`tfk8s_magics.ui` for the threading rule.
"""

from __future__ import annotations

import collections
import enum
import threading
import time
import traceback
from collections.abc import Callable

from .stream import Overwrites, finished


class ViewEnd(enum.Enum):
    """Where a live view is in its life: one value instead of a flag per ending.

    ``LIVE`` until one of the others; ``ENDED`` (the cluster ended and the
    view drew every update of it) may still become ``DELETED``; ``DELETED``
    and ``CLOSED`` are final.
    """

    LIVE = "live"  #: following the cluster
    ENDED = "ended"  #: the cluster ended; its final state is drawn
    DELETED = "deleted"  #: the cluster is gone (deleted here or elsewhere)
    CLOSED = "closed"  #: the view was closed (close(), or its cell ran again)

    @property
    def final(self) -> bool:
        """Whether the view draws nothing more."""
        return self is not ViewEnd.LIVE

    def then(self, new: ViewEnd) -> ViewEnd:
        """The state after ``new`` happens: DELETED and CLOSED are never undone."""
        if self in (ViewEnd.DELETED, ViewEnd.CLOSED):
            return self
        if self is ViewEnd.ENDED and new is ViewEnd.LIVE:
            return self
        return new


class Throttle:
    """Call ``fn`` on a daemon thread at most every ``interval`` s after :meth:`poke`.

    ``tick`` (seconds, or a callable returning seconds or None) also calls
    ``fn`` periodically while nothing is poked; None means no tick.
    ``finished()`` is checked after every call and ends the thread when
    true, so ``fn`` should draw the final state once it sees the end.
    """

    def __init__(
        self,
        fn: Callable[[], None],
        name: str,
        interval: float = 0.25,
        tick: float | Callable[[], float | None] | None = None,
        finished: Callable[[], bool] = lambda: False,
    ) -> None:
        self.fn = fn
        self.interval = interval
        self._tick = tick
        self._finished = finished
        self._wake = threading.Event()
        self._closed = threading.Event()
        self.calls = 0
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Throttle:
        """Start the thread; return ``self``, so it chains with the constructor."""
        self.thread.start()
        return self

    def poke(self) -> None:
        """Ask for a call soon (coalesced with other pokes)."""
        self._wake.set()

    def close(self) -> None:
        """End the thread (after its current call, if any)."""
        self._closed.set()
        self._wake.set()

    @property
    def alive(self) -> bool:
        """Whether the thread is still running."""
        return self.thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` for the thread to end (a no-op when called from the thread itself)."""
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def _tick_seconds(self) -> float | None:
        return self._tick() if callable(self._tick) else self._tick

    def _run(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(self._tick_seconds())
            self._wake.clear()
            if self._closed.is_set():
                return
            started = time.monotonic()
            try:
                self.fn()
            except Exception:  # noqa: BLE001 - a broken render must not kill the view's thread
                traceback.print_exc()
            self.calls += 1
            if self._finished():
                return
            # Coalesce: whatever arrives during this pause is drawn by the next call.
            self._closed.wait(max(0.0, self.interval - (time.monotonic() - started)))


def current_cell_id() -> str | None:
    """The id of the notebook cell being executed, when the front end sends it (JupyterLab does)."""
    try:
        from IPython import get_ipython

        kernel = getattr(get_ipython(), "kernel", None)
        if kernel is None:
            return None
        parent = (
            kernel.get_parent("shell") if hasattr(kernel, "get_parent") else kernel._parent_header
        )
        return (parent or {}).get("metadata", {}).get("cellId")
    except Exception:  # noqa: BLE001 - only an optimisation depends on it
        return None


def in_kernel() -> bool:
    """Whether this process is a Jupyter kernel (displays can be updated in place)."""
    try:
        from IPython import get_ipython

        return hasattr(get_ipython(), "kernel")
    except ImportError:
        return False


#: Cells remembered (the oldest are forgotten: their views were re-run or scrolled away long ago).
MAX_CELLS = 64
_by_cell: collections.OrderedDict[str, tuple[str | None, list]] = collections.OrderedDict()
_by_cell_lock = threading.Lock()


def supersede(view) -> None:
    """Close the views an earlier run of the current cell displayed; remember ``view``.

    Re-running a cell clears its output, so the views it showed before can
    no longer be seen: closing them stops their updates and frees their
    widgets.  Several views shown by one run of a cell all stay.
    """
    cell = current_cell_id()
    if cell is None:
        return
    msg_id = _current_msg_id()
    with _by_cell_lock:
        old_msg, views = _by_cell.get(cell, (None, []))
        if old_msg != msg_id:
            stale, views = views, []
        else:
            stale = []
        views.append(view)
        _by_cell[cell] = (msg_id, views)
        _by_cell.move_to_end(cell)
        _prune()
    for v in stale:
        if v is not view:
            v.close(destroy=True)


def _prune() -> None:
    """Forget cells whose views have all ended, then the oldest beyond MAX_CELLS (call under the lock)."""
    for cell, (msg, views) in list(_by_cell.items()):
        alive = [v for v in views if not v.end.final]
        if alive:
            _by_cell[cell] = (msg, alive)
        else:
            del _by_cell[cell]
    while len(_by_cell) > MAX_CELLS:
        _by_cell.popitem(last=False)


def _current_msg_id() -> str | None:
    try:
        from IPython import get_ipython

        kernel = get_ipython().kernel
        parent = (
            kernel.get_parent("shell") if hasattr(kernel, "get_parent") else kernel._parent_header
        )
        return (parent or {}).get("header", {}).get("msg_id")
    except Exception:  # noqa: BLE001
        return None


def close_tree(widget) -> None:
    """Close a widget, its children, layouts and styles (frees them in kernel and browser)."""
    for child in getattr(widget, "children", ()) or ():
        close_tree(child)
    for attr in ("layout", "style"):
        sub = getattr(widget, attr, None)
        if sub is not None and hasattr(sub, "close"):
            sub.close()
    widget.close()


class LogOutput:
    """An ``ipywidgets.Output`` fed line by line, holding a bounded number of lines.

    Lines are appended with ``append_stdout`` (the one way that reaches the
    browser reliably from a thread).  When more than twice ``max_lines``
    have been appended since the last re-base, the widget is re-based on
    the newest lines (``tail()``) under a ``head`` line saying where the
    rest is, so what it holds and sends stays bounded.  Call it under the
    owning view's draw lock.
    """

    def __init__(self, output, max_lines: int) -> None:
        self.output = output
        self.max_lines = max_lines
        self.shown = 0
        self.stream = Overwrites()  # a progress bar's updates rewrite its line in place

    def append(self, lines: list[str], tail: Callable[[], list[str]], head: Callable[[], str],
               skipped: int = 0) -> None:
        """Append ``lines``; re-base on ``tail()`` under ``head()`` when the widget holds too many.

        ``skipped``: lines that came before ``lines`` and were never formatted
        (a flood): the widget must not show a silent gap, so it re-bases.
        """
        self.shown += len(finished(lines)) + skipped
        if skipped or self.shown > 2 * self.max_lines:
            newest = finished(tail())
            self.stream = Overwrites()
            self.replace(head() + self.stream.render(newest), len(newest))
        else:
            self.output.append_stdout(self.stream.render(lines))

    def replace(self, text: str, shown: int) -> None:
        """Show ``text`` instead of everything; count ``shown`` lines towards the next re-base."""
        self.stream = Overwrites()
        self.output.outputs = ({"output_type": "stream", "name": "stdout", "text": text},)
        self.shown = shown
