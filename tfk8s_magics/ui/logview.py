"""A live, bounded view of a cluster's logs under a notebook cell.

Lines arrive from the cluster's :class:`~tfk8s_magics.watch.ClusterFeed`
on a background thread, so the kernel stays free to run other cells.  In
a Jupyter kernel they are appended to an ``ipywidgets.Output`` with
``append_stdout`` (the only way that reaches the browser reliably from a
thread); elsewhere they are printed.  The view holds at most ``max_lines``
lines: older ones are dropped from the notebook (the full log stays in the
task's log file, ``%tfcluster logs NAME``).
"""

from __future__ import annotations

import collections
import sys
import threading

from ..backends import ClusterStatus, LogLine
from ..watch import ClusterFeed
from .live import LogOutput, ViewEnd
from .stream import Overwrites, finished


def widgets_available() -> bool:
    """Whether this process is a Jupyter kernel able to show ipywidgets."""
    try:
        from IPython import get_ipython

        ip = get_ipython()
        if ip is None or not hasattr(ip, "kernel"):
            return False
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


class LogView:
    """Shows the live log of a cluster (all tasks, each line prefixed ``[task]``)."""

    def __init__(self, backend, name: str, max_lines: int = 500, tasks: list[str] | None = None,
                 announce_status: bool = True) -> None:
        self.backend = backend
        self.name = name
        self.max_lines = max_lines
        self.tasks = set(tasks) if tasks else None
        self.announce_status = announce_status
        self.lines: collections.deque[str] = collections.deque(maxlen=max_lines)
        self._stream = Overwrites()  # printed (no widgets): a progress bar rewrites its line
        self.dropped = 0
        self._last_phase: str | None = None
        self._lock = threading.Lock()
        self.output = None
        self._output: LogOutput | None = None
        self._unsubscribe = None
        #: Where the view is in its life; ``done`` is set once nothing more will be shown.
        self.end = ViewEnd.LIVE
        self.done = threading.Event()

    def show(self) -> LogView:
        """Display the view under the current cell and start feeding it."""
        if widgets_available():
            import ipywidgets
            from IPython.display import display

            self.output = ipywidgets.Output(layout={"max_height": "24em", "overflow": "auto"})
            self.output.add_class("tfk8s-logview")
            self._output = LogOutput(self.output, self.max_lines)
            display(self.output)
        feed = ClusterFeed.of(self.backend, self.name)
        self._unsubscribe = feed.subscribe(
            on_status=self._on_status if self.announce_status else None, on_logs=self._on_logs
        )
        threading.Thread(target=self._await_end, args=(feed,), daemon=True).start()
        return self

    def _await_end(self, feed: ClusterFeed) -> None:
        feed.logs_done.wait()
        feed.status_done.wait()
        self._end(ViewEnd.ENDED)

    def close(self) -> None:
        """Stop updating."""
        self._end(ViewEnd.CLOSED)

    def _end(self, how: ViewEnd) -> None:
        self.end = self.end.then(how)
        if self._unsubscribe:
            self._unsubscribe()
        self.done.set()

    def _on_status(self, st: ClusterStatus) -> None:
        if st.phase != self._last_phase:
            self._last_phase = st.phase
            reason = f" — {st.reason}" if st.reason else ""
            self._emit([f"[tfk8s] {st.name}: {st.phase}{reason}"])

    def _on_logs(self, batch: list[LogLine]) -> None:
        lines = batch if self.tasks is None else [ln for ln in batch if ln.task in self.tasks]
        # In a widget only the newest max_lines of a flood can stay: the older ones are
        # counted, not formatted (the printed fallback shows every line).
        skipped = max(0, len(lines) - self.max_lines) if self._output is not None else 0
        self._emit([f"[{ln.task}] {ln.text}" for ln in lines[skipped:]], skipped)

    def _emit(self, texts: list[str], skipped: int = 0) -> None:
        """Show ``texts``, the newest lines after ``skipped`` older ones that were not formatted."""
        if not texts:
            return
        with self._lock:
            kept = finished(texts)  # an update is transient: its finished line is what stays
            self.dropped += max(0, len(self.lines) + skipped + len(kept) - self.max_lines)
            self.lines.extend(kept)
            if self._output is None:
                sys.stdout.write(self._stream.render(texts))
                sys.stdout.flush()
                return
            self._output.append(
                texts,
                tail=lambda: list(self.lines),
                head=lambda: (f"… {self.dropped} earlier lines are in the log files "
                              f"(%tfcluster logs {self.name})\n"),
                skipped=skipped,
            )
