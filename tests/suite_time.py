"""Where the suite's time goes, printed at the end of every run (a pytest plugin, loaded by
conftest.py): the seconds of each module (setup, call and teardown of its tests, a shared
run's fixture counted where it was first set up), the tests that end-to-end markers name,
and any test that took long without one. pytest's own ``--durations`` (pyproject's addopts)
lists the slowest tests above it. ``--suite-time-json PATH`` also writes every test's
seconds, markers, worker and start and stop (epoch seconds), and its CPU seconds (the
worker's own and those of the processes it started and waited for: a test's training and
probe processes, its `snakemake` and that one's jobs; not a SLURM job's, which slurmd runs),
for bench/suite_time.py to compare two runs and to show what each worker ran when."""

import json
import os
import resource
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
_spans: dict[str, list] = {}  # nodeid -> [worker, first start, last stop] (epoch seconds)
_cpu: dict[str, float] = defaultdict(float)  # nodeid -> CPU seconds (setup, call, teardown)
_started = time.monotonic()


def pytest_addoption(parser):
    parser.addoption(
        "--suite-time-json",
        default=os.environ.get("TULA_SUITE_TIME_JSON"),
        help="write each test's seconds and markers to this JSON file (bench/suite_time.py)",
    )


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and of its children it has waited for."""
    me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


_last_cpu = [0.0]  # this process's CPU seconds when the running test's last phase ended


def pytest_runtest_logstart(nodeid, location):
    _last_cpu[0] = cpu_seconds()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report carries its CPU seconds (in user_properties, which pytest-xdist
    sends on to the controller)."""
    report = yield
    now = cpu_seconds()
    report.user_properties.append(("cpu_s", now - _last_cpu[0]))
    _last_cpu[0] = now
    return report


def pytest_runtest_logreport(report):
    # under pytest-xdist the reports come from the workers, an item's xdist group at the end of
    # its id ("...::test@slurm"), and its markers among its keywords
    nodeid = report.nodeid.split("@", 1)[0]
    _seconds[nodeid] += report.duration
    _cpu[nodeid] += sum(v for k, v in report.user_properties if k == "cpu_s")
    _markers.setdefault(nodeid, tuple(m for m in END_TO_END if m in report.keywords))
    node = getattr(report, "node", None)  # the xdist worker that ran it (controller side)
    worker = getattr(getattr(node, "gateway", None), "id", "main")
    span = _spans.setdefault(nodeid, [worker, report.start, report.stop])
    span[1], span[2] = min(span[1], report.start), max(span[2], report.stop)


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
    if not _seconds or hasattr(config, "workerinput"):  # the xdist controller sums its workers'
        return
    tr = terminalreporter
    wall = time.monotonic() - _started
    tests_s = sum(_seconds.values())
    tr.write_sep(
        "=",
        f"time by module ({len(_seconds)} tests, {tests_s:.0f} s in tests, "
        f"{sum(_cpu.values()):.0f} CPU s)",
    )
    for module, n, s in by_module(_seconds):
        tr.write_line(f"{s:8.1f} s {100 * s / tests_s:5.1f} %  {n:4d} tests  {module}")
    workers = getattr(config.option, "numprocesses", None) or 1
    tr.write_line(f"{wall:8.1f} s wall from collection to this summary, on {workers} worker(s)")
    for marker in END_TO_END:
        mine = [s for k, s in _seconds.items() if marker in _markers.get(k, ())]
        if mine:
            tr.write_line(f"  marked {marker}: {len(mine)} tests, {sum(mine):.0f} s")
    unmarked = sorted((s, k) for k, s in _seconds.items() if s > UNMARKED_S and not _markers.get(k))
    for s, k in reversed(unmarked):
        tr.write_line(f"  {s:.1f} s and no end-to-end marker ({', '.join(END_TO_END)}): {k}")
    out = config.getoption("--suite-time-json")
    if out:
        rows = {
            k: {
                "s": s,
                "cpu": _cpu.get(k, 0.0),
                "markers": list(_markers.get(k, ())),
                **dict(zip(("worker", "start", "stop"), _spans.get(k, ()))),
            }
            for k, s in _seconds.items()
        }
        with open(out, "w") as f:
            json.dump({"wall_s": wall, "workers": workers, "tests": rows}, f, indent=1)
