"""What one production run has spent and recorded: the trainer's ledger.

:class:`Ledger` owns the run's time accounts (steps, evaluation, checkpoints, start-ups, the
first steps of each batch shape, monitoring), its epoch rows, the epoch in progress's time, the
segment this attempt trains in (``attempts.json``), and the timer its timed steps use (the
probe's, :class:`tula.runtime.timer.timing.StepTimer`). It is carried across requeues in the run's
checkpoints. The trainer writes to it; records, the monitor and the stops read from it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tula.runtime.timer.timing import StepTimer

# time spent, carried across requeues: steps only / evaluation / checkpoints / process start-ups
# / each shape's first steps (and how many) / the monitor's pairs
TIMES = (
    "train_time_s",
    "eval_time_s",
    "checkpoint_time_s",
    "startup_time_s",
    "first_steps_time_s",
    "first_steps",
    "monitor_time_s",
)


class Ledger:
    """One worker's accounts of a production run (module docstring)."""

    def __init__(
        self, out: Path, rank: int, attempt: int, label: str, timer: StepTimer, started: float
    ):
        self.out, self.rank, self.attempt, self.label = Path(out), rank, attempt, label
        self.timer = timer
        self.times: dict[str, float] = {k: 0 if k == "first_steps" else 0.0 for k in TIMES}
        self.rows: list[dict[str, Any]] = []
        self.epoch_time = 0.0
        self.seg: dict[str, Any] = {}  # this attempt's segment (attempts.json)
        self.wall_before = 0.0  # the wall time of earlier attempts, to their last checkpoint
        self.resumed_from = 0  # the step of the checkpoint this attempt resumed from
        self.process_started, self.first_step_at = started, None
        self.shapes_met: set[str] = set()  # batch shapes this attempt has stepped at

    def spend(self, account: str, seconds: float, in_epoch: bool = False) -> None:
        """``seconds`` into ``account`` (one of TIMES), and into the epoch's time if
        ``in_epoch`` (the steps' own time)."""
        self.times[account] += seconds
        if in_epoch:
            self.epoch_time += seconds

    def first_of_shape(self, shape: str, seconds: float) -> None:
        """The attempt's first step at ``shape`` took ``seconds`` (first_steps_time_s)."""
        self.shapes_met.add(shape)
        self.spend("first_steps_time_s", seconds, in_epoch=True)
        self.times["first_steps"] += 1

    def first_step(self) -> float:
        """The attempt's first step is about to run: start-up ends now. Returns the time."""
        self.first_step_at = time.time()
        self.times["startup_time_s"] += self.first_step_at - self.process_started
        self.seg["first_step_time"] = self.first_step_at  # fault drills: time to resumed training
        return self.first_step_at

    def close_epoch(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self.epoch_time = 0.0

    def begin_segment(self, seg: dict[str, Any]) -> None:
        self.seg = dict(seg)

    def segment(self, **end: Any) -> dict[str, Any]:
        """This attempt's segment with how it ended (attempts.json)."""
        return {**self.seg, **end}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        """From the checkpoint resumed from, at ``step``: its ledger part (:meth:`state_dict`):
        the rows, the epoch's time so far, the accounts and the wall time of the attempts
        before."""
        self.rows, self.epoch_time = state["rows"], state["epoch_time_s"]
        self.times.update({k: state.get(k, 0.0) for k in self.times})
        self.wall_before = state.get("wall_time_s", 0.0)
        self.resumed_from = step

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of it."""
        return {
            "rows": self.rows,
            "epoch_time_s": self.epoch_time,
            **self.times,
            "wall_time_s": self.wall_time(),
        }

    def wall_time(self) -> float:
        """Seconds this run has taken so far: each attempt from its process's start (earlier
        attempts to their last checkpoint; time in the queue not counted)."""
        return self.wall_before + time.time() - self.process_started
