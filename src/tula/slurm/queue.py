"""The queue's expected wait in front of a job of a given shape, as SLURM estimates it.

``sbatch --test-only`` validates a job and says when the scheduler would start it, without
submitting anything: "sbatch: Job 123 to start at 2026-12-02T12:40:00 using 2 processors on
nodes lab0 in partition lab0". That start minus the moment of asking is the wait this module
returns, with its source and the time it was asked: it is the scheduler's estimate from the
jobs it knows now (their time limits, priorities), and backfill can move it either way.
Part of the SLURM room; the choice that adds the wait to the
predicted time is :mod:`tula.model.across`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from datetime import datetime

from tula.config import Config
from tula.slurm.shapes import job_shape

SOURCE = "sbatch --test-only"
DEFAULT_TIME_MIN = (
    1440  # the production job's limit when neither the config nor the profile sets one
)
CAVEAT = "the scheduler's estimate from the jobs it knows now; backfill can move it either way"
_START = re.compile(r"to start at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)")


class QueueUnreadable(RuntimeError):
    """SLURM did not say when a job would start (no sbatch, or it refused the shape)."""


@dataclass(frozen=True)
class Wait:
    """The expected wait of one job shape on one partition."""

    partition: str
    nodes: int
    tasks: int
    time_min: int
    wait_s: float
    start: str  # the start SLURM gave, its local time, ISO
    asked_at: float  # epoch seconds
    source: str = SOURCE

    def to_dict(self) -> dict:
        return {**asdict(self), "caveat": CAVEAT}

    def age_s(self, now: float | None = None) -> float:
        return (time.time() if now is None else now) - self.asked_at


def parse(text: str, asked_at: float) -> float:
    """The wait in seconds from ``sbatch --test-only``'s answer (its stderr), asked at
    ``asked_at``; a start already past is no wait."""
    m = _START.search(text)
    if not m:
        raise QueueUnreadable(f"{SOURCE} gave no start time: {text.strip()[:300]!r}")
    start = datetime.fromisoformat(m.group(1)).timestamp()  # SLURM prints local time
    return max(0.0, start - asked_at)


def test_only_args(
    partition: str, nodes: int, tasks: int, time_min: int, account: str | None = None
) -> list[str]:
    """The sbatch command that asks about a job of this shape and submits nothing."""
    args = ["sbatch", "--test-only", f"--partition={partition}", f"--nodes={nodes}"]
    args += [f"--ntasks={tasks}", f"--time={max(1, int(time_min))}"]
    if account:
        args.append(f"--account={account}")
    return [*args, "--wrap=true"]


def expected_wait(
    partition: str, nodes: int, tasks: int, time_min: int, account: str | None = None
) -> Wait:
    """Ask SLURM when a job of this shape would start on ``partition``, now."""
    if not shutil.which("sbatch"):
        raise QueueUnreadable("no sbatch on this machine: the queue's wait is unknown")
    asked = time.time()
    try:
        out = subprocess.run(
            test_only_args(partition, nodes, tasks, time_min, account),
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired as err:
        raise QueueUnreadable(f"{SOURCE} on {partition} did not answer in 60 s") from err
    text = out.stderr + out.stdout
    if out.returncode != 0:
        raise QueueUnreadable(f"{SOURCE} on {partition} refused the job: {text.strip()[:300]}")
    m = _START.search(text)
    return Wait(
        partition=partition,
        nodes=nodes,
        tasks=tasks,
        time_min=int(time_min),
        wait_s=parse(text, asked),
        start=m.group(1) if m else "",
        asked_at=asked,
    )


def wait_for(cfg: Config, workers: int, partition: str, time_min: int) -> Wait:
    """:func:`expected_wait` of the job of ``workers`` workers as ``cfg`` shapes it (its nodes
    and tasks, :func:`tula.slurm.shapes.job_shape`), charged to ``cfg``'s account."""
    nodes = job_shape(cfg, workers).nodes
    return expected_wait(partition, nodes, workers, time_min, cfg.launch.slurm_account)
