"""The training methods of the paper's comparison (§V): the optimizer each ``train.method``
steps with (AGS and static scaling through :class:`tula.runtime.train.optim.TulaOptimizer`; LARS;
post-local SGD through torch's ``PostLocalSGDOptimizer``; plain large-batch SGD), its
learning-rate schedule, when AGS refreshes its factors, and how a method follows a relaunch
at another global batch."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from tula.config import TrainSettings
from tula.runtime.train import recipe
from tula.runtime.train.optim import TulaOptimizer


class LARS(torch.optim.Optimizer):
    """Layer-wise adaptive rate scaling (You et al.) around a momentum-SGD optimizer.

    Per parameter tensor: g <- (g + wd*w) * trust, trust = eta * ||w|| / (||g|| + wd*||w||),
    then the wrapped optimizer (built with weight_decay=0) steps. 1-D tensors (biases,
    norm scales) keep trust 1 and plain weight decay when ``exclude_1d``.
    """

    def __init__(
        self,
        optim: torch.optim.Optimizer,
        weight_decay: float,
        eta: float = 0.001,
        exclude_1d: bool = True,
    ):
        self.optim, self.param_groups, self.defaults = optim, optim.param_groups, optim.defaults
        self.weight_decay, self.eta, self.exclude_1d = weight_decay, eta, exclude_1d

    @property
    def state(self):  # type: ignore[override]
        return self.optim.state

    def zero_grad(self, set_to_none: bool = True) -> None:  # type: ignore[override]
        self.optim.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        """Trust-ratio scaling, then the wrapped optimizer's step. ``closure`` is evaluated once,
        first (it recomputes the gradients), never after the scaling it would undo."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        w_norms = torch._foreach_norm(params)
        g_norms = torch._foreach_norm([p.grad for p in params])
        for p, wn, gn in zip(params, w_norms, g_norms):
            p.grad.add_(p, alpha=self.weight_decay)
            if self.exclude_1d and p.ndim <= 1:
                continue
            denom = gn + self.weight_decay * wn
            trust = torch.where((wn > 0) & (denom > 0), self.eta * wn / denom, torch.ones_like(wn))
            p.grad.mul_(trust)
        self.optim.step()
        return loss

    def state_dict(self):  # type: ignore[override]
        return self.optim.state_dict()

    def load_state_dict(self, state_dict):  # type: ignore[override]
        self.optim.load_state_dict(state_dict)


METHODS = ("lbt", "lrs", "lars", "polo", "static", "ags")


def build_method(
    method: str,
    t,
    params: torch.nn.Module | list[torch.nn.Parameter],
    global_batch: int,
    steps_per_epoch: int,
):
    """Optimizer for ``train.method`` (t = the config's TrainSettings), and a function that
    prepares the DDP module for it (post-local SGD registers its comm hook)."""
    if method not in METHODS:
        raise ValueError(
            f"config key 'train.method': unknown method {method!r} ({', '.join(METHODS)})"
        )
    wd = 0.0 if method == "lars" else t.weight_decay
    # train.optimizer (SGD by default); the schedule sets its LR
    # (tula.runtime.train.recipe.Schedule)
    base = recipe.build_optimizer(t, params, t.lr, wd)

    def no_hook(ddp) -> None:
        return None

    if method in ("lbt", "lrs"):
        return base, no_hook
    if method == "lars":
        return LARS(
            base, weight_decay=t.weight_decay, eta=t.lars_eta, exclude_1d=t.lars_exclude_1d
        ), no_hook
    if method == "polo":
        return _post_local(base, t, steps_per_epoch)
    s_max = math.sqrt(global_batch / t.ags_small_batch)
    return TulaOptimizer(
        base,
        mode=method,
        delta=t.ags_delta,
        static_scale=t.static_scale,
        s_max=s_max,
        s_min=t.ags_s_min,
        scale_update=recipe.scales_update(base),
        clip_norm=t.grad_clip_norm,
    ), no_hook


def _post_local(base, t, steps_per_epoch: int):
    """Post-local SGD (``train.method: polo``): the optimizer and the DDP hook it needs."""
    # torch.distributed.optim pulls in FSDP and DTensor: 0.7 s more for every worker that
    # starts, so only polo's imports them
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
        PostLocalSGDState,
        post_localSGD_hook,
    )
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.optim import PostLocalSGDOptimizer

    start = t.polo_sync_epochs * steps_per_epoch
    period = max(steps_per_epoch // t.polo_averages_per_epoch, 1)

    def hook(ddp) -> None:
        # After `start`, no gradient all-reduce at all: each worker steps locally (one GPU
        # per node in the paper) and parameters are averaged every `period` steps.
        state = PostLocalSGDState(
            process_group=None,
            subgroup=None,
            start_localSGD_iter=start,
            post_local_gradient_allreduce=False,
        )
        ddp.register_comm_hook(state, post_localSGD_hook)
        ddp.tula_polo_state = state  # a resumed run sets state.iter (set_post_local_iter)

    return PostLocalSGDOptimizer(
        base, PeriodicModelAverager(period=period, warmup_steps=start)
    ), hook


@dataclass(frozen=True)
class Cadence:
    """When a method's step is not a plain one, resolved from ``train`` once, as the replica is
    built: AGS refreshes its factors on an epoch's first step, or every ``refresh_every`` steps
    where ``train.ags_refresh_every_steps`` sets k; post-local SGD's ranks step apart between
    averages. The step, the timer's walk through an epoch, the monitor and the checkpoint ask
    it, not the config."""

    method: str
    refresh_every: int | None = None  # AGS's k (None: epoch starts only, or not AGS)

    @classmethod
    def of(cls, t: TrainSettings) -> Cadence:
        return cls(t.method, t.ags_refresh_every_steps if t.method == "ags" else None)

    def refresh_due(self, epoch_start: bool, global_step: int) -> bool:
        """AGS refreshes its factors on the first step of each epoch, or every k steps."""
        if self.method != "ags":
            return False
        k = self.refresh_every
        return global_step % k == 0 if k else epoch_start

    @property
    def replicas_differ(self) -> bool:
        """Can the ranks' models and optimizer states differ? Post-local SGD's local phase:
        each rank steps on its own gradient between two averages, so a checkpoint keeps every
        rank's model and optimizer state, not only rank 0's."""
        return self.method == "polo"

    def midepoch_refreshes_per_step(self) -> float:
        """How often training refreshes AGS's factors other than at an epoch's first step
        (``ags_refresh_every_steps: k``: every k steps; by default only at epoch starts)."""
        return 1.0 / self.refresh_every if self.refresh_every else 0.0


def set_post_local_iter(ddp: DDP, step: int) -> None:
    """Post-local SGD's hook counts steps in its own state; a resumed run continues the count."""
    state = getattr(ddp, "tula_polo_state", None)
    if state is not None:
        state.iter = step


def follow_new_batch(opt, old_batch: int, new_batch: int, rank: int) -> bool:
    """Adapt the restored optimizer to a relaunch at a smaller global batch (paper rules):

    - AGS: s_max = sqrt(B / ags_small_batch) is recomputed for the new B (build_method did);
      the per-parameter factors, ratios measured at the old B, are dropped and re-measured on
      the first step, and the previous gradient norm is forgotten (its scale depends on B),
      so that first step counts as sensitive and is not scaled.
    - The schedule is built again at the new B and continued where the epochs stand (the
      replica's :meth:`~tula.runtime.step.update.Update.follow`): lrs / lars's
      k = B / base_batch follows the new B; the others keep their LR.
    - Momentum buffers and the step count carry over; the data position is in samples.
    Returns True: the AGS factors must be refreshed at the next step.
    """
    if isinstance(opt, TulaOptimizer):
        opt.forget_batch()
    if rank == 0:
        print(
            f"[train] global batch {old_batch} -> {new_batch}"
            + (
                f": AGS s_max {opt.s_max:.3g}, scale factors re-measured"
                if isinstance(opt, TulaOptimizer)
                else ""
            ),
            flush=True,
        )
    return isinstance(opt, TulaOptimizer)
