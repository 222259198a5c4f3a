"""AGS's refresh (paper §III-C, Algorithm 1): the small-batch gradient on this rank's slice of
the reference sub-batch, averaged over the ranks with one all-reduce (an out-of-memory flag per
rank riding along), and the per-element scales it gives the optimizer
(:class:`tula.runtime.train.optim.TulaOptimizer`); the large-batch gradient put back."""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable

import torch
import torch.distributed as torch_dist

from tula.runtime.group.agreement import StepOOM, agree
from tula.runtime.train.optim import TulaOptimizer, squared_global_norm


def refresh_scales(
    model: torch.nn.Module,
    opt: TulaOptimizer,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    x_small: torch.Tensor,
    y_small: torch.Tensor,
    autocast: Callable[[], Any] = contextlib.nullcontext,
    loss_scale: float = 1.0,
) -> bool:
    """Compute the small-batch gradient on (x_small, y_small) and refresh ``opt``'s AGS scales.

    Call it after the large batch's backward (its gradient, all-reduced by DDP and unscaled,
    is in ``.grad``) and before ``opt.step()``. Each rank passes its own slice of the reference
    sub-batch; the small-batch gradient is averaged over ranks with one all-reduce of the
    gradient size, so every rank derives identical scales and the replicas stay equal. The
    large-batch gradient is restored afterwards. Cost: one forward/backward on the sub-batch
    and one all-reduce.

    Out of memory in the sub-batch's forward or backward on any rank: the ranks learn it from that
    same all-reduce (one flag per rank rides along) and all raise
    :class:`tula.runtime.group.agreement.StepOOM` (``where="refresh"``), the large-batch gradient
    restored.

    Mixed precision: the forward runs under ``autocast`` (the step's), and with fp16 the
    small loss is multiplied by the GradScaler's ``loss_scale`` and its gradient divided by it
    again, so both gradients compared are unscaled. Returns False, leaving the scales as they
    were, when the large-batch gradient is not finite (a step the GradScaler will skip).
    """
    params = opt._params_with_grad()
    large_sq = float(squared_global_norm([p.grad for p in params]))
    if not math.isfinite(large_sq):
        return False
    g_large = [p.grad.detach().clone() for p in params]
    g_small, oom = _small_batch_gradient(
        model, params, loss_fn, x_small, y_small, autocast, loss_scale
    )
    # the small gradient's sum over the ranks, and which ranks ran out of memory: one all-reduce
    flat, failed = agree(bool(oom), torch.cat([g.reshape(-1) for g in g_small]))
    _restore(params, g_large)
    if failed:
        raise StepOOM(failed, oom, where="refresh")
    flat = flat / (torch_dist.get_world_size() if torch_dist.is_initialized() else 1)
    g_small = [
        t.view_as(g) for t, g in zip(torch.split(flat, [g.numel() for g in g_small]), g_small)
    ]
    opt.set_scales(params, g_small, g_large)
    # the two squared norms give a one-step gradient noise estimate (tula.model.noise), for free
    opt.note_sq_norms(float(squared_global_norm(g_small)), large_sq)
    return True


def _small_batch_gradient(
    model, params, loss_fn, x_small, y_small, autocast, loss_scale
) -> tuple[list, str]:
    """This rank's gradient on its slice of the reference sub-batch (unscaled), computed
    without DDP's all-reduce, and the out-of-memory message if it ran out (zeros then)."""
    for p in params:
        p.grad = None
    try:
        with getattr(model, "no_sync", contextlib.nullcontext)():
            with autocast():
                loss = loss_fn(model(x_small), y_small)
            (loss * loss_scale if loss_scale != 1.0 else loss).backward()
        g_small = [
            p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params
        ]
    # agreed by the caller, through the all-reduce every rank makes anyway
    except torch.OutOfMemoryError as exc:
        return [torch.zeros_like(p) for p in params], str(exc) or "out of memory"
    if loss_scale != 1.0:
        torch._foreach_div_(g_small, loss_scale)
    return g_small, ""


def _restore(params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
    for p, g in zip(params, grads):
        p.grad = g
