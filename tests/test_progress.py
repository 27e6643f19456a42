"""The progress protocol inside a task (no TensorFlow needed)."""

import json
import time

from tfk8s_magics.runtime import progress


def test_reports_are_rate_limited_but_the_newest_is_always_written(tmp_path, monkeypatch):
    path = tmp_path / "p.jsonl"
    monkeypatch.setenv("TFK8S_PROGRESS_FILE", str(path))
    monkeypatch.setenv("TFK8S_TASK", "worker-0")
    r = progress._Reporter()
    written = [r.report(step, 1000, {"loss": 1.0 / step}) for step in range(1, 201)]
    assert written[0] is True and sum(written) < 5  # a burst is not written line by line
    time.sleep(1.0 / progress.MAX_RATE_HZ + 0.2)
    records = [json.loads(x) for x in path.read_text().splitlines()]
    assert records[-1]["step"] == 200  # the held record was flushed after the pause
    assert records[-1]["metrics"]["loss"] == 1.0 / 200
    assert records[-1]["task"] == "worker-0" and records[-1]["total"] == 1000


def test_final_step_is_written_at_once(tmp_path, monkeypatch):
    path = tmp_path / "p.jsonl"
    monkeypatch.setenv("TFK8S_PROGRESS_FILE", str(path))
    r = progress._Reporter()
    r.report(1, 2, {})
    assert r.report(2, 2, {}) is True
    assert json.loads(path.read_text().splitlines()[-1])["step"] == 2


def test_outside_a_task_it_does_nothing(monkeypatch, capsys):
    monkeypatch.delenv("TFK8S_PROGRESS_FILE", raising=False)
    monkeypatch.delenv("TFK8S_TASK", raising=False)
    assert progress._Reporter().report(5, 10, {}) is False
    assert capsys.readouterr().out == ""


def test_in_a_pod_records_go_to_stdout_with_a_marker(monkeypatch, capsys):
    monkeypatch.delenv("TFK8S_PROGRESS_FILE", raising=False)
    monkeypatch.setenv("TFK8S_TASK", "worker-1")
    assert progress._Reporter().report(3, 10, {"acc": 0.5}) is True
    line = capsys.readouterr().out.strip()
    assert line.startswith(progress.STDOUT_MARKER)
    assert progress.parse_record(line)["metrics"] == {"acc": 0.5}


def test_an_in_graph_client_redirects_its_records_until_its_cluster_is_deleted(monkeypatch):
    monkeypatch.delenv("TFK8S_PROGRESS_FILE", raising=False)
    monkeypatch.delenv("TFK8S_TASK", raising=False)
    got: list[str] = []
    progress.redirect_progress(got.append, "chief-0", key=("local", "ig"))
    try:
        assert progress.report_progress(5, total=5, loss=0.5) is True
        assert progress.parse_record(got[-1])["task"] == "chief-0"
        progress.end_redirect(("local", "other"))  # another cluster's delete changes nothing
        assert progress.report_progress(5, total=5) is True and len(got) == 2
    finally:
        progress.end_redirect(("local", "ig"))
    assert progress.report_progress(5, total=5) is False  # back to: outside a task, nothing
