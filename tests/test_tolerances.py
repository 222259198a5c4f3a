"""A test of the tests: no test writes a numeric tolerance of its own. Every tolerance lives in
tests/bounds.py with where its width comes from; a test states an exact relation
or reads its width from there.

A tolerance, as read here: a float literal inside an assert's ordering comparison (<, <=, >,
>=), or in a rel, abs, rtol, atol, rel_tol or abs_tol argument anywhere in a test. Literals
at or below bounds.ROUNDING state an equality up to rounding, and 0 and 1 a sign or a share's
end: those are exact. Integers are counts (a number of steps, of files) and not read."""

from __future__ import annotations

import ast
from pathlib import Path

import bounds

TESTS = Path(__file__).resolve().parent
TOLERANCE_ARGS = {"rel", "abs", "rtol", "atol", "rel_tol", "abs_tol"}
EXACT = {0.0, 1.0}


def _literals(node: ast.AST) -> list[float]:
    return [
        n.value
        for n in ast.walk(node)
        if isinstance(n, ast.Constant)
        and isinstance(n.value, float)
        and abs(n.value) > bounds.ROUNDING
        and abs(n.value) not in EXACT
    ]


def tolerances(source: str) -> list[tuple[int, float]]:
    """(line, literal) of every tolerance written in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg in TOLERANCE_ARGS:
                    found += [(kw.value.lineno, v) for v in _literals(kw.value)]
        elif isinstance(node, ast.Assert):
            for cmp in ast.walk(node.test):
                ordered = isinstance(cmp, ast.Compare) and any(
                    isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in cmp.ops
                )
                if ordered:
                    found += [(cmp.lineno, v) for v in _literals(cmp)]
    return sorted(set(found))


def test_the_reader_finds_a_tolerance_in_each_place_one_is_written():
    written = """
def test_x():
    assert a <= 1.3 * b
    assert 0.2 < share
    assert x == pytest.approx(y, rel=0.05)
    assert np.allclose(u, v, atol=2e-4)
    math.isclose(p, q, rel_tol=0.1)
"""
    assert [v for _, v in tolerances(written)] == [1.3, 0.2, 0.05, 2e-4, 0.1]


def test_the_reader_leaves_exact_relations_alone():
    exact = """
def test_y():
    assert x == pytest.approx(y, rel=1e-12)
    assert 0.0 <= p <= 1.0 and n >= 30
    assert a - b > 1e-6
    assert x == 0.25
    assert u < bounds.SOLVER * v
"""
    assert tolerances(exact) == []


def test_no_test_writes_a_tolerance_of_its_own():
    found = [
        f"{path.relative_to(TESTS)}:{line}: {value}"
        for path in sorted(TESTS.rglob("*.py"))
        if path.name not in {"bounds.py", Path(__file__).name}
        for line, value in tolerances(path.read_text())
    ]
    assert not found, "tolerances outside tests/bounds.py:\n" + "\n".join(found)
