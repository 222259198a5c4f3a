"""`tula plan` (tula.stages.plan): the answer to take to one's own training script, from the
choice alone. The DAG's `snakemake plan` is tests/test_dag_recipe.py's; here the record and
the batch script, and SLURM's own reading of the script (`sbatch --test-only`)."""

import json
import subprocess

import pandas as pd
import pytest
import yaml

from selections import selection_json
from tula.stages import plan


def _inputs(tmp_path, train=None, cluster=None, hardware=None, n=4, b=1024):
    cfg = {
        "workload": {"model": "small_cnn", "dataset": "digits", "epochs": 10},
        "grid": {"workers": [1, 2, 4], "batch_min": 128, "batch_max": 1024},
        "cluster": cluster or {"workers_per_node": 2},
        "train": {"lr": 0.1, "lr_decay_epochs": [], **(train or {})},
        "hardware": hardware or {},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    sel = selection_json(n, b, step_time_s=0.05, train_time_s=42.0, cost=0.12, mem_bytes=2e9)
    (tmp_path / "selection.json").write_text(json.dumps({**sel, "reason": "the least predicted T"}))
    row = dict(workers=n, global_batch=b, step_time_lo_s=0.04, step_time_hi_s=0.06)
    row.update(wall_time_s=300.0, wall_time_lo_s=280.0, wall_time_hi_s=320.0)
    pd.DataFrame([row]).to_csv(tmp_path / "predictions.csv", index=False)
    (tmp_path / "workload.json").write_text(json.dumps({"train_samples": 10240}))
    return [tmp_path / f for f in ("config.yaml", "selection.json", "predictions.csv")] + [
        tmp_path / "workload.json"
    ]


def test_the_plan_states_the_methods_lr_the_nodes_and_the_predictions(tmp_path):
    """lrs at B=1024 from base_batch 128: k = 8 times train.lr, reached by 5 warm-up epochs of
    10 steps; N=4 at two workers a node is two nodes; no limit given: 1.5 x the prediction's
    upper end (320 s), + 5 min."""
    out = tmp_path / "plan"
    p = plan.run(*_inputs(tmp_path, train={"method": "lrs"}), out)
    assert p["lr"] == pytest.approx(0.8) and "1024/128" in p["lr_note"]
    assert (p["steps_per_epoch"], p["warmup_epochs"], p["warmup_steps"]) == (10, 5, 50)
    assert (p["nodes"], p["workers_per_node"], p["gpus_per_node"]) == (2, 2, 0)
    assert p["predicted_wall_time_interval_s"] == [280.0, 320.0]
    assert p["time_limit_min"] == 13 and json.loads((out / "plan.json").read_text()) == p
    script = (out / "train.sbatch").read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --time=13", "--nproc-per-node=2", "--lr 0.8"):
        assert line in script, line
    assert "--gpus-per-node" not in script and "--partition" not in script


def test_a_gpu_job_asks_for_its_gpus_and_the_profiles_partition_account_and_memory(tmp_path):
    out = tmp_path / "plan"
    p = plan.run(
        *_inputs(tmp_path, hardware={"device": "cuda", "backend": "nccl"}),
        out,
        timeout_min=90,
        slurm_partition="gpu",
        slurm_account="lab",
        mem_mb=64000,
    )
    script = (out / "train.sbatch").read_text()
    assert p["gpus_per_node"] == 2 and p["lr"] == pytest.approx(0.1)  # AGS keeps train.lr
    for line in ("--gpus-per-node=2", "--time=90", "--partition=gpu", "--account=lab"):
        assert f"#SBATCH {line}" in script, line
    assert "#SBATCH --mem=64000M" in script and p["time_limit_why"] == "the profile's runtime"


@pytest.mark.slurm
def test_slurm_accepts_the_batch_script(slurm_cluster, tmp_path):
    """`sbatch --test-only` on the one-node cluster: SLURM reads every #SBATCH line of the
    script and says when the job would start; it runs nothing. One node, one worker."""
    out = tmp_path / "plan"
    plan.run(*_inputs(tmp_path, cluster={"workers_per_node": 1}, n=1, b=128), out)
    r = subprocess.run(
        ["sbatch", "--test-only", str(out / "train.sbatch")], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert "to start at" in r.stderr + r.stdout, r.stderr


def _script_inputs(tmp_path, n=2, b=256, comm_env=None, parts=None):
    """A script workload's plan inputs: the example script, its arguments."""
    from conftest import ROOT

    paths = _inputs(tmp_path, cluster={"workers_per_node": 1}, n=n, b=b)
    cfg = yaml.safe_load(paths[0].read_text())
    cfg["workload"] = {
        "script": str(ROOT / "examples" / "ddp_train" / "train.py"),
        "args": ["--batch-size", "{local_batch}", "--lr", "{lr}", "--epochs", "{epochs}"],
        "epochs": 3,
    }
    cfg["grid"] = {"workers": [1, 2], "batch_min": 64, "batch_max": 512}
    cfg["hardware"] = {"comm_env": comm_env or {}, "threads_per_worker": 1}
    paths[0].write_text(yaml.safe_dump(cfg))
    check = {"parts": parts if parts is not None else {"model": "DistributedDataParallel"}}
    paths[3].write_text(json.dumps({"train_samples": 16000, "check": check}))
    return paths


def test_a_scripts_batch_script_runs_that_script_at_the_point_as_the_probes_ran(tmp_path):
    """No placeholder: the script with its arguments at (N, B), one task per worker, in the
    environment the plan ran in, with hardware.comm_env and the threads per worker, --exclusive
    as the probes had it, a limit from the prediction, and SLURM's signal and requeue for the
    script's checkpoints; plan.json says what carries over."""
    import sys

    from tula.workers.script_run import ENV, ScriptRun

    out = tmp_path / "plan"
    p = plan.run(*_script_inputs(tmp_path, comm_env={"NCCL_SOCKET_IFNAME": "ib0"}), out)
    script = (out / "train.sbatch").read_text()
    assert "YOUR_" not in script
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=1",
        "#SBATCH --exclusive",
        "#SBATCH --time=13",
        "#SBATCH --signal=USR2@120",
        "#SBATCH --requeue",
        f"source {sys.prefix}/bin/activate",
        "export NCCL_SOCKET_IFNAME=ib0",
        "export OMP_NUM_THREADS=1",
        "examples/ddp_train/train.py --batch-size 128 --lr 0.1 --epochs 3",
    ):
        assert line in script, line
    assert "srun --kill-on-bad-exit=1 python -m tula.workers.script_run" in script
    exported = next(ln for ln in script.splitlines() if ln.startswith(f"export {ENV}="))
    spec = ScriptRun.from_env({ENV: exported.split("=", 1)[1].strip("'")})
    assert spec.role == "production" and spec.train.requeue == "scontrol"
    assert spec.train.out_dir == str((out / "run").resolve()) and spec.global_batch == 256
    g = p["guarantees"]
    assert g["prediction"].startswith("carries over") and g["ags"].startswith("does not carry")
    assert "model" in g["checkpoint_and_requeue"] and p["workload"] == "script"


def test_a_script_that_keeps_no_parts_is_told_a_requeue_starts_it_over(tmp_path):
    p = plan.run(*_script_inputs(tmp_path, parts={}), tmp_path / "plan")
    assert "starts over" in p["guarantees"]["checkpoint_and_requeue"]


@pytest.mark.slurm
def test_slurm_accepts_a_scripts_batch_script(slurm_cluster, tmp_path):
    out = tmp_path / "plan"
    plan.run(*_script_inputs(tmp_path, n=1, b=128), out)
    r = subprocess.run(
        ["sbatch", "--test-only", str(out / "train.sbatch")], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
