"""The equations' inputs (:mod:`tula.model.inputs`) built from a validated config: the one place
that reads config sections for :mod:`tula.model`, so that no equation takes the whole config.
Every stage, the runtime and the production job build what they pass from here."""

from __future__ import annotations

from tula.config import Config, TrainSettings
from tula.model.inputs import (
    Bounds,
    Device,
    Goal,
    GridSpec,
    JobExtras,
    Planning,
    Price,
    ProbeSteps,
)
from tula.model.lrplan import LINEAR_SCALING, LRPlan


def grid_spec(cfg: Config) -> GridSpec:
    return GridSpec(
        tuple(cfg.grid.workers),
        cfg.grid.batch_min,
        cfg.grid.batch_max,
        cfg.cluster.workers_per_node,
        cfg.search,
        swept=not cfg.workload.script,  # a script runs its one batch: no sweep between points
        # a user's script accumulates (or not) on its own
        accumulate=1 if cfg.workload.script else cfg.train.accumulate,
    )


def price(cfg: Config) -> Price:
    p = cfg.pricing
    return Price(
        model=p.model,
        per_worker_hour=p.per_worker_hour,
        per_node_hour=p.per_node_hour,
        per_gb_hour=p.per_gb_hour,
        currency=p.currency,
        workers_per_node=cfg.cluster.workers_per_node,
    )


def goal(cfg: Config) -> Goal:
    c = cfg.constraints
    return Goal(
        objective=cfg.objective,
        knee_on=cfg.knee_on,
        knee_rule=cfg.knee_rule,
        knee_gain=cfg.knee_gain,
        bounds=Bounds(c.min_workers, c.max_workers, c.min_batch, c.max_batch),
        epochs=cfg.workload.epochs,
        base_batch=cfg.train.base_batch,
    )


def planning(cfg: Config) -> Planning:
    """The grid, price, goal and job extras every prediction and choice of ``cfg`` rests on."""
    return Planning(
        grid_spec(cfg),
        price(cfg),
        goal(cfg),
        JobExtras(
            cfg.launch.checkpoint_every_steps,
            cfg.launch.checkpoint_every_epochs,
            cfg.train.compile != "off",
        ),
    )


def device(cfg: Config) -> Device:
    return Device(cfg.hardware.memory_budget_bytes, cfg.hardware.gpu, cfg.train.precision)


def probe_steps(cfg: Config) -> ProbeSteps:
    p = cfg.probe
    batches = tuple(p.memory_batches) if p.memory_batches else None
    return ProbeSteps(p.warmup_steps, p.timed_steps, p.timeout_s, p.precision, batches)


def lr_plan(t: TrainSettings) -> LRPlan:
    """The LR schedule's data, resolved from ``train`` once."""
    return LRPlan(
        t.lr,
        t.method in LINEAR_SCALING,
        t.base_batch,
        t.warmup,
        t.schedule,
        dict(t.schedule_args),
        tuple(t.lr_decay_epochs),
        t.lr_decay_factor,
    )


def lr_at(cfg: Config, global_batch: int) -> float:
    """The LR a user's script is given at global batch B (``{lr}``): train.lr, scaled by the
    method's rule (lrs, lars: B / base_batch)."""
    return lr_plan(cfg.train).peak(global_batch)
