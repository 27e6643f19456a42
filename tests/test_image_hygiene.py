"""Image hygiene: a rebuild or re-import replaces the previous image instead of piling up beside it.

``scripts/build_images.py`` tags every build ``<repo>:h-<hash of its inputs>`` (several GB each) and
``devcluster/images.py`` re-imports a tag into each real node's containerd when podman's id of it changes;
both used to keep every previous copy (podman 9 GB per build, containerd's store grew to 31 GB).
The rules are pure functions tested against literal values; then each is run for real on tiny
``FROM scratch`` images (one file each, so every version has layers of its own): podman for the
prune, the real node's containerd (``scripts/kube up --pods``) for the import.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import build_images  # noqa: E402

from devcluster import node  # noqa: E402


def test_stale_tags_are_the_older_hash_tags_no_container_uses():
    tags = {
        "localhost/tfk8s/hub:h-new": "id-new",
        "localhost/tfk8s/hub:0.1.0": "id-new",
        "localhost/tfk8s/hub:h-old1": "id-old1",
        "localhost/tfk8s/hub:h-old2": "id-old2",
        "localhost/tfk8s/hub:h-used": "id-used",
        "localhost/tfk8s/hub:mine": "id-old1",  # tagged by hand: not ours to remove
    }
    stale = build_images.stale_tags("localhost/tfk8s/hub", tags, "localhost/tfk8s/hub:h-new", {"id-used"})
    assert stale == ["localhost/tfk8s/hub:h-old1", "localhost/tfk8s/hub:h-old2"]
    # another repository's tags are never touched, even with a shared prefix
    other = {"localhost/tfk8s/hub-extra:h-x": "id-x"}
    assert build_images.stale_tags("localhost/tfk8s/hub", other, "localhost/tfk8s/hub:h-new", set()) == []


def test_a_new_hash_tag_supersedes_the_repositorys_other_hash_tags_in_containerd():
    have = {
        "localhost/tfk8s/notebook:h-aaa",
        "localhost/tfk8s/notebook:h-bbb",
        "localhost/tfk8s/notebook:0.1.0",
        "localhost/tfk8s/notebook-gpu:h-aaa",
        "localhost/tfk8s/pause:3.10-tfk8s",
    }
    assert node.superseded("localhost/tfk8s/notebook:h-ccc", have) == [
        "localhost/tfk8s/notebook:h-aaa",
        "localhost/tfk8s/notebook:h-bbb",
    ]
    assert node.superseded("localhost/tfk8s/notebook:h-bbb", have) == ["localhost/tfk8s/notebook:h-aaa"]
    assert (
        node.superseded("localhost/tfk8s/notebook:0.1.0", have) == []
    )  # the release tag is replaced in place


def test_a_removed_name_takes_the_kubelets_id_record_with_it_unless_another_name_shares_it():
    targets = {
        "localhost/tfk8s/notebook:0.1.0": "sha256:m1",
        "sha256:id1": "sha256:m1",  # the CRI's record of the same image, by id
        "localhost/tfk8s/notebook:h-aaa": "sha256:m2",
        "localhost/tfk8s/notebook:h-bbb": "sha256:m2",
        "sha256:id2": "sha256:m2",
    }
    assert node.stale_records("localhost/tfk8s/notebook:0.1.0", targets) == [
        "localhost/tfk8s/notebook:0.1.0",
        "sha256:id1",
    ]
    # h-bbb still names that content: only the one name goes
    assert node.stale_records("localhost/tfk8s/notebook:h-aaa", targets) == ["localhost/tfk8s/notebook:h-aaa"]
    assert node.stale_records("localhost/tfk8s/absent:1", targets) == []


def test_a_removed_pulled_name_takes_its_digest_record_with_it():
    # a pull records the name, the name by digest and the id; the digest record of another
    # repository (another name of the same content) keeps the id
    pulled = {
        "registry.tfk8s.test/tfk8s/task:0.1.0": "sha256:m1",
        "registry.tfk8s.test/tfk8s/task@sha256:m1": "sha256:m1",
        "sha256:id1": "sha256:m1",
    }
    assert node.stale_records("registry.tfk8s.test/tfk8s/task:0.1.0", pulled) == [
        "registry.tfk8s.test/tfk8s/task:0.1.0",
        "registry.tfk8s.test/tfk8s/task@sha256:m1",
        "sha256:id1",
    ]
    shared = {**pulled, "registry.tfk8s.test/tfk8s/other@sha256:m1": "sha256:m1"}
    assert node.stale_records("registry.tfk8s.test/tfk8s/task:0.1.0", shared) == [
        "registry.tfk8s.test/tfk8s/task:0.1.0",
        "registry.tfk8s.test/tfk8s/task@sha256:m1",
    ]


def _podman(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([*build_images.podman_base(), *args], capture_output=True, text=True, timeout=300)
    if check and r.returncode:
        raise AssertionError(f"podman {' '.join(args[:2])} failed: {r.stderr[-2000:]}")
    return r


def _scratch_image(ref: str, content: str, tmp: Path) -> str:
    """A one-file image (no base, no RUN: no runtime needed) whose layer is its own; its id."""
    ctx = tmp / secrets.token_hex(4)
    ctx.mkdir()
    (ctx / "f").write_text(content)
    (ctx / "Containerfile").write_text("FROM scratch\nCOPY f /f\n")
    _podman("build", "-q", "-f", str(ctx / "Containerfile"), "-t", ref, str(ctx))
    image = _podman("image", "inspect", "--format", "{{.Id}}", ref).stdout.strip()
    _BUILT.append(image)
    return image


_BUILT: list[str] = []  # every image id made here (a retagged one is left without a name)


@pytest.fixture
def repo():
    if not shutil.which("podman"):
        pytest.skip("podman is not installed: run scripts/bootstrap containers")
    name = f"localhost/tfk8s/hygiene-{secrets.token_hex(4)}"
    yield name
    for c in _podman("ps", "--all", "--format", "{{.ID}} {{.Image}}").stdout.splitlines():
        if name in c:
            _podman("rm", "--force", c.split()[0], check=False)
    refs = _podman("images", "--format", "{{.Repository}}:{{.Tag}}", name).stdout.split()
    if refs:
        _podman("rmi", "--force", *refs, check=False)
    for image in _BUILT:
        _podman("rmi", "--force", image, check=False)
    assert not _podman("images", "-q", name).stdout.strip(), f"{name} left in podman"
    left = [i for i in _BUILT if _podman("image", "exists", i, check=False).returncode == 0]
    _BUILT.clear()
    assert not left, f"images left in podman: {left}"


@pytest.mark.containers
def test_build_images_prune_removes_the_older_hash_tags_and_keeps_what_is_used(repo, tmp_path):
    ids = {
        tag: _scratch_image(f"{repo}:{tag}", tag, tmp_path) for tag in ("h-old1", "h-old2", "h-used", "h-new")
    }
    _podman("tag", f"{repo}:h-new", f"{repo}:{build_images.RELEASE}")
    _podman("create", "--name", f"{repo.rsplit('/', 1)[1]}-user", f"{repo}:h-used", "/f")  # holds h-used
    removed = build_images.prune(repo, keep=f"{repo}:h-new")
    assert sorted(removed) == [f"{repo}:h-old1", f"{repo}:h-old2"]
    left = set(_podman("images", "--format", "{{.Repository}}:{{.Tag}}", repo).stdout.split())
    assert left == {f"{repo}:h-new", f"{repo}:0.1.0", f"{repo}:h-used"}
    # the images only those tags named are gone, not just their names
    for tag in ("h-old1", "h-old2"):
        assert _podman("image", "exists", ids[tag], check=False).returncode == 1, tag


def _content(lay) -> set[str]:
    return set(node.ctr(lay, "content", "ls", "-q").stdout.decode().split())


def _blobs(lay, image: str) -> set[str]:
    """The manifest, config and layer digests of ``image`` in containerd."""
    rows = node.ctr(lay, "images", "ls").stdout.decode().splitlines()[1:]
    (digest,) = [r.split()[2] for r in rows if r.split()[0] == image]
    out, todo = set(), [digest]
    while todo:  # an index names manifests; a manifest names its config and layers
        d = todo.pop()
        out.add(d)
        doc = json.loads(node.ctr(lay, "content", "get", d).stdout)
        todo += [m["digest"] for m in doc.get("manifests", [])]
        out |= {b["digest"] for b in [doc["config"], *doc["layers"]]} if "config" in doc else set()
    return out


@pytest.mark.k8s
def test_a_reimport_removes_the_previous_image_and_its_content_from_containerd(repo, tmp_path):
    from devcluster.cluster import Cluster
    from tests.realkube import require_or_skip

    cluster = Cluster()
    if not node.running(cluster):
        require_or_skip(
            f"the real nodes of {cluster.root} are not running: start it with scripts/kube up --pods"
        )
    lay = node.layout(cluster)
    release, old_hash, new_hash = f"{repo}:0.1.0", f"{repo}:h-aaa", f"{repo}:h-bbb"
    try:
        # the same tag rebuilt: the old image goes before the new one comes, with its content
        _scratch_image(release, "version 1", tmp_path)
        assert node.import_images(cluster, (release,)) == [release]
        v1 = _blobs(lay, release)
        _scratch_image(release, "version 2", tmp_path)
        assert node.import_images(cluster, (release,)) == [release]
        v2 = _blobs(lay, release)
        assert v1.isdisjoint(v2)  # every blob of its own: nothing of v1 is still referenced
        content = _content(lay)
        assert v2 <= content and not (v1 & content), f"left in containerd: {sorted(v1 & content)}"
        assert [n for n in node.containerd_images(lay) if n.startswith(repo)] == [release]
        # unchanged in podman: no copy, no removal
        assert node.import_images(cluster, (release,)) == [release] and _blobs(lay, release) == v2
        # a new hash tag supersedes the older one; the same podman image under a new name is tagged
        _scratch_image(old_hash, "version 3", tmp_path)
        node.import_images(cluster, (old_hash,))
        v3 = _blobs(lay, old_hash)
        _podman("tag", release, new_hash)  # h-bbb is the image 0.1.0 already is in containerd
        node.import_images(cluster, (new_hash,))
        assert _blobs(lay, new_hash) == v2
        assert sorted(n for n in node.containerd_images(lay) if n.startswith(repo)) == [release, new_hash]
        assert not (v3 & _content(lay)), "the superseded h- image's content stayed"
        for other in node.layouts(cluster)[1:]:  # every real node got the same, once
            mine = sorted(n for n in node.containerd_images(other) if n.startswith(repo))
            assert mine == [release, new_hash], other.name
    finally:
        for each in node.layouts(cluster):
            for image in (release, old_hash, new_hash):
                node.remove_image(each, image)
                node._marker(each, image).unlink(missing_ok=True)
    for each in node.layouts(cluster):
        assert not [n for n in node.containerd_images(each) if n.startswith(repo)]
