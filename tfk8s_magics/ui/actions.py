"""The Stop / Delete action bar of one cluster, shared by the dashboard and the cluster list.

Stop ends every task (the record and logs stay).  Delete asks once: it
shows "Yes, delete" and "Cancel"; only the confirmation deletes.  An action
runs on its own thread (a button must not block the kernel) and its outcome
is handed to the owning view, which shows it.  Extra buttons (the
dashboard's TensorBoard) run through :meth:`ActionBar.run` too, so a view
does one thing at a time.

Threading (see :mod:`tfk8s_magics.ui`): button handlers run on the kernel's
main thread, actions on their own; both change widgets only under the
owning view's draw lock, and the backend is called with no lock held.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from typing import Any

from ..backends import ClusterStatus
from ..errors import ClusterNotFound


class ActionState(enum.Enum):
    """What the bar is doing: nothing, asking to confirm a delete, or running an action."""

    IDLE = "idle"
    CONFIRMING = "confirming"
    BUSY = "busy"


class ActionBar:
    """Stop, Delete (asks once), and any extra buttons for one cluster.

    ``cluster`` is a :class:`tfk8s_magics.api.Cluster`; ``draw_lock`` the
    owning view's draw lock.  ``on_outcome(text)`` shows what happened,
    ``on_stopped(status)`` and ``on_deleted()`` tell the view the result.
    ``widgets`` false builds no widgets (the actions still work).
    """

    def __init__(
        self,
        cluster,
        draw_lock: threading.RLock,
        *,
        on_outcome: Callable[[str], None],
        on_stopped: Callable[[ClusterStatus], None] = lambda _st: None,
        on_deleted: Callable[[], None] = lambda: None,
        widgets: bool = True,
        compact: bool = False,
        extra: tuple[Any, ...] = (),
    ) -> None:
        self.cluster = cluster
        self.name = cluster.name
        self._draw_lock = draw_lock
        self._on_outcome = on_outcome
        self._on_stopped = on_stopped
        self._on_deleted = on_deleted
        self._lock = threading.Lock()
        self.state = ActionState.IDLE
        self.deleted = False
        self._status: ClusterStatus | None = None  # as last drawn
        #: The thread of the last action (tests join it).
        self.thread: threading.Thread | None = None
        self.widget = self._build(compact, extra) if widgets else None

    def _build(self, compact: bool, extra: tuple[Any, ...]):
        import ipywidgets as w

        size = {"layout": w.Layout(width="auto")} if compact else {}
        self.stop_button = w.Button(description="Stop", button_style="warning",
                                    tooltip="end every task; the logs are kept", **size)
        self.delete_button = w.Button(description="Delete", button_style="danger",
                                      tooltip="stop and remove the cluster and its logs", **size)
        if not compact:
            self.stop_button.icon, self.delete_button.icon = "stop", "trash"
        self.confirm_button = w.Button(description="Yes, delete", button_style="danger",
                                       layout=w.Layout(display="none", width="auto"))
        self.cancel_button = w.Button(description="Cancel", layout=w.Layout(display="none", width="auto"))
        for b, cls, handler in (
            (self.stop_button, "tfk8s-stop", self.stop),
            (self.delete_button, "tfk8s-delete", self.ask_delete),
            (self.confirm_button, "tfk8s-confirm", self.confirm_delete),
            (self.cancel_button, "tfk8s-cancel", self.cancel),
        ):
            b.add_class(cls)
            b.on_click(lambda _b, h=handler: h())
        return w.HBox([self.stop_button, self.delete_button, self.confirm_button,
                       self.cancel_button, *extra])

    # -- button handlers (the kernel's main thread) -------------------------------------
    def stop(self) -> None:
        """Stop the cluster (on a thread); a click while busy is ignored."""
        def stop() -> str:
            try:
                st = self.cluster.stop()
            except ClusterNotFound:
                return self._found_gone()
            self._on_stopped(st)
            return f"stopped: the cluster is {st.phase}; logs kept in {st.log_dir}"

        self.run("stopping", stop)

    def ask_delete(self) -> None:
        """Ask to confirm a delete."""
        with self._lock:
            if self.state is not ActionState.IDLE or self.deleted:
                return
            self.state = ActionState.CONFIRMING
        self._redraw()
        self._on_outcome(f"delete {self.name} and its logs? press Yes, delete")

    def cancel(self) -> None:
        """Forget the delete question."""
        with self._lock:
            if self.state is not ActionState.CONFIRMING:
                return
            self.state = ActionState.IDLE
        self._redraw()
        self._on_outcome("")

    def confirm_delete(self) -> None:
        """Delete the cluster (on a thread), if a delete was asked for."""
        with self._lock:
            if self.state is not ActionState.CONFIRMING:
                return
            self.state = ActionState.IDLE

        def delete() -> str:
            try:
                self.cluster.delete()
            except ClusterNotFound:
                return self._found_gone()
            self.mark_deleted()
            return f"deleted {self.name}"

        self.run("deleting", delete)

    def mark_deleted(self) -> None:
        """The cluster is gone (deleted here or elsewhere): no action applies any more."""
        with self._lock:
            if self.deleted:
                return
            self.deleted = True
        self._on_deleted()

    def _found_gone(self) -> str:
        self.mark_deleted()
        return f"{self.name} was already deleted (by another cell, kernel or the tfk8s command)"

    # -- running an action -----------------------------------------------------------------
    def run(self, label: str, action: Callable[[], str]) -> bool:
        """Run ``action`` on a thread and show its outcome; False when another action runs."""
        with self._lock:
            if self.state is ActionState.BUSY or self.deleted:
                return False
            self.state = ActionState.BUSY
        self._redraw()
        self._on_outcome(f"{label}…")
        self.thread = threading.Thread(target=self._run, args=(label, action),
                                       name=f"tfk8s-action-{self.name}", daemon=True)
        self.thread.start()
        return True

    def _run(self, label: str, action: Callable[[], str]) -> None:
        try:
            outcome = action()
        except Exception as e:  # noqa: BLE001 - the outcome is shown to the user
            outcome = f"{label} failed: {e}"
        with self._lock:
            self.state = ActionState.IDLE
        self._redraw()
        self._on_outcome(outcome)

    # -- drawing -----------------------------------------------------------------------------
    def _redraw(self) -> None:
        if self.widget is not None:
            with self._draw_lock:
                self.draw(self._status, self.deleted)

    def draw(self, st: ClusterStatus | None, gone: bool) -> None:
        """Enable what can be done now (call under the view's draw lock)."""
        self._status = st
        if self.widget is None:
            return
        busy = self.state is ActionState.BUSY
        confirming = self.state is ActionState.CONFIRMING
        gone = gone or self.deleted
        self.stop_button.disabled = busy or gone or st is None or st.terminal
        self.delete_button.disabled = busy or gone or confirming
        self.confirm_button.layout.display = None if confirming else "none"
        self.cancel_button.layout.display = None if confirming else "none"
