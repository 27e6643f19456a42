"""The sidebar's TypeScript units (jest, labextension/test/) and its type check, run from pytest so
``scripts/test`` runs them too.  ``scripts/bootstrap lab`` installs the tools (npm ci)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

EXT = Path(__file__).resolve().parent.parent / "labextension"


@pytest.fixture(scope="module")
def npx() -> str:
    exe = shutil.which("npx")
    if exe is None:
        pytest.fail("npx is missing: install Node.js 20+ (Debian: apt-get install nodejs npm)")
    if not (EXT / "node_modules" / ".bin" / "jest").exists():
        pytest.fail("the sidebar's node_modules are missing: run scripts/bootstrap lab")
    return exe


def test_typescript_compiles_strictly(npx):
    r = subprocess.run([npx, "tsc", "--noEmit"], cwd=EXT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_jest_units(npx):
    r = subprocess.run([npx, "jest", "--ci"], cwd=EXT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "failed" not in r.stderr.split("Tests:")[-1].split("\n")[0]
