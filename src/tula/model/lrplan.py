"""The learning rate a method trains with at a global batch, as data: the base LR, the linear
scaling rule of lrs and lars (k = B / base_batch, Goyal et al.), the warm-up and the schedule.
The replica's schedule (:class:`tula.runtime.train.recipe.Schedule`) is built from it, and the plan
(``tula plan``) states it for a user's own script."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

LINEAR_SCALING = ("lrs", "lars")  # the methods whose peak LR is k = B / base_batch times train.lr


@dataclass(frozen=True)
class LRPlan:
    """What the LR schedule depends on, resolved from ``train`` once
    (:func:`tula.model_inputs.lr_plan`; the replica keeps this, not the config section): the
    base LR, whether the method scales it by k = B / base_batch, the warm-up in epochs and the
    schedule with its arguments."""

    lr: float
    linear_scaling: bool
    base_batch: int
    warmup_epochs: float
    schedule: str = "step"
    schedule_args: dict[str, Any] = field(default_factory=dict)
    decay_epochs: tuple[int, ...] = ()
    decay_factor: float = 0.1

    def peak(self, global_batch: int) -> float:
        """The LR the warm-up reaches at global batch B (lrs, lars: k = B / base_batch times)."""
        return self.lr * self.k(global_batch)

    def k(self, global_batch: int) -> float:
        return global_batch / self.base_batch if self.linear_scaling else 1.0
