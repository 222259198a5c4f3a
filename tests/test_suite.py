"""How `make test` shares this machine between its two pytest-xdist workers (sharing.py): what
must not happen twice or at once is kept in one xdist group, and a test marked `alone` has the
machine to itself."""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from types import SimpleNamespace

import pytest

import sharing
from conftest import ROOT
from sharing import beside_others, lock_files

# its threads wait on each other with deadlines of seconds: never at idle CPU priority
pytestmark = pytest.mark.wallclock

REPORT = """
import json, os, pytest

@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    rows = {}
    for it in items:  # as an xdist worker sees them: the group at the end of the id
        nodeid, _, group = it.nodeid.partition("@")
        rows[nodeid] = {"group": group or None, "fixtures": list(it.fixturenames),
                        "alone": it.get_closest_marker("alone") is not None,
                        "light": __import__("sharing").light(it),
                        "grouped": it.get_closest_marker("xdist_group") is not None}
    with open(os.environ["GROUPS_OUT"] + os.environ.get("PYTEST_XDIST_WORKER", ""), "w") as f:
        json.dump(rows, f)
    config.hook.pytest_deselected(items=items[:])  # seen, not run
    items[:] = []
"""


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """The whole suite's items as `make test`'s xdist workers see them: each collects it
    (a collection with two workers) and sends xdist the group at the end of each test's id."""
    d = tmp_path_factory.mktemp("groups")
    (d / "groups_report.py").write_text(REPORT)
    env = dict(os.environ, PYTHONPATH=str(d), GROUPS_OUT=str(d / "groups.json"))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "groups_report", "-p", "no:cacheprovider"]
    cmd += ["-n", "2", "--dist", "loadgroup", "tests"]  # (xdist has no --collect-only)
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, r.stdout[-3000:] + r.stderr[-3000:]
    seen = [json.loads((d / f"groups.jsongw{i}").read_text()) for i in (0, 1)]
    assert seen[0] == seen[1]  # xdist requires it: both workers collect the same
    return seen[0]


def test_the_slurm_tests_the_shared_runs_and_a_modules_run_each_stay_on_one_worker(collected):
    def groups(fixture):
        return {r["group"] for r in collected.values() if fixture in r["fixtures"]}

    # the lab replaces the one-node cluster while it is up: every SLURM test in one group
    assert groups("slurm_cluster") | groups("lab_cluster") == {"slurm"}
    # the default DAG run once: its readers together (and never free)
    assert len(groups("finished_run")) == 1 and None not in groups("finished_run")
    # a module-scoped reference run made once: its module's tests that compare with it together
    ref = groups("reference")
    assert len(ref) == 1 and None not in ref and ref != {"slurm"}
    # the rest is free: most of the suite, for either worker
    free = [k for k, r in collected.items() if r["group"] is None]
    assert 2 * len(free) > len(collected)
    assert "tests/model/test_choice.py::test_knee_of_l_shaped_curve_is_the_corner" in free
    # the lab's tests after the other SLURM tests, so that the lab comes up once
    order = [k for k, r in collected.items() if r["group"] == "slurm"]
    lab = [i for i, k in enumerate(order) if "lab_cluster" in collected[k]["fixtures"]]
    assert lab and lab == list(range(len(order) - len(lab), len(order)))
    # what is marked alone (the network lab's comparisons of measured sync, among others)
    assert all(r["alone"] for k, r in collected.items() if k.startswith("tests/test_netlab.py"))
    # a module's alone tests one group, so that they run one after another on one worker
    replan = {
        r["group"]
        for k, r in collected.items()
        if k.startswith("tests/production/test_replan.py") and r["alone"]
    }
    assert len(replan) == 1 and None not in replan
    # and a module with none, its steps on a virtual clock, free
    timing = {r["group"] for k, r in collected.items() if k.startswith("tests/runtime/test_timing")}
    assert timing == {None}


def test_the_light_tests_share_nothing_and_time_nothing(collected):
    """What make test runs at idle CPU priority (tests/beside.py): most of the suite by count,
    in no xdist group, none marked as a workflow, a probe, training, the lab, slow, alone or
    bounding a wall clock."""
    light = {k for k, r in collected.items() if r["light"]}
    assert 2 * len(light) > len(collected)
    assert "tests/model/test_choice.py::test_knee_of_l_shaped_curve_is_the_corner" in light
    assert not [k for k in light if collected[k]["grouped"]]
    heavy = ("tests/test_netlab.py", "tests/test_dag_slurm.py", "tests/test_suite.py")
    assert not [k for k in light if k.startswith(heavy)]
    stream = "test_a_stream_measures_both_decoders_and_decodes_with_the_faster"  # wallclock
    assert f"tests/runtime/test_decoding.py::{stream}" not in light
    assert (
        "tests/runtime/test_decoding.py::test_the_faster_decoder_is_kept_and_the_record_says_by_how_much"
        in light
    )


def held(path) -> bool:
    """Someone holds the lock of ``path`` (a try of an exclusive lock fails at once)."""
    import fcntl

    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def test_an_alone_test_waits_for_the_running_one_and_holds_off_the_next(monkeypatch):
    """Three threads as three workers' tests: A (shared) runs; B (alone) asks and waits for it;
    C (shared), asked for while B waits, starts only once B has ended, not beside A or B."""

    run = f"locktest{os.getpid()}"
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", run)
    gate, room = lock_files(run)
    spans: dict[str, tuple[float, float]] = {}
    release_a = threading.Event()

    def test(name, alone):
        with beside_others(alone=alone):
            t0 = time.monotonic()
            if name == "a":
                release_a.wait(10)
            spans[name] = (t0, time.monotonic())

    def until(what, timeout=10):
        deadline = time.monotonic() + timeout
        while not what():
            assert time.monotonic() < deadline
            time.sleep(0.01)

    threads = {n: threading.Thread(target=test, args=(n, n == "b")) for n in "abc"}
    threads["a"].start()
    until(lambda: held(room))  # A runs
    threads["b"].start()
    until(lambda: held(gate))  # B waits for the room, holding the gate
    threads["c"].start()
    time.sleep(0.2)  # C's chance to start beside them, were the lock wrong
    release_a.set()
    for t in threads.values():
        t.join(timeout=10)
    assert spans["b"][0] >= spans["a"][1]  # B began after A ended
    assert spans["c"][0] >= spans["b"][1]  # C waited for B: no test beside an alone one
    gate.unlink()
    room.unlink()


def test_a_run_of_alone_tests_holds_the_room_from_the_first_to_the_last(monkeypatch):
    """The hook as pytest calls it, on two `alone` tests and a shared one after them: the room
    is held from the first alone test's start through the second's end, not let go between
    them, and the shared test takes it again and gives it back."""

    run = f"holdtest{os.getpid()}"
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", run)
    monkeypatch.setattr(sharing, "_made", set())
    monkeypatch.setattr(sharing, "_held", [])  # not this test's own hold, which pytest made
    _, room = lock_files(run)

    def item(alone):
        return SimpleNamespace(fixturenames=[], get_closest_marker=lambda m: alone or None)

    first, second, shared = item(True), item(True), item(False)
    seen = []
    for it, nxt in ((first, second), (second, shared), (shared, None)):
        hook = sharing.pytest_runtest_protocol(it, nxt)
        next(hook)  # in the room: the test runs
        seen.append(held(room))
        with pytest.raises(StopIteration):
            hook.send(None)
        seen.append(held(room))  # between this test and the next
    assert seen == [True, True, True, False, True, False]
    assert sharing._held == []
    for f in lock_files(run):
        f.unlink(missing_ok=True)


def test_without_xdist_nothing_waits(monkeypatch, tmp_path):
    """Outside pytest-xdist (TEST_WORKERS=0, a single test run by hand) no test is beside
    another, so `beside_others` takes no lock: two `alone` sections nested in one thread (which
    a lock would deadlock) end at once, and no lock file is made. Run in a thread joined with
    a limit, so a lock taken by mistake fails here instead of hanging the suite."""
    monkeypatch.delenv("PYTEST_XDIST_TESTRUNUID", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where lock_files would be made
    ended = threading.Event()

    def nested() -> None:
        with beside_others(alone=True), beside_others(alone=True):
            pass
        ended.set()

    t0 = time.monotonic()
    threading.Thread(target=nested, daemon=True).start()
    assert ended.wait(timeout=10), "beside_others waited without xdist"
    assert time.monotonic() - t0 < 10
    assert list(tmp_path.iterdir()) == []  # no gate, no room: nothing was locked


def test_the_test_that_makes_a_timed_run_runs_alone_and_its_readers_do_not(monkeypatch):
    """The shared runs whose times tests bound (the default DAG, the lab's workflow) are made
    by the first test on a worker that asks for one, alone; the tests after it only read."""
    monkeypatch.setattr(sharing, "_made", set())

    def item(*fixtures, alone=False):
        return SimpleNamespace(
            fixturenames=list(fixtures), get_closest_marker=lambda m: alone or None
        )

    first, second = item("finished_run", "tmp_path"), item("finished_run")
    assert sharing.runs_alone(first)
    sharing._made.update({"finished_run"})  # as pytest_runtest_protocol does after it
    assert not sharing.runs_alone(second) and sharing.runs_alone(item("finished_run", "lab_run"))
    assert not sharing.runs_alone(item("tmp_path")) and sharing.runs_alone(item(alone=True))


BURN = """
import resource, subprocess, sys


def test_burns_in_a_child():
    code = "import resource\\nx = 0\\nfor i in range(3_000_000): x += i\\n"
    code += "r = resource.getrusage(resource.RUSAGE_SELF); print(r.ru_utime + r.ru_stime)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    with open("child_cpu.txt", "w") as f:
        f.write(out.stdout)
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_each_tests_cpu_seconds_count_the_processes_it_waited_for(tmp_path, workers):
    """suite_time's JSON holds each test's CPU seconds, with those of a child it ran (what a
    test's training, probe and snakemake processes cost), on one process and under xdist."""
    (tmp_path / "test_burn.py").write_text(BURN)
    out = tmp_path / "times.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tests"))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "suite_time", "-p", "no:cacheprovider"]
    cmd += [*workers, "--suite-time-json", str(out), "test_burn.py"]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    row = json.loads(out.read_text())["tests"]["test_burn.py::test_burns_in_a_child"]
    assert row["cpu"] >= float((tmp_path / "child_cpu.txt").read_text()) > 0
