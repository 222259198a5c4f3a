"""Configuration selection (§III-A.3): objective `time`, `cost` or `knee`, under constraints.

Candidates are the feasible grid points (memory model, no OOM probe) inside the user's
constraints (min/max N, min/max B). `time` and `cost` take the minimum of T or C.

`knee` runs Kneedle (the `kneed` package) on the *envelope* of the time curves: for each
B, the fastest N; x = B on a linear axis, y = T, curve convex, direction decreasing.
A linear x puts the knee where T(B) flattens (for T = a/B * (1 + B/B0) it lands near B0/2),
which is the paper's "beyond this point a larger batch does not significantly reduce
time"; on a log2(B) axis Kneedle would stop several doublings earlier.
When Kneedle finds no knee (fewer than three batch sizes, or a curve without a bend) the
selection falls back to the fastest point and says so.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from tula.config import Config


class NoFeasibleConfiguration(ValueError):
    pass


def candidates(pred: pd.DataFrame, cfg: Config) -> tuple[pd.DataFrame, dict[str, int]]:
    c = cfg.constraints
    keep = pred["feasible"].astype(bool)
    excluded = {"infeasible_memory_or_oom": int((~keep).sum())}
    for name, mask in (
        ("below_min_nodes", pred["nodes"] < c.min_nodes if c.min_nodes else None),
        ("above_max_nodes", pred["nodes"] > c.max_nodes if c.max_nodes else None),
        ("below_min_batch", pred["global_batch"] < c.min_batch if c.min_batch else None),
        ("above_max_batch", pred["global_batch"] > c.max_batch if c.max_batch else None),
    ):
        if mask is not None:
            excluded[name] = int((keep & mask).sum())
            keep &= ~mask
    return pred[keep].copy(), excluded


def knee_of(batches: np.ndarray, times: np.ndarray) -> int | None:
    """Global batch at the Kneedle knee of T(B), or None when there is none."""
    if len(batches) < 3 or np.allclose(times, times[0]):
        return None
    from kneed import KneeLocator  # imported here: `tula launch` reads selections without it

    kl = KneeLocator(batches.astype(float), times, curve="convex", direction="decreasing")
    if kl.knee is None:
        return None
    return int(round(kl.knee))


def _envelope(cand: pd.DataFrame, col: str) -> pd.DataFrame:
    """For each B, the candidate with the smallest ``col`` (T or C)."""
    idx = cand.groupby("global_batch")[col].idxmin()
    return cand.loc[idx].sort_values("global_batch")


def _summary(row: pd.Series, currency: str) -> dict[str, Any]:
    return {
        "nodes": int(row["nodes"]),
        "global_batch": int(row["global_batch"]),
        "local_batch": int(row["local_batch"]),
        "step_time_s": float(row["step_time_s"]),
        "train_time_s": float(row["train_time_s"]),
        "cost": float(row["cost"]),
        "currency": currency,
        "mem_bytes": float(row["mem_bytes"]),
        "probed": bool(row.get("probe_status", "") == "ok"),
    }


def select(pred: pd.DataFrame, cfg: Config) -> dict[str, Any]:
    cand, excluded = candidates(pred, cfg)
    if cand.empty:
        raise NoFeasibleConfiguration(
            "no feasible configuration: every grid point is excluded "
            f"({', '.join(f'{k}: {v}' for k, v in excluded.items() if v)}). Widen the grid "
            "(grid.nodes, grid.batch_min/batch_max), relax `constraints`, or raise hardware.device_memory_gb."
        )
    cur = cfg.pricing.currency
    obj = cfg.objective
    out: dict[str, Any] = {"objective": obj, "candidates": int(len(cand)), "excluded": excluded}
    if obj in ("time", "cost"):
        col = "train_time_s" if obj == "time" else "cost"
        ranked = cand.sort_values([col, "nodes", "global_batch"])
        best = ranked.iloc[0]
        runner = ranked.iloc[1] if len(ranked) > 1 else None
        unit = "s" if obj == "time" else cur
        reason = f"minimum {'training time T' if obj == 'time' else 'cost C'}: {best[col]:.4g} {unit}"
        if runner is not None:
            reason += f"; runner-up N={int(runner['nodes'])} B={int(runner['global_batch'])} at {runner[col]:.4g} {unit}"
    else:
        col, name, unit = ("cost", "C", cur) if cfg.knee_on == "cost" else ("train_time_s", "T", "s")
        env = _envelope(cand, col)
        b, y = env["global_batch"].to_numpy(), env[col].to_numpy()
        knee_b = knee_of(b, y)
        per_nodes = {}
        for n, g in cand.sort_values("global_batch").groupby("nodes"):
            per_nodes[str(int(n))] = knee_of(g["global_batch"].to_numpy(), g[col].to_numpy())
        out["knee"] = {
            "method": "kneed.KneeLocator(curve='convex', direction='decreasing')",
            "x": "global_batch (linear axis)",
            "y": f"{col} (best N per B)",
            "found": knee_b is not None,
            "global_batch": knee_b,
            "per_nodes": per_nodes,
            "envelope": [{"global_batch": int(r["global_batch"]), "nodes": int(r["nodes"]), col: float(r[col])}
                         for _, r in env.iterrows()],  # fmt: skip
        }
        if knee_b is None:
            best = env.sort_values(col).iloc[0]
            runner = None
            reason = (f"no knee on the {name}-vs-B curve (fewer than three batch sizes, or no bend); "
                      f"fell back to the best point, {name} = {best[col]:.4g} {unit}")  # fmt: skip
        else:
            pos = int(np.flatnonzero(b == knee_b)[0])
            best = env.iloc[pos]
            runner = env.iloc[pos + 1] if pos + 1 < len(env) else (env.iloc[pos - 1] if pos > 0 else None)
            lowest = env[col].min()
            reason = (f"knee of {name} vs B at B={knee_b}: {name} = {best[col]:.4g} {unit}, "
                      f"{100 * (best[col] / lowest - 1):.1f} % above the lowest point ({lowest:.4g} {unit})")  # fmt: skip
            if runner is not None and runner["global_batch"] > best["global_batch"]:
                gain = 100 * (1 - runner[col] / best[col])
                reason += f"; doubling to B={int(runner['global_batch'])} saves only {gain:.1f} % more"
    out["selected"] = _summary(best, cur)
    out["runner_up"] = _summary(runner, cur) if runner is not None else None
    out["reason"] = reason
    out["pricing"] = {"model": cfg.pricing.model, "per_node_hour": cfg.pricing.per_node_hour,
                      "per_gb_hour": cfg.pricing.per_gb_hour, "currency": cur}  # fmt: skip
    if not math.isfinite(out["selected"]["train_time_s"]):
        raise ValueError("selection: the selected point has no finite predicted time; check results/model/perf.json")
    return out


def selected_point(path) -> tuple[int, int]:
    """(nodes, global_batch) of a selection.json; the error names the file."""
    from tula.io import read_json

    sel = read_json(path)
    try:
        return int(sel["selected"]["nodes"]), int(sel["selected"]["global_batch"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{path}: no selected.nodes / selected.global_batch; re-run `tula select`") from None
