"""Log texts as a terminal-like stream: a progress bar's updates rewrite one line in place.

A log follower hands out two kinds of text (see
:mod:`tfk8s_magics.backends.local.logtail`): finished lines, which never
hold a ``\\r``, and *updates* — the state of a task's unfinished line that
carriage returns keep rewriting (Keras's progress bar), holding a ``\\r``
after the view's prefix.  :class:`Overwrites` turns a sequence of them into
stream text that Jupyter (``append_stdout``, a cell's stdout) and a
terminal render as Keras meant: the bar updates in place, and the finished
line replaces it.  Pure: no I/O, no widget.
"""

from __future__ import annotations

from collections.abc import Iterable


def is_update(text: str) -> bool:
    """Whether ``text`` is an update of an unfinished line (not a finished line)."""
    return "\r" in text


def finished(texts: Iterable[str]) -> list[str]:
    """Only the finished lines of ``texts`` (what a history keeps)."""
    return [t for t in texts if "\r" not in t]


class Overwrites:
    """Renders texts as stream text; remembers whose unfinished line ends the stream.

    While one task's line is open (its bar is showing), another task's
    updates are left out (under MultiWorkerMirroredStrategy every worker
    draws the same bar) and its finished lines start on a new line.
    """

    def __init__(self) -> None:
        #: The prefix (the text before its ``\r``) of the open line, or None.
        self.open: str | None = None

    def render(self, texts: Iterable[str]) -> str:
        """The stream text for ``texts`` (finished lines end with a newline; an update does not)."""
        out: list[str] = []
        for text in texts:
            key, cr, rest = text.partition("\r")
            if cr:
                if self.open is not None and self.open != key:
                    continue
                out.append("\r" + key + rest.replace("\r", ""))
                self.open = key
                continue
            if self.open is not None:
                out.append("\r" if text.startswith(self.open) else "\n")
                self.open = None
            out.append(text + "\n")
        return "".join(out)
