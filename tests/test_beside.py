"""`make test`'s two sessions (tests/beside.py): the light tests at idle CPU priority in a
cgroup v1 group with cpu.idle, beside the rest on the xdist workers; one session where no such
group can be made."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import beside
from conftest import ROOT

SUITE = textwrap.dedent(
    """
    import pytest

    def cpu_group():
        line = next(x for x in open("/proc/self/cgroup") if ":cpu:" in x or ":cpu," in x)
        return line.strip().split(":", 2)[2]

    def test_light():
        open("light.txt", "w").write(cpu_group())
        assert LIGHT_PASSES

    @pytest.mark.dag
    def test_heavy():
        open("heavy.txt", "w").write(cpu_group())
    """
)


def _run(tmp_path: Path, light_passes: bool) -> subprocess.CompletedProcess:
    (tmp_path / "test_two.py").write_text(SUITE.replace("LIGHT_PASSES", str(light_passes)))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tests"))
    env.pop("TULA_SUITE_TIME_JSON", None)
    cmd = [
        sys.executable,
        str(ROOT / "tests" / "beside.py"),
        "-p",
        "sharing",
        "-p",
        "no:cacheprovider",
    ]
    cmd += ["-n", "2", "--dist", "loadgroup", "test_two.py"]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_light_tests_run_in_the_idle_group_and_their_failure_fails_the_run(tmp_path):
    can = os.geteuid() == 0 and (beside.CPU / "cpu.idle").exists()
    r = _run(tmp_path, light_passes=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    light, heavy = (tmp_path / "light.txt").read_text(), (tmp_path / "heavy.txt").read_text()
    if can:  # root on cgroup v1 (CI): two sessions, the light one in the idle group
        own = next(x for x in open("/proc/self/cgroup") if ":cpu:" in x or ":cpu," in x)
        assert light.startswith(f"/{beside.PREFIX}"), light  # the run's own idle group
        assert heavy == own.strip().split(":", 2)[2], (heavy, own)  # where the run began
        assert "[beside] the light tests, at idle priority (exit 0)" in r.stdout
    else:  # one session, as before, saying why
        assert light == heavy and "[beside] the whole suite in one session" in r.stderr
    r = _run(tmp_path, light_passes=False)
    assert r.returncode != 0 and "test_light" in r.stdout, r.stdout[-3000:]


def test_no_idle_group_where_not_root(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert beside.idle_group() is None
    assert "the whole suite in one session (not root)" in capsys.readouterr().err


@pytest.mark.skipif(
    os.geteuid() != 0 or not (beside.CPU / "cpu.idle").exists(),
    reason="makes a cgroup v1 cpu group: root on cgroup v1 (CI is)",
)
def test_the_idle_group_is_made_idle_and_removed():
    group = beside.CPU / f"tula-test-{os.getpid()}"
    try:
        assert beside.idle_group(group) == group
        assert (group / "cpu.idle").read_text().strip() == "1"
    finally:
        beside.remove(group)
    assert not group.exists()


@pytest.mark.skipif(
    os.geteuid() != 0 or not (beside.CPU / "cpu.idle").exists(),
    reason="makes a cgroup v1 cpu group: root on cgroup v1 (CI is)",
)
def test_a_run_makes_its_own_group_and_removes_one_its_dead_run_left():
    """Two suites on one machine never share a group (one could remove it under the other);
    a group left by a run that was killed is removed by the next."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
    )
    stale = beside.CPU / f"{beside.PREFIX}{int(dead.stdout)}"
    stale.mkdir()
    group = None
    try:
        group = beside.idle_group()
        assert group == beside.CPU / f"{beside.PREFIX}{os.getpid()}" and not stale.exists()
    finally:
        beside.remove(stale)
        if group is not None:
            beside.remove(group)
    assert group is not None and not group.exists()
