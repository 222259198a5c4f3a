"""What became of a SLURM job, asked of accounting (``sacct``) and the controller (``scontrol``):
its state, the nodes it ran on, the tasks it was given."""

from __future__ import annotations

import shutil
import subprocess

from tula.slurm import controller


def job_state(job_id: str) -> str:
    """A job's state: sacct's, else the controller's (`scontrol show job`), since accounting
    records a job a moment after its submission; '' when neither knows it."""
    if shutil.which("sacct"):
        out = subprocess.run(
            ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], capture_output=True, text=True
        )
        if out.stdout.split():
            return out.stdout.split()[0]
    if shutil.which("scontrol"):
        out = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True
        )
        for item in out.stdout.split():
            if item.startswith("JobState="):
                return item.split("=", 1)[1]
    return ""


def job_nodes(job_id: str) -> list[str]:
    """The nodes a job ran on (its last run, from sacct), by name; [] when unknown."""
    try:
        listed = controller.ask(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "NodeList"]).split()
        if not listed or listed[0] in ("None", "(null)", "None assigned"):
            return []
        return controller.ask(["scontrol", "show", "hostnames", listed[0]]).split()
    except (controller.ClusterUnreadable, subprocess.TimeoutExpired):
        return []


def job_tasks(job_id: str) -> int:
    """Tasks allocated to a SLURM job, from ``scontrol show job`` (NumTasks); 1 if unknown."""
    if not shutil.which("scontrol"):
        return 1
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=False
    ).stdout
    for item in out.split():
        if item.startswith("NumTasks="):
            return int(item.split("=", 1)[1])
    return 1
