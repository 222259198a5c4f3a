"""Adaptive Gradient Scaling (paper §III-B/C, Algorithm 1) as an optimizer wrapper.

- Gradient variability (Eq. 5): Delta_i = | ||G_i||^2 - ||G_{i-1}||^2 | / ||G_{i-1}||^2, on the
  (already all-reduced) large-batch gradient, from one fused norm per step.
- Sensitive phase: Delta >= delta (default 0.5). Then gradients are left as they are.
- Otherwise gradients are multiplied element-wise by the current scale factors:
  static scaling U(s) (Eq. 8) uses one number s; AGS uses per-element factors
      s = clamp(|g_small / (g_large + eps)|, s_min, s_max),  s_max = sqrt(B_large / B_small)
  refreshed from a small reference sub-batch of the large batch
  (:func:`tula.runtime.train.refresh.refresh_scales`).
- A step whose gradient is not finite is skipped (counted), and a non-finite scale is
  replaced by 1, so neither ever reaches the weights.

``TulaOptimizer`` wraps any ``torch.optim.Optimizer`` the way torch's own
``PostLocalSGDOptimizer`` does: it shares ``param_groups`` (so LR schedulers work) and its
``state_dict`` carries the wrapped optimizer's state plus its own (previous norm, scales,
counters), so a resumed run continues bit-identically.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import FakeTensor

MODES = ("none", "static", "ags")


def squared_global_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """||G||^2 over all gradients, with one fused foreach norm (no per-parameter Python loop)."""
    if not grads:
        return torch.zeros(())
    norms = torch._foreach_norm(grads)
    return torch.linalg.vector_norm(torch.stack(norms)) ** 2


def variability(sq_norm: torch.Tensor, prev_sq_norm: torch.Tensor) -> torch.Tensor:
    """Eq. 5 on the device, with no host read: Delta = |G^2 - G_prev^2| / G_prev^2; infinite
    (a sensitive step) where there is no usable previous norm (NaN: none yet, <= 0, inf)."""
    usable = torch.isfinite(prev_sq_norm) & (prev_sq_norm > 0)
    safe_prev = torch.where(usable, prev_sq_norm, torch.ones_like(prev_sq_norm))
    return torch.where(
        usable, (sq_norm - prev_sq_norm).abs() / safe_prev, torch.full_like(sq_norm, math.inf)
    )


def grad_variability(sq_norm: float, prev_sq_norm: float | None) -> float:
    """Eq. 5 on host numbers (:func:`variability`). Infinite when there is no previous norm."""
    prev = math.nan if prev_sq_norm is None else prev_sq_norm
    return float(
        variability(
            torch.tensor(sq_norm, dtype=torch.float64), torch.tensor(prev, dtype=torch.float64)
        )
    )


def ags_scales(
    g_small: list[torch.Tensor],
    g_large: list[torch.Tensor],
    s_max: float,
    s_min: float = 0.0,
    eps: float = 1e-8,
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
    ``param_groups`` (so LR schedulers work) and its ``state``. AGS's factor of a parameter is
    its own, ``self.factors[p]``, keyed by the parameter, so it follows the parameter (a
    parameter without a factor is left unscaled, and counted), and never in the wrapped
    optimizer's per-parameter state: Adam and most others start a parameter's state when it is
    empty. AGS's state (the factors by parameter index, the previous gradient norm, counters)
    is :meth:`ags_state_dict`, a checkpoint's part of its own, so a resumed run continues
    bit-identically.
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
        scale_update: bool = False,
        clip_norm: float | None = None,
    ):
        if mode not in MODES:
            raise ValueError(
                f"config key 'train.method': unknown scaling mode {mode!r} ({', '.join(MODES)})"
            )
        self.optim = optim
        self.param_groups = optim.param_groups
        self.defaults = optim.defaults
        self.mode, self.delta, self.static_scale = mode, delta, static_scale
        self.s_max, self.s_min, self.eps = s_max, s_min, eps
        # scale the update the wrapped optimizer computes, not its gradient (an adaptive one's
        # second-moment normalisation would cancel a slowly changing gradient factor)
        self.scale_update = scale_update
        # train.grad_clip_norm: the (unscaled) gradient clipped after Delta(G) read its norm
        # and before the factors scale it
        self.clip_norm = clip_norm
        self.factors: dict[torch.nn.Parameter, torch.Tensor] = {}
        # Where the step reads the device nowhere: the previous ||G||^2 and Delta live on the
        # device (NaN: none yet), and so do the counts that depend on them (scaled, sensitive,
        # skipped_nonfinite); `counters` reads them, at an epoch's end or a checkpoint.
        self._prev: torch.Tensor | None = None
        self._delta: torch.Tensor | None = None
        self._counts: torch.Tensor | None = None  # scaled, sensitive, skipped_nonfinite
        self._host = {"steps": 0, "refreshes": 0, "unscaled_params": 0}

    DEVICE_COUNTERS = ("scaled", "sensitive", "skipped_nonfinite")

    @property
    def counters(self) -> dict[str, int]:
        """Steps taken, scaled, sensitive, skipped (non-finite), refreshes, unscaled parameters.
        Reading it reads the device: at an epoch's end, a checkpoint or the job's end."""
        dev = [0, 0, 0] if self._counts is None else [int(v) for v in self._counts.tolist()]
        return {
            "steps": self._host["steps"],
            **dict(zip(self.DEVICE_COUNTERS, dev)),
            "refreshes": self._host["refreshes"],
            "unscaled_params": self._host["unscaled_params"],
        }

    @counters.setter
    def counters(self, values: dict[str, int]) -> None:
        for k in self._host:
            self._host[k] = int(values.get(k, self._host[k]))
        dev = [float(values.get(k, 0)) for k in self.DEVICE_COUNTERS]
        self._counts = torch.tensor(dev, dtype=torch.float64, device=self._device())

    @property
    def prev_sq_norm(self) -> float | None:
        """||G||^2 of the last finite step (a device read), None before the first one."""
        if self._prev is None:
            return None
        v = float(self._prev)
        return None if math.isnan(v) else v

    @prev_sq_norm.setter
    def prev_sq_norm(self, value: float | None) -> None:
        v = math.nan if value is None else float(value)
        self._prev = torch.tensor(v, dtype=torch.float32, device=self._device())

    @property
    def last_delta(self) -> float:
        return math.inf if self._delta is None else float(self._delta)

    def _device(self) -> torch.device:
        for g in self.param_groups:
            for p in g["params"]:
                return p.device
        return torch.device("cpu")

    # -- torch.optim.Optimizer surface -------------------------------------------------
    @property
    def state(self):  # type: ignore[override]
        return self.optim.state

    def __repr__(self) -> str:
        return (
            f"TulaOptimizer(mode={self.mode}, delta={self.delta}, s_max={self.s_max:.3g}, "
            f"s_min={self.s_min}, {self.optim!r})"
        )

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
        self._host["steps"] += 1
        if not grads:
            self.optim.step()
            return loss
        sq = squared_global_norm(grads).float()
        finite = torch.isfinite(sq)
        if self.clip_norm is not None:  # clip_grad_norm_'s coefficient, from the same norm
            torch._foreach_mul_(grads, (self.clip_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0))
        if self._prev is None:
            self.prev_sq_norm = None
        if self._counts is None:
            self.counters = self._host
        prev = self._prev
        delta = variability(sq, prev)
        sensitive = delta >= self.delta
        apply = finite & ~sensitive
        targets, factors = self._factors(params, apply)
        scaled = apply if factors is not None else torch.zeros_like(finite)
        if factors is not None and not self.scale_update:
            torch._foreach_mul_([p.grad for p in targets], factors)
        scale_after = factors is not None and self.scale_update
        before = [p.detach().clone() for p in targets] if scale_after else []
        self._delta = torch.where(
            finite, delta, self._delta if self._delta is not None else torch.full_like(sq, math.inf)
        )
        self._prev = torch.where(finite, sq, prev)
        self._counts += torch.stack([scaled, finite & sensitive, ~finite]).to(self._counts.dtype)
        self._inner_step(finite)
        if before:  # w = w_before + factor * (the optimizer's own update)
            update = torch._foreach_sub(targets, before)
            torch._foreach_mul_(update, factors)
            torch._foreach_add_(before, update)
            torch._foreach_copy_(targets, before)
        return loss

    def _inner_step(self, finite: torch.Tensor) -> None:
        """The wrapped optimizer's step; a non-finite gradient never reaches the weights: a fused
        optimizer (SGD's default) skips the update on the device (found_inf); any other is
        asked on the host."""
        if not all(g.get("fused") for g in self.param_groups):
            # as torch's GradScaler does for such optimizers: one host read. Under FakeTensorMode
            # (the memory estimate) there is no value to read; the step is taken as a finite one.
            if isinstance(finite, FakeTensor) or bool(finite):
                self.optim.step()
            return
        self.optim.found_inf = (~finite).float()
        try:
            self.optim.step()
        finally:
            self.optim.found_inf = None

    def _factors(
        self, params: list[torch.nn.Parameter], apply: torch.Tensor
    ) -> tuple[list[torch.nn.Parameter], torch.Tensor | list[torch.Tensor] | None]:
        """The parameters to scale and each one's factor where ``apply`` (a device bool) holds,
        1 otherwise (1 + (s - 1) * apply: no read of ``apply`` on the host); None: nothing to
        scale. Static scaling: every parameter, by one s; AGS: those with a factor measured
        (the others counted)."""
        if self.mode == "static":
            return params, torch.where(apply, self.static_scale, 1.0)
        if self.mode != "ags":
            return [], None
        targets = [p for p in params if p in self.factors]
        self._host["unscaled_params"] += len(params) - len(targets)
        if not targets:
            return [], None
        factors = torch._foreach_sub([self.factors[p] for p in targets], 1.0)
        torch._foreach_mul_(factors, apply.to(factors[0].dtype))
        torch._foreach_add_(factors, 1.0)
        return targets, factors

    def scaled_so_far(self) -> torch.Tensor:
        """The count of steps scaled so far, on the device (a copy: no host read)."""
        if self._counts is None:
            return torch.zeros((), dtype=torch.float64, device=self._device())
        return self._counts[0].clone()

    def mean_factor(self) -> float | None:
        """The mean of the factors a step applies outside a sensitive phase (a host read):
        AGS's over every element of every parameter it has one for, static scaling's s; None
        before AGS's first refresh."""
        if self.mode == "static":
            return self.static_scale
        if not self.factors:
            return None
        total = sum(float(f.double().sum()) for f in self.factors.values())
        return total / sum(f.numel() for f in self.factors.values())

    def note_sq_norms(self, small_sq: float, large_sq: float) -> None:
        """A refresh's pair of squared norms (|G_small|^2, |G_B|^2): a one-step gradient noise
        estimate (tula.model.noise), read by the replica after the step."""
        self.last_sq_norms = (small_sq, large_sq)

    def set_scales(
        self,
        params: list[torch.nn.Parameter],
        g_small: list[torch.Tensor],
        g_large: list[torch.Tensor],
    ) -> None:
        """UPDATEGRADSCALE: each parameter's factor from its small- and large-batch gradients."""
        for p, s in zip(params, ags_scales(g_small, g_large, self.s_max, self.s_min, self.eps)):
            self.factors[p] = s
        self._host["refreshes"] += 1

    def forget_batch(self) -> None:
        """Resumed at another global batch: the factors and the last gradient norm, both
        measured at the old one, are dropped
        (:func:`tula.runtime.train.methods.follow_new_batch`)."""
        self.forget_scales()
        self.prev_sq_norm = None

    def forget_scales(self) -> None:
        """Drop every factor (they were measured at another batch); the next refresh measures them
        again."""
        self.factors.clear()

    def _params(self) -> list[torch.nn.Parameter]:
        return [p for g in self.param_groups for p in g["params"]]

    def scales(self) -> list[torch.Tensor]:
        """The factors, in parameter order (parameters without one left out)."""
        return [self.factors[p] for p in self._params() if p in self.factors]

    # -- checkpoints -------------------------------------------------------------------
    def ags_state_dict(self) -> dict[str, Any]:
        """AGS's own state: the mode, the factors by parameter index, the previous gradient
        norm and Delta, the counters."""
        return {
            "mode": self.mode,
            "factors": {
                i: self.factors[p] for i, p in enumerate(self._params()) if p in self.factors
            },
            "prev_sq_norm": self.prev_sq_norm,
            "last_delta": self.last_delta,
            "counters": dict(self.counters),
        }

    def load_ags_state_dict(self, t: dict[str, Any]) -> None:
        if t["mode"] != self.mode:
            raise ValueError(
                f"checkpoint was written with scaling mode {t['mode']!r}, this run uses "
                f"{self.mode!r}"
            )
        self.prev_sq_norm = t["prev_sq_norm"]
        delta = t.get("last_delta", math.inf)
        self._delta = torch.tensor(
            math.inf if delta is None else float(delta), device=self._device()
        )
        self.counters = {**self.counters, **t["counters"]}
        params = self._params()
        self.factors = {
            params[int(i)]: s.to(params[int(i)].device) for i, s in t["factors"].items()
        }

    def load_parts(self, optimizer: dict[str, Any], ags: dict[str, Any]) -> None:
        """A checkpoint's two parts: the wrapped optimizer's state (its own
        ``load_state_dict``, whose new param_groups this wrapper shares again) and AGS's."""
        self.optim.load_state_dict(optimizer)
        self.param_groups = self.optim.param_groups
        self.load_ags_state_dict(ags)

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """The wrapped optimizer's state and AGS's, as one (torch's optimizer interface)."""
        return {"base": self.optim.state_dict(), "tula": self.ags_state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        self.optim.load_state_dict(state_dict["base"])
        self.load_ags_state_dict(state_dict["tula"])
