"""``tula plot``: the figures, from results/*.csv and *.json; nothing is recomputed here.

``tula plot selection`` (rule plot_selection): training time, cost, memory and the compute
curve against the batch; ``tula plot training`` (rule plot_training): the training curve,
with the relaunches and resumes marked (:mod:`tula.stages.plot.training`). Each figure
function returns the figure it saved."""

from __future__ import annotations

import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from tula.figures import plt, save_figure
from tula.io import read_json
from tula.model import measurements as measurements_mod
from tula.model.perf import PerfModel
from tula.model.pricing import UNITS
from tula.model.selection import Selection
from tula.stages.plot.training import sync_over_run, training_curve


def _fmt_time(s: float) -> str:
    if s < 10:
        return f"{s:.2g} s"
    return f"{s:.0f} s" if s < 120 else (f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h")


def _batch_axis(ax, batches, ylabel: str, title: str) -> None:
    """B on a log2 axis with a tick at each grid batch; labels, grid, legend."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(batches))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("global batch size B")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def curve_vs_batch(
    pred: pd.DataFrame,
    selection: Selection,
    y: str,
    measured_y: str | None,
    ylabel: str,
    title: str,
    path,
) -> Figure:
    """One line per N of ``y`` against B (log2 axis); probes as points; the choice starred."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (n, g) in enumerate(pred.sort_values("global_batch").groupby("workers")):
        c = colors[i % len(colors)]
        ax.plot(g["global_batch"], g[y], "-", color=c, label=f"N={n} predicted")
        if y == "train_time_s" and {"train_time_lo_s", "train_time_hi_s"} <= set(g.columns):
            ax.fill_between(
                g["global_batch"],
                g["train_time_lo_s"],
                g["train_time_hi_s"],
                color=c,
                alpha=0.12,
                lw=0,
            )
        bad = g[~g["feasible"].astype(bool)]
        if len(bad):
            ax.plot(bad["global_batch"], bad[y], "x", color=c, ms=9, label=f"N={n} infeasible")
        if measured_y is not None:
            m = g[g["probe_status"] == "ok"]
            if len(m):
                ax.plot(
                    m["global_batch"],
                    m[measured_y],
                    "o",
                    color=c,
                    mfc="none",
                    ms=8,
                    label=f"N={n} probed",
                )
    sel = selection.selected
    row = pred[(pred["workers"] == sel.workers) & (pred["global_batch"] == sel.global_batch)]
    if len(row):
        ax.plot(
            row["global_batch"],
            row[y],
            "*",
            color="crimson",
            ms=18,
            zorder=5,
            label=f"selected ({selection.objective}): N={sel.workers}, B={sel.global_batch}",
        )
    _batch_axis(ax, pred["global_batch"].unique(), ylabel, title)
    save_figure(fig, path)
    return fig


def time_vs_batch(pred: pd.DataFrame, selection: Selection, path) -> Figure:
    sel = selection.selected
    return curve_vs_batch(
        pred,
        selection,
        "train_time_s",
        "measured_train_time_s",
        "training time T (s)",
        f"Training time vs batch — selected N={sel.workers}, B={sel.global_batch}: "
        f"{_fmt_time(sel.train_time_s)}",
        path,
    )


def cost_vs_batch(pred: pd.DataFrame, selection: Selection, path) -> Figure:
    pred = pred.copy()
    pr = selection.pricing
    col = f"cost_{pr['model']}"
    scale = (pred[col] / pred["train_time_s"]).where(pred["train_time_s"] > 0, 0.0)
    pred["measured_cost"] = pred["measured_train_time_s"] * scale
    sel = selection.selected
    unit = UNITS[pr["model"]]
    return curve_vs_batch(
        pred,
        selection,
        col,
        "measured_cost",
        f"cost C ({pr['currency']}, per {unit} pricing)",
        f"Training cost vs batch — selected: {sel.cost:.4g} {pr['currency']}",
        path,
    )


def compute_vs_batch(measured: pd.DataFrame, perf: dict, path) -> Figure:
    """The compute curve: every compute-only measurement (probe and sweep rows) against
    local batch, one colour per N, with the fitted compute model through them."""
    model = PerfModel.from_dict(perf)
    ok = measured[
        (measured["status"] == "ok")
        & pd.to_numeric(measured["compute_time_s"], errors="coerce").notna()
    ]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    src = ok["source"] if "source" in ok.columns else pd.Series("probe", index=ok.index)
    for i, (n, g) in enumerate(ok.groupby("workers")):
        c = colors[i % len(colors)]
        xs = np.geomspace(max(ok["local_batch"].min(), 1), ok["local_batch"].max(), 80)
        ax.plot(
            xs,
            1e3 * model.compute_time_s(np.full_like(xs, n), xs),
            "-",
            color=c,
            label=f"N={n} model ({model.compute.form.name})",
        )
        sw = g[src.loc[g.index] == "sweep"]
        pr = g[src.loc[g.index] != "sweep"]
        ax.plot(
            sw["local_batch"], 1e3 * sw["compute_time_s"], ".", color=c, ms=7, label=f"N={n} sweep"
        )
        ax.plot(
            pr["local_batch"],
            1e3 * pr["compute_time_s"],
            "o",
            color=c,
            mfc="none",
            ms=9,
            label=f"N={n} probe",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("local batch b")
    ax.set_ylabel("compute-only step time (ms)")
    ax.set_title(f"Compute curve — {model.compute.form.text}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    save_figure(fig, path)
    return fig


def memory_vs_batch(pred: pd.DataFrame, measured: pd.DataFrame, memory_model: dict, path) -> Figure:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    lb = np.sort(pred["local_batch"].unique())
    fit = memory_model["fit"]
    xs = np.linspace(lb.min(), lb.max(), 100)
    ax.plot(
        xs, (fit["intercept"] + fit["slope"] * xs) / 2**20, "-", label="Eq. 3 model (linear in b)"
    )
    ok = measured[
        (measured["status"] == "ok")
        & pd.to_numeric(measured["peak_mem_bytes"], errors="coerce").notna()
    ]
    ax.plot(
        ok["local_batch"], ok["peak_mem_bytes"] / 2**20, "o", mfc="none", ms=8, label="measured"
    )
    oom = measured[measured["status"] == "oom"]
    if len(oom):
        ax.plot(
            oom["local_batch"], np.full(len(oom), ax.get_ylim()[1]), "rx", ms=10, label="probe OOM"
        )
    if memory_model.get("budget_bytes"):
        budget = memory_model["budget_bytes"] / 2**20
        if budget < 4 * ax.get_ylim()[1]:
            ax.axhline(budget, color="crimson", ls="--", label="memory budget")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("local batch b = B / N")
    ax.set_ylabel("peak memory per worker (MiB)")
    mx = memory_model.get("max_local_batch")
    ax.set_title(
        f"Memory vs local batch — largest feasible b: {mx if mx is not None else 'unbounded'}"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)
    return fig


def run_selection(
    predictions,
    selection,
    measurements,
    memory,
    perf,
    time_plot,
    cost_plot,
    memory_plot,
    compute_plot,
) -> None:
    """``tula plot --selection ...``: the selection figures from the results files."""
    pred, sel, meas = (
        pd.read_csv(predictions),
        Selection.read(selection),
        measurements_mod.load(measurements),
    )
    time_vs_batch(pred, sel, time_plot)
    cost_vs_batch(pred, sel, cost_plot)
    memory_vs_batch(pred, meas, read_json(memory), memory_plot)
    compute_vs_batch(meas, read_json(perf), compute_plot)


def run_training(metrics, final, attempts, training_plot, steps=None, steps_plot=None) -> None:
    """``tula plot --metrics ...``: the training curve (and, with ``steps``, the monitored
    steps)."""
    fin = read_json(final)
    training_curve(
        pd.read_csv(metrics), fin, training_plot, read_json(attempts) if attempts else None
    )
    if steps and steps_plot:
        sync_over_run(pd.read_csv(steps), fin.get("drift", []), steps_plot)
