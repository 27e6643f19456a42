"""The per-task log tabs of a dashboard: one bounded live log per task, the whole file one click away.

A task's tab is created the first time the task is seen, before the fixed
tabs that follow the task tabs (events, TensorBoard).  Each holds at most
about twice ``max_lines`` lines (:class:`~.live.LogOutput` re-bases it on
the newest ones); "Full log" loads the task's kept log (up to
:data:`FULL_LOG_MAX_LINES` lines) on a thread.  Every method that touches
a widget is called under the dashboard's draw lock, or takes it.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Callable

from .live import LogOutput

#: Most lines the "full log" button loads into a tab.
FULL_LOG_MAX_LINES = 20_000


class TaskLogTabs:
    """The task tabs inside ``tabs`` (an ``ipywidgets.Tab`` whose fixed tabs come last)."""

    def __init__(
        self,
        tabs,
        name: str,
        max_lines: int,
        draw_lock: threading.RLock,
        read_log: Callable[[str], list[str]],
        newest: Callable[[str], list[str]],
    ) -> None:
        self.tabs = tabs
        self.name = name
        self.max_lines = max_lines
        self._draw_lock = draw_lock
        self._read_log = read_log
        self._newest = newest
        #: task → its page (a VBox with ``.output``), in the order the tasks were seen.
        self.pages: dict[str, object] = {}
        self._logs: dict[str, LogOutput] = {}
        #: The tab this view chose last; once the user picks another, the view stops choosing.
        self._chosen: int | None = None
        self._user_chose = False
        tabs.observe(self._on_select, names="selected_index")

    def _on_select(self, change) -> None:
        if change["new"] != self._chosen:
            self._user_chose = True

    def prefer(self, task: str | None) -> None:
        """Show ``task``'s tab (see :func:`.render.default_log_task`) unless the user chose one."""
        if task is None or self._user_chose or task not in self.pages:
            return
        index = list(self.pages).index(task)
        if self.tabs.selected_index != index:
            self._chosen = index
            self.tabs.selected_index = index

    def page(self, task: str):
        """The tab of one task's log, created the first time the task is seen."""
        page = self.pages.get(task)
        if page is None:
            page = self._new_page(task)
            self.pages[task] = page
            self._insert(task, page)
        return page

    def _new_page(self, task: str):
        import ipywidgets as w

        # column-reverse keeps the scroll anchored at the bottom: the newest line stays in view.
        out = w.Output(layout=w.Layout(height="20em", overflow="auto", display="flex",
                                       flex_flow="column-reverse", border="1px solid #ddd"))
        out.add_class("tfk8s-log")
        full = w.Button(description="Full log", icon="file-text-o",
                        tooltip=f"load the whole log of this task (up to {FULL_LOG_MAX_LINES:,} lines)")
        full.add_class("tfk8s-full-log")
        full.on_click(lambda _b, t=task: self.load_full(t))
        hint = w.HTML(
            f'<span style="color:#888">the last {self.max_lines} lines · '
            f"<code>%tfcluster logs {html.escape(self.name)} {html.escape(task)}</code> "
            "prints the whole log</span>"
        )
        page = w.VBox([out, w.HBox([full, hint], layout=w.Layout(align_items="center"))])
        page.add_class("tfk8s-task-log")
        page.output = out  # type: ignore[attr-defined]
        self._logs[task] = LogOutput(out, self.max_lines)
        return page

    def _insert(self, task: str, page) -> None:
        n = len(self.pages) - 1
        children, titles = list(self.tabs.children), list(self.tabs.titles)
        selected = self.tabs.selected_index
        self.tabs.children = children[:n] + [page] + children[n:]
        self.tabs.titles = tuple(titles[:n] + [task] + titles[n:])
        if n == 0 or selected is None:
            self._chosen = 0
            self.tabs.selected_index = 0
        elif selected >= n:  # the same tab stays selected (its index moved)
            self._chosen = selected + 1
            self.tabs.selected_index = selected + 1

    def append(self, task: str, lines: list[str], total: int) -> None:
        """Append a task's new lines (``total``: lines it printed so far)."""
        self.page(task)

        def head() -> str:
            dropped = max(0, total - len(self._newest(task)))
            return f"… {dropped} earlier lines: press Full log, or %tfcluster logs {self.name} {task}\n"

        self._logs[task].append(lines, lambda: self._newest(task), head)

    def load_full(self, task: str) -> threading.Thread:
        """Load the task's whole kept log into its tab, on a thread (no lock held while reading)."""
        def load() -> None:
            try:
                lines = self._read_log(task)
            except Exception as e:  # noqa: BLE001 - shown in place of the log
                lines, head = [], f"cannot read the log of {task}: {e}\n"
            else:
                head = ""
                if len(lines) > FULL_LOG_MAX_LINES:
                    head = f"… showing the last {FULL_LOG_MAX_LINES} of {len(lines)} lines\n"
                    lines = lines[-FULL_LOG_MAX_LINES:]
            with self._draw_lock:
                self.page(task)
                # Live lines keep coming; re-basing waits until as many again have arrived.
                self._logs[task].replace(head + "\n".join(lines) + "\n", -len(lines))

        t = threading.Thread(target=load, name=f"tfk8s-fulllog-{self.name}", daemon=True)
        t.start()
        return t
