"""Re-plan on drift: the sync part re-fitted with the production job's own
observations, and the grid re-predicted for the work that is left.

The re-fit keeps the compute part (Eq. 4's compute curve: it was measured on the same
devices, and compute-only steps in production confirm it) and scales the sync part of the
network level that drifted by what the job observed against what was predicted for it:

    r = observed sync / predicted sync   at the job's (N, B)

- the job spans several nodes: the link between nodes drifted; every multi-node point's
  sync is scaled by r (its within-node part too: one number cannot tell the two apart, so
  this over-states the slowdown of multi-node points a little — it errs toward moving in,
  not out, which a later drift back corrects);
- the job runs on one node: the node's own interconnect drifted; every multi-worker point
  on one node is scaled by r, multi-node points are left as predicted.

One worker pays no sync and is never scaled. The remaining work is ``epochs_left`` of
``workload.epochs`` at every point's own steps per epoch; T, the costs and the
time-to-accuracy columns are rescaled to it (all are linear in time), so ``tula select``'s
objectives and constraints choose among them as they did before training.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from tula.model.choice import NoFeasibleConfiguration, select
from tula.model.inputs import Planning

COST_COLUMNS = ("cost", "cost_worker_hour", "cost_node_hour", "cost_memory", "cost_to_accuracy")


@dataclass(frozen=True)
class Refit:
    factor: float  # r
    level: str  # "between nodes" or "within a node"
    observed_s: float
    predicted_s: float


def refit(
    pred: pd.DataFrame, workers: int, batch: int, observed_sync_s: float
) -> tuple[pd.DataFrame, Refit]:
    """predictions.csv with sync (and step) re-fitted from the observed sync at (workers, batch)."""
    row = _row(pred, workers, batch)
    predicted = float(row["sync_time_s"])
    factor = observed_sync_s / predicted if predicted > 0 else np.inf
    multi = int(row["nodes"]) > 1
    out = pred.copy()
    same_level = (out["nodes"] > 1) if multi else ((out["nodes"] == 1) & (out["workers"] > 1))
    # nothing predicted there: the observed sync itself, at every point of that level
    if not np.isfinite(factor):
        out.loc[same_level, "sync_time_s"] = observed_sync_s
    else:
        out.loc[same_level, "sync_time_s"] = out.loc[same_level, "sync_time_s"] * factor
    out["step_time_s"] = out["compute_time_s"] + out["sync_time_s"]
    return out, Refit(
        float(factor), "between nodes" if multi else "within a node", observed_sync_s, predicted
    )


def remaining(pred: pd.DataFrame, epochs_left: float) -> pd.DataFrame:
    """T, costs and time to accuracy of the work left (``epochs_left`` epochs) at every point."""
    out = pred.copy()
    old = out["train_time_s"].replace(0, np.nan)
    out["train_time_s"] = epochs_left * out["steps_per_epoch"] * out["step_time_s"]
    share = out["train_time_s"] / old
    for c in COST_COLUMNS:
        if c in out.columns:
            out[c] = out[c] * share
    if "time_to_accuracy_s" in out.columns:
        frac = epochs_left / out["epochs"]
        out["time_to_accuracy_s"] = (
            out["epochs_to_accuracy"] * frac * out["steps_per_epoch"] * out["step_time_s"]
        )
    return out


def _row(pred: pd.DataFrame, workers: int, batch: int) -> pd.Series:
    match = pred[(pred["workers"] == workers) & (pred["global_batch"] == batch)]
    if match.empty:
        raise ValueError(f"predictions.csv has no row for N={workers} B={batch}")
    return match.iloc[0]


# -- the decision: move or stay ---------------------------------------------------------
MARGIN = 0.10  # of the remaining time (or cost) at the current point
COST_OBJECTIVES = ("cost", "cost_to_accuracy")


@dataclass(frozen=True)
class Decision:
    move: bool
    workers: int
    global_batch: int
    reason: str
    saving: float  # share of what is left at the current point


def _chosen(plan: Planning, rest: pd.DataFrame, workers: int, batch: int) -> tuple[int, int]:
    """The (N, B) the objective chooses for the rest of training (the current one where
    nothing is feasible)."""
    try:
        return select(rest, plan).point
    except NoFeasibleConfiguration:
        return workers, batch


def _saving(
    rest: pd.DataFrame,
    plan: Planning,
    here: tuple[int, int],
    there: tuple[int, int],
    relaunch_s: float,
) -> float:
    """What training the rest at ``there`` instead of ``here`` saves, the relaunch paid, as a
    share of what is left at ``here`` (time, or cost for a cost objective)."""
    cur, to = _row(rest, *here), _row(rest, *there)
    col = "cost" if plan.goal.objective in COST_OBJECTIVES else "train_time_s"
    rate = (
        float(to["cost"] / to["train_time_s"]) if col == "cost" and to["train_time_s"] > 0 else 1.0
    )
    net = float(cur[col] - to[col]) - relaunch_s * rate
    return net / float(cur[col]) if cur[col] > 0 else 0.0


def _before(
    pred: pd.DataFrame, workers: int, batch: int, from_s: float | None, predicted_s: float
) -> pd.DataFrame:
    """The predictions as the job stood before a drift: as predicted, or, where the drift left a
    level an earlier drift set (``from_s``), re-fitted to that level."""
    if from_s is None or np.isclose(float(from_s), predicted_s):
        return pred
    return refit(pred, workers, batch, float(from_s))[0]


def decide(
    plan: Planning,
    pred: pd.DataFrame,
    workers: int,
    batch: int,
    drift: dict[str, Any],
    relaunch_s: float,
) -> Decision:
    """Re-selection on drift, for `tula launch` (launch.replan: move): where to train
    the rest after ``drift`` (a drift.json entry: observed_s, epochs_done), and whether moving
    there pays for the relaunch.

    The sync part is re-fitted from the job's own observations (:mod:`tula.model.refit`), the
    grid re-predicted for the epochs left, and ``tula select``'s own objective and constraints
    choose among it. The job moves when the chosen (N, B) finishes the rest sooner — or, for a
    cost objective, cheaper — than staying, once the relaunch is paid, by more than a margin
    on top of what the same move was predicted to save before the drift:

        saving - measured relaunch cost (submission to first step, from this run's attempts)
          >  MARGIN x what is left at the current point  +  the same move's saving undrifted

    so a prediction's own error (BENCHMARKS.md "Production confirms the prediction") cannot move
    it for nothing, nor a sync faster than predicted move it off a point that the predictions
    liked less already: a drift counts by what it changed. "Before" is the level the drift left
    (its ``from_s``): after an earlier drift, the level that one set, so a slowdown from a sync
    that had come out faster than predicted counts in full. Else it is recorded; the job goes on.
    """
    refitted, fit = refit(pred, workers, batch, float(drift["observed_s"]))
    left = max(plan.goal.epochs - float(drift["epochs_done"]), 0.0)
    rest = remaining(refitted, left)
    head = (
        f"{drift['reason']}; re-fitted sync {fit.level} x{fit.factor:.2f}, {left:.2f} epochs left: "
    )
    what = "cost" if plan.goal.objective in COST_OBJECTIVES else "time"
    n2, b2 = _chosen(plan, rest, workers, batch)
    if (n2, b2) == (workers, batch):
        still = f"N={workers} B={batch} is still the {plan.goal.objective} choice; stayed"
        return Decision(False, workers, batch, head + still, 0.0)
    saving = _saving(rest, plan, (workers, batch), (n2, b2), relaunch_s)
    was = _before(pred, workers, batch, drift.get("from_s"), fit.predicted_s)
    before = max(_saving(remaining(was, left), plan, (workers, batch), (n2, b2), relaunch_s), 0.0)
    if saving <= MARGIN + before:
        undrifted = (
            f", {100 * before:.0f} % of it predicted before the drift: the drift adds "
            f"{100 * (saving - before):.0f} %,"
            if before > 0
            else ""
        )
        why = (
            f"N={n2} B={b2} would save {100 * saving:.0f} % of the remaining {what} after the "
            f"relaunch ({relaunch_s:.0f} s){undrifted} not more than the {100 * MARGIN:.0f} % "
            "margin; stayed"
        )
        return Decision(False, workers, batch, head + why, saving)
    why = (
        f"moved from N={workers} B={batch} to N={n2} B={b2}, predicted to save "
        f"{100 * saving:.0f} % of the remaining {what} (relaunch {relaunch_s:.0f} s included)"
    )
    return Decision(True, n2, b2, head + why, saving)


def onto(
    plan: Planning, pred: pd.DataFrame, workers: int, batch: int, allowed: list[int]
) -> Decision:
    """Where to train the rest when N = ``workers`` cannot run any more (a node lost) and only
    the worker counts ``allowed`` can: ``tula select``'s own objective among the predictions at
    those N. A constraint on N that cannot hold there is dropped, and the reason says so. Every
    point trains the same epochs that are left, so the choice over whole-run predictions is the
    choice for the rest."""
    rest = pred[pred["workers"].isin(allowed)]
    c, dropped = plan.goal.bounds, []
    if c.min_workers and not (rest["workers"] >= c.min_workers).any():
        dropped.append(f"constraints.min_workers={c.min_workers}")
        c = replace(c, min_workers=None)
    n2, b2 = select(rest, replace(plan, goal=replace(plan.goal, bounds=c))).point
    why = (
        f"N={workers} B={batch} cannot run on the nodes left (N <= {max(allowed)} can); "
        f"re-planned to N={n2} B={b2}, the {plan.goal.objective} choice among the predictions there"
        + (f" ({', '.join(dropped)} cannot hold on them: dropped for the rest)" if dropped else "")
    )
    return Decision(True, n2, b2, why, 0.0)
