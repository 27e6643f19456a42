"""The documentation builds with warnings as errors, and every internal link and anchor resolves.

The build is Sphinx's own (``-W --keep-going -n``: warnings fail it, nitpicky so every
cross-reference must resolve; MyST reports a link to a missing page or heading as a warning).
Then the built HTML is read back and every relative ``href`` is checked against the files and
element ids that exist, so a link into a generated page or an autodoc anchor is checked too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
BUILD_TIMEOUT = 1200  # seconds; a build takes well under a minute on an idle machine


def build_docs(out: Path, src: Path = DOCS, env: dict | None = None) -> subprocess.CompletedProcess:
    """Build the docs from scratch (``-E``) into ``out``, as scripts/docs does."""
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-E", "-q", "-b", "html",
         str(src), str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=BUILD_TIMEOUT,
        env={**os.environ, **(env or {})})


def scripts_docs(*args: str, out: Path, port: int | None = None, **kwargs):
    env = {**os.environ, "TFK8S_LAB_SKIP_BOOTSTRAP": "1", "TFK8S_DOCS_OUT": str(out)}
    if port is not None:
        env["TFK8S_DOCS_PORT"] = str(port)
    return [str(REPO / "scripts" / "docs"), *args], {"cwd": REPO, "env": env, **kwargs}


@pytest.fixture(scope="module")
def html(tmp_path_factory) -> Path:
    """The docs as ``scripts/docs build`` builds them (a fresh output dir: a full build)."""
    out = tmp_path_factory.mktemp("docs") / "html"
    argv, kw = scripts_docs("build", out=out)
    result = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT, **kw)
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
        "extensions = ['myst_nb']\nhtml_static_path = []\n", encoding="utf-8")
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


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_scripts_docs_serves_the_build_on_loopback_only(html):
    import time
    import urllib.request

    import psutil

    port = _free_port()
    argv, kw = scripts_docs("serve", out=html, port=port)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    try:
        deadline = time.monotonic() + 60
        page = None
        while page is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/users/index.html", timeout=5) as r:
                    page = r.read().decode()
            except OSError:
                time.sleep(0.2)
        assert page is not None, f"scripts/docs serve did not answer: {proc.poll()}"
        assert "Getting started" in page
        listening = [c.laddr for c in psutil.Process(proc.pid).net_connections("inet")
                     if c.status == psutil.CONN_LISTEN]
        assert listening and all(a.ip == "127.0.0.1" for a in listening), listening
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_scripts_docs_refuses_a_port_in_use_in_one_sentence(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv, kw = scripts_docs(out=tmp_path / "html", port=port)
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120, **kw)
    assert result.returncode == 2
    assert f"cannot serve on 127.0.0.1:{port}" in result.stderr and "TFK8S_DOCS_PORT" in result.stderr
    assert not (tmp_path / "html").exists(), "a refused start built nothing"


def test_the_readme_is_a_front_door_whose_links_resolve():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200, "the README is a front door: at most ~200 lines"
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert local, "the README links into the docs"
    missing = [link for link in local if not (REPO / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_the_error_catalogue_lists_each_raised_sentence_under_its_cause(tmp_path):
    sys.path.insert(0, str(DOCS / "_ext"))
    import tfk8s_docs

    pkg = tmp_path / "pkg"
    (pkg / "storage").mkdir(parents=True)
    (pkg / "spec.py").write_text(
        "def f(name, n):\n"
        "    if n:\n"
        "        raise SpecError(f'--workers {n} is out of range: ' 'give a count from 0 to 256.')\n"
        "    raise ValueError('a builtin error is not a user-facing sentence')\n")
    (pkg / "storage" / "urls.py").write_text(
        "MISSING = 'the {kind} package is not installed: pip install {kind}.'\n"
        "def g(url):\n    raise StorageError(f'unknown scheme in {url!r}: use s3:// or gs://.')\n"
        "def h(kind):\n    raise StorageError(MISSING.format(kind=kind))\n"
        "def explain(url, e):\n"
        "    if e:\n        return StorageError(f'{url} was refused: check the credentials.')\n"
        "    return StorageError(f'{url} does not exist: check the path.')\n"
        "def i(url, e):\n    raise explain(url, e)\n")
    found = tfk8s_docs.error_sentences(pkg)
    assert found == {
        "Object storage (URLs, credentials, transfers)": [
            ("the ‹kind› package is not installed: pip install ‹kind›.", "StorageError", "storage/urls.py"),
            ("unknown scheme in ‹url›: use s3:// or gs://.", "StorageError", "storage/urls.py"),
            ("‹url› does not exist: check the path.", "explain()", "storage/urls.py"),
            ("‹url› was refused: check the credentials.", "explain()", "storage/urls.py")],
        "What you asked for: names, flags, values, shapes": [
            ("--workers ‹n› is out of range: give a count from 0 to 256.", "SpecError", "spec.py")],
    }


def test_the_troubleshooting_page_shows_the_real_error_sentences(html):
    import html as html_

    page = (html / "users" / "troubleshooting.html").read_text(encoding="utf-8")
    text = " ".join(html_.unescape(re.sub(r"<[^>]+>", "", page)).split())
    assert "a cluster needs a name: give one such as 'mnist'." in text
    assert text.count("SpecError") > 50


def test_the_api_reference_documents_exactly_the_public_api(html):
    import tfk8s_magics

    ids = set()
    for page in html.rglob("*.html"):
        ids |= {i for i in _parse(page).ids if i.startswith("tfk8s_magics.")}
    top_level = {i.removeprefix("tfk8s_magics.") for i in ids if i.count(".") == 1}
    assert top_level == set(tfk8s_magics.__all__), (
        f"documented but not exported: {sorted(top_level - set(tfk8s_magics.__all__))}; "
        f"exported but not documented: {sorted(set(tfk8s_magics.__all__) - top_level)}")
    # The Backend contract (for writing a backend) is public too, under tfk8s_magics.backends.
    from tfk8s_magics import backends

    prefix = "tfk8s_magics.backends."
    contract = {i.removeprefix(prefix) for i in ids if i.startswith(prefix)}
    assert {c.partition(".")[0] for c in contract} == set(backends.__all__), (
        f"backends: documented {sorted(contract)}, exported {sorted(backends.__all__)}")
    members = {i for i in ids if i.count(".") > 1 and not i.startswith("tfk8s_magics.backends.")}
    assert all(m.split(".")[1] in tfk8s_magics.__all__ for m in members), sorted(members)
