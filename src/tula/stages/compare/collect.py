"""accuracy.csv from the runs' result.json files, with each workload's target and the time to
it (``tula compare aggregate``, which also writes table.md and heatmap.png)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from tula import config as config_mod
from tula.io import read_json, write_bytes, write_csv
from tula.stages.compare.cells import Metric
from tula.stages.compare.heatmap import heatmap
from tula.stages.compare.table import table_markdown

COLUMNS = [  # results/compare/accuracy.csv, in this order
    "model", "dataset", "global_batch", "method", "seed", "status", "test_acc", "best_test_acc",
    "train_time_s", "epochs", "target_acc", "time_to_target_s", "epochs_to_target", "error",
]  # fmt: skip


def time_to_target(epochs: list[dict], target: float, goal: str = "max") -> tuple[float, int]:
    """(step time summed up to the first epoch whose test metric reaches target: at least it,
    or at most it where train.metric_goal is min; epochs that took); (nan, -1) when none did."""
    spent = 0.0
    for i, e in enumerate(epochs, 1):
        spent += float(e["epoch_time_s"])
        value = float(e["test_acc"])
        if (value <= target) if goal == "min" else (value >= target):
            return spent, i
    return float("nan"), -1


def targets(cfg: config_mod.Config, df: pd.DataFrame) -> dict[tuple[str, str], float]:
    """Each workload's target: its target_accuracy, else target_fraction of the best mean
    final metric of its cells (the best over the fraction where smaller is better)."""
    out, minimise = {}, cfg.train.metric_goal == "min"
    for w in cfg.compare.workloads:
        if w.target_accuracy is not None:
            out[w.model, w.dataset] = float(w.target_accuracy)
            continue
        ok = df[(df["model"] == w.model) & (df["dataset"] == w.dataset) & (df["status"] == "ok")]
        if len(ok):
            means = ok.groupby(["global_batch", "method"])["test_acc"].mean()
            fraction = cfg.compare.target_fraction
            # smaller is better (train.metric_goal: min): the best divided by the fraction
            target = means.min() / fraction if minimise else fraction * means.max()
            out[w.model, w.dataset] = float(target)
    return out


def collect(cfg: config_mod.Config, results: list[str | Path]) -> pd.DataFrame:
    """accuracy.csv's rows from the runs' result.json files, with time to each workload's target."""
    recs = [read_json(p) for p in results]
    df = pd.DataFrame(
        [
            {
                k: rec.get(k)
                for k in COLUMNS
                if k not in ("epochs", "target_acc", "time_to_target_s", "epochs_to_target")
            }
            for rec in recs
        ]
    )
    goal = targets(cfg, df)
    for i, rec in enumerate(recs):
        target = goal.get((rec["model"], rec["dataset"]))
        tt, et = (
            time_to_target(rec["epochs"], target, cfg.train.metric_goal)
            if target is not None
            else (float("nan"), -1)
        )
        df.loc[i, ["epochs", "target_acc", "time_to_target_s", "epochs_to_target"]] = (
            len(rec["epochs"]),
            target,
            tt,
            et if et > 0 else np.nan,
        )
    return df.reindex(columns=COLUMNS)


def aggregate(
    cfg_path: str | Path,
    results: list[str | Path],
    csv: str | Path,
    table: str | Path,
    heatmap_path: str | Path,
) -> pd.DataFrame:
    cfg = config_mod.load(cfg_path)
    df = collect(cfg, results)
    write_csv(csv, df)
    metric = Metric.of(cfg.train)
    write_bytes(table, table_markdown(df, metric).encode())
    heatmap(df, heatmap_path, metric)
    return df
