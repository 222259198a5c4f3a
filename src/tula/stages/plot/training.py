"""``tula plot training`` (rule plot_training): the training curve with the relaunches and
resumes marked, and the synchronisation the monitor measured over the run. Each figure
function returns the figure it saved."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from tula.figures import plt, save_figure


def attempt_marks(metrics: pd.DataFrame, attempts: dict | None) -> list[tuple[float, str, bool]]:
    """(epoch position, label, is_relaunch) of every restart of the training job: a relaunch
    at another batch after an OOM, or a requeue from a checkpoint within one attempt."""
    if not attempts or metrics.empty:
        return []
    steps = np.concatenate([[0.0], metrics["step"].to_numpy(float)])
    epochs = np.concatenate([[0.0], metrics["epoch"].to_numpy(float)])
    marks: list[tuple[float, str, bool]] = []
    prev = None
    for a in attempts.get("attempts", []):
        if prev is not None:
            why = "OOM" if prev["outcome"] == "oom" else prev["outcome"]
            n, pn = a.get("workers"), prev.get("workers")
            where = f"N={n} B={a['global_batch']}" if n and n != pn else f"B={a['global_batch']}"
            was = (
                f"N={pn} B={prev['global_batch']}" if n and n != pn else f"B={prev['global_batch']}"
            )
            marks.append(
                (
                    float(np.interp(a["start_step"], steps, epochs)),
                    f"{where} ({why} at {was})",
                    True,
                )
            )
        for seg in a.get("segments", [])[1:]:
            marks.append((float(np.interp(seg["start_step"], steps, epochs)), "resumed", False))
        prev = a
    return marks


def training_curve(
    metrics: pd.DataFrame, final: dict, path, attempts: dict | None = None
) -> Figure:
    noisy = "grad_noise_scale" in metrics.columns and metrics["grad_noise_scale"].notna().any()
    fig, axes = plt.subplots(1, 3 if noisy else 2, figsize=(15 if noisy else 10, 4))
    a1, a2 = axes[0], axes[1]
    if noisy:  # the epoch's gradient noise scale (AGS refreshes) beside the batch training runs at
        a3 = axes[2]
        a3.plot(
            metrics["epoch"],
            metrics["grad_noise_scale"],
            "-o",
            ms=3,
            color="tab:purple",
            label="B_noise (per epoch, AGS refresh)",
        )
        a3.axhline(
            final["global_batch"],
            color="k",
            ls="--",
            lw=1,
            label=f"trained at B={final['global_batch']}",
        )
        a3.set_xlabel("epoch")
        a3.set_ylabel("gradient noise scale (samples)")
        a3.set_yscale("log")
        a3.legend()
        a3.grid(alpha=0.3)
    a1.plot(metrics["epoch"], metrics["train_loss"], "-o", ms=3, label="train")
    a1.plot(metrics["epoch"], metrics["test_loss"], "-o", ms=3, label="test")
    a1.set_xlabel("epoch")
    a1.set_ylabel("cross-entropy loss")
    a2.plot(metrics["epoch"], 100 * metrics["train_acc"], "-o", ms=3, label="train")
    a2.plot(metrics["epoch"], 100 * metrics["test_acc"], "-o", ms=3, label="test")
    a2.set_xlabel("epoch")
    a2.set_ylabel("accuracy (%)")
    for x, label, relaunch in attempt_marks(metrics, attempts):
        for ax in (a1, a2):
            ax.axvline(
                x, color="tab:red" if relaunch else "0.6", ls="--" if relaunch else ":", lw=1.2
            )
        a1.annotate(
            label,
            (x, 1),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            ha="right",
            fontsize=8,
            color="tab:red" if relaunch else "0.4",
        )
    for ax in (a1, a2):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"Training at N={final['workers']}, B={final['global_batch']}: final test accuracy "
        f"{100 * final['final_test_acc']:.2f}%"
    )
    save_figure(fig, path)
    return fig


def sync_over_run(steps: pd.DataFrame, drifts: list[dict], path) -> Figure:
    """The production job's monitored steps (results/train/steps.csv): step and sync time over
    the run against the band the drift detector accepts around the predicted sync, and where it
    found drift. An empty steps.csv (one worker, post-local SGD, or launch.replan: off) gets a
    figure that says so."""
    fig, ax = plt.subplots(figsize=(10, 3.6))
    if steps.empty:
        why = "no monitored steps (one worker, post-local SGD, or launch.replan: off)"
        ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        save_figure(fig, path)
        return fig
    x = steps["step"]
    ax.plot(x, 1e3 * steps["step_time_s"], ".", ms=5, color="tab:blue", label="step (synced)")
    compute = dict(ms=4, color="tab:green", alpha=0.6, label="compute-only step")
    ax.plot(x, 1e3 * steps["compute_time_s"], ".", **compute)
    ax.plot(
        x, 1e3 * steps["sync_time_s"], "o", ms=4, color="tab:red", label="sync = step - compute"
    )
    if steps["predicted_sync_s"].notna().any():
        ax.plot(
            x, 1e3 * steps["predicted_sync_s"], "--", color="tab:red", lw=1, label="predicted sync"
        )
        ax.fill_between(
            x,
            1e3 * steps["sync_lo_s"],
            1e3 * steps["sync_hi_s"],
            color="tab:red",
            alpha=0.12,
            label="band the detector accepts",
        )
    for d in drifts:
        ax.axvline(d["step"], color="k", ls=":", lw=1.2)
        ax.annotate(
            f"drift ({d['direction']}): {d['action']}",
            (d["step"], 1),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            ha="right",
            fontsize=8,
        )
    ax.set_xlabel("training step")
    ax.set_ylabel("time (ms)")
    ax.set_title(
        f"Monitored steps: {len(steps)} paired compute-only steps, "
        f"N={int(steps['workers'].iloc[-1])}, B={int(steps['global_batch'].iloc[-1])}"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=3)
    save_figure(fig, path)
    return fig
