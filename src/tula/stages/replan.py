"""`tula launch` on a drift the job reported (launch.replan: move; issue 23): re-fit, re-predict,
re-select for the work that is left, and move only if it pays for the relaunch.

The sync part is re-fitted from the job's own observations (:mod:`tula.model.refit`), the
grid re-predicted for the epochs left, and ``tula select``'s own objective and constraints
choose among it. The job moves when the chosen (N, B) finishes the rest sooner — or, for a
cost objective, cheaper — than staying, once the relaunch is paid, by more than a margin:

    saving - measured relaunch cost (submission to first step, from this run's attempts)
      >  MARGIN x what is left at the current point

so a prediction's own error (BENCHMARKS.md: production within about 0.9-1.2x) cannot
make it move for nothing. Otherwise the drift is recorded and the job goes on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tula.config import Config
from tula.model import refit as refit_mod
from tula.stages import select as select_mod

MARGIN = 0.10  # of the remaining time (or cost) at the current point
COST_OBJECTIVES = ("cost", "cost_to_accuracy")


@dataclass(frozen=True)
class Decision:
    move: bool
    workers: int
    global_batch: int
    reason: str
    saving: float  # share of what is left at the current point


def decide(cfg: Config, predictions: str | Path, workers: int, batch: int, drift: dict[str, Any],
           relaunch_s: float) -> Decision:  # fmt: skip
    """Where to train the rest after ``drift`` (a drift.json entry: observed_s, epochs_done)."""
    pred = pd.read_csv(predictions)
    refitted, fit = refit_mod.refit(pred, workers, batch, float(drift["observed_s"]))
    left = max(cfg.workload.epochs - float(drift["epochs_done"]), 0.0)
    rest = refit_mod.remaining(refitted, left)
    cur = rest[(rest["workers"] == workers) & (rest["global_batch"] == batch)].iloc[0]
    try:
        chosen = select_mod.select(rest, cfg)["selected"]
    except select_mod.NoFeasibleConfiguration:
        chosen = {"workers": workers, "global_batch": batch}
    to = rest[(rest["workers"] == chosen["workers"]) & (rest["global_batch"] == chosen["global_batch"])].iloc[0]
    col = "cost" if cfg.objective in COST_OBJECTIVES else "train_time_s"
    rate = float(to["cost"] / to["train_time_s"]) if col == "cost" and to["train_time_s"] > 0 else 1.0
    net = float(cur[col] - to[col]) - relaunch_s * rate  # what moving saves, the relaunch paid
    head = (f"{drift['reason']}; re-fitted sync {fit.level} x{fit.factor:.2f}, {left:.2f} epochs left: ")
    what = "time" if col == "train_time_s" else "cost"
    n2, b2 = int(to["workers"]), int(to["global_batch"])
    if (n2, b2) == (workers, batch):
        return Decision(False, workers, batch, head + f"N={workers} B={batch} is still the {cfg.objective} choice; "
                        "stayed", 0.0)  # fmt: skip
    saving = net / float(cur[col]) if cur[col] > 0 else 0.0
    if saving <= MARGIN:
        return Decision(False, workers, batch, head + f"N={n2} B={b2} would save {100 * saving:.0f} % of the remaining "
                        f"{what} after the relaunch ({relaunch_s:.0f} s), not more than the {100 * MARGIN:.0f} % margin; "
                        "stayed", saving)  # fmt: skip
    return Decision(True, n2, b2, head + f"moved from N={workers} B={batch} to N={n2} B={b2}, predicted to save "
                    f"{100 * saving:.0f} % of the remaining {what} (relaunch {relaunch_s:.0f} s included)", saving)
