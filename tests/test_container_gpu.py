"""The task image's ``gpu`` target, resolved for real but not built.

See docs/contributors/testing.md, "Images and containers".

Building ``--target gpu`` installs tensorflow[and-cuda]'s NVIDIA wheels: several GB
twice over (the build stage and the final stage's copy of the venv) on a disk
that must keep 25 GB free, and nothing here could run it (no GPU).  What the
build's large pip layer would do is checked instead, in the CPU task image
(the same venv, the same pip): pip resolves the very command of that layer,
``pip install -c requirements.lock -c requirements-gpu.lock "tensorflow[and-cuda]"``,
with ``--dry-run --report``, against the package index the build uses.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import test_containers

pytestmark = [pytest.mark.containers, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
GPU_LOCK = REPO / "images" / "task" / "requirements-gpu.lock"
images = test_containers.images  # the shared fixture: the three images, built once per session


def _pins(path: Path) -> dict[str, str]:
    return {name.lower().replace("_", "-"): version
            for name, _, version in (line.partition("==") for line in path.read_text().splitlines())
            if version and not name.startswith("#")}


def test_gpu_layer_resolves_to_exactly_the_pinned_cuda_wheels(images):
    """The gpu target's pip layer, dry-run in the task image: it would install exactly the
    NVIDIA wheels requirements-gpu.lock pins, at those versions, and change nothing else."""
    from tests.containers.podman import build_images

    text = (REPO / "images" / "task" / "Dockerfile").read_text()
    layer = 'pip install --no-cache-dir -c requirements.lock -c requirements-gpu.lock "tensorflow[and-cuda]"'
    assert f"RUN {layer}" in text, "the gpu stage's pip layer changed: change this test with it"
    cmd = [*build_images.podman_base(), "run", "--rm", "--network", "host", *build_images.ulimits(),
           # root, as the build's RUN is: root's pip configuration (mounted as in the build) applies
           "--user", "0", *build_images.pip_mounts(),
           "-v", f"{REPO / 'requirements.lock'}:/locks/requirements.lock:ro",
           "-v", f"{GPU_LOCK}:/locks/requirements-gpu.lock:ro", "--workdir", "/locks",
           "--entrypoint", "pip", images["task"],
           *layer.removeprefix("pip ").replace('"', "").split(), "--dry-run", "--quiet", "--report", "-"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    would = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
             for i in report["install"]}
    # nothing of the CPU image is replaced (tensorflow and the rest stay as requirements.lock
    # pins them), and every wheel the GPU lock pins is one the layer needs, at that version
    pins = _pins(GPU_LOCK)
    assert len(pins) == 12 and would == pins, f"would install {would}; the lock pins {pins}"
