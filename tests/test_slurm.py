"""Against a real SLURM cluster (scripts/slurm-cluster.sh up starts a one-node one as root).

Skipped, with the reason, when no SLURM controller answers on this machine.
"""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _controller_answers() -> bool:
    if not shutil.which("sbatch"):
        return False
    return subprocess.run(["scontrol", "ping"], capture_output=True, text=True).returncode == 0


pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(not _controller_answers(), reason="no SLURM controller answers (run scripts/slurm-cluster.sh up as root)"),
]


def wait_for_job(job_id: str, timeout_s: float = 180) -> str:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        state = subprocess.run(["sacct", "-n", "-X", "-j", job_id, "-o", "State"], capture_output=True, text=True).stdout.strip()
        if state and state.split()[0] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"):
            return state.split()[0]
        time.sleep(1)
    raise TimeoutError(f"SLURM job {job_id} did not finish in {timeout_s}s")


def test_two_task_probe_under_srun(tiny_config_file, tmp_path):
    out = tmp_path / "N2_B64.json"
    tula = Path(sys.executable).parent / "tula"
    job = subprocess.run(
        ["sbatch", "--parsable", "-n", "2", "-o", str(tmp_path / "job-%j.out"),
         "--wrap", f"{tula} probe --config {tiny_config_file} --nodes 2 --global-batch 64 --out {out}"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert wait_for_job(job) == "COMPLETED"
    steps = subprocess.run(["sacct", "-n", "-P", "-j", job, "-o", "JobID,NTasks,State"], capture_output=True, text=True).stdout
    assert f"{job}.0|2|COMPLETED" in steps  # the workers ran as one 2-task srun step
    rec = json.loads(out.read_text())
    assert rec["status"] == "ok", rec.get("error")
    assert rec["env"]["launcher"] == "slurm" and rec["env"]["world_size"] == 2 and rec["env"]["backend"] == "gloo"
