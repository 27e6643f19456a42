"""The dashboard and cluster list, driven by a scripted backend (and once by a real local cluster).

The scripted backend implements the real :class:`Backend` interface: its
``watch`` and ``follow_logs`` yield what the test pushes, so the dashboard
is fed through the real :class:`ClusterFeed` exactly as in a notebook.
Widgets work without a kernel (their comms are inert), so every value the
browser would get is asserted on the widget objects themselves.
"""

from __future__ import annotations

import dataclasses
import queue
import re
import threading
import time

import pytest

from tests.conftest import wait_for as shared_wait_for
from tfk8s_magics.api import Cluster
from tfk8s_magics.backends import (
    Backend,
    ClusterStatus,
    Event,
    LogLine,
    Phase,
    Progress,
    TaskStatus,
    TensorBoardInfo,
)
from tfk8s_magics.backends.base import LogLocation
from tfk8s_magics.errors import ClusterNotFound
from tfk8s_magics.ui import dashboard as dash_mod
from tfk8s_magics.ui import render
from tfk8s_magics.ui.cluster_list import ClusterList
from tfk8s_magics.ui.dashboard import Dashboard
from tfk8s_magics.ui.plot import MetricHistory, sparkline_svg
from tfk8s_magics.ui.render import header_html, progress_html, tasks_html
from tfk8s_magics.watch import ClusterFeed

EVIL = "<img src=x onerror=alert(1)>"
ESCAPED = "&lt;img src=x onerror=alert(1)&gt;"
TIMEOUT = 10.0

_END = object()


def wait_for(cond, timeout: float = TIMEOUT, what: str = "condition"):
    return shared_wait_for(cond, timeout, what, interval=0.02)


def make_status(name="demo", phase=Phase.RUNNING, tasks=None, progress=None, **kw) -> ClusterStatus:
    return ClusterStatus(
        name=name,
        backend="scripted",
        mode="between",
        phase=phase,
        created=time.time() - 65,
        owner="alice",
        log_dir=LogLocation("/tmp/logs"),
        tasks=tasks
        if tasks is not None
        else [
            TaskStatus(
                "worker-0",
                Phase.RUNNING,
                "running the script",
                host="127.0.0.1:1234",
                started=time.time() - 30,
            ),
        ],
        progress=progress,
        **kw,
    )


class ScriptedBackend(Backend):
    """A backend whose status and log streams are pushed by the test."""

    name = "scripted"

    def __init__(self) -> None:
        self.statuses: dict[str, ClusterStatus] = {}
        self.status_q: dict[str, queue.Queue] = {}
        self.log_q: dict[str, queue.Queue] = {}
        self.logs: dict[str, list[LogLine]] = {}
        self.event_list: list[Event] = []
        self.calls: list[tuple[str, str]] = []
        self.stop_delay = 0.0

    def add(self, st: ClusterStatus) -> Cluster:
        self.statuses[st.name] = st
        self.status_q[st.name] = queue.Queue()
        self.log_q[st.name] = queue.Queue()
        self.logs[st.name] = []
        return Cluster(st.name, self)

    def push(self, st: ClusterStatus) -> None:
        self.statuses[st.name] = st
        self.status_q[st.name].put(st)

    def push_lines(self, name: str, task: str, texts: list[str]) -> None:
        for t in texts:
            line = LogLine(task, t, time.time())
            self.logs[name].append(line)
            self.log_q[name].put(line)

    def end(self, name: str) -> None:
        self.status_q[name].put(_END)
        self.log_q[name].put(_END)

    def _get(self, name: str) -> ClusterStatus:
        if name not in self.statuses:
            raise ClusterNotFound(f"no scripted cluster named {name!r}")
        return self.statuses[name]

    # -- the Backend interface -------------------------------------------------
    def launch(self, spec, *, detach=False):
        raise NotImplementedError

    def status(self, name):
        return self._get(name)

    def list_clusters(self):
        return sorted(self.statuses.values(), key=lambda s: s.created, reverse=True)

    def spec(self, name):
        self._get(name)
        raise NotImplementedError

    def watch(self, name, stop):
        # Like the real backends: ends once the cluster has ended (or is gone).
        st = self._get(name)
        yield st
        q = self.status_q[name]
        while not stop.is_set() and not st.terminal:
            try:
                item = q.get(timeout=0.05)
            except queue.Empty:
                continue
            if item is _END:
                return
            st = item
            yield item
            if name not in self.statuses:
                return

    def read_logs(self, name, task=None, tail=None):
        lines = [ln for ln in self.logs.get(name, []) if task is None or ln.task == task]
        return lines[-tail:] if tail else lines

    def follow_logs(self, name, stop, tasks=None, from_start=True):
        q = self.log_q[name]
        while not stop.is_set():
            try:
                item = q.get(timeout=0.05)
            except queue.Empty:
                if name not in self.statuses or self.statuses[name].terminal:
                    return
                continue
            if item is _END:
                return
            yield item

    def events(self, name):
        self._get(name)
        return list(self.event_list)

    def stop(self, name):
        self.calls.append(("stop", name))
        time.sleep(self.stop_delay)
        st = self._get(name)
        st = make_status(
            name,
            Phase.STOPPED,
            reason="stopped by the user",
            tasks=[
                TaskStatus(
                    t.name,
                    Phase.STOPPED,
                    "stopped by the user",
                    signal="SIGTERM",
                    host=t.host,
                    started=t.started,
                    finished=time.time(),
                )
                for t in st.tasks
            ],
            finished=time.time(),
        )
        self.push(st)
        return st

    def delete(self, name, keep_logs=False):
        self.calls.append(("delete", name))
        self._get(name)
        del self.statuses[name]
        return None

    def addresses(self, name):
        return {}

    def tensorboard(self, name):
        self.calls.append(("tensorboard", name))
        return TensorBoardInfo(6006, "/proxy/6006/", "/tmp/logs", False, 1)

    def serve(self, name, model=None, **options):
        from tfk8s_magics.serving import ServingInfo

        self.calls.append(("serve", name))
        return ServingInfo(name, model or name, 3, "/proxy/8501/", "http://127.0.0.1:8501/",
                           "127.0.0.1:8500", "/tmp/logs/models/demo")


@pytest.fixture
def scripted():
    be = ScriptedBackend()
    yield be
    for name in list(be.status_q):
        ClusterFeed.forget(be, name)


def dashboard_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("tfk8s-") and t.is_alive()]


def text_of(html_value: str) -> str:
    return re.sub(r"<[^>]+>", " ", html_value)


# -- pure renderings ---------------------------------------------------------------
def test_task_table_rows_and_columns():
    now = time.time()
    st = make_status(
        tasks=[
            TaskStatus(
                "ps-0",
                Phase.SUCCEEDED,
                "not needed",
                exit_code=0,
                host="127.0.0.1:1",
                started=now - 20,
                finished=now - 5,
            ),
            TaskStatus(
                "worker-0",
                Phase.FAILED,
                "crashed",
                exit_code=None,
                signal="SIGKILL",
                restarts=2,
                host="node-a",
                started=now - 10,
                finished=now - 4,
            ),
        ]
    )
    html = tasks_html(st, now=now)
    rows = re.findall(r'<tr data-task="([^"]+)" data-phase="([^"]+)">(.*?)</tr>', html)
    assert [(r[0], r[1]) for r in rows] == [("ps-0", "succeeded"), ("worker-0", "failed")]
    cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", rows[1][2])]
    assert cells[0:6] == ["worker-0", "failed", "crashed", "2", "SIGKILL", "node-a"]
    assert cells[7] == "6s"
    first = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", rows[0][2])]
    assert first[4] == "0" and first[7] == "15s"


def test_progress_text_has_step_percent_eta_rate_and_metrics():
    st = make_status(progress=Progress(step=12, total=30, rate=2.0, metrics={"loss": 0.25}, task="worker-0"))
    text = text_of(progress_html(st))
    assert "step 12/30 (40.0%)" in text
    assert "ETA 9s" in text
    assert "2 steps/s" in text
    assert "loss 0.25" in text
    assert "report_progress" in progress_html(make_status())


def test_header_shows_name_mode_backend_phase_age_owner():
    st = make_status(reason="all tasks running")
    text = text_of(header_html(st, "demo", now=st.created + 65))
    for want in (
        "demo",
        "between-graph",
        "scripted",
        "running",
        "all tasks running",
        "age 1m05s",
        "owner alice",
    ):
        assert want in text, want
    ended = make_status(phase=Phase.SUCCEEDED, finished=st.created + 30)
    assert "after 30s" in text_of(header_html(ended, "demo"))
    assert 'data-phase="deleted"' in header_html(ended, "demo", deleted=True)


def test_everything_user_controlled_is_escaped():
    st = make_status(
        name=EVIL,
        reason=EVIL,
        tasks=[TaskStatus("worker-0", Phase.FAILED, EVIL, host=EVIL)],
        progress=Progress(step=1, total=2, metrics={EVIL: 1.0}),
    )
    warning = Event(time.time(), EVIL, EVIL, EVIL, "Warning")
    for html in (
        header_html(st, EVIL, warning=warning),
        tasks_html(st),
        progress_html(st),
        render.events_html([warning]),
        sparkline_svg(EVIL, [(1, 1.0), (2, 0.5)]),
        dash_mod.tensorboard_html(EVIL, EVIL, False),
    ):
        assert "<img" not in html
        assert ESCAPED in html
    # A URL that is not http(s) or same-origin is never made a link.
    assert "href" not in dash_mod.tensorboard_html("javascript:alert(1)", "/log", False)


def test_metric_history_and_curve_points():
    h = MetricHistory()
    for step in range(1, 6):
        h.record(make_status(progress=Progress(step=step, total=10, metrics={"loss": 1.0 / step}, time=step)))
    h.record(make_status(progress=Progress(step=5, total=10, metrics={"loss": 0.2}, time=5)))  # same record
    pts = h.points()["loss"]
    assert pts == [(1, 1.0), (2, 0.5), (3, 1 / 3), (4, 0.25), (5, 0.2)]
    svg = sparkline_svg("loss", pts)
    coords = re.search(r'<polyline[^>]*points="([^"]+)"', svg).group(1).split()
    assert len(coords) == 5
    ys = [float(c.split(",")[1]) for c in coords]
    assert ys == sorted(ys)  # loss falls: each point lower on the plot (larger y)
    h.record(make_status(progress=Progress(step=1, total=10, metrics={"loss": 0.9}, time=99)))
    assert h.points()["loss"] == [(1, 0.9)]  # training started over


# -- the live dashboard ------------------------------------------------------------
def test_dashboard_follows_status_logs_and_progress(scripted):
    cluster = scripted.add(make_status(phase=Phase.STARTING, tasks=[TaskStatus("worker-0", Phase.STARTING)]))
    scripted.event_list = [Event(time.time(), "worker-0", "Scheduled", "placed on node-a")]
    d = Dashboard(cluster, widgets=True, max_lines=20).start()
    wait_for(lambda: 'data-phase="starting"' in d.tasks.value, what="starting row")
    assert d.tabs.titles[0] == "worker-0"

    for step in (3, 6):
        scripted.push(
            make_status(
                progress=Progress(
                    step=step, total=30, rate=3.0, metrics={"loss": 1.0 / step}, time=time.time()
                )
            )
        )
    scripted.push_lines("demo", "worker-0", ["hello", EVIL])
    wait_for(lambda: d.progress.value == 6, what="progress value 6")
    assert d.progress.max == 30
    assert "ETA 8s" in d.progress_label.value and "20.0%" in d.progress_label.value
    wait_for(lambda: 'data-phase="running"' in d.tasks.value, what="running row")
    out = d._task_pages["worker-0"].output
    wait_for(lambda: "hello" in "".join(o["text"] for o in out.outputs), what="log line")
    logged = "".join(o["text"] for o in out.outputs)
    assert EVIL in logged  # an Output stream is text: the browser shows it, never parses it
    wait_for(lambda: "<polyline" in d.curves.value, what="loss curve")
    assert "Scheduled" in d.events_view.value and d.tabs.titles[-2].startswith("Events (1)")

    scripted.push(
        make_status(
            phase=Phase.SUCCEEDED,
            tasks=[TaskStatus("worker-0", Phase.SUCCEEDED, "exit code 0", exit_code=0)],
            progress=Progress(step=30, total=30, metrics={"loss": 0.01}, time=time.time()),
            finished=time.time(),
        )
    )
    scripted.end("demo")
    assert d.wait(TIMEOUT), "the dashboard did not reach its final state"
    assert d.progress.value == 30 and d.progress.bar_style == "success"
    assert 'data-phase="succeeded"' in d.tasks.value
    assert d.actions.stop_button.disabled and not d.actions.delete_button.disabled
    wait_for(lambda: not d.running, what="render thread to end")


def test_log_tab_is_bounded_and_keeps_the_newest_lines(scripted):
    cluster = scripted.add(make_status())
    d = Dashboard(cluster, widgets=True, max_lines=20).start()
    wait_for(lambda: "worker-0" in d._task_pages, what="task tab")
    for i in range(0, 500, 10):
        scripted.push_lines("demo", "worker-0", [f"line {j}" for j in range(i, i + 10)])
        time.sleep(0.01)
    out = d._task_pages["worker-0"].output
    wait_for(lambda: "line 499\n" in "".join(o["text"] for o in out.outputs), what="newest line")
    held = "".join(o["text"] for o in out.outputs).splitlines()
    assert len(held) <= 2 * 20 + 1
    assert held[-1] == "line 499"
    # The whole log is one click away.
    page = d._task_pages["worker-0"]
    page.children[1].children[0].click()
    wait_for(lambda: "line 0\n" in "".join(o["text"] for o in out.outputs), what="full log")
    assert "".join(o["text"] for o in out.outputs).count("\n") >= 500


def test_interleaved_tasks_each_get_their_own_tab(scripted):
    cluster = scripted.add(
        make_status(tasks=[TaskStatus("ps-0", Phase.RUNNING), TaskStatus("worker-0", Phase.RUNNING)])
    )
    d = Dashboard(cluster, widgets=True, max_lines=10).start()
    wait_for(lambda: len(d._task_pages) == 2, what="two tabs")
    assert list(d.tabs.titles[:2]) == ["ps-0", "worker-0"]
    batch = []
    for i in range(40):
        batch.append(LogLine("worker-0", f"w{i}", time.time()))
        if i % 4 == 0:
            batch.append(LogLine("ps-0", f"p{i}", time.time()))
    d._on_logs(batch)  # one batch, as the watcher hands it over
    assert list(d.lines["worker-0"]) == [f"w{i}" for i in range(30, 40)]
    assert list(d.lines["ps-0"]) == [f"p{i}" for i in range(0, 40, 4)]
    assert d.line_counts == {"worker-0": 40, "ps-0": 10}
    d.refresh()
    worker = "".join(o["text"] for o in d._task_pages["worker-0"].output.outputs)
    ps = "".join(o["text"] for o in d._task_pages["ps-0"].output.outputs)
    assert worker.splitlines()[-1] == "w39" and "p" not in worker
    assert ps.splitlines() == [f"p{i}" for i in range(0, 40, 4)]


def test_stop_button_stops_once_and_shows_the_outcome(scripted):
    cluster = scripted.add(make_status())
    scripted.stop_delay = 0.3
    d = Dashboard(cluster, widgets=True).start()
    wait_for(lambda: 'data-phase="running"' in d.tasks.value, what="running")
    assert not d.actions.stop_button.disabled
    d.actions.stop_button.click()
    d.actions.stop_button.click()  # a second click while stopping is ignored
    assert d.actions.stop_button.disabled
    d.actions.thread.join(TIMEOUT)
    assert scripted.calls.count(("stop", "demo")) == 1
    assert "stopped" in d.outcome and "/tmp/logs" in d.outcome
    wait_for(lambda: 'data-phase="stopped"' in d.tasks.value, what="stopped row")
    assert "stopped: the cluster is stopped" in d.outcome_label.value
    assert d.actions.stop_button.disabled


def test_delete_asks_once_then_deletes_and_leaves_no_thread(scripted):
    before = {t.ident for t in dashboard_threads()}
    cluster = scripted.add(make_status())
    d = Dashboard(cluster, widgets=True).start()
    watcher = ClusterFeed.of(scripted, "demo")
    wait_for(lambda: 'data-phase="running"' in d.tasks.value, what="running")
    d.actions.delete_button.click()
    assert scripted.calls == []  # asked, not done
    assert "delete demo and its logs?" in d.outcome_label.value
    assert d.actions.confirm_button.layout.display is None and d.actions.delete_button.disabled
    d.actions.cancel_button.click()
    assert d.actions.confirm_button.layout.display == "none" and not d.actions.delete_button.disabled
    d.actions.delete_button.click()
    d.actions.confirm_button.click()
    d.actions.confirm_button.click()  # the question is gone: a second confirm does nothing
    d.actions.thread.join(TIMEOUT)
    assert scripted.calls == [("delete", "demo")]
    assert d.wait(TIMEOUT) and d.deleted
    assert "deleted demo" in d.outcome_label.value
    assert 'data-phase="deleted"' in d.header.value
    assert d.actions.delete_button.disabled and d.actions.stop_button.disabled
    assert d._on_status not in watcher._status_subs and d._on_logs not in watcher._log_subs
    wait_for(lambda: not ({t.ident for t in dashboard_threads()} - before), what="threads to end")


def test_external_delete_ends_the_dashboard(scripted):
    """Deleting through another handle (another cell, the CLI) also ends the view and its thread."""
    cluster = scripted.add(make_status())
    d = Dashboard(cluster, widgets=True).start()
    wait_for(lambda: 'data-phase="running"' in d.tasks.value, what="running")
    Cluster("demo", scripted).delete()
    assert d.wait(TIMEOUT)
    assert d.deleted and 'data-phase="deleted"' in d.header.value
    wait_for(lambda: not d.running, what="render thread to end")


def test_tensorboard_button_shows_proxied_link_and_iframe(scripted):
    cluster = scripted.add(make_status())
    d = Dashboard(cluster, widgets=True).start()
    d.tensorboard_button.click()
    d.actions.thread.join(TIMEOUT)
    assert scripted.calls == [("tensorboard", "demo")]
    assert 'href="/proxy/6006/"' in d.tensorboard_view.value and "<iframe" in d.tensorboard_view.value
    assert d.tabs.selected_index == len(d.tabs.children) - 1


def test_serve_button_shows_the_endpoint_and_model_version(scripted):
    cluster = scripted.add(make_status())
    d = Dashboard(cluster, widgets=True).start()
    d.serve_button.click()
    d.actions.thread.join(TIMEOUT)
    assert scripted.calls == [("serve", "demo")]
    assert "serving model 'demo' version 3" in d.outcome, d.outcome
    assert "/proxy/8501/v1/models/demo" in d.outcome_label.value and "127.0.0.1:8500" in d.outcome


def test_two_views_share_one_feed(scripted):
    cluster = scripted.add(make_status())
    a = Dashboard(cluster, widgets=True).start()
    b = Dashboard(Cluster("demo", scripted), widgets=True).start()
    assert a._feed is b._feed
    scripted.push_lines("demo", "worker-0", ["shared"])
    for d in (a, b):
        out = wait_for(lambda d=d: d._task_pages.get("worker-0"), what="tab")
        wait_for(lambda out=out: "shared" in "".join(o["text"] for o in out.output.outputs), what="line")
    a.close()
    scripted.push_lines("demo", "worker-0", ["after"])
    wait_for(
        lambda: "after" in "".join(o["text"] for o in b._task_pages["worker-0"].output.outputs),
        what="line in b",
    )
    assert "after" not in "".join(o["text"] for o in a._task_pages["worker-0"].output.outputs)
    wait_for(lambda: not a.running, what="closed view's thread to end")


def test_rerunning_a_cell_closes_the_views_it_showed_before(scripted, monkeypatch, capsys):
    from tfk8s_magics.ui import live

    cluster = scripted.add(make_status())
    run = {"msg": "run-1"}
    monkeypatch.setattr(live, "current_cell_id", lambda: "cell-a")
    monkeypatch.setattr(live, "_current_msg_id", lambda: run["msg"])
    first = Dashboard(cluster, widgets=True).show()
    same_run = Dashboard(cluster, widgets=True).show()  # one run may show several views
    assert first.running and same_run.running
    run["msg"] = "run-2"  # the cell is executed again
    again = Dashboard(cluster, widgets=True).show()
    wait_for(lambda: not first.running and not same_run.running, what="old views to stop")
    assert first.widget.comm is None  # its widgets were closed, not leaked
    assert again.running
    scripted.push_lines("demo", "worker-0", ["still live"])
    out = wait_for(lambda: again._task_pages.get("worker-0"), what="tab")
    wait_for(lambda: "still live" in "".join(o["text"] for o in out.output.outputs), what="line")
    again.close()


def test_a_destroyed_dashboard_leaves_no_widget_behind(scripted):
    """close(destroy=True) frees every widget the view made (bench/soak.py found one Layout per
    view left in ipywidgets' registry: the action bar's, replaced and never closed)."""
    import warnings

    import ipywidgets

    def live_widgets() -> set:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # Widget.widgets: the registry
            return set(ipywidgets.Widget.widgets)

    cluster = scripted.add(make_status())
    before = live_widgets()
    d = Dashboard(cluster, widgets=True).start()
    scripted.push_lines("demo", "worker-0", ["a line"])
    wait_for(lambda: d._task_pages.get("worker-0"), what="the task's tab")
    d.close(destroy=True)
    wait_for(lambda: not d.running, what="the view's thread to end")
    left = [type(ipywidgets.Widget.widgets[k]).__name__ for k in live_widgets() - before]
    assert left == []


def test_a_draw_that_comes_after_destroy_makes_no_widget(scripted):
    """bench/soak.py (session 20, 30 cycles that delete at once): +2 live widgets per cycle. A
    draw already under way when the cell is re-run finished after close(destroy=True) and made
    the new task's log page, outside the tree that was closed. A draw after destroy must draw
    nothing (here on the calling thread, deterministically)."""
    import warnings

    import ipywidgets

    def live_widgets() -> set:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # Widget.widgets: the registry
            return set(ipywidgets.Widget.widgets)

    cluster = scripted.add(make_status())
    before = live_widgets()
    d = Dashboard(cluster, widgets=True)  # not started: no thread draws behind the test's back
    d.close(destroy=True)
    d.status, d._status_dirty = make_status(), True  # what the feed delivered meanwhile
    d.refresh()
    left = [type(ipywidgets.Widget.widgets[k]).__name__ for k in live_widgets() - before]
    assert left == []
    assert "worker-0" not in d._task_pages


def test_fallback_repr_without_widgets(scripted):
    cluster = scripted.add(make_status(name="demo", reason=EVIL, progress=Progress(step=5, total=10)))
    d = Dashboard(cluster, widgets=False)
    assert d.widget is None
    html = d._repr_html_()
    assert "demo" in html and ESCAPED in html and "<img" not in html and "step 5/10" in html
    text = repr(d)
    assert "cluster demo (scripted, between): running" in text and "worker-0" in text
    bundle = d._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    w = Dashboard(cluster, widgets=True)
    assert "application/vnd.jupyter.widget-view+json" in w._repr_mimebundle_()
    assert "text/html" in w._repr_mimebundle_()  # what nbconvert shows without widget state


def test_cluster_list_rows_actions_and_fallback(scripted):
    scripted.add(
        make_status(
            name="done", phase=Phase.SUCCEEDED, finished=time.time(), progress=Progress(step=10, total=10)
        )
    )
    scripted.add(make_status(name=EVIL))
    lst = ClusterList(scripted, widgets=True)
    assert set(lst.rows) == {"done", EVIL}
    assert ESCAPED in lst.rows[EVIL].name_cell.value and "<img" not in lst.rows[EVIL].name_cell.value
    done = lst.rows["done"]
    assert 'data-phase="succeeded"' in done.phase_cell.value and done.bar.value == 10
    assert done.actions.stop_button.disabled and not done.live
    assert lst.rows[EVIL].live  # a running cluster is followed through its watcher
    # The same cluster making progress (a new ``created`` would be a relaunch: the row's
    # deletion watch rightly calls that a deletion, and the Stop below would be ignored).
    scripted.push(dataclasses.replace(scripted.statuses[EVIL], progress=Progress(step=4, total=8)))
    wait_for(lambda: lst.rows[EVIL].bar.value == 4, what="list progress")
    assert lst.rows[EVIL].bar.max == 8
    row = lst.rows[EVIL]
    row.actions.stop_button.click()
    row.actions.thread.join(TIMEOUT)
    assert scripted.calls == [("stop", EVIL)]
    row.actions.delete_button.click()  # the same ask-once flow as the dashboard's
    assert scripted.calls == [("stop", EVIL)] and row.actions.confirm_button.layout.display is None
    row.actions.confirm_button.click()
    row.actions.thread.join(TIMEOUT)
    assert scripted.calls[-1] == ("delete", EVIL) and row.deleted
    assert "deleted" in lst.outcome_label.value and ESCAPED in lst.outcome_label.value
    d = lst.open_dashboard("done")
    assert lst.detail.children == (d.widget,)
    assert d.wait(TIMEOUT)
    lst.close()
    text = repr(lst)
    assert "done" in text and "succeeded" in text
    assert "<img" not in lst._repr_html_()


# -- a real local cluster ----------------------------------------------------------
SCRIPT = """
import time, tfk8s_magics
N = 12
for i in range(N + 1):
    print(f"step {i} <img src=x onerror=alert(1)>", flush=True)
    tfk8s_magics.report_progress(i, total=N, loss=1.0 / (i + 1))
    time.sleep(0.15)
"""


@pytest.mark.slow
def test_real_local_cluster_end_to_end(local, workdir):
    import tfk8s_magics as tk

    before = {t.ident for t in dashboard_threads()}
    cluster = tk.launch("dash", backend=local, workers=1, ps=0, script=SCRIPT, ps_grace_period=0)
    d = Dashboard(cluster, widgets=True).start()
    wait_for(lambda: 'data-phase="running"' in d.tasks.value, timeout=120, what="worker running")
    wait_for(lambda: 'data-phase="succeeded"' in d.tasks.value, timeout=60, what="worker succeeded")
    assert d.wait(60)
    assert d.progress.value == 12 and d.progress.max == 12
    logged = "".join(o["text"] for o in d._task_pages["worker-0"].output.outputs)
    assert "step 12 " + EVIL in logged
    pts = d._history.points()["loss"]
    assert pts[-1] == (12, pytest.approx(1 / 13)) and len(pts) >= 3
    assert "Completed" in d.events_view.value
    d.actions.delete_button.click()
    d.actions.confirm_button.click()
    d.actions.thread.join(30)
    assert d.deleted and "deleted dash" in d.outcome
    with pytest.raises(ClusterNotFound):
        local.status("dash")
    wait_for(lambda: not ({t.ident for t in dashboard_threads()} - before), what="threads to end")


def test_a_watch_error_is_reported_not_swallowed():
    class Broken:
        name = "broken"

        def watch(self, name, stop):
            raise RuntimeError("403 Forbidden: pods is forbidden")
            yield  # a generator, like a real backend's

        def follow_logs(self, name, stop, tasks=None, from_start=True):
            return iter(())

    got = []
    w = ClusterFeed.of(Broken(), "x")
    w.subscribe(on_logs=got.extend)
    wait_for(lambda: w.status_done.is_set() and got, what="the error to reach the view")
    assert "403 Forbidden: pods is forbidden" in w.error
    assert got[-1].task == "tfk8s" and "watching the status of 'x' stopped" in got[-1].text


def test_a_views_end_is_one_value_and_deleted_or_closed_is_final():
    from tfk8s_magics.ui.live import ViewEnd

    assert not ViewEnd.LIVE.final and all(e.final for e in ViewEnd if e is not ViewEnd.LIVE)
    assert ViewEnd.LIVE.then(ViewEnd.ENDED) is ViewEnd.ENDED
    assert ViewEnd.ENDED.then(ViewEnd.DELETED) is ViewEnd.DELETED  # deleted after it ended
    assert ViewEnd.ENDED.then(ViewEnd.LIVE) is ViewEnd.ENDED
    assert ViewEnd.DELETED.then(ViewEnd.ENDED) is ViewEnd.DELETED
    assert ViewEnd.CLOSED.then(ViewEnd.DELETED) is ViewEnd.CLOSED


def test_the_cell_registry_is_bounded(monkeypatch):
    from tfk8s_magics.ui import live

    class View:
        def __init__(self):
            self.end = live.ViewEnd.LIVE

        def close(self, destroy=False):
            self.end = live.ViewEnd.CLOSED

    monkeypatch.setattr(live, "_by_cell", type(live._by_cell)())
    monkeypatch.setattr(live, "_current_msg_id", lambda: "run")
    ended = View()
    monkeypatch.setattr(live, "current_cell_id", lambda: "first")
    live.supersede(ended)
    ended.end = live.ViewEnd.ENDED
    monkeypatch.setattr(live, "current_cell_id", lambda: "second")
    live.supersede(View())
    assert list(live._by_cell) == ["second"]  # a cell whose views all ended is dropped at once
    for i in range(3 * live.MAX_CELLS):
        monkeypatch.setattr(live, "current_cell_id", lambda i=i: f"cell-{i}")
        live.supersede(View())
    assert len(live._by_cell) == live.MAX_CELLS  # one entry per cell, the oldest forgotten


def test_no_backend_call_under_the_feed_registry_lock(scripted, monkeypatch):
    """A slow status read (a far API) for one cluster never holds up the feeds of others."""
    scripted.add(make_status(name="slow", phase=Phase.SUCCEEDED, finished=time.time()))
    scripted.add(make_status(name="demo"))
    first = ClusterFeed.of(scripted, "slow")
    wait_for(lambda: not first.running, what="the ended cluster's feed to finish")
    release = threading.Event()
    entered = threading.Event()
    real_status = scripted.status

    def slow_status(name):
        if name == "slow":
            entered.set()
            release.wait(TIMEOUT)
        return real_status(name)

    monkeypatch.setattr(scripted, "status", slow_status)
    blocked = threading.Thread(target=ClusterFeed.of, args=(scripted, "slow"), daemon=True)
    blocked.start()
    assert entered.wait(TIMEOUT)  # ClusterFeed.of("slow") is inside the backend now
    started = time.monotonic()
    other = ClusterFeed.of(scripted, "demo")
    assert time.monotonic() - started < 1.0 and other.name == "demo"
    release.set()
    blocked.join(TIMEOUT)


# -- views never contradict the truth (issue 8, item 5) ------------------------------------
def _failed(name="demo"):
    return make_status(name=name, phase=Phase.FAILED, reason="worker-0 failed", finished=time.time(),
                       tasks=[TaskStatus("worker-0", Phase.FAILED, "exit code 1", exit_code=1,
                                         started=time.time() - 5, finished=time.time())])


def test_delete_button_of_an_ended_dashboard_shows_deleted(scripted):
    """Regression: after the Delete button of a failed cluster's dashboard, its header still
    said "failed" (the view had drawn its final state and stopped drawing)."""
    cluster = scripted.add(_failed())
    d = Dashboard(cluster, widgets=True).start()
    assert d.wait(TIMEOUT) and 'data-phase="failed"' in d.header.value
    d.actions.delete_button.click()
    d.actions.confirm_button.click()
    d.actions.thread.join(TIMEOUT)
    wait_for(lambda: 'data-phase="deleted"' in d.header.value, what="the header to say deleted")
    assert d.actions.delete_button.disabled and d.actions.stop_button.disabled
    assert d.tensorboard_button.disabled


def test_delete_elsewhere_of_an_ended_cluster_reaches_its_dashboard(scripted):
    """A cluster that ended, then was deleted by another cell (or another process): the view
    that had stopped drawing shows it within one tick, with every button disabled."""
    cluster = scripted.add(_failed())
    d = Dashboard(cluster, widgets=True).start()
    assert d.wait(TIMEOUT)
    del scripted.statuses["demo"]  # as another process deleting it: no call in this kernel
    wait_for(lambda: 'data-phase="deleted"' in d.header.value, 10, "the header to say deleted")
    assert d.actions.delete_button.disabled and d.tensorboard_button.disabled


def test_a_deleted_running_cluster_shows_no_running_task(scripted):
    """Regression: after `%tfcluster delete` of an in-graph cluster its task table stayed
    "running / serving"."""
    cluster = scripted.add(make_status(tasks=[
        TaskStatus("ps-0", Phase.RUNNING, "serving", started=time.time() - 5),
        TaskStatus("worker-0", Phase.RUNNING, "serving", started=time.time() - 5)]))
    d = Dashboard(cluster, widgets=True).start()
    wait_for(lambda: 'data-phase="running"' in d.tasks.value, what="running")
    Cluster("demo", scripted).delete()
    assert d.wait(TIMEOUT)
    wait_for(lambda: 'data-phase="running"' not in d.tasks.value, what="the table to drop running")
    assert "serving" not in d.tasks.value and 'data-phase="deleted"' in d.tasks.value


def test_cluster_list_after_a_delete_elsewhere(scripted):
    """Regression: `%tfcluster list` kept a deleted cluster with live buttons, a summary that
    contradicted its row ("1 running"), and Delete there said "There are none yet"."""
    scripted.add(make_status(name="gone"))
    scripted.add(_failed(name="ended"))
    lst = ClusterList(scripted, widgets=True)
    assert "1 running" in lst.summary.value
    Cluster("gone", scripted).delete()  # another cell of this kernel
    del scripted.statuses["ended"]  # another process
    for name in ("gone", "ended"):
        row = lst.rows[name]
        wait_for(lambda r=row: 'data-phase="deleted"' in r.phase_cell.value, 10, f"{name} deleted")
        assert row.actions.delete_button.disabled and row.actions.stop_button.disabled
        assert row.dash_button.disabled
    wait_for(lambda: "0 running" in lst.summary.value or "no clusters" in lst.summary.value, 10,
             "the summary to agree with the rows")
    assert "1 running" not in lst.summary.value
    lst.close()


def test_a_delete_that_finds_the_cluster_gone_says_so(scripted):
    """Pressing Delete on a row whose cluster another process removed a moment ago."""
    scripted.add(make_status(name="racy"))
    lst = ClusterList(scripted, widgets=True)
    row = lst.rows["racy"]
    row.actions.delete_button.click()
    del scripted.statuses["racy"]
    row.actions.confirm_button.click()
    row.actions.thread.join(TIMEOUT)
    assert "racy was already deleted" in lst.outcome, lst.outcome
    assert row.deleted and row.actions.delete_button.disabled
    lst.close()


def test_the_log_shown_first_is_the_failed_task_else_the_chief_else_worker_0():
    """Regression: PS clusters opened on ps-0's log, and a failed cluster on a healthy worker."""
    from tfk8s_magics.ui.render import default_log_task

    def tasks(*specs):
        return make_status(tasks=[TaskStatus(n, ph, "", finished=f) for n, ph, f in specs])

    run = Phase.RUNNING
    assert default_log_task(tasks(("ps-0", run, None), ("worker-0", run, None))) == "worker-0"
    assert default_log_task(tasks(("ps-0", run, None), ("chief-0", run, None),
                                  ("worker-0", run, None))) == "chief-0"
    assert default_log_task(tasks(("ps-0", run, None), ("worker-0", run, None),
                                  ("worker-1", Phase.FAILED, 5.0), ("worker-2", Phase.FAILED, 3.0))
                            ) == "worker-2"
    assert default_log_task(tasks(("ps-0", Phase.FAILED, 1.0), ("worker-0", run, None))) == "ps-0"


def test_dashboard_opens_on_the_failed_task_and_respects_the_users_choice(scripted):
    cluster = scripted.add(make_status(tasks=[
        TaskStatus("ps-0", Phase.RUNNING, "serving"), TaskStatus("worker-0", Phase.RUNNING, ""),
        TaskStatus("worker-1", Phase.RUNNING, "")]))
    d = Dashboard(cluster, widgets=True).start()
    wait_for(lambda: d.tabs.titles[:3] == ("ps-0", "worker-0", "worker-1"), what="tabs")
    wait_for(lambda: d.tabs.selected_index == 1, what="worker-0 shown first (not ps-0)")
    scripted.push(make_status(phase=Phase.FAILED, finished=time.time(), tasks=[
        TaskStatus("ps-0", Phase.STOPPED, ""), TaskStatus("worker-0", Phase.STOPPED, ""),
        TaskStatus("worker-1", Phase.FAILED, "exit code 1", exit_code=1, finished=time.time())]))
    wait_for(lambda: d.tabs.selected_index == 2, what="the failed worker-1 shown")
    d.close()


def test_in_graph_hints_speak_of_the_kernel_not_a_script():
    """Regression: the in-graph dashboard told the user to call report_progress "in the script"
    (there is none in-graph: the training loop runs in the kernel)."""
    from tfk8s_magics.ui.plot import curves_html
    from tfk8s_magics.ui.render import progress_html

    st = make_status()
    st_ig = dataclasses.replace(st, mode="in-graph")
    hint = progress_html(st_ig)
    assert "script" not in hint and "this notebook" in hint and "%tfcluster connect demo" in hint
    assert "in the training script" in progress_html(st)
    assert "script" not in curves_html({})


def test_the_header_says_stalled_with_how_long_and_the_last_lines():
    """The stall detector's verdict (ClusterStatus.shown_phase / stall_text) reaches the header."""
    from tfk8s_magics.ui.render import header_html

    base = make_status()

    class Stalled(ClusterStatus):
        shown_phase = "stalled"

        def stall_text(self, now=None):
            return "stalled for 2m10s; worker-0 last printed: <b>epoch 1</b>"

    st = Stalled(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)})
    html_text = header_html(st, "demo")
    assert 'data-phase="stalled"' in html_text and "tfk8s-phase-stalled" in html_text
    assert "stalled for 2m10s" in html_text and "&lt;b&gt;epoch 1&lt;/b&gt;" in html_text
    assert 'data-phase="deleted"' in header_html(st, "demo", deleted=True)
    assert 'data-phase="running"' in header_html(base, "demo")


def test_a_log_tab_the_user_picked_stays_picked(scripted):
    cluster = scripted.add(make_status(tasks=[
        TaskStatus("ps-0", Phase.RUNNING, "serving"), TaskStatus("worker-0", Phase.RUNNING, "")]))
    d = Dashboard(cluster, widgets=True).start()
    wait_for(lambda: d.tabs.selected_index == 1, what="worker-0 shown first")
    d.tabs.selected_index = 0  # the user opens ps-0 (the browser syncs the trait like this)
    scripted.push(make_status(phase=Phase.FAILED, finished=time.time(), tasks=[
        TaskStatus("ps-0", Phase.STOPPED, ""),
        TaskStatus("worker-0", Phase.FAILED, "exit code 1", exit_code=1, finished=time.time())]))
    assert d.wait(TIMEOUT)
    assert d.tabs.selected_index == 0


# -- issue 27 item 7: no text that is no longer true ---------------------------------------
def test_an_ended_cluster_says_how_its_tasks_ended_not_0_of_1():
    from tfk8s_magics.ui.render import tasks_running

    done = make_status(phase=Phase.SUCCEEDED, tasks=[TaskStatus("worker-0", Phase.SUCCEEDED, "exit code 0")])
    assert tasks_running(done) == "1 succeeded"
    assert tasks_running(_failed()) == "1 failed"
    assert tasks_running(make_status(tasks=[TaskStatus("worker-0", Phase.RUNNING, "")])) == "1/1"


def test_an_ended_dashboard_without_metrics_does_not_say_yet(scripted):
    from tfk8s_magics.ui.plot import curves_html

    assert "no metrics were reported" in curves_html({}, ended=True)
    assert "yet" not in curves_html({}, ended=True)
    cluster = scripted.add(_failed(name="quiet"))
    d = Dashboard(cluster, widgets=True).start()
    wait_for(lambda: "no metrics were reported" in d.curves.value, what="the ended text")
    assert "yet" not in d._repr_html_().split("tfk8s-curves")[1][:200]
    d.close()


def test_the_final_record_is_the_live_dashboards_alternative_not_a_second_copy(scripted):
    """Issue 27 item 7: a "final state" block was drawn under every live dashboard, duplicating
    it.  Now the record is the dashboard output's HTML/text alternative: JupyterLab keeps showing
    the widget view; a notebook saved without widget state (or nbconvert) shows the record."""
    from tfk8s_magics.ui import summary

    cluster = scripted.add(make_status(name="rec"))
    d = Dashboard(cluster, widgets=True)
    live_bundle = d._repr_mimebundle_()
    assert "final state" not in live_bundle["text/html"] + live_bundle["text/plain"]
    rec = summary.FinalSummary(cluster, view=d)
    ended = make_status(name="rec", phase=Phase.SUCCEEDED, finished=time.time(),
                        tasks=[TaskStatus("worker-0", Phase.SUCCEEDED, "exit code 0", exit_code=0)])
    assert rec.finish(ended)
    bundle = d._repr_mimebundle_()
    # One output: the widget view for a live front end, the record as its alternatives.
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert 'class="tfk8s-summary" data-phase="succeeded"' in bundle["text/html"], bundle["text/html"]
    assert bundle["text/plain"].startswith("final state of rec\ncluster rec (scripted, between): succeeded")
    assert rec._handle is None  # no output of its own
    # Deleted afterwards: the same output says so.
    del scripted.statuses["rec"]
    assert rec.finish(deleted=True)
    assert "(then deleted; it had ended <b>succeeded</b>)" in d._repr_mimebundle_()["text/html"]


def test_a_deleted_clusters_views_do_not_show_its_deleted_log_dir(scripted, tmp_path):
    """Issue 27 item 7: after a delete, the header (and the final record) still showed the log
    dir that the delete had removed.  A log dir that is still there (kept, or the user's) is
    still shown."""
    import shutil

    from tfk8s_magics.ui import summary

    for kept in (False, True):
        logs = tmp_path / f"logs-{kept}"
        logs.mkdir()
        name = f"gone{int(kept)}"
        cluster = scripted.add(dataclasses.replace(_failed(name=name), log_dir=LogLocation(str(logs))))
        d = Dashboard(cluster, widgets=True).start()
        rec = summary.FinalSummary(cluster, view=d)
        assert d.wait(TIMEOUT) and str(logs) in d.header.value
        assert rec.finish(cluster.status()) and str(logs) in d.record._repr_html_()
        if not kept:
            shutil.rmtree(logs)
        del scripted.statuses[name]  # deleted (by another process: no call in this kernel)
        wait_for(lambda d=d: 'data-phase="deleted"' in d.header.value, 10, "the header to say deleted")
        rec.finish(deleted=True)
        shown = [d.header.value, d._repr_html_(), repr(d), d.record._repr_html_(), repr(d.record)]
        for text in shown:
            if kept:
                assert str(logs) in text, text
            else:
                assert str(logs) not in text and "deleted with the cluster" in text, text
        d.close()
