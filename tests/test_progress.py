"""Progress lines (tula.progress): durations a person reads at a glance, a rate and an ETA
from the work done in this process, and no more than one line every every_s seconds."""

import pytest

from tula import progress
from tula.progress import Progress, fmt_duration


def test_durations_read_at_a_glance():
    assert [fmt_duration(s) for s in (-1, 0, 4.4, 59.6, 61, 3599, 3600, 5400, 90061)] == [
        "0s",
        "0s",
        "4s",
        "1m00s",
        "1m01s",
        "59m59s",
        "1h00m",
        "1h30m",
        "25h01m",
    ]


class Clock:
    """time.perf_counter, advanced by hand."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(progress.time, "perf_counter", c)
    return c


def test_rate_and_eta_count_only_this_processes_work_and_lines_are_rate_limited(clock, capsys):
    p = Progress("train N=2 B=64", 10, unit="epoch", every_s=2.0, start=4)  # resumed after 4 epochs
    clock.now += 1.0
    p.update(5, "epoch ")  # 1 s since the last line: too soon
    clock.now += 1.5
    p.update(6, "epoch ", extra="loss 0.5")
    out = capsys.readouterr().out.splitlines()
    assert out == ["[train N=2 B=64] epoch 6/10 epochs  0.80 epoch/s  elapsed 2s  ETA 5s  loss 0.5"]
    p.update(10, "epoch ")  # the last unit is always printed
    assert capsys.readouterr().out.startswith("[train N=2 B=64] epoch 10/10 epochs")


def test_a_disabled_progress_prints_nothing_and_an_unknown_eta_says_so(clock, capsys):
    Progress("x", 5, enabled=False).update(5, force=True)
    assert capsys.readouterr().out == ""
    Progress("probe N1_B32", 5).update(0, force=True)
    assert (
        capsys.readouterr().out.strip()
        == "[probe N1_B32] 0/5 steps  0.00 step/s  elapsed 0s  ETA ?"
    )
