"""Configuration selection (§III-A.3), pure on predictions.csv's frame: what ``tula select``
writes and what ``tula launch`` re-plans with. Objective objective ``time``, ``cost``, ``knee``,
``time_to_accuracy`` or ``cost_to_accuracy``, under the user's constraints (one function per
objective: :func:`_minimum`, :func:`_knee`, :func:`_to_accuracy`).

Candidates are the feasible grid points (memory model, no OOM probe) inside the user's
constraints (min/max N, min/max B). `time` and `cost` take the minimum of T or C.

`knee` looks at the *envelope* of the curves: for each B, the best N. Two rules
(config key `knee_rule`), both answers recorded in selection.json:

- `marginal` (default): the smallest B beyond which every doubling of B saves less than
  `knee_gain` (10 %) of T (or C). It reads "more batch stops paying" literally and does not
  move when the batch range changes. When T still falls by more than knee_gain at the
  largest B, the knee lies beyond the grid: the largest B is chosen and the reason says so.
- `kneedle`: the paper's Kneedle (the `kneed` package) on x = B (linear axis), y = T,
  curve convex, direction decreasing. Kneedle normalises x to [0, 1], so on T ~ a/B + c its
  knee is set by the batch range (kneed issue #170, "by design"). When it finds no knee
  the selection falls back to the fastest point and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from tula.model import noise
from tula.model.inputs import Goal, Planning
from tula.model.pricing import UNITS
from tula.model.selection import WAIT, Point, Selection

# objective time_to_result: the queue's expected wait (WAIT, tula.slurm.queue) plus T
TO_RESULT = "time_to_result_s"


class NoFeasibleConfiguration(ValueError):
    pass


def candidates(pred: pd.DataFrame, goal: Goal) -> tuple[pd.DataFrame, dict[str, int]]:
    c = goal.bounds
    keep = pred["feasible"].astype(bool)
    excluded = {"infeasible_memory_or_oom": int((~keep).sum())}
    for name, mask in (
        ("below_min_workers", pred["workers"] < c.min_workers if c.min_workers else None),
        ("above_max_workers", pred["workers"] > c.max_workers if c.max_workers else None),
        ("below_min_batch", pred["global_batch"] < c.min_batch if c.min_batch else None),
        ("above_max_batch", pred["global_batch"] > c.max_batch if c.max_batch else None),
    ):
        if mask is not None:
            excluded[name] = int((keep & mask).sum())
            keep &= ~mask
    return pred[keep].copy(), excluded


def knee_of(batches: np.ndarray, times: np.ndarray) -> int | None:
    """Global batch at the Kneedle knee of T(B), or None when there is none."""
    if len(batches) < 3 or np.allclose(times, times[0]):
        return None
    # imported here: kneed brings scipy.signal and matplotlib (about 2 s), which every
    # `snakemake` parse (and each SLURM job's) would pay through the workflow's imports
    from kneed import KneeLocator

    kl = KneeLocator(batches.astype(float), times, curve="convex", direction="decreasing")
    if kl.knee is None:
        return None
    return int(round(kl.knee))


def doubling_gains(batches: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Fraction of T (or C) saved per doubling of B between consecutive envelope points
    (a gap of k doublings counts as k equal steps); negative where it grows."""
    b, y = np.asarray(batches, float), np.asarray(values, float)
    doublings = np.log2(b[1:] / b[:-1])
    return 1.0 - (y[1:] / y[:-1]) ** (1.0 / doublings)


def marginal_knee(batches: np.ndarray, values: np.ndarray, gain: float) -> tuple[int, bool]:
    """(B, flattened): the smallest B beyond which every doubling saves less than ``gain``;
    flattened is False when even the last doubling still saves ``gain`` or more (then B is
    the largest batch: the knee lies beyond the grid)."""
    b = np.asarray(batches)
    if len(b) < 2:
        return int(b[0]), False
    g = doubling_gains(b, values)
    i = len(g)
    while i > 0 and g[i - 1] < gain:
        i -= 1
    return int(b[i]), i < len(g)


def _envelope(cand: pd.DataFrame, col: str) -> pd.DataFrame:
    """For each B, the candidate with the smallest ``col`` (T or C)."""
    idx = cand.groupby("global_batch")[col].idxmin()
    return cand.loc[idx].sort_values("global_batch")


@dataclass
class Choice:
    """What an objective chose: the point, the runner-up, why, and its own block of
    selection.json (``knee`` or ``noise``), if any."""

    best: pd.Series
    runner: pd.Series | None
    reason: str
    block: dict[str, Any] = field(default_factory=dict)


def _minimum(pred: pd.DataFrame, cand: pd.DataFrame, goal: Goal, currency: str) -> Choice:
    """Objective time, cost or time_to_result: the least predicted T, C, or wait + T (T
    alone where no wait is known)."""
    col, what, unit = {
        "time": ("train_time_s", "training time T", "s"),
        "cost": ("cost", "cost C", currency),
    }.get(goal.objective, ("train_time_s", "training time T (no queue wait known)", "s"))
    if goal.objective == "time_to_result" and WAIT in cand.columns:
        cand = cand.assign(**{TO_RESULT: cand["train_time_s"] + cand[WAIT].fillna(0.0)})
        col, what = TO_RESULT, "queue wait + training time"
    ranked = cand.sort_values([col, "workers", "global_batch"])
    best, runner = ranked.iloc[0], ranked.iloc[1] if len(ranked) > 1 else None
    reason = f"minimum {what}: {best[col]:.4g} {unit}"
    if runner is not None:
        reason += (
            f"; runner-up N={int(runner['workers'])} B={int(runner['global_batch'])} at "
            f"{runner[col]:.4g} {unit}"
        )
    return Choice(best, runner, reason)


def _knee(pred: pd.DataFrame, cand: pd.DataFrame, goal: Goal, currency: str) -> Choice:
    """Objective knee: on the best-N envelope of T (or C) vs B, the marginal rule's or
    Kneedle's knee (``knee_rule``), both recorded."""
    col, name, unit = (
        ("cost", "C", currency) if goal.knee_on == "cost" else ("train_time_s", "T", "s")
    )
    env = _envelope(cand, col)
    b, y = env["global_batch"].to_numpy(), env[col].to_numpy()
    kneedle_b = knee_of(b, y)
    marginal_b, flattened = marginal_knee(b, y, goal.knee_gain)
    gains = doubling_gains(b, y) if len(b) > 1 else np.array([])
    knee_b = marginal_b if goal.knee_rule == "marginal" else kneedle_b
    block = _knee_block(cand, goal, col, name, env, gains, knee_b, kneedle_b, marginal_b, flattened)
    if knee_b is None:
        best = env.sort_values(col).iloc[0]
        return Choice(
            best,
            None,
            f"no Kneedle knee on the {name}-vs-B curve (fewer than three batch sizes, or no "
            f"bend); fell back to the best point, {name} = {best[col]:.4g} {unit}",
            block,
        )
    pos = int(np.flatnonzero(b == knee_b)[0])
    best = env.iloc[pos]
    runner = env.iloc[pos + 1] if pos + 1 < len(env) else (env.iloc[pos - 1] if pos > 0 else None)
    reason = _knee_reason(goal, name, unit, b, gains, pos, best[col], env[col].min(), flattened)
    if kneedle_b is not None and kneedle_b != marginal_b:
        other = "Kneedle" if goal.knee_rule == "marginal" else "the marginal rule"
        reason += (
            f" ({other} would pick B={kneedle_b if goal.knee_rule == 'marginal' else marginal_b})"
        )
    return Choice(best, runner, reason, block)


def _knee_block(
    cand, goal, col, name, env, gains, knee_b, kneedle_b, marginal_b, flattened
) -> dict[str, Any]:
    """selection.json's ``knee``: both rules' answers, per N too, and the envelope with its
    gains."""
    per_nodes = {}
    for n, g in cand.sort_values("global_batch").groupby("workers"):
        gb, gy = g["global_batch"].to_numpy(), g[col].to_numpy()
        per_nodes[str(int(n))] = {
            "marginal": marginal_knee(gb, gy, goal.knee_gain)[0],
            "kneedle": knee_of(gb, gy),
        }
    return {
        "rule": goal.knee_rule,
        "on": f"{col} (best N per B)",
        "global_batch": knee_b,
        "found": knee_b is not None,
        "marginal": {
            "global_batch": marginal_b,
            "gain_threshold": goal.knee_gain,
            "flattened": flattened,
            "rule": "smallest B beyond which every doubling saves "
            f"< {100 * goal.knee_gain:g} % of {name}",
        },
        "kneedle": {
            "global_batch": kneedle_b,
            "found": kneedle_b is not None,
            "method": "kneed.KneeLocator(curve='convex', direction='decreasing'), "
            "x = B (linear axis)",
        },
        "per_nodes": per_nodes,
        "envelope": [
            {
                "global_batch": int(r["global_batch"]),
                "workers": int(r["workers"]),
                col: float(r[col]),
                "gain_of_next_doubling": float(gains[i]) if i < len(gains) else None,
            }
            for i, (_, r) in enumerate(env.iterrows())
        ],
    }


def _knee_reason(goal, name, unit, b, gains, pos, value, lowest, flattened) -> str:
    above = f"{100 * (value / lowest - 1):.1f} % above the lowest point ({lowest:.4g} {unit})"
    knee_b = int(b[pos])
    if goal.knee_rule == "kneedle":
        reason = f"Kneedle knee of {name} vs B at B={knee_b}: {name} = {value:.4g} {unit}, {above}"
        if pos < len(gains):
            reason += f"; doubling to B={int(b[pos + 1])} would save {100 * gains[pos]:.1f} %"
        return reason
    if not len(gains):
        return f"a single batch size: B={knee_b}, {name} = {value:.4g} {unit}"
    if not flattened:
        return (
            f"{name} still falls by {100 * gains[-1]:.1f} % (>= {100 * goal.knee_gain:g} %) on the "
            f"last doubling, to B={knee_b}: the knee lies beyond the grid, so the largest B is "
            f"chosen ({name} = {value:.4g} {unit}); raise grid.batch_max to find it"
        )
    reason = (
        f"knee at B={knee_b}: doubling to B={int(b[pos + 1])} saves {100 * gains[pos]:.1f} % of "
        f"{name} (< {100 * goal.knee_gain:g} %)"
    )
    if pos + 1 < len(gains):
        reason += (
            f", and no further doubling saves more than {100 * max(gains[pos + 1 :].max(), 0):.1f} "
            "%"
        )
    if pos > 0:
        reason += f"; the doubling from B={int(b[pos - 1])} saved {100 * gains[pos - 1]:.1f} %"
    return reason + f". {name} = {value:.4g} {unit}, {above}"


TO_ACCURACY = {
    "time_to_accuracy": ("time_to_accuracy_s", "time to accuracy", "s", "slower"),
    "cost_to_accuracy": ("cost_to_accuracy", "cost to accuracy", None, "dearer"),
}


def _accuracy_assumption(goal: Goal) -> str:
    """What time (cost) to accuracy assumes, in words for selection.json and the report."""
    b0 = goal.base_batch
    return (
        f"workload.epochs ({goal.epochs}) reach the target accuracy at "
        f"train.base_batch ({b0}); a batch B needs (1 + B/B_noise)/(1 + {b0}/B_noise) times "
        "those epochs (McCandlish et al. 2018). B_noise is measured by the probes near the start "
        "of training; it usually grows as training goes on, so later in training larger batches "
        "pay off more than predicted here"
    )


def _to_accuracy(pred: pd.DataFrame, cand: pd.DataFrame, goal: Goal, currency: str) -> Choice:
    """Objective time_to_accuracy / cost_to_accuracy: the least predicted time (cost) to the
    accuracy that workload.epochs reach at train.base_batch, with the gradient noise scale
    (tula.stages.predict); its block is selection.json's ``noise``."""
    col, what, unit, worse = TO_ACCURACY[goal.objective]
    unit = unit or currency
    if col not in cand.columns or cand[col].isna().all():
        raise ValueError(
            f"config key 'objective': {goal.objective} needs the gradient noise scale, which no "
            "probe gave: it comes from multi-worker probes (a grid.workers value >= 2) with "
            "probe.noise_steps > 0, and needs a positive |G|^2 estimate; use objective time, cost "
            "or knee otherwise"
        )
    ranked = cand.sort_values([col, "workers", "global_batch"])
    best, runner = ranked.iloc[0], ranked.iloc[1] if len(ranked) > 1 else None
    bn, b = float(best["b_noise"]), int(best["global_batch"])

    def at(row) -> dict[str, Any]:
        return {
            "workers": int(row["workers"]),
            "global_batch": int(row["global_batch"]),
            col: float(row[col]),
            "ratio_to_chosen": float(row[col] / best[col]),
            "statistical_efficiency": noise.statistical_efficiency(float(row["global_batch"]), bn),
        }

    versus = {}
    for other in ("time", "knee"):
        pick = OBJECTIVES[other](pred, cand, replace(goal, objective=other), currency).best
        same = (cand["workers"] == pick["workers"]) & (cand["global_batch"] == pick["global_batch"])
        versus[other] = at(cand[same].iloc[0])
    block = {
        "b_noise": bn,
        "b_noise_se": float(best["b_noise_se"]),
        "critical_batch": bn,
        "chosen_over_critical": b / bn,
        "statistical_efficiency": noise.statistical_efficiency(b, bn),
        "epochs_to_accuracy": float(best["epochs_to_accuracy"]),
        "versus": versus,
        "assumption": _accuracy_assumption(goal),
    }
    reason = (
        f"minimum predicted {what}: {best[col]:.4g} {unit} ({best['epochs_to_accuracy']:.3g} "
        f"epochs at B={b}); gradient noise scale B_noise = {bn:.0f} ± {block['b_noise_se']:.0f} "
        f"(the critical batch), B = {b / bn:.2f}x B_noise, statistical efficiency "
        f"{100 * block['statistical_efficiency']:.0f} %"
    )
    for other, v in versus.items():
        if (v["workers"], v["global_batch"]) != (int(best["workers"]), b):
            reason += (
                f"; objective {other} would pick N={v['workers']} B={v['global_batch']}, "
                f"{100 * (v['ratio_to_chosen'] - 1):.0f} % {worse} to accuracy"
            )
        else:
            reason += f"; objective {other} picks the same point"
    return Choice(best, runner, reason, block)


OBJECTIVES = {
    "time": _minimum,
    "cost": _minimum,
    "time_to_result": _minimum,
    "knee": _knee,
    "time_to_accuracy": _to_accuracy,
    "cost_to_accuracy": _to_accuracy,
}
BLOCK_NAME = {"knee": "knee", "time_to_accuracy": "noise", "cost_to_accuracy": "noise"}


def select(pred: pd.DataFrame, plan: Planning) -> Selection:
    """selection.json: the point ``objective`` chooses among the feasible candidates inside
    the constraints, the runner-up, why, the objective's own block and the price."""
    goal, price = plan.goal, plan.price
    cand, excluded = candidates(pred, goal)
    if cand.empty:
        raise NoFeasibleConfiguration(
            "no feasible configuration: every grid point is excluded "
            f"({', '.join(f'{k}: {v}' for k, v in excluded.items() if v)}). Widen the grid "
            "(grid.workers, grid.batch_min/batch_max), relax `constraints`, or raise "
            "hardware.device_memory_gb."
        )
    cur = price.currency
    choice = OBJECTIVES[goal.objective](pred, cand, goal, cur)
    block = {BLOCK_NAME[goal.objective]: choice.block} if goal.objective in BLOCK_NAME else {}
    out = Selection(
        objective=goal.objective,
        candidates=int(len(cand)),
        excluded=excluded,
        selected=Point.of_row(choice.best, cur),
        runner_up=Point.of_row(choice.runner, cur) if choice.runner is not None else None,
        reason=choice.reason,
        pricing={
            "model": price.model,
            "unit": UNITS[price.model],
            "per_worker_hour": price.per_worker_hour,
            "per_node_hour": price.per_node_hour,
            "per_gb_hour": price.per_gb_hour,
            "currency": cur,
            "workers_per_node": price.workers_per_node,
        },
        **block,
    )
    if not math.isfinite(out.selected.train_time_s):
        raise ValueError(
            "selection: the selected point has no finite predicted time; check "
            "results/model/perf.json"
        )
    return out
