"""The task image's storage venv (``/opt/storage``): what it installs and what runs in it.

The sync, backup and serve-from-URL step containers run ``/opt/storage/bin/python``
(:data:`~tfk8s_magics.backends.kubernetes.storage_pods.STORAGE_PYTHON`), a venv
of its own because botocore (under s3fs) needs python-dateutil<3 while the
kubernetes client of the image's main venv needs >=3.  Its lock must pin
exactly what fsspec, s3fs, aiohttp and PyYAML need, at requirements.lock's
versions except python-dateutil; the build's ``pip check`` proves it complete
in the image, these tests keep the file in step with the lab's lock.
The image itself is run in ``tests/test_k8s_storage_containers.py``.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
STORAGE_LOCK = REPO / "images" / "task" / "requirements-storage.lock"
#: What the storage venv is for: the filesystems and the lab's own imports.
ROOTS = ("fsspec", "s3fs", "aiohttp", "PyYAML")
#: Where the storage venv differs from requirements.lock, and what python-dateutil 2.x needs.
OWN = {"python-dateutil": "2.9.0.post0"}
DATEUTIL_2_NEEDS = {"six"}


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version, f"{path.name}: {line!r} is not pinned with =="
            out[_normalize(name)] = version
    return out


def _closure() -> set[str]:
    """Every distribution the roots need on Linux / CPython 3.11 (no extras), from the dev
    venv's metadata, with python-dateutil's own needs as of its 2.x line."""
    env = {"python_version": "3.11", "python_full_version": "3.11.2", "sys_platform": "linux",
           "platform_system": "Linux", "os_name": "posix", "platform_machine": "x86_64",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
    seen: set[str] = set()
    todo = list(ROOTS)
    while todo:
        name = _normalize(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        if name == "python-dateutil":
            todo += DATEUTIL_2_NEEDS
            continue
        for text in md.requires(name) or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate(env):
                todo.append(req.name)
    return seen


def test_the_storage_lock_pins_exactly_what_the_storage_venv_needs():
    assert set(_pins(STORAGE_LOCK)) == _closure()


def test_its_pins_are_the_labs_except_python_dateutil():
    lab = _pins(REPO / "requirements.lock")
    own = _pins(STORAGE_LOCK)
    differ = {n: v for n, v in own.items() if lab.get(n) != v}
    assert differ == OWN
    assert int(own["python-dateutil"].split(".")[0]) < 3  # what botocore declares


def test_the_step_commands_import_neither_kubernetes_nor_tensorflow():
    """What the storage venv runs (the storage tool, the steps) imports no module it lacks."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import tfk8s_magics.storage.__main__, "
            "tfk8s_magics.backends.kubernetes.steps; "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    r = subprocess.run([sys.executable, "-c", code, str(REPO)], capture_output=True, text=True,
                       check=True)
    loaded = set(json.loads(r.stdout))
    # cython_runtime: the pseudo-module of PyYAML's compiled part
    third_party = {n for n in loaded if n not in sys.stdlib_module_names and not n.startswith("_")
                   and n != "cython_runtime"}
    # yaml is PyYAML (in the lock); nothing else outside the standard library
    assert third_party == {"tfk8s_magics", "yaml"}, third_party


def test_the_step_pods_run_the_storage_venv():
    from tfk8s_magics.backends.kubernetes import storage_pods as sp
    from tfk8s_magics.backends.kubernetes.settings import K8sSettings
    from tfk8s_magics.spec import ClusterSpec

    spec = ClusterSpec(name="sv", workers=1, script="print(1)", data_url="s3://b/d", data_sync=True,
                       backup_url="s3://b/out")
    settings = K8sSettings()
    sync = sp.sync_pod(spec, settings)["spec"]
    backup = sp.backup_pod(spec, settings, ["worker-0"])["spec"]
    commands = [c["command"] for c in [*sync["initContainers"], *sync["containers"],
                                       *backup["containers"]]]
    assert [c[0] for c in commands] == ["/opt/storage/bin/python"] * 3
    dockerfile = (REPO / "images" / "task" / "Dockerfile").read_text()
    assert "RUN python -m venv /opt/storage" in dockerfile
    assert dockerfile.count("COPY --from=storage /opt/storage /opt/storage") == 2  # cpu and gpu
