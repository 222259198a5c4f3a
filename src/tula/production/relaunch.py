"""After an attempt that did not complete: the next smaller batch after an out-of-memory
error (the memory model's order, :func:`tula.model.memory.smaller_batches`), or why the run
ends here, said in words the user can act on."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import submitit

from tula.model.memory import smaller_batches
from tula.production import submission
from tula.production.attempts import Attempt


class RunEnds(Exception):
    """The run cannot go on: ``error`` is what the user is told, ``status`` the run's record."""

    def __init__(self, status: str, error: Exception):
        super().__init__(str(error))
        self.status, self.error = status, error


class OutOfMemory(RuntimeError):
    """The job ran out of memory and the launcher was told not to relaunch it smaller."""


def fallback_batches(
    workers: int, batch: int, predictions: str | Path | None, floor: int
) -> list[int]:
    """Global batches to try after an OOM at ``batch`` (:func:`tula.model.memory.smaller_batches`):
    the grid's batches for N that the memory model calls feasible; without predictions, halving."""
    if predictions and Path(predictions).exists():
        p = pd.read_csv(predictions)
        cands = p[(p["workers"] == workers) & p["feasible"].astype(bool)]["global_batch"].tolist()
    else:
        cands = [batch >> k for k in range(1, batch.bit_length())]
    return smaller_batches(cands, batch, workers, floor)


def why_it_ends(att: Attempt, job: submitit.Job, workers: int, out: Path, shrink: bool) -> RunEnds:
    """Why an attempt that did not complete ends the run (stopped, failed, or out of memory
    with no relaunch smaller asked for)."""
    if att.outcome == "stopped":
        return RunEnds(
            "stopped",
            RuntimeError(
                f"the training job {job.job_id} was stopped ({att.reason}); its checkpoint of step "
                f"{att.checkpoint_step} is kept: run the same command again to resume from it"
            ),
        )
    if att.outcome == "oom" and not shrink:
        return RunEnds(
            "oom",
            OutOfMemory(
                f"out of memory training at N={workers} B={att.global_batch} (attempt "
                f"{att.attempt}, job {job.job_id}): {att.reason}"
            ),
        )
    return RunEnds(
        "failed",
        RuntimeError(
            f"training at N={workers} B={att.global_batch} failed (attempt {att.attempt}, job "
            f"{job.job_id}): {att.reason}\nlogs: {out / 'submitit'}\n{submission.log_tail(job)}"
        ),
    )


def next_batch(
    workers: int, batch: int, tried: set[int], predictions: str | Path | None, floor: int
) -> int:
    """The largest batch after an OOM at ``batch`` not tried yet; :class:`RunEnds` if none."""
    left = [b for b in fallback_batches(workers, batch, predictions, floor) if b not in tried]
    if not left:
        error = RuntimeError(
            f"out of memory at every global batch tried for N={workers} "
            f"({', '.join(map(str, sorted(tried, reverse=True)))}) and no smaller batch >= "
            f"grid.batch_min={floor} divides over {workers} workers; lower grid.batch_min, use "
            "more workers, or a device with more memory"
        )
        raise RunEnds("failed", error)
    print(
        f"[launch] out of memory at B={batch}: relaunching at B={left[0]} from the last checkpoint",
        flush=True,
    )
    return left[0]
