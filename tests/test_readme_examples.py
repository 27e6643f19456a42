"""Every example in the README and the docs that launches a cluster runs, as written, to success.

On a page with a ```python block that launches a cluster, every ```python block runs, in order,
in one IPython session (real TensorFlow), as a reader pastes them into notebook cells.
```ipython blocks are fragments shown, not run (Kubernetes-only flags, object storage URLs, a
placeholder NAME): every ``%tfcluster`` line in them must still parse with the options
registry's parser, so no example shows a flag that does not exist.
"""

import re
import subprocess
import sys

import pytest

import tfk8s_magics as tk
from tests.conftest import REPO
from tfk8s_magics.backends import Phase

README = (REPO / "README.md").read_text(encoding="utf-8")
#: The README and every docs page a reader sees (generated pages are derived from the code).
PAGES = [REPO / "README.md", *sorted(p for p in (REPO / "docs").rglob("*.md")
                                     if "_generated" not in p.parts and "_build" not in p.parts)]


def blocks(text: str, lang: str) -> list[str]:
    """The ```lang blocks of a Markdown page."""
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def launches(block: str) -> bool:
    return "tfcluster launch" in block or "tk.launch(" in block


def python_blocks_that_launch(text: str = README) -> list[str]:
    """A page's ```python blocks that launch a cluster."""
    return [b for b in blocks(text, "python") if launches(b)]


def pages_that_launch() -> list:
    return [p for p in PAGES if python_blocks_that_launch(p.read_text(encoding="utf-8"))]


def cells(block: str) -> list[str]:
    """A block as the notebook cells it shows: separated by blank lines; a ``%%`` cell runs on."""
    out: list[str] = []
    for chunk in re.split(r"\n\s*\n", block.strip()):
        open_string = bool(out) and out[-1].count("'''") % 2 == 1
        cell_body = bool(out) and out[-1].startswith("%%") and not chunk.lstrip().startswith("%")
        if open_string or cell_body:
            out[-1] += "\n\n" + chunk  # a blank line inside a cell body or a string
        else:
            out.append(chunk)
    return out


@pytest.fixture
def ip(state_dir, workdir):
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    return start_ipython() or get_ipython()


def test_the_readme_has_launching_examples():
    found = python_blocks_that_launch()
    assert found and any("%%tfcluster launch" in b for b in found)
    assert "tfk8s submit NAME --script train.py --workers 2" in " ".join(README.split())


def test_the_docs_have_launching_examples_beyond_the_readme():
    assert any(p.parent.name != REPO.name for p in pages_that_launch()), pages_that_launch()


@pytest.mark.slow
@pytest.mark.parametrize("page", pages_that_launch(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_python_example_that_launches_runs_as_written(page, ip, state_dir):
    import tensorflow as tf

    ip.run_cell("%load_ext tfk8s_magics")
    for block in blocks(page.read_text(encoding="utf-8"), "python"):
        for cell in cells(block):
            result = ip.run_cell(cell)
            assert result.success, f"{page.name} cell failed:\n{cell}\n{result.error_in_exec!r}"
    for st in tk.list_clusters():
        cluster = tk.get(st.name)
        if st.mode == "in-graph":
            assert isinstance(ip.user_ns["strategy"], tf.distribute.ParameterServerStrategy)
            assert cluster.status().ready
            cluster.delete()
            continue
        final = cluster.wait(timeout=600)
        assert final.phase == Phase.SUCCEEDED, cluster.logs()[-3000:]
        if "progress_callback" in (cluster.spec.script or ""):
            assert final.progress is not None and final.progress.step == 8  # 2 epochs x 4 steps
        cluster.delete()


def magic_lines(text: str) -> list[str]:
    """Every ``%tfcluster`` line of a page's ```ipython and ```python blocks, from the subcommand on."""
    found = []
    for block in blocks(text, "ipython") + blocks(text, "python"):
        for line in block.splitlines():
            m = re.search(r"%%?tfcluster\s+(.*)$", line)
            if m:
                found.append(m.group(1))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_tfcluster_line_shown_parses(page):
    from tfk8s_magics.magics import TFClusterMagics

    magics = TFClusterMagics(shell=None)
    for line in magic_lines(page.read_text(encoding="utf-8")):
        args = magics._parse(line)  # a UsageError names the line's mistake
        assert args is not None and args.cmd, line


def test_a_line_with_a_flag_that_does_not_exist_fails_the_parse_check():
    from IPython.core.error import UsageError

    from tfk8s_magics.magics import TFClusterMagics

    lines = magic_lines("```ipython\n%tfcluster launch x --workers 2 --gpu-count 3\n```\n")
    assert lines == ["launch x --workers 2 --gpu-count 3"]
    with pytest.raises(UsageError):
        TFClusterMagics(shell=None)._parse(lines[0])


def test_cells_keep_a_triple_quoted_string_with_blank_lines_whole():
    block = "x = '''\na\n\nb\n'''\n\n%tfcluster list\n\n%%tfcluster launch y\nprint(1)\n\nprint(2)\n"
    assert cells(block) == ["x = '''\na\n\nb\n'''", "%tfcluster list",
                            "%%tfcluster launch y\nprint(1)\n\nprint(2)"]


@pytest.mark.slow
def test_the_readme_terminal_example_runs_as_written(state_dir, workdir):
    """`tfk8s submit NAME --script train.py --workers 2` with the README's own training code."""
    block = python_blocks_that_launch()[0]
    body = next(c for c in cells(block) if c.startswith("%%tfcluster launch"))
    (workdir / "train.py").write_text(body.split("\n", 1)[1], encoding="utf-8")
    command = "tfk8s submit NAME --script train.py --workers 2".replace("NAME", "readme-cli").split()
    proc = subprocess.run([sys.executable, "-m", "tfk8s_magics.cli", *command[1:], "--follow"],
                          cwd=workdir, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "readme-cli: succeeded" in proc.stdout
