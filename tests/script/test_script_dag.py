"""The whole workflow on a user's own script (examples/ddp_train/train.py as workload.script),
as a user runs it: `snakemake plan`, then `snakemake` (--cores 2). The check ran the script
here, the memory probe, every probe and the production job ran it, and the plan's batch
script runs it; nothing of Tula's own model or data was built."""

import json
import shutil

import pandas as pd
import pytest
import yaml

from conftest import ROOT, copy_workflow, snakemake, venv_env

ARGS = "--batch-size {local_batch} --lr {lr} --epochs {epochs} --samples 2000".split()


@pytest.fixture(scope="module")
def script_run(tmp_path_factory):
    wd = tmp_path_factory.mktemp("dag-script")
    copy_workflow(wd)
    (wd / "workflow" / "config.yaml").write_text((ROOT / "workflow" / "config.yaml").read_text())
    shutil.copytree(ROOT / "examples" / "ddp_train", wd / "train")
    raw = {
        "workload": {"script": "train/train.py", "args": ARGS, "epochs": 2},
        "grid": {"workers": [2], "batch_min": 64, "batch_max": 128},
        "search": "partial",
        "probe": {"warmup_steps": 2, "timed_steps": 6, "precision": 0.25, "time_budget_s": 1},
    }
    (wd / "script.yaml").write_text(yaml.safe_dump(raw))
    env = venv_env()
    plan = snakemake(wd, "plan", "--configfile", "script.yaml", env=env)
    assert plan.returncode == 0, plan.stderr[-4000:]
    run = snakemake(wd, "--configfile", "script.yaml", env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    return wd, plan.stdout + plan.stderr, run.stdout + run.stderr


@pytest.mark.dag
def test_every_stage_ran_the_users_script(script_run):
    wd, _, out = script_run
    w = json.loads((wd / "results" / "workload.json").read_text())
    assert w["workload"] == "script" and w["check"]["steps"] == 2 and w["train_samples"] == 1600
    # the memory probe: one launch of the script per local batch, each one step's peak
    mem = json.loads((wd / "results" / "memory_probe.json").read_text())
    points = mem["points"]
    assert mem["env"]["script"] == "train.py" and [p["local_batch"] for p in points] == [32, 64]
    assert all(p["status"] == "ok" for p in points) and mem["memory_model"]["fit"]["slope"] > 0
    assert points[1]["peak_mem_bytes"] > points[0]["peak_mem_bytes"]
    m = pd.read_csv(wd / "results" / "measurements.csv")
    probes = m[m["source"] == "probe"]
    assert len(probes) == 2 and (probes["status"] == "ok").all()  # N = 2 at B = 64 and 128
    records = [
        json.loads(f.read_text())
        for f in (wd / "results" / "partitions").glob("*/probes/N*/B*.json")
    ]
    assert len(records) == 2 and {r["model"] for r in records} == {"train/train.py"}
    final = json.loads((wd / "results" / "train" / "final.json").read_text())
    assert final["workload"] == "script" and final["script"].endswith("train/train.py")
    assert final["predicted_step_time_s"] > 0 and final["step_time_ratio"] > 0
    assert "prediction check at" in (wd / "results" / "logs" / "launch.log").read_text()
    assert "tula: use N=" in out and (wd / "results" / "report.html").exists()


@pytest.mark.dag
def test_the_plan_hands_back_a_batch_script_that_runs_the_users_script(script_run):
    wd, plan_out, _ = script_run
    p = json.loads((wd / "results" / "plan" / "plan.json").read_text())
    sbatch = (wd / "results" / "plan" / "train.sbatch").read_text()
    assert "YOUR_" not in sbatch and "train/train.py --batch-size" in sbatch
    assert f"--batch-size {p['local_batch']} " in sbatch and p["workload"] == "script"
    assert p["guarantees"]["prediction"].startswith("carries over")
    assert "train.sbatch" in plan_out
