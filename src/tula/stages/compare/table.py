"""The suite's table (``table.md``): the test metric per cell over its seeds, best per row in
bold, AGS's gain over LBT, and the median time to the workload's target per cell."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tula.stages.compare.cells import Metric, cell_stats, methods_in


def _grid(st: pd.DataFrame, methods: list[str], cell, best) -> list[str]:
    """The header, the rule and one row per (model, dataset, B) of a method table: ``cell(row)``
    gives a cell's text, None for a cell without a figure to compare; the best cell of a row
    (``best`` over the row's figures) is in bold."""
    lines = [
        "| model | dataset | B | "
        + " | ".join(m.upper() if m != "ags" else "Tula AGS" for m in methods)
        + " |",
        "|---|---|---|" + "---|" * len(methods),
    ]
    for (model, ds, b), g in st.groupby(["model", "dataset", "global_batch"]):
        by_method = {row["method"]: row for _, row in g.iterrows()}
        texts = {m: cell(row) for m, row in by_method.items()}
        top = best(g)
        cells = [
            "—"
            if m not in by_method
            else f"**{texts[m][0]}**"
            if texts[m][1] == top
            else texts[m][0]
            for m in methods
        ]
        lines.append(f"| {model} | {ds} | {b} | " + " | ".join(cells) + " |")
    return lines


def _metric_cell(row: pd.Series) -> tuple[str, float]:
    return f"{row['mean']:.4g} ± {row['std']:.2g}", row["mean"]


def _accuracy_cell(row: pd.Series) -> tuple[str, float]:
    return f"{row['mean']:.2f} ± {row['std']:.2f}", row["mean"]


def _time_cell(row: pd.Series) -> tuple[str, float | None]:
    if not np.isfinite(row["ttt_median"]):
        return (
            f"{'median ' if row['reached'] else ''}not reached ({row['reached']}/{row['n']})",
            None,
        )
    return f"{row['ttt_median']:.2f} s ({row['reached']}/{row['n']})", row["ttt_median"]


def table_markdown(df: pd.DataFrame, metric: Metric = Metric()) -> str:
    """table.md: the test metric per cell (mean ± std over seeds, best per row by the metric's
    goal in bold, AGS's gain over LBT) and, with a target, the median time to it per cell
    (fastest in bold)."""
    st = cell_stats(df, metric)
    methods = methods_in(st)
    cell = _accuracy_cell if metric.percent else _metric_cell
    lines = _grid(st, methods, cell, lambda g: metric.best(g["mean"]))
    gains, near_best, rows = [], 0, 0
    for _, g in st.groupby(["model", "dataset", "global_batch"]):
        means = dict(zip(g["method"], g["mean"]))
        if "ags" in means:
            rows += 1
            near_best += abs(means["ags"] - metric.best(list(means.values()))) <= 1.0
            if "lbt" in means:
                gains.append(means["ags"] - means["lbt"])
    what = "Test accuracy (%)" if metric.percent else f"Test {metric.name}"
    better = "" if metric.goal == "max" else " (smaller is better)"
    seeds = int(st["n"].min()) if len(st) else 0
    lines += ["", f"{what}{better}, mean ± std over {seeds} seeds; best mean per row in bold."]
    unit = " points" if metric.percent else ""
    if gains:
        lines.append(
            f"AGS − LBT, averaged over the {len(gains)} rows: {np.mean(gains):+.4g}{unit}."
        )
    if rows and metric.percent:
        lines.append(f"AGS best or within 1 point of the best in {near_best}/{rows} rows.")
    failed = df[df["status"] != "ok"]
    if len(failed):
        runs = [
            f"B={r.global_batch} {r.method} seed {r.seed} ({r.status})" for r in failed.itertuples()
        ]
        lines.append(f"Not trained: {', '.join(runs)}.")
    if "ttt_median" in st and df["target_acc"].notna().any():
        lines += [
            "",
            "### Time to target accuracy",
            "",
            *_grid(st, methods, _time_cell, lambda g: g["ttt_median"].min()),
        ]
        goals = df.groupby(["model", "dataset"])["target_acc"].first()
        side = "below" if metric.goal == "min" else "above"
        lines += [
            "",
            f"Training-step time (evaluation excluded) summed to the first epoch at or {side} the "
            "target, median over the seeds, one that never reached it counting as infinitely slow "
            "(reached/seeds); fastest per row in bold. Targets: "
            + ", ".join(
                f"{m} / {d}: {metric.show(t).split(' ', 1)[1]}"
                for (m, d), t in goals.items()
                if t == t
            )
            + ".",
        ]
    return "\n".join(lines) + "\n"
