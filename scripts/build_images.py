#!/usr/bin/env python3
"""Build the lab's images with podman, on the base ``scripts/base-image`` makes; cached.

    scripts/build_images.py [--push] [task] [notebook] [hub] [task-gpu]    (default: the first three)

``--push`` then pushes each image to the test cluster's registry (``devcluster/registry.py``:
started with ``registry.up``; ``$TFK8S_KUBE_DIR`` picks the cluster) as
``tfk8s/<repository>:<release>``, named ``registry.tfk8s.test/tfk8s/<repository>:<release>``.

Prints one ``NAME IMAGE`` line per image built or found.  An image's tag is a
hash of its inputs (the base image's id, its Dockerfile, the build target, and
every file its ``COPY`` lines take from the repository), so a rerun with
nothing changed finds the image and builds nothing, and a changed input
gives a new tag.  Each image is also tagged with the release tag the
manifests and the chart name (``localhost/tfk8s/tensorflow-task:0.1.0`` …).
After a build, the repository's older ``h-`` tags that no container uses are
removed (:func:`prune`): each one holds several GB.

Podman on these machines needs ``--runtime /usr/sbin/runc`` (crun fails on
hybrid cgroups) and ulimits at or under the host's hard limits: see
:func:`podman_base` and :func:`run_flags`, which the container tests share.
No registry is needed: pip inside the build reaches the package index
through the host's own pip configuration, mounted read-only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RELEASE = "0.1.0"
#: name -> (Dockerfile directory, build target or None for the last stage, repository)
IMAGES = {
    "task": ("task", None, "localhost/tfk8s/tensorflow-task"),
    "notebook": ("notebook", None, "localhost/tfk8s/notebook"),
    "hub": ("hub", None, "localhost/tfk8s/hub"),
    "task-gpu": ("task", "gpu", "localhost/tfk8s/tensorflow-task-gpu"),
}
DEFAULT = ("task", "notebook", "hub")
#: pip's configuration files on the host (global and root's): mounted read-only when present.
PIP_CONFIGS = ("/etc/pip.conf", "/etc/xdg/pip", "/root/.config/pip", "/root/.pip")
SKIP = {"__pycache__", ".pytest_cache", ".ruff_cache"}


def runtime() -> str:
    """The OCI runtime podman must use here (``TFK8S_OCI_RUNTIME``, default runc)."""
    return os.environ.get("TFK8S_OCI_RUNTIME", "/usr/sbin/runc")


def podman_base() -> list[str]:
    """``podman`` with the global flags every call needs."""
    exe = shutil.which("podman")
    if not exe:
        raise SystemExit("build_images: podman is missing; run scripts/bootstrap containers")
    return [exe, "--runtime", runtime()]


def ulimits() -> list[str]:
    """``--ulimit`` flags at or under this machine's hard limits (podman's defaults exceed them)."""
    out = []
    for name, res, cap in (("nofile", resource.RLIMIT_NOFILE, 65536), ("nproc", resource.RLIMIT_NPROC, 4096)):
        hard = resource.getrlimit(res)[1]
        value = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
        out += ["--ulimit", f"{name}={value}:{value}"]
    return out


def run_flags() -> list[str]:
    """Flags every ``podman run`` of the lab's containers needs on this machine."""
    return ulimits()


def base_image() -> str:
    """Make (or find) the Debian base with ``scripts/base-image``; its name."""
    r = subprocess.run([str(REPO / "scripts" / "base-image")], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"build_images: scripts/base-image failed:\n{r.stderr[-3000:]}")
    return r.stdout.strip().splitlines()[-1]


def _copy_sources(dockerfile: Path) -> list[Path]:
    """Every repository path a ``COPY`` (not ``--from``) of ``dockerfile`` takes."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    out = []
    for line in text.splitlines():
        words = line.split()
        if words and words[0].upper() == "COPY" and not any(w.startswith("--from") for w in words):
            srcs = [w for w in words[1:-1] if not w.startswith("--")]
            out += [REPO / s.rstrip("/") for s in srcs]
    return out


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(
        p for p in path.rglob("*")
        if p.is_file() and not SKIP.intersection(p.parts) and not p.name.endswith(".pyc")
        and not any(part.endswith(".egg-info") for part in p.parts)
    )


def pip_mounts() -> list[str]:
    """``-v`` flags giving the build's pip the host's way to the package index, read-only:
    the CA bundle, pip's config files, and the local directories they name (``file://``
    indexes, ``find-links``)."""
    paths = ["/etc/ssl/certs"]
    for conf in PIP_CONFIGS:
        if not os.path.exists(conf):
            continue
        paths.append(conf)
        files = [Path(conf)] if os.path.isfile(conf) else sorted(Path(conf).glob("*"))
        for f in files:
            for m in re.finditer(r"(?:file://)?(/[^\s]+)", f.read_text()):
                local = m.group(1).rstrip("/")
                paths.append(local.split("/simple")[0] if "/simple" in local else local)
    out: list[str] = []
    mounted: list[str] = []
    for path in dict.fromkeys(paths):
        if os.path.exists(path) and not any(path.startswith(m + "/") for m in mounted):
            mounted.append(path)
            out += ["-v", f"{path}:{path}:ro"]
    return out


def snapshot(name: str, into: Path) -> Path:
    """Copy what image ``name`` is built from (its Dockerfile and COPY sources) into ``into``.

    The build reads this copy, not the working tree, so the image is exactly what
    its tag's hash says even if the tree changes during a long build.
    """
    directory, _, _ = IMAGES[name]
    dockerfile = REPO / "images" / directory / "Dockerfile"
    for src in [dockerfile, *_copy_sources(dockerfile)]:
        for f in _files(src):
            dest = into / f.relative_to(REPO)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest)
    return into / "images" / directory / "Dockerfile"


def input_hash(name: str, base_id: str, root: Path) -> str:
    """A hash of everything the image ``name`` is built from (as copied under ``root``)."""
    _, target, _ = IMAGES[name]
    h = hashlib.sha256(f"{base_id}\0{target}\0".encode())
    for f in _files(root):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def image_id(ref: str) -> str | None:
    """The id of a local image, or None when there is none."""
    r = subprocess.run([*podman_base(), "image", "inspect", "--format", "{{.Id}}", ref],
                       capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def build(name: str, base: str, log=sys.stderr) -> tuple[str, float]:
    """Build ``name`` on ``base`` unless an image with the same inputs exists: (image, seconds)."""
    _, target, repo = IMAGES[name]
    base_id = image_id(base)
    if base_id is None:
        raise SystemExit(f"build_images: the base image {base} does not exist")
    with tempfile.TemporaryDirectory(prefix=f"tfk8s-{name}-", dir="/var/tmp") as tmp:
        dockerfile = snapshot(name, Path(tmp))
        ref = f"{repo}:h-{input_hash(name, base_id, Path(tmp))}"
        seconds = 0.0
        if image_id(ref) is None:
            cmd = [*podman_base(), "build", "--network", "host", *ulimits(), *pip_mounts(),
                   "--build-arg", f"BASE_IMAGE={base}", "--label", f"tfk8s.inputs={ref}",
                   "-f", str(dockerfile), "-t", ref, *(["--target", target] if target else []), tmp]
            start = time.monotonic()
            r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
            if r.returncode != 0:
                raise SystemExit(f"build_images: building {name} failed (podman build exit {r.returncode})")
            seconds = time.monotonic() - start
    subprocess.run([*podman_base(), "tag", ref, f"{repo}:{RELEASE}"], check=True)
    return ref, seconds


def stale_tags(repo: str, tags: dict[str, str], keep: str, in_use: set[str]) -> list[str]:
    """The refs of ``repo`` a build leaves behind (pure): its ``h-`` tags other than ``keep``.

    ``tags`` maps each ``repo:tag`` podman holds to its image id; a ref whose image a container
    uses (``in_use``: image ids) is kept, and so is every tag that is not an ``h-`` hash tag (the
    release tag ``0.1.0`` and anything a person tagged by hand).
    """
    return sorted(
        ref
        for ref, image in tags.items()
        if ref.startswith(f"{repo}:h-") and ref != keep and image not in in_use
    )


def prune(repo: str, keep: str, log=sys.stderr) -> list[str]:
    """Remove ``repo``'s older ``h-`` tags (:func:`stale_tags`) from podman; the refs removed.

    Each build of a changed tree adds a tag of several GB; without this they pile up until the
    disk is full. Untagging the last tag of an image removes the image and the layers only it had.
    """
    fmt = "{{.Repository}}:{{.Tag}} {{.ID}}"
    out = subprocess.run([*podman_base(), "images", "--no-trunc", "--format", fmt, repo],
                         capture_output=True, text=True, check=True).stdout
    tags = {}
    for line in out.splitlines():
        ref, _, image = line.partition(" ")
        tags[ref] = image.removeprefix("sha256:")
    used = subprocess.run([*podman_base(), "ps", "--all", "--no-trunc", "--format", "{{.ImageID}}"],
                          capture_output=True, text=True, check=True).stdout
    in_use = {i.removeprefix("sha256:") for i in used.split()}
    removed = []
    for ref in stale_tags(repo, tags, keep, in_use):
        # never --force: podman refuses an image a container started since the listing uses
        r = subprocess.run([*podman_base(), "rmi", ref], capture_output=True, text=True)
        if r.returncode == 0:
            removed.append(ref)
        else:
            print(f"build_images: kept {ref}: {r.stderr.strip()}", file=log)
    return removed


def size_mb(ref: str) -> float:
    """The image's size in MB (podman's count of its layers)."""
    out = subprocess.run([*podman_base(), "image", "inspect", "--format", "{{.Size}}", ref],
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip()) / 1e6


def push_images(names: list[str]) -> dict[str, dict]:
    """Push each named image's release tag to the running test cluster's registry.

    Layers the registry already holds are not sent again, so a push of an unchanged image takes
    seconds. Returns, per image, the name nodes pull it by and the seconds the push took.
    """
    sys.path.insert(0, str(REPO))
    from devcluster import registry
    from devcluster.cluster import Cluster

    reg = registry.load(Cluster())
    if reg is None or registry.ready(reg.address, reg.ca) != 401:
        raise SystemExit(
            "build_images: no test cluster registry runs here: start it with scripts/kube up --pods"
        )
    out = {}
    for name in names:
        repo = IMAGES[name][2]
        start = time.monotonic()
        target = f"{repo.removeprefix('localhost/')}:{RELEASE}"
        pulled_as = registry.podman_push(reg, f"{repo}:{RELEASE}", target, podman=podman_base())
        out[name] = {"image": pulled_as, "seconds": round(time.monotonic() - start, 1)}
        print(f"build_images: pushed {name} as {pulled_as}", file=sys.stderr, flush=True)
    return out


def main(argv: list[str]) -> int:
    """Build the images named in ``argv`` (default: task, notebook, hub); ``--push`` pushes them."""
    push = "--push" in argv
    argv = [a for a in argv if a != "--push"]
    names = argv or list(DEFAULT)
    unknown = [n for n in names if n not in IMAGES]
    if unknown:
        print(f"build_images: unknown image {unknown[0]!r}; choose from {', '.join(IMAGES)}", file=sys.stderr)
        return 2
    # One build at a time on this machine: scripts/test builds the node's images in the background
    # while the container tests build theirs, and two podman builds of one image race in its
    # storage ("committing container for step ..."). The second waits, then finds the image built.
    import fcntl

    lock_path = Path(os.environ.get("TFK8S_CACHE") or Path.home() / ".cache" / "tfk8s") / "build_images.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = open(lock_path, "w")  # noqa: SIM115 - held until the process ends
    fcntl.flock(lock, fcntl.LOCK_EX)
    start = time.monotonic()
    if "notebook" in names:  # it ships the sidebar prebuilt: build it (a no-op when up to date)
        # its output goes to stderr: stdout carries only this script's "<name> <ref>" lines
        subprocess.run([str(REPO / "scripts" / "bootstrap"), "lab"], check=True, stdout=sys.stderr)
    base = base_image()
    report = {"base": {"image": base, "seconds": round(time.monotonic() - start, 1),
                       "mb": round(size_mb(base))}}
    for name in names:
        ref, seconds = build(name, base)
        for gone in prune(IMAGES[name][2], keep=ref):
            print(f"build_images: removed the older {gone}", file=sys.stderr)
        report[name] = {"image": ref, "seconds": round(seconds, 1), "mb": round(size_mb(ref))}
        print(name, ref, flush=True)
    if push:
        report["pushed"] = push_images(names)
    print(json.dumps(report), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
