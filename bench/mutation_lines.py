"""Which tests can see a mutant: coverage-guided test selection for bench/mutation.py.

A mutant changes one line of a tula.model module. A test that never runs that line runs
exactly the code it ran before, so it cannot kill the mutant; only the tests that run it can.
``build`` runs tests/model once under coverage with each test as its own context and writes,
per module and line, the tests that ran it. ``select`` (called by the mutation runner for
each mutant) finds the changed lines, maps each to the line coverage records for its
statement, and prints the tests to run:

- ``ALL``: a changed line ran while no test was running (at import: a constant, a default
  argument, a decorator, a function called at module level) or its statement is unknown to
  coverage: every test of tests/model may see it, so all run, as before;
- the node ids of the tests that ran the changed statements, otherwise.

This only skips tests that cannot fail on the mutant, so a mutant's verdict is the same as
running all of tests/model (bench/mutation.py --recheck, which runs them all, checks a run's
survivors); a survivor costs its own few tests instead of the ~40 s of the whole suite.
"""

from __future__ import annotations

import ast
import difflib
import json
import sys
from pathlib import Path

import coverage
import pytest

MODEL = Path("src/tula/model")


class _Contexts:
    """A pytest plugin: each test's lines recorded under its node id."""

    def __init__(self, cov: coverage.Coverage) -> None:
        self.cov, self.test = cov, ""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item):
        self.test = item.nodeid
        self.cov.switch_context(self.test)
        yield
        self.test = ""
        self.cov.switch_context("")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        """A fixture shared by several tests is set up once, under the first test's name, and
        the others use what it computed: its lines count as run outside any test (ALL)."""
        if fixturedef.scope == "function":
            yield
            return
        self.cov.switch_context("")
        yield
        self.cov.switch_context(self.test)


def build(out: Path) -> int:
    """Run tests/model under coverage (in this directory's src) and write the map
    ``{module: {line: [node ids] or "ALL"}}``; the tests' exit code."""
    cov = coverage.Coverage(source=[str(MODEL)], data_file=None)
    cov.start()
    code = pytest.main(
        ["-q", "-p", "no:cacheprovider", "-o", "addopts=", "-n", "0", "tests/model"],
        plugins=[_Contexts(cov)],
    )
    cov.stop()
    data = cov.get_data()
    lines: dict[str, dict[str, object]] = {}
    for path in data.measured_files():
        per: dict[str, object] = {}
        for line, ctxs in data.contexts_by_lineno(path).items():
            per[str(line)] = "ALL" if "" in ctxs else sorted(ctxs)
        lines[Path(path).name] = per
    out.write_text(json.dumps(lines))
    return int(code)


def statement_line(source: str, line: int) -> int | None:
    """The line coverage records for the innermost statement holding ``line`` (its first
    line), or None where no statement holds it (a decorator's line, say)."""
    best = None
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.stmt) and node.lineno <= line <= (node.end_lineno or node.lineno):
            if best is None or node.lineno >= best.lineno:
                best = node
    return None if best is None else best.lineno


def changed_lines(old: str, new: str) -> list[int]:
    """The lines of ``old`` (1-based) that ``new`` changes."""
    sm = difflib.SequenceMatcher(a=old.splitlines(), b=new.splitlines(), autojunk=False)
    out: list[int] = []
    for tag, i1, i2, _, _ in sm.get_opcodes():
        if tag != "equal":
            out.extend(range(i1 + 1, max(i2, i1 + 1) + 1))
    return out


def tests_for(tree: Path, pristine: Path, lines_map: dict) -> list[str] | None:
    """The tests that can see the mutant in ``tree`` (None: all of them)."""
    wanted: set[str] = set()
    for path in sorted((tree / MODEL).glob("*.py")):
        old, new = (pristine / MODEL / path.name).read_text(), path.read_text()
        if old == new:
            continue
        per = lines_map.get(path.name, {})
        for line in changed_lines(old, new):
            at = statement_line(old, line)
            ran = per.get(str(at)) if at is not None else None
            if ran is None or ran == "ALL":
                return None
            wanted.update(ran)
    return sorted(wanted)


def select(tree: Path, pristine: Path, map_file: Path) -> None:
    got = tests_for(tree, pristine, json.loads(map_file.read_text()))
    print("ALL" if got is None else "\n".join(got))


if __name__ == "__main__":
    if sys.argv[1] == "build":
        sys.exit(build(Path(sys.argv[2])))
    select(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
