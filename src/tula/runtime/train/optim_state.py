"""Any optimizer's state, whichever one ``train.optimizer`` built and whether AGS or static
scaling wraps it: the parts a checkpoint holds and their owners' loading
(:func:`optimizer_parts`, :func:`load_optimizer_parts`), a wrapper's parameter groups linked
again after a load (:func:`load_optimizer_state`), and every tensor it keeps between steps,
the optimizer term of Eq. 3 (:func:`state_tensors`)."""

from __future__ import annotations

from typing import Any

import torch

from tula.runtime.train.optim import TulaOptimizer


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


def optimizer_parts(opt: torch.optim.Optimizer) -> dict[str, Any]:
    """A checkpoint's optimizer parts, each written by its owner: ``optimizer``, the optimizer
    ``train.optimizer`` built (under AGS or static scaling, the one they wrap), and ``ags``,
    :meth:`TulaOptimizer.ags_state_dict` (None for the other methods)."""
    if isinstance(opt, TulaOptimizer):
        return {"optimizer": opt.optim.state_dict(), "ags": opt.ags_state_dict()}
    return {"optimizer": opt.state_dict(), "ags": None}


def load_optimizer_parts(opt: torch.optim.Optimizer, parts: dict[str, Any]) -> None:
    """:func:`optimizer_parts` put back, each by its owner's ``load_state_dict``."""
    if isinstance(opt, TulaOptimizer):
        opt.load_parts(parts["optimizer"], parts["ags"])
    else:
        load_optimizer_state(opt, parts["optimizer"])


def state_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor the optimizer keeps between steps (the optimizer term of Eq. 3): the
    wrapped optimizer's per-parameter state (momentum, Adam's moments) and AGS's factors."""
    out = [v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)]
    if isinstance(opt, TulaOptimizer):
        out += list(opt.factors.values())
    return out
