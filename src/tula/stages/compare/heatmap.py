"""The suite's figure (``heatmap.png``): the mean test metric per row (model / dataset / B) and
method, and beside it the median time to target."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from tula.figures import plt, save_figure
from tula.stages.compare.cells import Metric, cell_stats, methods_in


def heatmap(df: pd.DataFrame, path: str | Path, metric: Metric = Metric()):
    """Mean test metric per row (model / dataset / B) and method; beside it, the median time to
    target when the runs have one (a cell no median reached is drawn "—"). Returns the figure
    it saved, None when there is no run to draw."""
    st = cell_stats(df, metric)
    if st.empty:
        return None
    st = st.sort_values(["model", "dataset", "global_batch"])
    st["row"] = st["model"] + " / " + st["dataset"] + " / B=" + st["global_batch"].astype(str)
    label = "test accuracy (%)" if metric.percent else f"test {metric.name}"
    good = "RdYlGn_r" if metric.goal == "min" else "RdYlGn"
    panels = [("mean", label, good, metric.best, "{:.1f}" if metric.percent else "{:.3g}")]
    if "ttt_median" in st:
        st["ttt_median"] = st["ttt_median"].replace(np.inf, np.nan)  # not reached: no colour, "—"
        if st["ttt_median"].notna().any():
            panels.append(("ttt_median", "time to target (s)", "RdYlGn_r", np.nanmin, "{:.1f}"))
    rows = st["row"].unique()
    methods = methods_in(st)
    fig, axes = plt.subplots(
        1,
        len(panels),
        figsize=(len(panels) * (1.3 * len(methods) + 3), 0.5 * len(rows) + 1.5),
        squeeze=False,
    )
    for ax, (col, label, cmap, best, fmt) in zip(axes[0], panels):
        piv = st.pivot(index="row", columns="method", values=col).reindex(rows)[methods]
        im = ax.imshow(piv.to_numpy(dtype=float), cmap=cmap, aspect="auto")
        ax.set_xticks(range(len(methods)), [c.upper() for c in methods])
        ax.set_yticks(range(len(piv)), piv.index if ax is axes[0][0] else [""] * len(piv))
        for i in range(len(piv)):
            row = piv.iloc[i].to_numpy(dtype=float)
            for j, v in enumerate(row):
                if v == v:
                    ax.text(
                        j,
                        i,
                        fmt.format(v),
                        ha="center",
                        va="center",
                        fontsize=8,
                        fontweight="bold" if v == best(row) else "normal",
                    )
                else:
                    ax.text(j, i, "—", ha="center", va="center", fontsize=8)
        fig.colorbar(im, ax=ax, label=label)
        ax.set_title(
            (label.capitalize() if col == "mean" else "Time to target") + " by method (over seeds)"
        )
    save_figure(fig, path)
    return fig
