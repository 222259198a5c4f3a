"""The queue's expected wait: sbatch --test-only's answer read, and asked of a real
controller, where a job that holds the node makes the next one wait."""

import subprocess
from datetime import datetime

import pytest

from conftest import holding
from tula.slurm import queue


def test_parse_reads_the_start_and_a_past_start_is_no_wait():
    asked = datetime(2026, 12, 2, 12, 0, 0).timestamp()
    said = (
        "sbatch: Job 41 to start at 2026-12-02T12:40:00 using 2 processors on nodes lab0 "
        "in partition lab0"
    )
    assert queue.parse(said, asked) == 2400.0
    assert queue.parse(said.replace("12:40", "11:40"), asked) == 0.0
    with pytest.raises(queue.QueueUnreadable, match="gave no start time"):
        queue.parse("sbatch: error: invalid partition specified: nope", asked)


def test_the_command_asks_and_submits_nothing():
    args = queue.test_only_args("gpu-a", 2, 8, 90.4, "ml")
    assert args[:2] == ["sbatch", "--test-only"]
    assert "--partition=gpu-a" in args and "--nodes=2" in args and "--ntasks=8" in args
    assert "--time=90" in args and "--account=ml" in args


def _partition() -> str:
    out = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True).stdout
    return out.split()[0].rstrip("*")


def test_a_job_holding_the_node_makes_the_next_one_wait(slurm_cluster):
    part = _partition()
    free = queue.expected_wait(part, 1, 1, 5)
    assert free.wait_s < 60 and free.source == "sbatch --test-only"
    with holding(part):
        blocked = queue.expected_wait(part, 1, 1, 5)
        # the holder's 20-min limit is what the scheduler expects it to run
        assert 15 * 60 < blocked.wait_s <= 20 * 60 + 60, blocked
        assert blocked.to_dict()["caveat"].startswith("the scheduler's estimate")
    with pytest.raises(queue.QueueUnreadable, match="refused the job"):
        queue.expected_wait("no-such-partition", 1, 1, 5)
