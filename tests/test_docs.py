"""The documentation builds with warnings as errors, and every internal link and anchor resolves.

The build is Sphinx's own (``-W --keep-going -n``: warnings fail it, nitpicky so every
cross-reference must resolve; MyST reports a link to a missing page or heading as a warning).
Then the built HTML is read back and every relative ``href`` is checked against the files and
element ids that exist, so a link into a generated page or an autodoc anchor is checked too.
"""

from __future__ import annotations

import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
BUILD_TIMEOUT = 1200  # seconds; a build takes well under a minute on an idle machine


def build_docs(out: Path, src: Path = DOCS) -> subprocess.CompletedProcess:
    """Build the docs from scratch (``-E``) into ``out``, as scripts/docs does."""
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-E", "-q", "-b", "html",
         str(src), str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=BUILD_TIMEOUT)


@pytest.fixture(scope="module")
def html(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "html"
    result = build_docs(out)
    assert result.returncode == 0, (
        f"the docs build failed (warnings are errors):\n{result.stderr[-6000:]}")
    return out


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("name"):
            self.ids.add(a["name"])
        if tag == "a" and a.get("href") is not None:
            self.hrefs.append(a["href"])


def _parse(path: Path) -> _Links:
    p = _Links()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def broken_links(root: Path) -> list[str]:
    """Every relative link in the HTML under ``root`` whose file or anchor does not exist."""
    pages = {p: _parse(p) for p in root.rglob("*.html")}
    broken = []
    for page, parsed in pages.items():
        for href in parsed.hrefs:
            url = urlsplit(href)
            if url.scheme or url.netloc or href.startswith("//"):
                continue  # external: not checked (the build is offline)
            target = (page.parent / unquote(url.path)).resolve() if url.path else page
            if target.is_dir():
                target = target / "index.html"
            where = f"{page.relative_to(root)}: {href}"
            if not target.exists():
                broken.append(f"{where} (no file {target.relative_to(root.resolve())})")
                continue
            if url.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if unquote(url.fragment) not in ids:
                    broken.append(f"{where} (no anchor #{url.fragment})")
    return broken


def test_docs_build_with_warnings_as_errors(html):
    for page in ("index", "users/index", "admins/index", "contributors/index"):
        assert (html / f"{page}.html").exists(), f"{page}.html was not built"


def test_every_internal_link_and_anchor_resolves(html):
    broken = broken_links(html)
    assert not broken, "broken internal links in the docs:\n" + "\n".join(broken)


def test_the_link_checker_finds_a_missing_page_and_a_missing_anchor(tmp_path):
    (tmp_path / "a.html").write_text(
        '<h1 id="top">A</h1><a href="b.html#there">ok</a><a href="b.html#nowhere">x</a>'
        '<a href="missing.html">y</a><a href="#top">self</a><a href="https://example.org/z">ext</a>')
    (tmp_path / "b.html").write_text('<section id="there"></section>')
    assert broken_links(tmp_path) == [
        "a.html: b.html#nowhere (no anchor #nowhere)",
        "a.html: missing.html (no file missing.html)",
    ]


def test_a_link_to_a_missing_heading_fails_the_build(tmp_path):
    """With this configuration Sphinx itself refuses a link to a heading that does not exist."""
    src = tmp_path / "docs"
    src.mkdir()
    (src / "conf.py").write_text(
        f"exec(compile(open({str(DOCS / 'conf.py')!r}).read(), 'conf.py', 'exec'))\n"
        "extensions = ['myst_nb']\n", encoding="utf-8")
    (src / "index.md").write_text("# Home\n\n```{toctree}\npage\n```\n", encoding="utf-8")
    (src / "page.md").write_text("# Page\n\n## A heading\n\n[ok](index.md#home) "
                                 "[ok](#a-heading) [nothing](index.md#no-such-heading)\n",
                                 encoding="utf-8")
    result = build_docs(tmp_path / "html", src=src)
    assert result.returncode != 0
    assert "no-such-heading" in result.stderr, result.stderr[-3000:]
    assert result.stderr.count("WARNING") == 1, result.stderr[-3000:]


def test_the_manual_is_organised_by_reader():
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    for reader in ("users/index", "admins/index", "contributors/index"):
        assert reader in index, f"docs/index.md's toctree lacks {reader}"
        assert "{toctree}" in (DOCS / f"{reader}.md").read_text(encoding="utf-8")
