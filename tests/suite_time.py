"""Where the suite's time goes, printed at the end of every run (a pytest plugin, loaded by
conftest.py): the seconds of each module (setup, call and teardown of its tests, a shared
run's fixture counted where it was first set up), the tests that end-to-end markers name,
and any test that took long without one. pytest's own ``--durations`` (pyproject's addopts)
lists the slowest tests above it. ``--suite-time-json PATH`` also writes every test's
seconds, for bench/suite_time.py to compare two runs."""

import json
import os
import time
from collections import defaultdict

import pytest

# What a test that runs for real says in its marker (registered in pyproject.toml).
END_TO_END = ("dag", "training", "probe", "netlab", "slurm")
# A test past this without one of those markers is named at the end of the run: it runs for
# real what it does not say, or it waits on something it should not.
UNMARKED_S = 20.0

_seconds: dict[str, float] = defaultdict(float)
_markers: dict[str, tuple[str, ...]] = {}
_started = time.monotonic()


def pytest_addoption(parser):
    parser.addoption(
        "--suite-time-json",
        default=os.environ.get("TULA_SUITE_TIME_JSON"),
        help="write each test's seconds and markers to this JSON file (bench/suite_time.py)",
    )


@pytest.hookimpl(trylast=True)  # after conftest.py has marked the tests that use shared runs
def pytest_collection_modifyitems(config, items):
    for item in items:
        _markers[item.nodeid] = tuple(m for m in END_TO_END if item.get_closest_marker(m))


def pytest_runtest_logreport(report):
    _seconds[report.nodeid] += report.duration


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def by_module(seconds: dict[str, float]) -> list[tuple[str, int, float]]:
    """(module, tests, seconds), slowest first."""
    count: dict[str, int] = defaultdict(int)
    total: dict[str, float] = defaultdict(float)
    for nodeid, s in seconds.items():
        count[module_of(nodeid)] += 1
        total[module_of(nodeid)] += s
    return sorted(((m, count[m], total[m]) for m in total), key=lambda r: -r[2])


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _seconds:
        return
    tr = terminalreporter
    wall = time.monotonic() - _started
    tests_s = sum(_seconds.values())
    tr.write_sep("=", f"time by module ({len(_seconds)} tests, {tests_s:.0f} s in tests)")
    for module, n, s in by_module(_seconds):
        tr.write_line(f"{s:8.1f} s {100 * s / tests_s:5.1f} %  {n:4d} tests  {module}")
    tr.write_line(f"{wall:8.1f} s wall from collection to this summary")
    for marker in END_TO_END:
        mine = [s for k, s in _seconds.items() if marker in _markers.get(k, ())]
        if mine:
            tr.write_line(f"  marked {marker}: {len(mine)} tests, {sum(mine):.0f} s")
    unmarked = sorted((s, k) for k, s in _seconds.items() if s > UNMARKED_S and not _markers.get(k))
    for s, k in reversed(unmarked):
        tr.write_line(f"  {s:.1f} s and no end-to-end marker ({', '.join(END_TO_END)}): {k}")
    out = config.getoption("--suite-time-json")
    if out:
        rows = {k: {"s": s, "markers": list(_markers.get(k, ()))} for k, s in _seconds.items()}
        with open(out, "w") as f:
            json.dump({"wall_s": wall, "tests": rows}, f, indent=1)
