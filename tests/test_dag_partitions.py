"""Several partitions through the whole workflow's plan (`snakemake plan`), here under the
local executor: each partition planned on its own under results/partitions/<name>/, the choice
made across them, and what follows the choice (the plot, the report, plan.json and
train.sbatch) made for the chosen partition. Both partitions are this machine, so their probes
agree within its noise and the price decides objective cost; a change of objective re-runs the
choices and no probe. On SLURM (the lab's two partitions) the same targets are measured by
bench/lab_partitions.py (BENCHMARKS.md "Where to train: partitions")."""

import copy
import json

import pandas as pd
import pytest
import yaml

import bounds
from conftest import ROOT, TINY, copy_workflow, snakemake, venv_env

pytestmark = pytest.mark.dag

PARTS = [
    {"name": "dear", "per_worker_hour": 4.0},
    {"name": "cheap", "per_worker_hour": 1.0, "account": "ml"},
]


@pytest.fixture(scope="module")
def two_partitions(tmp_path_factory):
    wd = tmp_path_factory.mktemp("dag-partitions")
    copy_workflow(wd)
    (wd / "workflow" / "config.yaml").write_text((ROOT / "workflow" / "config.yaml").read_text())
    cfg = copy.deepcopy(TINY)
    # one worker count, so one probe job a partition: what this module holds (each partition
    # planned on its own, the choice across them, what follows it) needs no second N, and the
    # plan of both partitions is the suite's to pay; the lab's bench probes N = 1 and 2
    # (bench/lab_partitions.py)
    cfg["grid"] = {**cfg["grid"], "workers": [1]}
    cfg.update(objective="cost", cluster={"partitions": PARTS})
    (wd / "parts.yaml").write_text(yaml.safe_dump(cfg))
    r = snakemake(wd, "plan", "--configfile", "parts.yaml", env=venv_env())
    assert r.returncode == 0, r.stderr[-4000:]
    return wd, r.stdout + r.stderr


def test_each_partition_is_planned_on_its_own_and_cost_chooses_the_cheap_one(two_partitions):
    wd, out = two_partitions
    res = wd / "results"
    for name in ("dear", "cheap"):
        own = res / "partitions" / name
        for f in ("workload.json", "memory_probe.json", "measurements.csv", "selection.json"):
            assert (own / f).is_file(), f"{name}: {f}"
        q = json.loads((own / "queue.json").read_text())
        assert q["waits"] == [] and "local executor" in q["error"]
    sel = json.loads((res / "selection.json").read_text())
    block = sel["across_partitions"]
    # the same machine at a quarter of the price: a quarter of the cost, give or take its noise
    assert sel["partition"] == "cheap" == sel["selected"]["partition"]
    assert block["measure"] == "cost" and block["runner_up"]["partition"] == "dear"
    # two fits from their own probes, minutes apart: the price's ratio within two reads' noise
    price = PARTS[0]["per_worker_hour"] / PARTS[1]["per_worker_hour"]
    assert bounds.log_error(block["runner_up"]["ratio"], price) <= bounds.TWO_READS_BOUND, block
    assert {r["partition"] for r in block["compute_ratios"]} == {"cheap"}
    spanning = pd.read_csv(res / "partitions" / "predictions.csv")
    assert set(spanning["partition"]) == {"dear", "cheap"}
    # what follows the choice reads the chosen partition's files and config
    chosen = pd.read_csv(res / "predictions.csv")
    own = pd.read_csv(res / "partitions" / "cheap" / "predictions.csv")
    pd.testing.assert_frame_equal(chosen, own)
    cfg = json.loads((res / "partitions" / "chosen.json").read_text())
    assert cfg["launch"]["slurm_partition"] == "cheap" and cfg["pricing"]["per_worker_hour"] == 1
    sbatch = (res / "plan" / "train.sbatch").read_text()
    assert "#SBATCH --partition=cheap" in sbatch and "#SBATCH --account=ml" in sbatch
    report = (res / "plan" / "report.html").read_text()
    assert "<b>Partitions</b>" in report and "no queue: the local executor" in report
    assert "per worker) on partition cheap</div>" in report
    assert (res / "plots" / "partitions.png").stat().st_size > 10_000
    assert "on partition cheap, objective cost: across 2 partitions by cost C: cheap" in out


def test_a_new_objective_chooses_again_and_probes_nothing(two_partitions):
    wd, _ = two_partitions
    r = snakemake(
        wd, "plan", "--configfile", "parts.yaml", "--config", "objective=time", env=venv_env()
    )
    assert r.returncode == 0, r.stderr[-4000:]
    ran = r.stdout + r.stderr
    assert "cheap_select" in ran and "dear_select" in ran and "combine" in ran
    for costly in ("_probe", "_memprobe", "_check"):
        assert f"{costly} " not in ran.split("Job stats:")[1].split("total")[0], ran[-3000:]
    sel = json.loads((wd / "results" / "selection.json").read_text())
    assert sel["across_partitions"]["measure"] == "train_time_s"
