"""Where the workers of one SLURM job meet: whether this process is inside an allocation of N
tasks, the job's first node, and the port every task derives alike from the job's id."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from tula.slurm import accounting


def in_allocation(nproc: int, environ: os._Environ | dict | None = None) -> bool:
    """True inside a SLURM job (sbatch/salloc, not yet a job step) with at least nproc tasks.

    Snakemake's SLURM executor clears every SLURM_* variable but SLURM_JOB_ID before it runs
    a rule's command inside a job, so without SLURM_NTASKS the task count comes from scontrol.
    """
    env = os.environ if environ is None else environ
    if "SLURM_JOB_ID" not in env or "SLURM_STEP_ID" in env:
        return False
    if "SLURM_NTASKS" in env:
        return int(env["SLURM_NTASKS"]) >= nproc
    return nproc > 1 and accounting.job_tasks(env["SLURM_JOB_ID"]) >= nproc


def master_addr(nodelist: str) -> str:
    """First host of a SLURM node list (``node[01-04],gpu7`` -> ``node01``)."""
    if shutil.which("scontrol"):
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=False
        ).stdout.split()
        if out:
            return out[0]
    # Fallback parser for the common forms when scontrol is not on PATH.
    first = nodelist.split(",")[0]
    if "[" in first:
        prefix, rest = first.split("[", 1)
        first = prefix + rest.split("-")[0].split(",")[0].rstrip("]")
    return first


EPHEMERAL_LOW = 32768  # Linux's default net.ipv4.ip_local_port_range starts here
PORT_BASE = 10000


def master_port(job_id: str) -> int:
    """A port every task of one job derives alike from its job id: ``10000 + (digits of the
    id mod 22768)``, below Linux's ephemeral range (32768-60999 by default). A port in that
    range can be held at any moment by an outgoing connection on the node (submitit's own
    choice, a random port in 20000-60000, was: a relaunched job failed with EADDRINUSE in CI).
    An array task's id (``123_4``) counts its digits."""
    return PORT_BASE + int(re.sub(r"\D", "", str(job_id))) % (EPHEMERAL_LOW - PORT_BASE)
