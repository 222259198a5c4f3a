"""What the one training step (:class:`tula.runtime.step.replica.Replica`) is given and where it
stands: :class:`StepHooks`, the job's hooks, given when the replica is built, and
:class:`Position`, where training stands in steps and samples."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass
class Position:
    """Where training stands: optimizer steps taken, the epoch in progress (1-based) and how
    many samples of that epoch's permutation are consumed. Independent of the batch size, so
    a relaunch at a smaller batch continues with the next unseen sample."""

    step: int = 0
    epoch: int = 1
    offset: int = 0

    def epochs_done(self, train_samples: int) -> float:
        return (self.epoch - 1) + min(self.offset, train_samples) / train_samples

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step, "epoch": self.epoch, "offset": self.offset}

    @classmethod
    def from_state_dict(cls, state: dict[str, int]) -> Position:
        return cls(int(state["step"]), int(state["epoch"]), int(state["offset"]))


def _no_stop() -> int:
    return 0


@dataclass(frozen=True)
class StepHooks:
    """What the job asks of the step, given when the replica is built: ``stop_code()``, the
    stop every rank agrees on at each step (the production job's signals and move requests;
    0: go on); ``sync_delay(step)``, seconds a fault drill adds to a synced step (a slower
    network); ``injector(place, step, global batch)``, the fault drills' errors
    (:class:`tula.faults.Injector`)."""

    stop_code: Callable[[], int] = _no_stop
    sync_delay: Callable[[int], float] | None = None
    injector: Callable[[str, int, int], None] | None = None
