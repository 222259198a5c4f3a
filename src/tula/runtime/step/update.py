"""The step's update: what a training step changes besides the weights and where its walk
stands. That is the ``train.method`` optimizer (AGS, static scaling, the plain optimizer, LARS
or post-local SGD), its LR schedule at the global batch
(:class:`tula.runtime.train.recipe.Schedule`), the GradScaler of fp16, this epoch's AGS noise pairs
and the weights' moving average.

:class:`Update` is a part of :class:`tula.runtime.step.replica.Replica` (``replica.update``) and
owns them. The replica's step drives it (:meth:`Update.clear_gradients`, :meth:`Update.backward`,
:meth:`Update.unscale`, :meth:`Update.apply`); the replica's checkpoint holds
:meth:`Update.state` and puts it back (:meth:`Update.load`, at another global batch
:meth:`Update.follow`); the monitor's compute-only step saves and restores it
(:meth:`Update.saved`, :meth:`Update.put_back`).
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch

from tula.model.lrplan import LRPlan
from tula.runtime.train import recipe
from tula.runtime.train.methods import follow_new_batch
from tula.runtime.train.optim import TulaOptimizer
from tula.runtime.train.optim_state import (
    load_optimizer_parts,
    load_optimizer_state,
    optimizer_parts,
)
from tula.runtime.train.refresh import refresh_scales


class Update:
    """One replica's optimizer, LR schedule, GradScaler and AGS noise pairs. ``epochs``: the
    run's, which the schedule spans at each global batch; ``fp16``: the GradScaler scales."""

    def __init__(
        self,
        opt: torch.optim.Optimizer,
        lr_plan: LRPlan,
        epochs: int,
        batches: tuple[int, int],
        fp16: bool,
        device: torch.device,
        clip: float | None = None,
        ema: recipe.WeightsEMA | None = None,
    ):
        self.opt, self.lr_plan, self.epochs = opt, lr_plan, epochs
        self.ema = ema  # train.ema_decay: the weights' average, updated after every step
        # train.grad_clip_norm: AGS's optimizer clips inside its step (after its Delta(G) read
        # the unclipped norm, before its factors: tula.runtime.train.methods gives it the norm); any
        # other is clipped here, before its step
        self.clip = None if isinstance(opt, TulaOptimizer) else clip
        self.scaler = torch.amp.GradScaler(device.type, enabled=fp16)
        # this epoch's AGS refreshes: (|G_small|^2, |G_B|^2)
        self.noise_pairs: list[tuple[float, float]] = []
        self.sched = self._schedule(*batches)

    def _schedule(self, global_batch: int, steps_per_epoch: int) -> recipe.Schedule:
        """The LR schedule at ``global_batch``, from its first step (the run's epochs at it)."""
        return recipe.Schedule(
            self.opt, self.lr_plan, global_batch, steps_per_epoch, self.epochs * steps_per_epoch
        )

    # -- what it shows (read-only views) -------------------------------------------------
    @property
    def lr(self) -> float:
        """The learning rate the next step takes (the first parameter group's)."""
        return float(self.opt.param_groups[0]["lr"])

    @property
    def loss_scaled(self) -> bool:
        """Does the GradScaler scale the loss (fp16)?"""
        return self.scaler.is_enabled()

    def ags_counters(self) -> dict | None:
        """AGS's (or static scaling's) counters of the steps it scaled; None for another
        method."""
        return dict(self.opt.counters) if isinstance(self.opt, TulaOptimizer) else None

    def ags_scaled_so_far(self) -> torch.Tensor | None:
        """AGS's count of scaled steps, on the device (read without waiting); None for
        another method."""
        return self.opt.scaled_so_far() if isinstance(self.opt, TulaOptimizer) else None

    def ags_mean_factor(self) -> float | None:
        """AGS's mean scale factor over the layers now; None for another method."""
        return self.opt.mean_factor() if isinstance(self.opt, TulaOptimizer) else None

    # -- the step ------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor) -> None:
        """The loss's gradients, scaled by the GradScaler (a no-op scale unless fp16)."""
        self.scaler.scale(loss).backward()

    def unscale(self) -> None:
        """The gradients unscaled (AGS and its Δ(G) see them so; a no-op unless fp16)."""
        self.scaler.unscale_(self.opt)

    def loss_scale(self) -> float:
        """The loss scale of this step's gradients (1.0 unless fp16; read from the device:
        asked only when a refresh needs it)."""
        return self.scaler.get_scale() if self.scaler.is_enabled() else 1.0

    def refresh(
        self,
        model: torch.nn.Module,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        x_small: torch.Tensor,
        y_small: torch.Tensor,
        autocast: Callable[[], Any],
    ) -> bool:
        """AGS's refresh inside the step, after the step's gradient is complete and unscaled:
        the scale factors measured again at the reference sub-batch (this rank's share, x_small,
        y_small; :func:`tula.runtime.train.refresh.refresh_scales`), and their pair of squared norms
        kept for the epoch's gradient noise scale. False: a non-finite gradient, nothing
        refreshed. Raises :class:`tula.runtime.group.agreement.StepOOM` on every rank together."""
        scale = self.loss_scale()
        done = refresh_scales(
            model, self.opt, loss_fn, x_small, y_small, autocast=autocast, loss_scale=scale
        )
        if done:
            self.noise_pairs.append(self.opt.last_sq_norms)
        return done

    def apply(self) -> None:
        """The optimizer's step through the GradScaler (skipped when fp16 gradients
        overflowed: no Δ sample, no AGS step), then the LR schedule's; the gradient clipped
        to ``train.grad_clip_norm`` first (by AGS's optimizer itself, see :meth:`__init__`)."""
        if self.clip is not None:  # the gradient unscale()d already (the replica's step)
            params = [p for g in self.opt.param_groups for p in g["params"]]
            torch.nn.utils.clip_grad_norm_(params, self.clip, foreach=True)
        self.scaler.step(self.opt)
        self.scaler.update()
        self.sched.step()
        if self.ema is not None:
            self.ema.update()

    def clear_gradients(self) -> None:
        """The gradients dropped (a step's start; a measurement's backward, after it)."""
        self.opt.zero_grad(set_to_none=True)

    def take_noise_pairs(self) -> list[tuple[float, float]]:
        """This epoch's AGS noise pairs, handed over and forgotten (the epoch's noise scale)."""
        pairs, self.noise_pairs = self.noise_pairs, []
        return pairs

    # -- what a checkpoint holds of it, and putting that back ------------------------------
    def state_dict(self) -> dict[str, Any]:
        """A checkpoint's optimizer parts ("optimizer", "ags"), "scheduler", "scaler",
        "noise_pairs" and the weights' average ("ema", train.ema_decay)."""
        ema = {"ema": self.ema.state_dict()} if self.ema is not None else {}
        return {
            **optimizer_parts(self.opt),
            "scheduler": self.sched.state_dict(),
            "scaler": self.scaler.state_dict(),
            "noise_pairs": list(self.noise_pairs),
            **ema,
        }

    def load_state_dict(self, state: dict[str, Any], same_batch: bool = True) -> None:
        """:meth:`state_dict` put back, each part by its owner; the schedule only if ``state`` was
        written at this global batch (:meth:`follow` builds it at another)."""
        load_optimizer_parts(self.opt, state)
        if same_batch:
            self.sched.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.noise_pairs = [tuple(p) for p in state.get("noise_pairs", [])]
        if self.ema is not None and "ema" in state:
            self.ema.load_state_dict(state["ema"])

    def load_own(self, own: dict[str, Any]) -> None:
        """This rank's own optimizer parts (post-local SGD between two averages)."""
        load_optimizer_parts(self.opt, own)

    def follow(
        self, written_at: int, batches: tuple[int, int], epochs_done: float, rank: int
    ) -> bool:
        """After loading a checkpoint written at global batch ``written_at``, run at
        ``batches`` (the global batch, its steps per epoch): the optimizer follows the new
        batch (:func:`tula.runtime.train.methods.follow_new_batch`), the noise pairs are dropped and
        the schedule is built at the new batch, where the run's ``epochs_done`` stand (``rank``
        0 says so). Returns whether AGS's factors must be refreshed at the next step."""
        global_batch, steps_per_epoch = batches
        self.noise_pairs = []
        refresh = follow_new_batch(self.opt, written_at, global_batch, rank)
        self.sched = self._schedule(global_batch, steps_per_epoch)
        self.sched.fast_forward(round(epochs_done * steps_per_epoch))
        return refresh

    def saved(self) -> list[Any]:
        """A copy of everything a step changes here (:meth:`put_back` restores it)."""
        opt = copy.deepcopy(self.opt.state_dict())
        ema = copy.deepcopy(self.ema.state_dict()) if self.ema is not None else None
        return [opt, self.sched.state_dict(), self.scaler.state_dict(), list(self.noise_pairs), ema]

    def put_back(self, saved: list[Any]) -> None:
        """The optimizer, schedule, scaler, noise pairs and weights' average as :meth:`saved`
        copied them."""
        load_optimizer_state(self.opt, saved[0])
        self.sched.load_state_dict(saved[1])
        self.scaler.load_state_dict(saved[2])
        self.noise_pairs = list(saved[3])
        if self.ema is not None:
            self.ema.load_state_dict(saved[4])
