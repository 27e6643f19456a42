"""Sphinx configuration of the tfk8s-lab documentation (MyST Markdown, notebooks via MyST-NB).

Build: ``scripts/docs`` (build, then serve on 127.0.0.1), or
``.venv/bin/python -m sphinx -W --keep-going -n -b html docs build/docs/html``.
Generated reference pages (options, chart values, error sentences) are written at build time by
``docs/_ext/tfk8s_docs.py`` and committed (``scripts/docs generate``; a test checks they are
current).
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "hub_config"))  # tfk8s_hub, whose docstrings some admin pages include
sys.path.insert(0, str(DOCS / "_ext"))

project = "tfk8s-lab"
author = "the tfk8s-lab authors"
copyright = "the tfk8s-lab authors"  # noqa: A001 (Sphinx's name)
release = "0.1.0"

extensions = [
    "myst_nb",  # MyST Markdown pages and .ipynb notebooks (includes myst_parser)
    "sphinx.ext.autodoc",
    "tfk8s_docs",
]

source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "_generated", "**/.ipynb_checkpoints", "README.md"]
root_doc = "index"

# Every cross-reference must resolve (the build runs with -W -n in tests/test_docs.py).
nitpicky = True


def _private_targets() -> str:
    """A regex of every ``tfk8s_magics.X`` that is not exported: private, so not documented."""
    import tfk8s_magics

    public = "|".join(sorted(tfk8s_magics.__all__, key=len, reverse=True))
    return rf"tfk8s_magics\.(?!(?:{public})(?:\.|$)).*"


nitpick_ignore_regex = [
    # the standard library's and third parties' types in signatures: no intersphinx (offline build)
    (r"py:.*", r"(abc|collections\.abc|pathlib|threading|typing|tf|tensorflow|np|numpy|IPython|traitlets"
     r"|kubernetes|ipywidgets)\..*"),
    # the public API's docstrings name private types it returns (ClusterStatus, Event, ...):
    # everything not in tfk8s_magics.__all__ is private and has no page to link to
    (r"py:.*", _private_targets()),
    (r"py:.*", r"(Backend|SCHEMA_VERSION)"),
]

myst_enable_extensions = ["colon_fence", "deflist", "fieldlist", "substitution"]
# Every heading up to level 4 gets an anchor, so [text](page.md#a-heading) links are checked.
myst_heading_anchors = 4

# Notebooks are never executed by the docs build: the copies rendered are the ones that
# tests/test_notebooks.py executed (with their outputs), see docs/_ext/tfk8s_docs.py.
nb_execution_mode = "off"
nb_merge_streams = True

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}

html_theme = "pydata_sphinx_theme"
html_title = "tfk8s-lab"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
html_static_path = ["_static"]
html_css_files = ["tfk8s.css"]
html_show_sourcelink = False
