"""A quiet lab kernel (issue 27, item 6): the lab's IPython profile loads the extension at start,
and a notebook's own ``%load_ext tfk8s_magics`` prints nothing; ``import tensorflow`` before
anything of ours prints no C++ start-up lines."""

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO

PROFILE = REPO / "hub_config" / "ipython" / "profile_default" / "ipython_config.py"


def _ipython(tmp_path, code: str) -> subprocess.CompletedProcess:
    ipdir = tmp_path / "ipython"
    (ipdir / "profile_default").mkdir(parents=True)
    shutil.copyfile(PROFILE, ipdir / "profile_default" / "ipython_config.py")
    script = tmp_path / "cell.ipy"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(IPYTHONDIR=str(ipdir), PYTHONPATH=str(REPO), TFK8S_STATE_DIR=str(tmp_path / "state"))
    return subprocess.run([sys.executable, "-m", "IPython", "--no-banner", "--colors=NoColor",
                           str(script)], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)


def test_a_notebooks_load_ext_prints_nothing_in_a_lab_kernel(tmp_path):
    out = _ipython(tmp_path, "%load_ext tfk8s_magics\n%tfcluster list\nprint('END')\n")
    assert "END" in out.stdout, out.stderr
    assert "already loaded" not in out.stdout + out.stderr
    assert out.stdout.count("END") == 1


@pytest.mark.slow
def test_importing_tensorflow_first_in_a_lab_kernel_is_quiet(tmp_path):
    out = _ipython(tmp_path, "import tensorflow as tf\nprint('TF', tf.__version__)\n"
                             "%load_ext tfk8s_magics\n")
    assert "TF " in out.stdout, out.stderr[-2000:]
    noise = ("cudart_stub", "oneDNN custom operations", "absl::InitializeLog", "rebuild TensorFlow",
             "already loaded")
    assert not [n for n in noise if n in out.stdout + out.stderr], out.stderr[-3000:]


@pytest.mark.slow
def test_connect_prints_no_tensorflow_info_lines(tmp_path):
    """``connect`` built the strategy with TensorFlow's INFO lines on stderr (six, two of them
    twice); a quiet lab shows none of them."""
    out = _ipython(tmp_path, "import os\nos.environ['TFK8S_POOL_SIZE'] = '0'\n"
                             "import tfk8s_magics as tk\n"
                             "c = tk.launch('ig', mode='in-graph', ps=1, workers=1, wait_ready=240)\n"
                             "print('CONNECTING', flush=True)\n"
                             "s = tk.connect('ig')\n"
                             "print('CONNECTED', type(s).__name__, flush=True)\n"
                             "c.delete()\n")
    assert "CONNECTED ParameterServerStrategy" in out.stdout, out.stderr[-3000:]
    assert "INFO:tensorflow" not in out.stdout + out.stderr, out.stderr[-3000:]
