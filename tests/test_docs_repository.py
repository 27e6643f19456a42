"""The docs as the repository's own site shows them, without a build.

A reader on the repository's site sees the Markdown files as committed: an include of a file
git ignores is an empty box, a link to one is a 404, and an autodoc block shows nothing. So:
every include and link target of the README and the docs is a tracked file; the generated
reference pages are committed and equal what their sources give now; every autodoc block links
the source file its text comes from; and no page tells the project's development history.
"""

from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
PAGES = [REPO / "README.md",
         *sorted(p for p in DOCS.rglob("*.md") if not {"_build", "notebooks"} & set(p.parts))]

INCLUDE = re.compile(r"^```\{include\}\s+(\S+)", re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")
AUTODOC_BLOCK = re.compile(r"^```\{eval-rst\}\n(.*?)^```\n", re.S | re.M)
AUTODOC_TARGET = re.compile(r"^\.\. auto\w+:: (\S+)", re.M)
#: words that tell how the project was made rather than what it does
HISTORY = re.compile(r"\b(?:issue|stop|round) #?\d+\b|\bthis (?:stop|round|session)\b|"
                     r"\blast (?:stop|round|session)\b|\b(?:seven|several|six) engineers\b", re.I)


def tracked() -> set[str]:
    """Every file git tracks in this checkout (paths relative to the repository)."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    return set(out.stdout.decode().split("\0")) - {""}


def local_targets(page: Path, text: str) -> list[tuple[str, Path]]:
    """``(as written, resolved path)`` of each include and relative link of a page."""
    found = [(t, page.parent / t) for t in INCLUDE.findall(text)]
    for link in LINK.findall(text):
        path = link.split("#", 1)[0]
        if not path or "://" in path or path.startswith(("mailto:", "path:")):
            continue
        found.append((link, page.parent / path))
    return found


def untracked_targets(page: Path, text: str, files: set[str]) -> list[str]:
    """The includes and links of ``text`` (a page at ``page``) that name no tracked file or folder."""
    bad = []
    for written, target in local_targets(page, text):
        try:
            rel = target.resolve().relative_to(REPO).as_posix()
        except ValueError:
            bad.append(written)  # outside the repository
            continue
        if rel not in files and not any(f.startswith(rel.rstrip("/") + "/") for f in files):
            bad.append(written)
    return bad


def test_every_include_and_link_target_is_a_tracked_file():
    files = tracked()
    bad = {str(p.relative_to(REPO)): untracked_targets(p, p.read_text(encoding="utf-8"), files)
           for p in PAGES}
    bad = {page: targets for page, targets in bad.items() if targets}
    assert not bad, f"includes or links the repository's site cannot show (untracked or missing): {bad}"


def test_the_target_check_finds_an_ignored_include_and_an_ignored_link():
    page = DOCS / "users" / "x.md"
    text = ("```{include} ../_generated/notebooks/x.md\n```\n"
            "[a notebook](notebooks/in_graph_walkthrough.ipynb) [ok](magics.md#every-option) "
            "[the site](https://example.org/x)\n")
    assert untracked_targets(page, text, tracked()) == [
        "../_generated/notebooks/x.md", "notebooks/in_graph_walkthrough.ipynb"]


def test_the_committed_reference_pages_are_current():
    sys.path[:0] = [str(DOCS / "_ext"), str(REPO / "hub_config")]
    try:
        import tfk8s_docs
    finally:
        del sys.path[:2]
    files = tracked()
    for name, page in tfk8s_docs.PAGES.items():
        path = DOCS / "_generated" / name
        assert f"docs/_generated/{name}" in files, f"docs/_generated/{name} is not committed"
        assert path.read_text(encoding="utf-8") == page(), (
            f"docs/_generated/{name} differs from its source: run scripts/docs generate and commit it")


def source_file(dotted: str) -> str:
    """The repository path of the file that defines ``dotted`` (a module, class or function)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return Path(inspect.getsourcefile(obj)).resolve().relative_to(REPO).as_posix()
    raise LookupError(dotted)


@pytest.mark.parametrize("page", [p for p in PAGES if "{eval-rst}" in p.read_text(encoding="utf-8")],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_every_autodoc_block_links_the_source_it_shows(page):
    sys.path.insert(0, str(REPO / "hub_config"))
    try:
        text = page.read_text(encoding="utf-8")
        for block in AUTODOC_BLOCK.finditer(text):
            after = text[block.end():].lstrip("\n").split("\n", 1)[0]
            linked = {(page.parent / t).resolve().relative_to(REPO).as_posix()
                      for t in LINK.findall(after)}
            needed = {source_file(n) for n in AUTODOC_TARGET.findall(block.group(1))}
            assert needed <= linked, (
                f"{page.name}: the autodoc block at offset {block.start()} shows {sorted(needed)} but the "
                f"line after it links only {sorted(linked)}: add 'Read in the repository: [...](...)'")
    finally:
        sys.path.remove(str(REPO / "hub_config"))


def test_no_page_tells_the_development_history():
    told = {str(p.relative_to(REPO)): HISTORY.findall(p.read_text(encoding="utf-8")) for p in PAGES}
    told = {page: words for page, words in told.items() if words}
    assert not told, f"development history belongs in the commit log, not the docs: {told}"


def test_the_history_check_finds_what_it_looks_for():
    text = "fixed in issue 23; as seven engineers found this round; see stop 30"
    assert HISTORY.findall(text) == ["issue 23", "seven engineers", "this round", "stop 30"]
