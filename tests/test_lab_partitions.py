"""The lab's two partitions (scripts/slurm-cluster.sh up --nodes 2 --partitions 2): lab0 and
lab1 of one node each; `slow lab1:2` runs every task on lab1 under a real CPU quota (cgroup v1,
1/2 of a core), so lab1 is a slower "GPU type"; a job holding lab0 makes the next one wait
there, as SLURM's `sbatch --test-only` says, and not on lab1. What the quota does to the
probes' compute step is measured, not bounded here (bench/lab_partitions.py, BENCHMARKS.md
"Where to train: partitions")."""

import subprocess
import time
from dataclasses import replace
from pathlib import Path

from conftest import TINY, cluster, holding
from selections import point, selection
from tula import config, partitions, pipeline
from tula.io import read_json, write_json
from tula.model.selection import Across, Standing
from tula.slurm import queue
from tula.stages import launch

SLOW_CG = Path("/sys/fs/cgroup/cpu/tula-slow")
# the task's cpu cgroup, and that cgroup's quota per 10-ms period
SHOW = (
    "cat /proc/self/cgroup; "
    "cat /sys/fs/cgroup/cpu$(awk -F: '$2==\"cpu\"{print $3}' /proc/self/cgroup)/cpu.cfs_quota_us"
)


def _srun(partition: str, command: str) -> str:
    r = subprocess.run(
        ["srun", "-p", partition, "-n1", "-t", "2", "sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_the_lab_has_two_partitions_of_one_node_each(lab_cluster):
    for part, node in (("lab0", "tula-n0"), ("lab1", "tula-n1")):
        nodes = subprocess.run(
            ["sinfo", "-h", "-p", part, "-N", "-o", "%N"], capture_output=True, text=True
        ).stdout.split()
        assert nodes == [node], (part, nodes)
        assert _srun(part, "hostname").strip() == node


def test_a_slowed_partition_runs_each_task_under_a_cpu_quota(lab_cluster):
    try:
        cluster("slow", "lab1:2")
        slowed = _srun("lab1", SHOW)
        assert ":cpu:/tula-slow/" in slowed and slowed.split()[-1] == "5000", slowed
        free = _srun("lab0", "cat /proc/self/cgroup")
        assert "tula-slow" not in free, free
        # the task's cgroup goes with the task (the TaskEpilog, which may end just after srun)
        for _ in range(50):
            left = [d for d in SLOW_CG.iterdir() if d.is_dir()]
            if not left:
                break
            time.sleep(0.2)
        assert not left, left
        cluster("slow", "none")
        assert "tula-slow" not in _srun("lab1", "cat /proc/self/cgroup")
    finally:
        cluster("slow", "none")


def test_a_job_holding_lab0_makes_the_next_wait_there_and_not_on_lab1(lab_cluster):
    with holding("lab0"):
        blocked, free = queue.expected_wait("lab0", 1, 2, 10), queue.expected_wait("lab1", 1, 2, 10)
        assert 15 * 60 < blocked.wait_s <= 21 * 60, blocked
        assert free.wait_s < 60, free


def _planned_across(tmp_path) -> tuple[dict, Path]:
    """A plan across lab0 and lab1 as `tula combine` leaves it: lab0 chosen (100 s, no wait),
    lab1 the runner-up (150 s), and lab1's config snapshot where the plan writes it."""
    raw = config.validate(
        {
            **TINY,
            "cluster": {"workers_per_node": 2, "partitions": [{"name": "lab0"}, {"name": "lab1"}]},
        }
    )
    own = {n: p.config for n, p in partitions.table(raw, {}).items()}
    pipeline.snapshot(config.from_dict(own["lab1"]), tmp_path / partitions.snapshot_path("lab1"))

    def standing(name, t, ratio=None):
        return Standing(name, t, point(2, 64, train_time_s=t), ratio)

    block = Across(
        measure="train_time_s",
        what="training time T",
        unit="s",
        partitions=(standing("lab0", 100.0), standing("lab1", 150.0)),
        chosen="lab0",
        runner_up=standing("lab1", 150.0, 1.5),
    )
    chosen = selection(2, 64, train_time_s=100.0)
    sel = tmp_path / "results" / "selection.json"
    write_json(
        sel,
        replace(
            chosen, selected=chosen.selected.on("lab0"), partition="lab0", across_partitions=block
        ).to_json(),
    )
    return own["lab0"], sel


def test_at_submission_the_wait_is_asked_again_and_replan_decides_the_move(
    lab_cluster, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # the plan's snapshots are found from the workflow's folder
    chosen, sel = _planned_across(tmp_path)
    record = config.from_dict({**chosen, "launch": {**chosen["launch"], "replan": "record"}})
    assert launch.queue_again(record, sel, tmp_path) is None  # both free: lab0 ends first
    said = read_json(tmp_path / "queue.json")
    assert not said["runner_first"] and "lab0 still ends first" in said["reason"]
    with holding("lab0"):
        assert launch.queue_again(record, sel, tmp_path) is None  # record: says, stays
        said = read_json(tmp_path / "queue.json")
        assert said["runner_first"] and not said["moved"] and said["waits_s"]["lab0"] > 900
        move = config.from_dict({**chosen, "launch": {**chosen["launch"], "replan": "move"}})
        cfg, point, predictions = launch.queue_again(move, sel, tmp_path)
        assert cfg.launch.slurm_partition == "lab1" and point == (2, 64)
        assert predictions == tmp_path / "results" / "partitions" / "lab1" / "predictions.csv"
        assert read_json(tmp_path / "queue.json")["moved"]
