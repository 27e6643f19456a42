"""Issue 14, item 11: the smaller defects, each kept as a test (the rest are in test_faults_state.py
and test_bounded_reads.py)."""

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

import tfk8s_magics as tk
from tfk8s_magics.backends import LogLine
from tfk8s_magics.ui.dashboard import Dashboard


def test_a_nul_byte_in_a_body_names_its_line():
    with pytest.raises(tk.SpecError) as e:
        tk.make_spec("nul", script="x = 1\ny = 2\nz = '\0'\n")
    assert str(e.value) == ("the training script contains a NUL byte at <cell> line 3: remove it and "
                            "launch again.")


def test_submit_with_a_name_that_looks_like_a_flag_is_one_sentence(tmp_path):
    r = subprocess.run([sys.executable, "-m", "tfk8s_magics.cli", "submit", "--", "-lead"],
                       env={**os.environ, "TFK8S_STATE_DIR": str(tmp_path)}, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().startswith("tfk8s: cluster name '-lead' is not valid:"), r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "clusters").exists()


def test_a_text_dashboard_takes_lines_after_each_draw():
    """Without widgets, each draw empties the pending lines; a task's next lines must not raise
    KeyError: 'worker-0' (they did, as tracebacks in the notebook)."""
    board = Dashboard(SimpleNamespace(backend=None, name="plain"), widgets=False)
    board._on_logs([LogLine("worker-0", "one")])
    with board._lock:
        board._pending.clear()  # what the text view's draw does
    board._on_logs([LogLine("worker-0", "two")])
    assert list(board.lines["worker-0"]) == ["one", "two"]
    assert list(board._pending["worker-0"]) == ["two"]


def test_only_an_import_at_the_top_of_the_script_means_it_cannot_run(tmp_path):
    import runpy

    from tfk8s_magics.runtime.task import import_at_top_level

    top = tmp_path / "top.py"
    top.write_text("import no_such_module_here\n")
    late = tmp_path / "late.py"
    late.write_text("def step():\n    import no_such_module_here\n\nstep()\n")
    for path, broken in ((top, True), (late, False)):
        with pytest.raises(ImportError) as e:
            runpy.run_path(str(path), run_name="__main__")
        assert import_at_top_level(e.value, str(path)) is broken, path
