"""Several partitions through the workflow's plan where users run it: `snakemake plan --profile`
(profiles/slurm, with the lab's memory and short waits) on the lab's two partitions, lab1's
tasks under a CPU quota of a third of a core (`scripts/slurm-cluster.sh slow lab1:3`, a slower
GPU type) and lab1 at a tenth of lab0's price. The module shares the machine with the suite's
other worker: a third of a core keeps lab1 well beyond the drift's x1.47 slower than lab0 with
another test's processes beside them (a quarter made it x5.7 alone), and a tenth of the price
keeps it the cheaper while it is less than ten times as slow. Each partition is planned on its
own, under results/partitions/<name>/, by SLURM jobs on its own node; the choice is made across
them:
objective time → the fast partition (lab0); cost → the cheap one (lab1), with no probe run
again; time_to_result → lab1 while a job holds lab0, the wait asked of SLURM at the plan. What
follows the choice (plan.json, train.sbatch, the report) is made for the chosen partition. The
plan trains with the user's optimizer and schedule given as import paths
(tests/user_workload.py), which every probe job imports on its node. The lab's bench measures
the same over a wider grid, production included (bench/lab_partitions.py, BENCHMARKS.md
"Where to train: partitions")."""

import copy
import json
import math
import subprocess

import pandas as pd
import pytest
import yaml

import bounds
from conftest import (
    ROOT,
    SLURM_SNAKEMAKE,
    TESTS,
    TINY,
    cluster,
    copy_workflow,
    holding,
    slurm_test_profile,
    venv_env,
)

pytestmark = [pytest.mark.dag, pytest.mark.slurm]

PRICE = {"lab0": 1.0, "lab1": 0.1}
PARTS = [{"name": n, "per_worker_hour": p, "account": "root"} for n, p in PRICE.items()]
QUEUES = ["--forcerun", "queue"]  # ask SLURM for each partition's waits again


def plan(wd, *extra: str) -> str:
    """`snakemake plan` with the test profile; what it printed."""
    cmd = ["timeout", "-s", "INT", "900", *SLURM_SNAKEMAKE, "plan", "--profile", "profiles/test"]
    r = subprocess.run(
        [*cmd, "--configfile", "parts.yaml", *extra],
        cwd=wd,
        capture_output=True,
        text=True,
        env=venv_env(PYTHONPATH=str(TESTS)),  # the user's module, in every job (--export=ALL)
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout + r.stderr


def ran(out: str) -> dict[str, int]:
    """The job stats table of a snakemake run's output: how many jobs of each rule ran."""
    rows = out.split("Job stats:")[1].split("total")[0].splitlines()
    cells = [r.split() for r in rows]
    return {c[0]: int(c[1]) for c in cells if len(c) == 2 and c[1].isdigit()}


@pytest.fixture(scope="module")
def two_partitions(tmp_path_factory, lab_cluster):
    wd = tmp_path_factory.mktemp("dag-partitions")
    copy_workflow(wd)
    (wd / "workflow" / "config.yaml").write_text((ROOT / "workflow" / "config.yaml").read_text())
    # a job on each partition at once: lab0's task takes a core, lab1's a third
    slurm_test_profile(wd, jobs=2)
    cfg = copy.deepcopy(TINY)
    # one worker count, so one probe job a partition: what this module holds needs no second
    # N; the lab's bench probes N = 1 and 2 (bench/lab_partitions.py)
    cfg["grid"] = {**cfg["grid"], "workers": [1]}
    cfg["train"] = {
        **cfg["train"],
        "optimizer": "user_workload:nesterov_sgd",
        "schedule": "user_workload:quarters",
    }
    # CPU only: on `auto`, a partition with gpu GRES is taken for a GPU partition (docs/slurm.md)
    cfg.update(
        objective="time",
        hardware={"device": "cpu"},
        cluster={"workers_per_node": 2, "partitions": PARTS},
    )
    (wd / "parts.yaml").write_text(yaml.safe_dump(cfg))
    started = subprocess.run(
        ["date", "+%Y-%m-%dT%H:%M:%S"], capture_output=True, text=True, check=True
    ).stdout.strip()
    cluster("slow", "lab1:3")
    try:
        out = plan(wd)
        yield wd, out, started
    finally:
        cluster("slow", "none")


def test_each_partition_is_planned_by_its_own_jobs_and_time_chooses_the_fast_one(two_partitions):
    wd, out, started = two_partitions
    res = wd / "results"
    for name in PRICE:
        own = res / "partitions" / name
        for f in ("workload.json", "memory_probe.json", "measurements.csv", "selection.json"):
            assert (own / f).is_file(), f"{name}: {f}"
        # every point probed with the user's optimizer and schedule, imported in the job
        m = pd.read_csv(own / "measurements.csv")
        assert len(m) and set(m["status"]) == {"ok"}, m[["workers", "global_batch", "status"]]
        q = json.loads((own / "queue.json").read_text())
        assert q["waits"] and q["error"] is None, q  # SLURM's own answer, not the local executor's
    # each partition's probes ran as SLURM jobs on that partition
    rows = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-S", started, "-o", "Partition,State"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert {"lab0|COMPLETED", "lab1|COMPLETED"} <= set(rows), rows
    sel = json.loads((res / "selection.json").read_text())
    block = sel["across_partitions"]
    assert sel["partition"] == "lab0" == sel["selected"]["partition"], sel["reason"]
    assert block["measure"] == "train_time_s" and block["runner_up"]["partition"] == "lab1"
    # the quota measured by the probes: lab1's compute slower than drift alone could make it
    (ratio,) = block["compute_ratios"]
    assert ratio["partition"] == "lab1" and math.log(ratio["compute_ratio"]) > bounds.DRIFT_BOUND
    # what follows the choice reads the chosen partition's files and config
    pd.testing.assert_frame_equal(
        pd.read_csv(res / "predictions.csv"),
        pd.read_csv(res / "partitions" / "lab0" / "predictions.csv"),
    )
    sbatch = (res / "plan" / "train.sbatch").read_text()
    assert "#SBATCH --partition=lab0" in sbatch and "#SBATCH --account=root" in sbatch
    report = (res / "plan" / "report.html").read_text()
    assert "<b>Partitions</b>" in report and "on partition lab0</div>" in report
    assert "on partition lab0, objective time: across 2 partitions by" in out


def test_cost_chooses_the_cheap_one_and_probes_nothing(two_partitions):
    wd, _, _ = two_partitions
    out = plan(wd, "--config", "objective=cost")
    jobs = ran(out)
    # each partition's own choice again (the {partition} wildcard), then the choice across
    assert jobs["select"] == 2 and jobs["combine"] == 1, jobs
    assert "partition=lab0" in out and "partition=lab1" in out
    assert not {"probe", "memprobe", "check"} & set(jobs), out[-3000:]
    sel = json.loads((wd / "results" / "selection.json").read_text())
    block = sel["across_partitions"]
    assert sel["partition"] == "lab1" and block["measure"] == "cost", sel["reason"]
    # the runner-up's cost: the price ratio over the compute ratio, within two reads' noise
    assert block["runner_up"]["partition"] == "lab0"
    expected = (PRICE["lab0"] / PRICE["lab1"]) / block["compute_ratios"][0]["compute_ratio"]
    assert bounds.log_error(block["runner_up"]["ratio"], expected) <= bounds.TWO_READS_BOUND
    sbatch = (wd / "results" / "plan" / "train.sbatch").read_text()
    assert "#SBATCH --partition=lab1" in sbatch


def test_time_to_result_takes_the_free_partition_while_the_fast_one_is_held(two_partitions):
    wd, _, _ = two_partitions
    with holding("lab0", minutes=30):
        out = plan(wd, "--config", "objective=time_to_result", *QUEUES)
    assert ran(out)["queue"] == 2  # each partition's queue asked again
    sel = json.loads((wd / "results" / "selection.json").read_text())
    block = sel["across_partitions"]
    assert sel["partition"] == "lab1" and block["runner_up"]["partition"] == "lab0", sel["reason"]
    held = json.loads((wd / "results" / "partitions" / "lab0" / "queue.json").read_text())
    free = json.loads((wd / "results" / "partitions" / "lab1" / "queue.json").read_text())
    # SLURM's answer: lab0's next job starts when the 30-minute holder ends, lab1's at once
    assert min(w["wait_s"] for w in held["waits"]) > max(w["wait_s"] for w in free["waits"])
    assert "runner-up lab0" in sel["reason"] and "queue wait" in sel["reason"]
