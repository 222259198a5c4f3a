"""Adaptive Gradient Scaling (paper §III-B/C, Algorithm 1) as an optimizer wrapper.

- Gradient variability (Eq. 5): Delta_i = | ||G_i||^2 - ||G_{i-1}||^2 | / ||G_{i-1}||^2, on the
  (already all-reduced) large-batch gradient, from one fused norm per step.
- Sensitive phase: Delta >= delta (default 0.5). Then gradients are left as they are.
- Otherwise gradients are multiplied element-wise by the current scale factors:
  static scaling U(s) (Eq. 8) uses one number s; AGS uses per-element factors
      s = clamp(|g_small / (g_large + eps)|, s_min, s_max),  s_max = sqrt(B_large / B_small)
  refreshed from a small reference sub-batch of the large batch (:func:`refresh_scales`).
- A step whose gradient is not finite is skipped (counted), and a non-finite scale is
  replaced by 1, so neither ever reaches the weights.

``TulaOptimizer`` wraps any ``torch.optim.Optimizer`` the way torch's own
``PostLocalSGDOptimizer`` does: it shares ``param_groups`` (so LR schedulers work) and its
``state_dict`` carries the wrapped optimizer's state plus its own (previous norm, scales,
counters), so a resumed run continues bit-identically.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable

import torch
import torch.distributed as torch_dist

from tula.runtime.agreement import StepOOM, agree

MODES = ("none", "static", "ags")


def squared_global_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """||G||^2 over all gradients, with one fused foreach norm (no per-parameter Python loop)."""
    if not grads:
        return torch.zeros(())
    norms = torch._foreach_norm(grads)
    return torch.linalg.vector_norm(torch.stack(norms)) ** 2


def grad_variability(sq_norm: float, prev_sq_norm: float | None) -> float:
    """Eq. 5. Infinite (a sensitive step) when there is no previous norm to compare with."""
    if prev_sq_norm is None or prev_sq_norm <= 0 or not math.isfinite(prev_sq_norm):
        return math.inf
    return abs(sq_norm - prev_sq_norm) / prev_sq_norm


def ags_scales(
    g_small: list[torch.Tensor], g_large: list[torch.Tensor], s_max: float, s_min: float = 0.0, eps: float = 1e-8
) -> list[torch.Tensor]:
    """Algorithm 1, lines 15-17: s = min(|g_small / (g_large + eps)|, s_max), and >= s_min."""
    out = []
    for gs, gl in zip(g_small, g_large):
        s = (gs / (gl + eps)).abs().clamp_(min=s_min, max=s_max)
        out.append(torch.where(torch.isfinite(s), s, torch.ones_like(s)))
    return out


class TulaOptimizer(torch.optim.Optimizer):
    """Wraps ``optim``; scales gradients outside sensitive phases (static or AGS).

    As torch's own wrappers do (``PostLocalSGDOptimizer``), it shares the wrapped optimizer's
    ``param_groups`` (so LR schedulers work) and its ``state``: AGS's factor of a parameter is
    ``self.state[p]["ags_scale"]``, beside SGD's momentum buffer, so it follows the parameter
    (a parameter without a factor is left unscaled, and counted) and the wrapped optimizer's
    ``state_dict`` carries it. Tula's own state (the previous gradient norm, counters) is
    added to that ``state_dict`` under ``"tula"``, so a resumed run continues bit-identically.
    """

    def __init__(
        self,
        optim: torch.optim.Optimizer,
        mode: str = "ags",
        delta: float = 0.5,
        static_scale: float = 2.0,
        s_max: float = 2.0,
        s_min: float = 0.0,
        eps: float = 1e-8,
    ):
        if mode not in MODES:
            raise ValueError(f"config key 'train.method': unknown scaling mode {mode!r} ({', '.join(MODES)})")
        self.optim = optim
        self.param_groups = optim.param_groups
        self.defaults = optim.defaults
        self.mode, self.delta, self.static_scale = mode, delta, static_scale
        self.s_max, self.s_min, self.eps = s_max, s_min, eps
        self.prev_sq_norm: float | None = None
        self.last_delta = math.inf
        self.counters = {"steps": 0, "scaled": 0, "sensitive": 0, "skipped_nonfinite": 0, "refreshes": 0,
                         "unscaled_params": 0}  # fmt: skip

    # -- torch.optim.Optimizer surface -------------------------------------------------
    @property
    def state(self):  # type: ignore[override]
        return self.optim.state

    def __repr__(self) -> str:
        return f"TulaOptimizer(mode={self.mode}, delta={self.delta}, s_max={self.s_max:.3g}, s_min={self.s_min}, {self.optim!r})"

    def zero_grad(self, set_to_none: bool = True) -> None:  # type: ignore[override]
        self.optim.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optim.add_param_group(param_group)

    def _params_with_grad(self) -> list[torch.nn.Parameter]:
        return [p for g in self.param_groups for p in g["params"] if p.grad is not None]

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None):  # type: ignore[override]
        """Algorithm 1, lines 3-9: Delta(G) of the step's gradient (Eq. 5); outside a
        sensitive phase the gradient is scaled (U(s), or AGS's per-parameter factors); then
        the wrapped optimizer steps. ``closure`` is evaluated once, first, as torch's do."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = self._params_with_grad()
        grads = [p.grad for p in params]
        sq = float(squared_global_norm(grads))
        self.counters["steps"] += 1
        if not math.isfinite(sq):
            self.counters["skipped_nonfinite"] += 1  # never let inf/nan reach the weights
            return loss
        self.last_delta = grad_variability(sq, self.prev_sq_norm)
        self.prev_sq_norm = sq
        if self.last_delta >= self.delta:
            self.counters["sensitive"] += 1
        elif self.mode == "static":
            torch._foreach_mul_(grads, self.static_scale)
            self.counters["scaled"] += 1
        elif self.mode == "ags":
            self._scale_by_factors(params)
        self.optim.step()
        return loss

    def _scale_by_factors(self, params: list[torch.nn.Parameter]) -> None:
        scaled = [(p.grad, self.state[p]["ags_scale"]) for p in params if "ags_scale" in self.state[p]]
        if scaled:
            torch._foreach_mul_([g for g, _ in scaled], [s for _, s in scaled])
            self.counters["scaled"] += 1
        self.counters["unscaled_params"] += len(params) - len(scaled)  # a gradient with no factor measured yet

    def set_scales(self, params: list[torch.nn.Parameter], g_small: list[torch.Tensor],
                   g_large: list[torch.Tensor]) -> None:  # fmt: skip
        """UPDATEGRADSCALE: each parameter's factor from its small- and large-batch gradients."""
        for p, s in zip(params, ags_scales(g_small, g_large, self.s_max, self.s_min, self.eps)):
            self.state[p]["ags_scale"] = s
        self.counters["refreshes"] += 1

    def forget_scales(self) -> None:
        """Drop every factor (they were measured at another batch); the next refresh measures them again."""
        for st in self.state.values():
            st.pop("ags_scale", None)

    def scales(self) -> list[torch.Tensor]:
        """The factors, in parameter order (parameters without one left out)."""
        return [self.state[p]["ags_scale"] for g in self.param_groups for p in g["params"] if "ags_scale" in self.state[p]]

    # -- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        return {
            "base": self.optim.state_dict(),  # per parameter: momentum buffer and ags_scale
            "tula": {"mode": self.mode, "prev_sq_norm": self.prev_sq_norm, "last_delta": self.last_delta,
                     "counters": dict(self.counters)},  # fmt: skip
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        self.optim.load_state_dict(state_dict["base"])
        t = state_dict["tula"]
        if t["mode"] != self.mode:
            raise ValueError(f"checkpoint was written with scaling mode {t['mode']!r}, this run uses {self.mode!r}")
        self.prev_sq_norm, self.last_delta = t["prev_sq_norm"], t["last_delta"]
        self.counters = {**self.counters, **t["counters"]}
        if t.get("scales"):  # written before the factors were per-parameter state: one list, parameter order
            params = [p for g in self.param_groups for p in g["params"]]
            if len(params) == len(t["scales"]):
                for p, s in zip(params, t["scales"]):
                    self.state[p]["ags_scale"] = s.to(p.device)


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

    Out of memory in the sub-batch's forward or backward on any rank: the ranks learn it
    from that same all-reduce (one flag per rank rides along) and all raise
    :class:`tula.runtime.agreement.StepOOM` (``where="refresh"``), the large-batch gradient restored.

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
    g_small, oom = _small_batch_gradient(model, params, loss_fn, x_small, y_small, autocast, loss_scale)
    # the small gradient's sum over the ranks, and which ranks ran out of memory: one all-reduce
    flat, failed = agree(bool(oom), torch.cat([g.reshape(-1) for g in g_small]))
    _restore(params, g_large)
    if failed:
        raise StepOOM(failed, oom, where="refresh")
    flat = flat / (torch_dist.get_world_size() if torch_dist.is_initialized() else 1)
    g_small = [t.view_as(g) for t, g in zip(torch.split(flat, [g.numel() for g in g_small]), g_small)]
    opt.set_scales(params, g_small, g_large)
    # the two squared norms give a one-step gradient noise estimate (tula.model.noise), for free
    opt.last_sq_norms = (float(squared_global_norm(g_small)), large_sq)
    return True


def _small_batch_gradient(model, params, loss_fn, x_small, y_small, autocast, loss_scale) -> tuple[list, str]:
    """This rank's gradient on its slice of the reference sub-batch (unscaled), computed
    without DDP's all-reduce, and the out-of-memory message if it ran out (zeros then)."""
    for p in params:
        p.grad = None
    try:
        with getattr(model, "no_sync", contextlib.nullcontext)():
            with autocast():
                loss = loss_fn(model(x_small), y_small)
            (loss * loss_scale if loss_scale != 1.0 else loss).backward()
        g_small = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params]
    except torch.OutOfMemoryError as exc:  # agreed by the caller, through the all-reduce every rank makes anyway
        return [torch.zeros_like(p) for p in params], str(exc) or "out of memory"
    if loss_scale != 1.0:
        torch._foreach_div_(g_small, loss_scale)
    return g_small, ""


def _restore(params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
    for p, g in zip(params, grads):
        p.grad = g


class LARS(torch.optim.Optimizer):
    """Layer-wise adaptive rate scaling (You et al.) around a momentum-SGD optimizer.

    Per parameter tensor: g <- (g + wd*w) * trust, trust = eta * ||w|| / (||g|| + wd*||w||),
    then the wrapped optimizer (built with weight_decay=0) steps. 1-D tensors (biases,
    norm scales) keep trust 1 and plain weight decay when ``exclude_1d``.
    """

    def __init__(self, optim: torch.optim.Optimizer, weight_decay: float, eta: float = 0.001, exclude_1d: bool = True):
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


def load_optimizer_state(opt: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
    """``opt.load_state_dict``, then the wrapper's ``param_groups`` linked again to the wrapped
    optimizer's: torch's ``Optimizer.load_state_dict`` builds new groups, and a wrapper that
    shares them (TulaOptimizer, LARS, torch's PostLocalSGDOptimizer) would keep the old ones,
    so an LR scheduler's later changes would no longer reach the optimizer that steps (a
    resumed warm-up or decay would stop where the checkpoint was)."""
    opt.load_state_dict(state_dict)
    inner = getattr(opt, "optim", None)
    if inner is not None:
        opt.param_groups = inner.param_groups


METHODS = ("lbt", "lrs", "lars", "polo", "static", "ags")


def lr_factor(method: str, step: int, steps_per_epoch: int, global_batch: int, base_batch: int,
              warmup_epochs: int, decay_epochs: tuple[int, ...], decay_factor: float) -> float:  # fmt: skip
    """Multiplier of train.lr at a global step.

    lrs / lars: linear scaling k = B / base_batch (Goyal et al.), reached by a linear warm-up
    from 1 over ``warmup_epochs``; polo: warm-up from 0 to 1 over ``warmup_epochs`` (paper:
    all baselines warm up for 5 epochs); lbt / static / ags: 1. Times the step decays.
    """
    epoch = step / max(steps_per_epoch, 1)
    warm = min(1.0, epoch / warmup_epochs) if warmup_epochs > 0 else 1.0
    if method in ("lrs", "lars"):
        k = global_batch / base_batch
        f = 1.0 + (k - 1.0) * warm
    elif method == "polo":
        f = max(warm, 1.0 / max(warmup_epochs * steps_per_epoch, 1))
    else:
        f = 1.0
    return f * decay_factor ** sum(1 for e in decay_epochs if step >= e * steps_per_epoch)


def build_method(method: str, t, params: list[torch.nn.Parameter], global_batch: int, steps_per_epoch: int):
    """Optimizer for ``train.method`` (t = the config's TrainSettings), and a function that
    prepares the DDP module for it (post-local SGD registers its comm hook)."""
    if method not in METHODS:
        raise ValueError(f"config key 'train.method': unknown method {method!r} ({', '.join(METHODS)})")
    wd = 0.0 if method == "lars" else t.weight_decay
    base = torch.optim.SGD(params, lr=t.lr, momentum=t.momentum, weight_decay=wd)

    def no_hook(ddp) -> None:
        return None

    if method in ("lbt", "lrs"):
        return base, no_hook
    if method == "lars":
        return LARS(base, weight_decay=t.weight_decay, eta=t.lars_eta, exclude_1d=t.lars_exclude_1d), no_hook
    if method == "polo":
        # torch.distributed.optim pulls in FSDP and DTensor: 0.7 s more for every worker that starts, so only polo's
        from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState, post_localSGD_hook  # noqa: I001 - see above
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager  # polo only, as above
        from torch.distributed.optim import PostLocalSGDOptimizer  # polo only, as above

        start = t.polo_sync_epochs * steps_per_epoch
        period = max(steps_per_epoch // t.polo_averages_per_epoch, 1)

        def hook(ddp) -> None:
            # After `start`, no gradient all-reduce at all: each worker steps locally (one GPU
            # per node in the paper) and parameters are averaged every `period` steps.
            state = PostLocalSGDState(process_group=None, subgroup=None, start_localSGD_iter=start,
                                      post_local_gradient_allreduce=False)  # fmt: skip
            ddp.register_comm_hook(state, post_localSGD_hook)
            ddp.tula_polo_state = state  # a resumed run sets state.iter (tula.runtime.replica.set_post_local_iter)

        return PostLocalSGDOptimizer(base, PeriodicModelAverager(period=period, warmup_steps=start)), hook
    s_max = math.sqrt(global_batch / t.ags_small_batch)
    return TulaOptimizer(base, mode=method, delta=t.ags_delta, static_scale=t.static_scale, s_max=s_max,
                         s_min=t.ags_s_min), no_hook  # fmt: skip
