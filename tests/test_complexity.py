"""Code that is safe to change: no function over 60 lines, no complexity grade worse than C.

The same check by hand: ``radon cc -n D -s tfk8s_magics hub_config`` prints
nothing when every block is graded A to C (see docs/contributors/index.md, "Rules of the code").
"""

from __future__ import annotations

import ast
from pathlib import Path

from radon.complexity import cc_rank, cc_visit

REPO = Path(__file__).resolve().parent.parent
#: Where the rules hold (bench/ and tests/ are exempt).
ROOTS = ("tfk8s_magics", "hub_config")
MAX_LINES = 60
WORST_GRADE = "C"


def _sources() -> list[Path]:
    return sorted(p for root in ROOTS for p in (REPO / root).rglob("*.py"))


def test_no_function_is_longer_than_60_lines():
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "split these functions:\n" + "\n".join(long)


def test_no_complexity_grade_worse_than_c():
    worse = []
    for path in _sources():
        for block in cc_visit(path.read_text(encoding="utf-8")):
            grade = cc_rank(block.complexity)
            if grade > WORST_GRADE:
                worse.append(f"{path.relative_to(REPO)}:{block.lineno} {block.fullname} "
                             f"{grade} ({block.complexity})")
    assert not worse, "simplify these blocks:\n" + "\n".join(worse)


def test_the_checks_can_fail():
    """The measures are real: a deliberately tangled function is graded worse than C."""
    tangled = "def f(x):\n" + "".join(f"    if x == {i}:\n        return {i}\n" for i in range(25))
    (block,) = cc_visit(tangled)
    assert cc_rank(block.complexity) > WORST_GRADE
