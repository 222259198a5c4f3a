"""``tula plot partitions`` (rule plot_partitions): every partition's candidates on one
time-cost plane, each partition's Pareto front (no other point of it both faster and
cheaper) drawn as a line, the choice starred and the runner-up on another partition marked
with its ratio."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from tula.figures import plt, save_figure
from tula.model.across import PARTITION, value
from tula.model.selection import WAIT, Selection


def pareto_front(df: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """The rows no other row beats on both ``x`` and ``y`` (lower is better), by ``x``."""
    ranked = df.sort_values([x, y])
    best_y, keep = np.inf, []
    for i, row in ranked.iterrows():
        if row[y] < best_y:
            keep.append(i)
            best_y = row[y]
    return ranked.loc[keep]


def pareto(spanning: pd.DataFrame, selection: Selection, path) -> Figure:
    """The figure (saved to ``path``); time is the queue's wait + T where a wait is known."""
    feas = spanning[spanning["feasible"].astype(bool)].copy()
    waited = WAIT in feas.columns and feas[WAIT].notna().any()
    x = "time_to_result_s" if waited else "train_time_s"
    feas[x] = [value(r, x) for _, r in feas.iterrows()]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, g) in enumerate(feas.groupby(PARTITION, sort=False)):
        c = colors[i % len(colors)]
        ax.scatter(g[x], g["cost"], s=14, color=c, alpha=0.35)
        front = pareto_front(g, x, "cost")
        ax.plot(front[x], front["cost"], "-o", color=c, ms=4, label=f"{name} (Pareto front)")
    block = selection.across_partitions
    marks = (("*", "chosen", block and block.standing[block.chosen]),)
    marks += (("D", "runner-up", block and block.runner_up),)
    for marker, label, who in marks:
        if not who:
            continue
        name, point = who.partition, who.point
        at = feas[
            (feas[PARTITION] == name)
            & (feas["workers"] == point.workers)
            & (feas["global_batch"] == point.global_batch)
        ]
        if at.empty:
            continue
        ratio = f", {who.ratio:.2f}x" if who.ratio else ""
        ax.scatter(
            at[x],
            at["cost"],
            marker=marker,
            s=180,
            color="k",
            zorder=5,
            label=f"{label}: {name} N={point.workers} B={point.global_batch}{ratio}",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("queue wait + predicted training time (s)" if waited else "predicted T (s)")
    ax.set_ylabel(f"predicted cost ({selection.selected.currency})")
    ax.set_title(f"Partitions, objective {selection.objective}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    save_figure(fig, path)
    return fig


def run(predictions, selection, out) -> None:
    """Read results/partitions/predictions.csv and results/selection.json; draw ``out``."""
    pareto(pd.read_csv(predictions), Selection.read(selection), out)
