"""The user's way of training, built from torch's own parts: ``train.optimizer`` (any class of
``torch.optim`` by name, or an import path), its LR schedule (a linear warm-up, then ``step``,
``cosine``, ``onecycle``, ``constant`` or an import path: ``torch.optim.lr_scheduler``'s classes,
stepped every optimizer step), the EMA of the weights, and the config check's look at them
with the loss and the metric (:mod:`tula.runtime.train.loss_metric`). The probe, the production job
and the generalization suite build them here, from the same ``train`` section: one step,
whichever way it trains.

The methods (``train.method``) act on top: lrs and lars multiply the peak LR by
k = B / base_batch, reached by the warm-up from train.lr; AGS and static scaling wrap whichever
optimizer this builds (:class:`tula.runtime.train.optim.TulaOptimizer`).
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
from torch.optim import lr_scheduler
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from tula import model_inputs
from tula.config import ConfigError, TrainSettings
from tula.model.lrplan import LRPlan
from tula.runtime.input.data import import_callable
from tula.runtime.train.loss_metric import EpochMetric, build_loss, build_metric


def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """The class of ``torch.optim`` called ``name``, in any case; an unknown name is an error
    listing the ones torch has."""
    classes = {
        k.lower(): v
        for k, v in vars(torch.optim).items()
        if isinstance(v, type)
        and issubclass(v, torch.optim.Optimizer)
        and v is not torch.optim.Optimizer
    }
    if name.lower() not in classes:
        raise ConfigError(
            f"config key 'train.optimizer': torch.optim has no optimizer {name!r}; it has "
            f"{', '.join(sorted(classes))}, or give `package.module:callable` taking (params, lr)"
        )
    return classes[name.lower()]


def _as_args(args: dict[str, Any]) -> dict[str, Any]:
    """YAML's lists as the tuples torch's signatures name (``betas: [0.9, 0.99]``)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in args.items()}


# the layers whose parameters train.no_weight_decay's `norm` exempts (batch and instance norm
# are _NormBase's)
NORMS = (
    torch.nn.modules.batchnorm._NormBase,
    torch.nn.LayerNorm,
    torch.nn.GroupNorm,
    torch.nn.LocalResponseNorm,
    torch.nn.RMSNorm,
)
NAMED_ARGS = ("named_params", "named_parameters")  # a callable's first argument that takes names


def exempt_from_decay(t: TrainSettings, model: torch.nn.Module) -> set[str]:
    """The names of the parameters ``train.no_weight_decay`` exempts from weight decay."""
    spec, named = t.no_weight_decay, dict(model.named_parameters())
    if isinstance(spec, str):
        names = set(import_callable(spec, "train.no_weight_decay")(list(named.items())))
        unknown = sorted(names - set(named))
        if unknown:
            raise ConfigError(
                f"config key 'train.no_weight_decay': {spec} returned names the model has no "
                f"parameter of: {', '.join(map(repr, unknown[:5]))}"
            )
        return names
    out = set()
    if "norm" in spec:
        for prefix, m in model.named_modules():
            if isinstance(m, NORMS):
                out |= {
                    f"{prefix}.{n}" if prefix else n for n, _ in m.named_parameters(recurse=False)
                }
    if "bias" in spec:
        out |= {n for n in named if n.rsplit(".", 1)[-1] == "bias"}
    return out


def param_groups(t: TrainSettings, model: torch.nn.Module) -> list:
    """The optimizer's parameters: all of them (one group), or with ``train.no_weight_decay`` a
    group of the rest and one of the exempt at weight_decay 0."""
    named = list(model.named_parameters())
    exempt = exempt_from_decay(t, model) if t.no_weight_decay else set()
    if not exempt:
        return [p for _, p in named]
    decayed = [p for n, p in named if n not in exempt]
    groups = [{"params": decayed}] if decayed else []
    return groups + [{"params": [p for n, p in named if n in exempt], "weight_decay": 0.0}]


def build_optimizer(
    t: TrainSettings,
    params: torch.nn.Module | list[torch.nn.Parameter],
    lr: float,
    weight_decay: float,
) -> torch.optim.Optimizer:
    """``train.optimizer`` over ``params`` (a model: its :func:`param_groups`; or a list of
    parameters) at ``lr``: train.weight_decay and, where the class takes it, train.momentum,
    then ``optimizer_args``. The default, SGD, is fused (one kernel for the update, and it
    honours AGS's skip of a non-finite step on the device). A callable whose first argument is
    named ``named_params`` gets the model's (name, parameter) pairs."""
    args = _as_args(t.optimizer_args)
    model = params if isinstance(params, torch.nn.Module) else None
    if model is None and t.no_weight_decay:
        raise ValueError("train.no_weight_decay needs the model, not a list of parameters")
    params = param_groups(t, model) if model is not None else list(params)
    if ":" in t.optimizer:
        fn = import_callable(t.optimizer, "train.optimizer")
        first = next(iter(inspect.signature(fn).parameters), "")
        if first in NAMED_ARGS:
            if model is None:
                raise ValueError(f"train.optimizer {t.optimizer} takes names: give the model")
            opt = fn(list(model.named_parameters()), lr, **args)
        else:
            opt = fn(params, lr, **args)
        if not isinstance(opt, torch.optim.Optimizer):
            raise ConfigError(
                f"config key 'train.optimizer': {t.optimizer} returned a "
                f"{type(opt).__name__}, not a torch.optim.Optimizer"
            )
        return opt
    cls = optimizer_class(t.optimizer)
    takes = inspect.signature(cls.__init__).parameters
    unknown = sorted(set(args) - set(takes))
    if unknown:
        raise ConfigError(
            f"config key 'train.optimizer_args': torch.optim.{cls.__name__} takes no "
            f"{', '.join(map(repr, unknown))} (it takes "
            f"{', '.join(k for k in takes if k not in ('self', 'params', 'lr'))})"
        )
    own: dict[str, Any] = {"weight_decay": weight_decay} if "weight_decay" in takes else {}
    if "momentum" in takes:
        own["momentum"] = t.momentum
    if cls is torch.optim.SGD and "foreach" not in args:
        own["fused"] = True
    try:
        return cls(params, lr=lr, **{**own, **args})
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"config key 'train.optimizer_args': torch.optim.{cls.__name__} refused them: {exc}"
        ) from None


def scales_update(opt: torch.optim.Optimizer) -> bool:
    """Whether AGS scales the update the optimizer computes rather than its gradient: for every
    optimizer but SGD. An adaptive one (Adam, AdamW, RMSprop, ...) divides by its running
    gradient magnitude, which a slowly changing per-parameter factor on the gradient would
    largely cancel; SGD's update is the gradient (through momentum), so it is scaled there, as
    Algorithm 1 says."""
    return not isinstance(opt, torch.optim.SGD)


class Schedule:
    """The LR schedule of a run: a linear warm-up of ``warmup_epochs`` (LinearLR), then
    ``train.schedule`` over the steps left (SequentialLR), stepped once per optimizer step.
    It stops stepping at ``total_steps`` (the LR stays at its last value): a probe may run more
    steps than a tiny run has, and OneCycleLR refuses a step past its end. Its state is the
    torch scheduler's own ``state_dict`` and the steps taken."""

    def __init__(
        self,
        opt: torch.optim.Optimizer,
        plan: LRPlan,
        global_batch: int,
        steps_per_epoch: int,
        total_steps: int,
    ):
        k = plan.k(global_batch)
        for g in opt.param_groups:  # built again at another B (a relaunch): the new peak
            g["lr"] = g["initial_lr"] = plan.peak(global_batch)
        self.total = max(int(total_steps), 1)
        w = plan.warmup_epochs
        self.warm = min(round(w * steps_per_epoch), self.total) if w > 0 else 0
        main = _main_schedule(opt, plan, steps_per_epoch, self.total - self.warm, self.warm)
        if self.warm:
            start = 1.0 / k if plan.linear_scaling else 1.0 / self.warm
            self.torch = lr_scheduler.SequentialLR(
                opt, [_warm_up(opt, start, self.warm), main], milestones=[self.warm]
            )
        else:
            self.torch = main
        self.steps = 0

    def step(self) -> None:
        if self.steps < self.total:
            self.torch.step()
            self.steps += 1

    def fast_forward(self, steps: int) -> None:
        """Steps taken without training: a relaunch at another B continues the schedule where
        its epochs stand, built again at the new batch."""
        for _ in range(min(steps, self.total)):
            self.step()

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "scheduler": self.torch.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.torch.load_state_dict(state["scheduler"])
        self.steps = int(state["steps"])


def _warm_up(opt: torch.optim.Optimizer, start: float, steps: int) -> lr_scheduler.LRScheduler:
    """From ``start`` times the peak LR to the peak, linearly, over ``steps``. LinearLR takes a
    start up to 1; lrs and lars below base_batch (k < 1) warm *down* from train.lr, a line
    LambdaLR draws."""
    if start <= 1.0:
        return lr_scheduler.LinearLR(opt, start_factor=start, end_factor=1.0, total_iters=steps)
    return lr_scheduler.LambdaLR(opt, lambda s: start + (1.0 - start) * min(1.0, s / steps))


def _main_schedule(
    opt: torch.optim.Optimizer, plan: LRPlan, steps_per_epoch: int, steps: int, offset: int
) -> lr_scheduler.LRScheduler:
    """``train.schedule`` over ``steps`` (the run's steps after a warm-up of ``offset``)."""
    args = _as_args(plan.schedule_args)
    steps = max(steps, 1)
    try:
        if plan.schedule == "step":  # the decay epochs count from the run's start
            miles = [max(e * steps_per_epoch - offset, 1) for e in plan.decay_epochs]
            return lr_scheduler.MultiStepLR(opt, miles, gamma=plan.decay_factor, **args)
        if plan.schedule == "cosine":
            return lr_scheduler.CosineAnnealingLR(opt, T_max=steps, **args)
        if plan.schedule == "onecycle":
            peak = opt.param_groups[0]["lr"]
            return lr_scheduler.OneCycleLR(opt, max_lr=peak, total_steps=steps, **args)
        if plan.schedule == "constant":
            return lr_scheduler.ConstantLR(opt, factor=1.0, total_iters=0, **args)
    except TypeError as exc:
        raise ConfigError(f"config key 'train.schedule_args': {plan.schedule}: {exc}") from None
    fn = import_callable(plan.schedule, "train.schedule")
    sched = fn(opt, steps, **args)
    if not isinstance(sched, lr_scheduler.LRScheduler):
        raise ConfigError(
            f"config key 'train.schedule': {plan.schedule} returned a {type(sched).__name__}, "
            "not a torch.optim.lr_scheduler.LRScheduler"
        )
    return sched


class WeightsEMA:
    """``train.ema_decay``: an exponential moving average of the model's weights and buffers
    (torch's ``AveragedModel`` with ``get_ema_multi_avg_fn``: ema <- d * ema + (1 - d) * w),
    updated after every optimizer step, evaluated beside the raw weights and checkpointed."""

    def __init__(self, live: torch.nn.Module, decay: float):
        self.live = live
        avg = get_ema_multi_avg_fn(decay)
        self.averaged = AveragedModel(live, multi_avg_fn=avg, use_buffers=True).eval()

    @property
    def module(self) -> torch.nn.Module:
        """The averaged model itself (evaluation's forward; the weights saved at the end)."""
        return self.averaged.module

    def update(self) -> None:
        self.averaged.update_parameters(self.live)

    def state_dict(self) -> dict[str, Any]:
        return self.averaged.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.averaged.load_state_dict(state)


def build_ema(t: TrainSettings, live: torch.nn.Module) -> WeightsEMA | None:
    return WeightsEMA(live, t.ema_decay) if t.ema_decay is not None else None


def check(t: TrainSettings, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    """The config check's look at the way of training, before any job: the optimizer built on
    the model's parameters (a name or an argument torch does not take is named), its schedule
    built and stepped through a short run, and the loss and the metric on the model's outputs
    for real samples. Returns what ``results/workload.json`` says of it."""
    opt = build_optimizer(t, model, t.lr, t.weight_decay)
    sched = Schedule(opt, model_inputs.lr_plan(t), t.base_batch, 4, 12)
    out = model(x)
    loss = build_loss(t)(out, y)
    if not isinstance(loss, torch.Tensor) or loss.ndim != 0 or not loss.requires_grad:
        raise ConfigError(
            f"config key 'train.loss': {t.loss} must return a scalar tensor with a gradient, "
            f"got {type(loss).__name__} {tuple(getattr(loss, 'shape', ()))}"
        )
    metric_of = build_metric(t)
    metric = float(metric_of(out.detach(), y)) / len(y)
    if isinstance(metric_of, EpochMetric):
        metric = metric_of.compute()
    if not math.isfinite(metric):
        raise ConfigError(f"config key 'train.metric': {t.metric} gave {metric} on real samples")
    for _ in range(12):
        opt.step()  # no gradient: nothing moves; the schedule's order of calls is torch's
        sched.step()
    return {**t.recipe(), "optimizer": type(opt).__name__}
