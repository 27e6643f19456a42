"""The lab's images in the real nodes' containerd: the pause image, and images copied from podman.

Each node's containerd has its own image store (``<cache>/nodes-images/<netns>``, kept across
clusters); two running containerd instances cannot share one (each keeps its own metadata database
and collects blobs the other's does not know). So at ``up`` the images are imported into the first
node only (``podman save --format docker-archive`` -> ``ctr images import``), and every other
node's store is made a **clone** of it before its containerd starts (:func:`clone_store`): every
immutable file (content blobs, unpacked layers) is a hard link to the first node's, only the two
bolt databases are copied. A second node then costs seconds and almost no disk, instead of one
more import of 6 GB of images. While the nodes run, :func:`import_podman_images` imports into each
node (a test's own small images).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from .nodes import PAUSE_IMAGE, Node, NodeError, ctr
from .versions import HERE, cache_root

#: the lab's images the tests run, imported from podman (scripts/build_images.py tags them so);
#: ``$TFK8S_KUBE_IMAGES`` (space-separated) names fewer where the disk is short
LAB_IMAGES = tuple(
    os.environ.get("TFK8S_KUBE_IMAGES", "").split()
    or (
        "localhost/tfk8s/tensorflow-task:0.1.0",
        "localhost/tfk8s/notebook:0.1.0",
        "localhost/tfk8s/hub:0.1.0",
    )
)


class ImageError(NodeError):
    """An image could not be built, saved or imported; the message says why."""


def _run(argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=check, **kw)


def pause_image_tar(binary: bytes, name: str = PAUSE_IMAGE) -> bytes:
    """A docker-archive of a one-file image holding the static ``/pause`` (pure, deterministic)."""

    def tar_bytes(members: list[tuple[str, bytes, int]]) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for path, data, mode in members:
                info = tarfile.TarInfo(path)
                info.size, info.mode, info.mtime = len(data), mode, 0
                tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    layer = tar_bytes([("pause", binary, 0o755)])
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created_by": "devcluster/pause/pause.c, gcc -static"}],
        },
        sort_keys=True,
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_name = hashlib.sha256(layer).hexdigest() + "/layer.tar"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [name], "Layers": [layer_name]}]).encode()
    return tar_bytes(
        [(config_name, config, 0o644), (layer_name, layer, 0o644), ("manifest.json", manifest, 0o644)]
    )


def build_pause(log=print) -> Path:
    """Compile ``pause.c`` statically and wrap it as an image archive (cached by the source's hash)."""
    source = HERE / "pause" / "pause.c"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    out = cache_root() / f"pause-{digest}" / "pause-image.tar"
    if out.is_file():
        return out
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise ImageError("a C compiler is missing to build the pause image: apt-get install gcc")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        binary = Path(tmp) / "pause"
        r = _run([cc, "-static", "-Os", "-Wall", "-o", str(binary), str(source)], check=False)
        if r.returncode:
            raise ImageError(f"compiling {source} failed: {r.stderr.strip()}")
        (Path(tmp) / "image.tar").write_bytes(pause_image_tar(binary.read_bytes()))
        (Path(tmp) / "image.tar").rename(out)
    log(f"devcluster: built the pause image {PAUSE_IMAGE}")
    return out


def import_archive(lay: Node, archive: Path) -> None:
    """Import a docker-archive into containerd's k8s.io namespace."""
    with open(archive, "rb") as f:
        ctr(lay, "images", "import", "-", stdin=f)


def containerd_images(lay: Node) -> set[str]:
    """The image references containerd's k8s.io namespace holds."""
    return set(ctr(lay, "images", "list", "-q").stdout.decode().split())


def podman_image_id(image: str) -> str | None:
    """podman's id of ``image``, or None when podman does not have it."""
    if not shutil.which("podman"):
        return None
    r = _run(
        ["podman", "--runtime", "/usr/sbin/runc", "image", "inspect", "--format", "{{.Id}}", image],
        check=False,
    )
    return r.stdout.strip() if r.returncode == 0 else None


def image_targets(lay: Node) -> dict[str, str]:
    """Every image record of containerd's k8s.io namespace -> the digest of its manifest (index)."""
    rows = ctr(lay, "images", "ls").stdout.decode().splitlines()[1:]
    return {cols[0]: cols[2] for cols in (row.split() for row in rows) if len(cols) > 2}


def stale_records(image: str, targets: dict[str, str]) -> list[str]:
    """The records to delete so that nothing keeps ``image``'s content (pure).

    The kubelet's image service (CRI) adds a record named by the image's id (``sha256:<config
    digest>``) beside every name it sees; that record alone keeps every blob and snapshot of
    the image alive. It goes with the name unless another name still points at the same content.
    A pull also records the name by digest (``<repository>@sha256:<manifest digest>``): that
    record of the same repository goes with the name too.
    """
    if image not in targets:
        return []
    target = targets[image]
    repo = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    own = [r for r, t in targets.items() if t == target and r.startswith(repo + "@sha256:")]
    names = [
        r
        for r, t in targets.items()
        if t == target and r != image and r not in own and not r.startswith("sha256:")
    ]
    ids = [r for r, t in targets.items() if t == target and r.startswith("sha256:")]
    return [image, *sorted(own), *([] if names else sorted(ids))]


def remove_image(lay: Node, image: str) -> bool:
    """Remove ``image`` from containerd and collect its content and snapshots now; False if absent.

    Its id record (:func:`stale_records`) goes too, and ``--sync`` makes containerd run its
    garbage collector before answering, so the blobs and unpacked layers no other image
    references are gone when this returns (not at some later GC).
    """
    records = stale_records(image, image_targets(lay))
    if not records:
        return False
    ctr(lay, "images", "rm", "--sync", *records)
    return True


def _marker(lay: Node, image: str) -> Path:
    return lay.images / "imported" / hashlib.sha256(image.encode()).hexdigest()


def _imported_id(lay: Node, image: str) -> str | None:
    marker = _marker(lay, image)
    return marker.read_text() if marker.is_file() else None


def superseded(image: str, have: set[str] | list[str]) -> list[str]:
    """The images of ``have`` that importing ``image`` makes stale (pure).

    ``scripts/build_images.py`` tags every build ``<repo>:h-<hash of its inputs>``: a new ``h-``
    tag of a repository supersedes that repository's other ``h-`` tags (other tags stay).
    """
    repo, _, tag = image.rpartition(":")
    if not tag.startswith("h-"):
        return []
    return sorted(n for n in have if n != image and n.startswith(f"{repo}:h-"))


#: the bolt databases of a store: written in place, so copied by a clone, never linked
BOLT_FILES = ("io.containerd.metadata.v1.bolt/meta.db", "io.containerd.snapshotter.v1.overlayfs/metadata.db")


def in_sync(a: Node, b: Node) -> bool:
    """True when ``b``'s store holds podman's id of every image ``a``'s was given."""

    def marks(n: Node) -> dict[str, str]:
        d = n.images / "imported"
        return {f.name: f.read_text() for f in d.iterdir()} if d.is_dir() else {}

    return marks(a).items() <= marks(b).items()


def clone_store(src: Node, dst: Node) -> None:
    """Make ``dst``'s image store a copy of ``src``'s (both containerd stopped), sharing every
    immutable file by a hard link (content blobs and unpacked layers never change in place)."""
    tmp = dst.images.with_name(dst.images.name + ".clone")
    shutil.rmtree(tmp, ignore_errors=True)
    r = _run(["cp", "-a", "--link", str(src.images), str(tmp)], check=False)
    if r.returncode:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ImageError(f"cloning the image store of {src.name} failed: {r.stderr.strip()}")
    for rel in BOLT_FILES:
        if (src.images / rel).is_file():
            (tmp / rel).unlink()
            shutil.copy2(src.images / rel, tmp / rel)
    shutil.rmtree(dst.images, ignore_errors=True)
    tmp.rename(dst.images)


def _prepare(lay: Node, image: str, pid: str, log) -> bool:
    """Make ``lay`` ready to take podman's ``pid`` of ``image``; True when it has it already."""
    have = containerd_images(lay)
    marker = _marker(lay, image)
    if image in have and marker.is_file() and marker.read_text() == pid:
        return True
    marker.unlink(missing_ok=True)
    if image in have:
        remove_image(lay, image)
        log(f"devcluster: removed the previous {image} from {lay.name} (podman's id changed)")
    same = [n for n in sorted(have) if n != image and _imported_id(lay, n) == pid]
    if same:  # the same podman image under another name: a new name, no copy
        ctr(lay, "images", "tag", "--force", same[0], image)
    for stale in superseded(image, have):
        remove_image(lay, stale)
        _marker(lay, stale).unlink(missing_ok=True)
        log(f"devcluster: removed {stale} from {lay.name} (superseded by {image})")
    if same:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(pid)
        log(f"devcluster: {image} is {same[0]} in {lay.name} (the same podman image): tagged")
    return bool(same)


def import_podman_images(nodes: list[Node], images: tuple[str, ...], log) -> list[str]:
    """Copy podman images into every node's containerd (``podman save`` once -> ``ctr import`` per node).

    A node that has podman's id of an image already is skipped; an image podman lacks is skipped
    with a line (the tests that need it say so). When podman's id of a tag changed, the old image
    is removed (and its content collected) before the new one is imported, so each store holds
    one copy per tag, not one per build. Returns the images imported or present.
    """
    out = []
    for image in images:
        pid = podman_image_id(image)
        if pid is None:
            log(f"devcluster: podman has no {image}; build it with scripts/build_images.py (not imported)")
            continue
        lacking = [n for n in nodes if not _prepare(n, image, pid, log)]
        out.append(image)
        if not lacking:
            continue
        t0 = time.monotonic()
        with tempfile.NamedTemporaryFile(suffix=".tar", dir=lacking[0].images) as tmp:
            r = _run(
                [
                    "podman",
                    "--runtime",
                    "/usr/sbin/runc",
                    "save",
                    "--format",
                    "docker-archive",
                    "-o",
                    tmp.name,
                    image,
                ],
                check=False,
            )
            if r.returncode:
                raise ImageError(f"podman save {image} failed: {r.stderr.strip()}")
            saved = time.monotonic() - t0
            for n in lacking:
                t1 = time.monotonic()
                import_archive(n, Path(tmp.name))
                marker = _marker(n, image)
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text(pid)
                log(f"devcluster: imported {image} into {n.name} in {time.monotonic() - t1:.0f} s")
        log(
            f"devcluster: {image}: saved from podman in {saved:.0f} s, {len(lacking)} node(s) in "
            f"{time.monotonic() - t0:.0f} s"
        )
    return out
