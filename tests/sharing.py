"""How `make test`'s two pytest-xdist workers share this machine (a pytest plugin, loaded by
conftest.py).

`make test` runs the suite on two workers (-n 2 --dist loadgroup), which share this machine's
two cores: one worker's SLURM jobs, process starts and rendezvous wait while the other
computes. What the two must not do twice, or at once, is kept on one worker by its xdist
group (xdist_groups): every test of the SLURM clusters (the lab replaces the one-node cluster
while it is up), every reader of a shared session run (finished_run), every test of a module
whose module-scoped run it shares. A test marked `alone` (it asserts on measured times) runs
with no other test beside it (beside_others), and so does the test that makes a shared run
whose times other tests bound (TIMED_RUNS); a module's `alone` tests are one group, run one
after another in one hold of the room."""

import contextlib
import os
import tempfile
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

SLURM_FIXTURES = {"slurm_cluster", "lab_cluster"}


def _shared(item) -> set[str]:
    """What ``item`` shares with other tests: "slurm", its session-scoped runs, its module's,
    and, marked `alone`, its module's other `alone` tests."""
    keys = set()
    if set(item.fixturenames) & SLURM_FIXTURES or item.get_closest_marker("slurm"):
        keys.add("slurm")
    for name, defs in item._fixtureinfo.name2fixturedefs.items():
        d = defs[-1]
        code = getattr(d.func, "__code__", None)
        if name in SLURM_FIXTURES or not (code and code.co_filename.startswith(str(TESTS))):
            continue  # pytest's own (tmp_path_factory, ...) share nothing that costs a run
        if d.scope == "session":
            keys.add(name)
        elif d.scope == "module":
            keys.add(f"module {item.module.__name__}")
    if item.get_closest_marker("alone"):
        keys.add(f"alone {item.module.__name__}")  # one after another, in one hold of the room
    return keys


def xdist_groups(items) -> dict:
    """Each item's xdist group (None: free to run on any worker): tests that share anything,
    directly or through a third, are in one group, "slurm" where it holds the SLURM tests, else
    named by its first key in sort order."""
    root: dict[str, str] = {}

    def find(k: str) -> str:
        while root.setdefault(k, k) != k:
            k = root[k]
        return k

    shared = {item: sorted(_shared(item)) for item in items}
    for keys in shared.values():
        for k in keys[1:]:
            a, b = sorted((find(k), find(keys[0])), key=lambda r: (r != "slurm", r))
            root[b] = a
    return {item: find(keys[0]) if keys else None for item, keys in shared.items()}


# What no test of the idle session (tests/beside.py) may be: it runs a workflow, a probe, a
# training job or the network lab, it is slow, it asserts on measured times, or it bounds a
# wall-clock time (a deadline): the idle session gets only the CPU the rest leaves idle.
HEAVY_MARKS = ("dag", "training", "probe", "netlab", "slurm", "slow", "alone", "wallclock")


def light(item) -> bool:
    """A test the idle session can run: none of HEAVY_MARKS, and nothing shared with another
    test (a SLURM cluster, a session's or a module's run)."""
    return not any(item.get_closest_marker(m) for m in HEAVY_MARKS) and not _shared(item)


def pytest_addoption(parser):
    parser.addoption(
        "--part",
        choices=("all", "light", "heavy"),
        default="all",
        help="light: only the tests sharing.light() names (tests/beside.py runs them at idle CPU "
        "priority beside the rest); heavy: the rest; all (default): every test",
    )


# first: xdist's worker writes the xdist_group markers into the test ids in its own hook
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    part = config.getoption("part")
    if part != "all":
        mine = {it: light(it) == (part == "light") for it in items}
        config.hook.pytest_deselected(items=[it for it, m in mine.items() if not m])
        items[:] = [it for it, m in mine.items() if m]
    for item, group in xdist_groups(items).items():
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


LOST = (
    "pytest-xdist did not take this test's xdist_group, so it could run beside a test it must "
    "not (pytest-xdist#1386: pytest 9.2 ignores the id xdist 3.8 writes). Install pytest<9.2 "
    "(pyproject's dev extra, which make test installs, keeps it there) or run the suite in one "
    "process: TEST_WORKERS=0 make test."
)


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
def pytest_groups_taken(config, items):
    """A test whose id lacks its group would run on either worker: a SLURM test beside the
    lab, a shared run made twice. Each such test fails at its setup, saying why, before it
    runs anything."""
    if hasattr(config, "workerinput") and config.getvalue("loadgroup"):
        for item in items:
            if item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
                item.stash[LOST_KEY] = True


LOST_KEY = pytest.StashKey[bool]()


def pytest_runtest_setup(item):
    if item.stash.get(LOST_KEY, False):
        pytest.fail(LOST, pytrace=False)


def lock_files(run: str) -> tuple[Path, Path]:
    """The gate and the room of one xdist run (its PYTEST_XDIST_TESTRUNUID)."""
    base = Path(tempfile.gettempdir()) / f"tula-suite-{run}"
    return Path(f"{base}.gate"), Path(f"{base}.room")


@contextlib.contextmanager
def beside_others(alone: bool):
    """Under pytest-xdist, a test marked `alone` (it asserts on measured times) waits for the
    other worker's test to end, and holds the next one off until it ends: a writer's lock of
    two files (fcntl.flock), the gate taken first so that no new test slips in while an
    `alone` one waits for the room. Without xdist, nothing runs beside a test anyway."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        yield
        return
    import fcntl

    gate_file, room_file = lock_files(run)
    with open(gate_file, "a") as gate, open(room_file, "a") as room:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)


# Shared runs whose measured times tests bound (tests/bounds.py): the test that makes one runs
# alone, so that the run is timed as a user's would be, with no other test's processes beside
# it (its readers after it only read its files, and share the machine as usual).
TIMED_RUNS = {"finished_run", "recipe_run", "lab_run"}
_made: set[str] = set()  # the timed runs this xdist worker (or process) has made


def runs_alone(item) -> bool:
    """Marked `alone`, or the first test on this worker to ask for a timed run: it makes it."""
    return item.get_closest_marker("alone") is not None or bool(
        TIMED_RUNS.intersection(item.fixturenames) - _made
    )


# The room this worker holds from one `alone` test to the next (none or one ExitStack).
_held: list[contextlib.ExitStack] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test in the room (`beside_others`). A run of `alone` tests on one worker keeps it
    from the first to the last: let go between them, the other worker's next test would take
    it, and each of them would wait for a test of its own to end (18 in a module, once)."""
    alone = runs_alone(item)
    if not _held:
        stack = contextlib.ExitStack()
        stack.enter_context(beside_others(alone=alone))
        _held.append(stack)
    try:
        return (yield)
    finally:
        _made.update(TIMED_RUNS.intersection(item.fixturenames))
        if not (alone and nextitem is not None and runs_alone(nextitem)):
            _held.pop().close()


def pytest_sessionfinish(session):
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run and not hasattr(session.config, "workerinput"):  # the controller, after its workers
        for f in lock_files(run):
            f.unlink(missing_ok=True)
