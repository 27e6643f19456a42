"""Every README example that launches a cluster runs, as written, to success (real TensorFlow)."""

import re
import subprocess
import sys

import pytest

import tfk8s_magics as tk
from tests.conftest import REPO
from tfk8s_magics.backends import Phase

pytestmark = pytest.mark.slow
README = (REPO / "README.md").read_text(encoding="utf-8")


def python_blocks_that_launch() -> list[str]:
    """The README's ```python blocks that launch a cluster."""
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    return [b for b in blocks if "tfcluster launch" in b or "tk.launch(" in b]


def cells(block: str) -> list[str]:
    """A block as the notebook cells it shows: separated by blank lines; a ``%%`` cell runs on."""
    out: list[str] = []
    for chunk in re.split(r"\n\s*\n", block.strip()):
        if out and out[-1].startswith("%%") and not chunk.lstrip().startswith("%"):
            out[-1] += "\n\n" + chunk  # a blank line inside a cell body
        else:
            out.append(chunk)
    return out


@pytest.fixture
def ip(state_dir, workdir):
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    return start_ipython() or get_ipython()


def test_the_readme_has_launching_examples():
    blocks = python_blocks_that_launch()
    assert blocks and any("%%tfcluster launch" in b for b in blocks)
    assert "tfk8s submit NAME --script train.py --workers 2" in " ".join(README.split())


def test_every_readme_python_example_runs_as_written(ip, state_dir):
    import tensorflow as tf

    for block in python_blocks_that_launch():
        for cell in cells(block):
            result = ip.run_cell(cell)
            assert result.success, f"README cell failed:\n{cell}\n{result.error_in_exec!r}"
    for st in tk.list_clusters():
        cluster = tk.get(st.name)
        if st.mode == "in-graph":
            assert isinstance(ip.user_ns["strategy"], tf.distribute.ParameterServerStrategy)
            assert cluster.status().ready
            cluster.delete()
            continue
        final = cluster.wait(timeout=600)
        assert final.phase == Phase.SUCCEEDED, cluster.logs()[-3000:]
        assert final.progress is not None and final.progress.step == 8  # 2 epochs x 4 steps


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
