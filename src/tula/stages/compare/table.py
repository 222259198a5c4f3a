"""The generalization suite's table (``table.md``) and figure (``heatmap.png``): the test
metric per cell (model / dataset / B, method) over its seeds, and the median time to the
workload's target, under ``train.metric``'s name and goal (:class:`Metric`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tula.config import TrainSettings, metric_name
from tula.figures import plt, save_figure

METHOD_ORDER = ["lbt", "lars", "polo", "lrs", "static", "ags"]


@dataclass(frozen=True)
class Metric:
    """How the suite reads ``train.metric``: its name, whether larger is better, and whether it
    is a fraction shown in percent (accuracy, whose differences are points)."""

    name: str = "accuracy"
    goal: str = "max"

    @classmethod
    def of(cls, t: TrainSettings) -> Metric:
        return cls(metric_name(t.metric), t.metric_goal)

    @property
    def percent(self) -> bool:
        return self.name == "accuracy"

    @property
    def scale(self) -> float:
        return 100.0 if self.percent else 1.0

    def best(self, values) -> float:
        return float(np.nanmin(values) if self.goal == "min" else np.nanmax(values))

    def show(self, value: float) -> str:
        """``accuracy 93.42%``, or ``error_rate 0.0658``."""
        return f"{self.name} {value * 100:.2f}%" if self.percent else f"{self.name} {value:.4g}"


def cell_stats(df: pd.DataFrame, metric: Metric = Metric()) -> pd.DataFrame:
    """Per cell: the test metric's mean and std over seeds (in percent for accuracy), the seeds,
    and the median time to target with how many seeds reached it."""
    ok = df[df["status"] == "ok"]
    keys = ["model", "dataset", "global_batch", "method"]
    g = ok.groupby(keys)["test_acc"]
    k = metric.scale
    st = pd.DataFrame({"mean": k * g.mean(), "std": k * g.std(ddof=1).fillna(0.0), "n": g.size()})
    if "time_to_target_s" in ok:
        t = ok.assign(t=median_time_input(ok["time_to_target_s"], ok["target_acc"])).groupby(keys)[
            "t"
        ]
        st["ttt_median"] = t.median()  # inf where most seeds never reached the target
        st["reached"] = ok.groupby(keys)["time_to_target_s"].count()  # NaN: never reached
    return st.reset_index()


def median_time_input(times: pd.Series, target: pd.Series | None = None) -> pd.Series:
    """Times to target ready for a median over seeds: a seed that never reached the target is
    infinitely slow (so a cell whose seeds mostly failed has no median time, and one where 2 of
    3 reached it has the slower of the two); NaN stays NaN only where there was no target."""
    filled = times.astype(float).fillna(np.inf)
    return filled if target is None else filled.where(target.notna())


def _methods(st: pd.DataFrame) -> list[str]:
    return [m for m in METHOD_ORDER if m in set(st["method"])]


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
    methods = _methods(st)
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
    methods = _methods(st)
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
