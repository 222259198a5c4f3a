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

from dataclasses import dataclass

import numpy as np
import pandas as pd

COST_COLUMNS = ("cost", "cost_worker_hour", "cost_node_hour", "cost_memory", "cost_to_accuracy")


@dataclass(frozen=True)
class Refit:
    factor: float  # r
    level: str  # "between nodes" or "within a node"
    observed_s: float
    predicted_s: float


def refit(pred: pd.DataFrame, workers: int, batch: int, observed_sync_s: float) -> tuple[pd.DataFrame, Refit]:
    """predictions.csv with sync (and step) re-fitted from the observed sync at (workers, batch)."""
    row = _row(pred, workers, batch)
    predicted = float(row["sync_time_s"])
    factor = observed_sync_s / predicted if predicted > 0 else np.inf
    multi = int(row["nodes"]) > 1
    out = pred.copy()
    same_level = (out["nodes"] > 1) if multi else ((out["nodes"] == 1) & (out["workers"] > 1))
    if not np.isfinite(factor):  # nothing predicted there: the observed sync itself, at every point of that level
        out.loc[same_level, "sync_time_s"] = observed_sync_s
    else:
        out.loc[same_level, "sync_time_s"] = out.loc[same_level, "sync_time_s"] * factor
    out["step_time_s"] = out["compute_time_s"] + out["sync_time_s"]
    return out, Refit(float(factor), "between nodes" if multi else "within a node", observed_sync_s, predicted)


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
        out["time_to_accuracy_s"] = out["epochs_to_accuracy"] * frac * out["steps_per_epoch"] * out["step_time_s"]
    return out


def _row(pred: pd.DataFrame, workers: int, batch: int) -> pd.Series:
    match = pred[(pred["workers"] == workers) & (pred["global_batch"] == batch)]
    if match.empty:
        raise ValueError(f"predictions.csv has no row for N={workers} B={batch}")
    return match.iloc[0]
