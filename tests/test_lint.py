"""Strict tooling: the whole tree is ruff-clean (docstring rules included)."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_ruff_is_clean():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "."],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
