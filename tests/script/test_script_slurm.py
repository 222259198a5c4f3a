"""The plan's batch script for a user's own script, submitted for real: `sbatch` on the one-node
cluster, where a USR2 mid-run (SLURM's signal before the time limit, or a preemption) makes
the script checkpoint and SLURM requeue the job, which resumes and ends; and on the lab's two
nodes, where its two workers rendezvous across the shaped link from srun's variables."""

import json
import subprocess
import time

import pytest
import yaml

from conftest import ROOT
from selections import selection_json
from tula.stages import plan

EXAMPLE = ROOT / "examples" / "ddp_train" / "train.py"
ARGS = "--batch-size {local_batch} --lr {lr} --epochs {epochs} --samples 2000".split()
TRAIN = 1600  # MNIST-1D's training samples of 2,000
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL")

pytestmark = [pytest.mark.slurm, pytest.mark.training]


def _plan(tmp_path, workers_per_node: int, epochs: int, partition: str | None = None):
    """plan.json and train.sbatch for N = 2, B = 128 of the example, as `tula plan` writes them."""
    raw = {
        "workload": {"script": str(EXAMPLE), "args": ARGS, "epochs": epochs},
        "grid": {"workers": [1, 2], "batch_min": 64, "batch_max": 256},
        "cluster": {"workers_per_node": workers_per_node},
        "launch": {"checkpoint_every_steps": 5},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw))
    sel = selection_json(
        2, 128, objective="knee", step_time_s=0.02, train_time_s=5.0, cost=0.01, mem_bytes=1e8
    )
    (tmp_path / "selection.json").write_text(json.dumps(sel))
    (tmp_path / "predictions.csv").write_text(
        "workers,global_batch,wall_time_s,wall_time_lo_s,wall_time_hi_s\n2,128,60,50,70\n"
    )
    check = {"parts": {"model": "DistributedDataParallel", "optimizer": "SGD"}}
    (tmp_path / "workload.json").write_text(json.dumps({"train_samples": TRAIN, "check": check}))
    inputs = [tmp_path / f for f in ("config.yaml", "selection.json", "predictions.csv")]
    return plan.run(
        *inputs, tmp_path / "workload.json", tmp_path / "plan", slurm_partition=partition
    )


def _sacct(job: str, *fields: str) -> str:
    cmd = ["sacct", "-n", "-P", "-X", "-D", "-j", job, "-o", ",".join(fields)]
    return subprocess.run(cmd, capture_output=True, text=True).stdout


def _wait(job: str, timeout_s: float = 300) -> str:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        states = _sacct(job, "State").split()
        if states and states[-1] in FINAL:
            return states[-1]
        time.sleep(1)
    raise TimeoutError(f"job {job} did not end in {timeout_s} s")


def _submit(script) -> str:
    r = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def test_the_batch_script_checkpoints_on_usr2_is_requeued_by_slurm_and_ends(
    slurm_cluster, tmp_path, venv_path
):
    p = _plan(tmp_path, workers_per_node=2, epochs=8)
    run_dir = tmp_path / "plan" / "run"
    job = _submit(tmp_path / "plan" / "train.sbatch")
    deadline = time.time() + 300
    while not list((run_dir / "checkpoints").glob("step-*.json")) and time.time() < deadline:
        time.sleep(0.2)  # the first checkpoint (every 5 steps): training is under way
    why = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True, text=True)
    assert list((run_dir / "checkpoints").glob("step-*.json")), f"job {job}: {why.stdout}"
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    state = _wait(job)
    log = "\n".join(f.read_text() for f in run_dir.glob("slurm-*.out"))
    assert state == "COMPLETED", log[-3000:]
    final = json.loads((run_dir / "final.json").read_text())
    assert final["steps"] == 8 * (TRAIN // 128 + 1) and final["workers"] == 2
    segments = json.loads((run_dir / "segments.json").read_text())
    assert [s["outcome"] for s in segments] == ["requeued", "completed"], segments
    assert "SIGUSR2" in segments[0]["reason"] and segments[1]["start_step"] > 0
    assert "resumed from the checkpoint of step" in log
    assert "REQUEUED" in _sacct(job, "State") or len(_sacct(job, "State").split()) > 1
    assert p["guarantees"]["checkpoint_and_requeue"].startswith("carries over")


@pytest.mark.netlab
def test_the_batch_script_runs_across_the_labs_two_nodes(lab_cluster, tmp_path, venv_path):
    _plan(tmp_path, workers_per_node=1, epochs=2, partition="lab")
    script = (tmp_path / "plan" / "train.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --partition=lab" in script
    job = _submit(tmp_path / "plan" / "train.sbatch")
    run_dir = tmp_path / "plan" / "run"
    state = _wait(job)
    log = "\n".join(f.read_text() for f in run_dir.glob("slurm-*.out"))
    assert state == "COMPLETED", log[-3000:]
    final = json.loads((run_dir / "final.json").read_text())
    assert sorted(final["hostnames"]) == ["tula-n0", "tula-n1"] and final["backend"] == "gloo"
    assert final["steps"] == 2 * (TRAIN // 128 + 1)
