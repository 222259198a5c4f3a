"""Fidelity of Tula's performance, memory and cost models on this machine (issue #4).

Probes every grid point of the shipped config REPEATS times (repeats interleaved, so slow
drift hits every point alike); the ground truth of a point is the median over repeats.
Then, per repeat:
  partial: fit on that repeat's 4 corner probes; error on the held-out (non-corner) points;
  full:    leave-one-out: fit on all other points of that repeat, predict the one left out.
Reported: median / max absolute % error of step time, T and C (node and memory pricing),
memory-model error, the noise floor (step-time CV within a probe, spread across repeats),
regret of the selection vs the measured oracle for each objective, and probe cost.

    .venv/bin/python bench/model_fidelity.py [REPEATS] [--model NAME] [--dataset NAME]

Writes results/fidelity/{probes/,fidelity.json} and results/plots/fidelity_*.png.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tula import config as config_mod  # noqa: E402
from tula import memory, perfmodel, probe  # noqa: E402
from tula.grid import grid, search_set  # noqa: E402
from tula.io import read_json, write_json  # noqa: E402
from tula.measurements import row_from_probe  # noqa: E402
from tula.select import select  # noqa: E402


def pct(pred, true) -> np.ndarray:
    return 100.0 * np.abs(np.asarray(pred, float) - np.asarray(true, float)) / np.asarray(true, float)


def summary(errors) -> dict:
    e = np.asarray(list(errors), float)
    return {"median_pct": float(np.median(e)), "max_pct": float(np.max(e)), "n": int(e.size)}


def frame_from_truth(cfg, truth: pd.DataFrame, D: int) -> pd.DataFrame:
    """A predictions-shaped table whose values are the measured truth (for the oracle)."""
    t = truth.copy()
    t["steps_per_epoch"] = np.ceil(D / t["global_batch"]).astype(int)
    t["train_time_s"] = cfg.workload.epochs * t["steps_per_epoch"] * t["step_time_s"]
    t["cost_node"] = t["train_time_s"] / 3600 * t["nodes"] * cfg.pricing.per_node_hour
    t["cost_memory"] = t["train_time_s"] / 3600 * t["nodes"] * t["peak_mem_bytes"] / 1e9 * cfg.pricing.per_gb_hour
    t["cost"] = t["cost_node"]
    t["mem_bytes"] = t["peak_mem_bytes"]
    t["feasible"] = True
    t["probe_status"] = "ok"
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("repeats", type=int, nargs="?", default=3)
    ap.add_argument("--model", default=None)
    ap.add_argument("--dataset", default=None)
    ap.add_argument("--out", default=str(ROOT / "results" / "fidelity"))
    a = ap.parse_args()

    raw = yaml.safe_load((ROOT / "workflow" / "config.yaml").read_text())
    raw["search"] = "full"
    if a.model:
        raw["workload"]["model"] = a.model
    if a.dataset:
        raw["workload"]["dataset"] = a.dataset
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    cfg = config_mod.load(cfg_path)
    points = grid(cfg)
    corners = set(search_set(config_mod.from_dict({**raw, "search": "partial"})))

    # 1. probe everything, repeats interleaved
    rows = []
    t0 = time.perf_counter()
    for r in range(a.repeats):
        for i, p in enumerate(points):
            f = out / "probes" / f"r{r}" / f"{p.name}.json"
            rec = probe.run(cfg_path, p.nodes, p.global_batch, f) if not f.exists() else read_json(f)
            if rec["status"] != "ok":
                sys.exit(f"probe {p.name} repeat {r} failed: {rec.get('error')}")
            rows.append({**row_from_probe(rec, str(f)), "repeat": r})
            print(f"[fidelity] repeat {r + 1}/{a.repeats}, point {i + 1}/{len(points)} done "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
    m = pd.DataFrame(rows)
    D = int(m["train_samples"].iloc[0])
    truth = m.groupby(["nodes", "global_batch", "local_batch"], as_index=False)[
        ["step_time_s", "compute_time_s", "sync_time_s", "peak_mem_bytes"]].median()  # fmt: skip
    truth_frame = frame_from_truth(cfg, truth, D)
    key = lambda df: list(zip(df["nodes"], df["global_batch"]))  # noqa: E731
    tmap = dict(zip(key(truth_frame), truth_frame.to_dict("records")))

    # 2. noise floor
    spread = m.groupby(["nodes", "global_batch"])["step_time_s"].agg(lambda s: (s.max() - s.min()) / s.median())
    noise = {"median_within_probe_cv": float(m["step_time_cv"].median()),
             "median_across_repeat_spread_pct": float(100 * spread.median())}  # fmt: skip

    # 3. partial and full (leave-one-out) errors
    errs = {k: [] for k in ("partial_step", "partial_T", "partial_C_node", "partial_C_memory", "partial_mem",
                            "full_step", "full_T", "full_C_node", "full_mem")}  # fmt: skip
    regret = {k: [] for k in ("time", "cost", "knee")}
    picks = {k: [] for k in regret}
    partial_preds = []
    budget = cfg.hardware.memory_budget_bytes
    for r in range(a.repeats):
        mr = m[m["repeat"] == r]
        corner_rows = mr[[(n, b) in {(c.nodes, c.global_batch) for c in corners} for n, b in key(mr)]]
        perf = perfmodel.fit(corner_rows, cfg.hardware.collective)
        mem = memory.fit(corner_rows, budget)
        pred = perfmodel.predict(cfg, perf, mem, D)
        pred["repeat"] = r
        partial_preds.append(pred)
        held = pred[[(n, b) not in {(c.nodes, c.global_batch) for c in corners} for n, b in key(pred)]]
        tru = pd.DataFrame([tmap[k] for k in key(held)])
        errs["partial_step"] += list(pct(held["step_time_s"], tru["step_time_s"]))
        errs["partial_T"] += list(pct(held["train_time_s"], tru["train_time_s"]))
        errs["partial_C_node"] += list(pct(held["cost_node"], tru["cost_node"]))
        errs["partial_C_memory"] += list(pct(held["cost_memory"], tru["cost_memory"]))
        errs["partial_mem"] += list(pct(held["mem_bytes"], tru["peak_mem_bytes"]))
        for obj in regret:
            ocfg = config_mod.from_dict({**raw, "objective": obj})
            col = "cost" if obj == "cost" else "train_time_s"
            chosen = select(pred, ocfg)["selected"]
            oracle = select(truth_frame, ocfg)["selected"]
            got = tmap[(chosen["nodes"], chosen["global_batch"])][col]
            best = tmap[(oracle["nodes"], oracle["global_batch"])][col]
            regret[obj].append(100.0 * (got - best) / best)
            picks[obj].append({"chosen": f"N{chosen['nodes']}_B{chosen['global_batch']}",
                               "oracle": f"N{oracle['nodes']}_B{oracle['global_batch']}"})  # fmt: skip
        for i in range(len(mr)):
            train_rows, test = mr.drop(mr.index[i]), mr.iloc[i]
            perf = perfmodel.fit(train_rows, cfg.hardware.collective)
            mem = memory.fit(train_rows, budget)
            p1 = perfmodel.predict(config_mod.from_dict({**raw, "grid": {**raw["grid"]}}), perf, mem, D)
            row = p1[(p1["nodes"] == test["nodes"]) & (p1["global_batch"] == test["global_batch"])].iloc[0]
            t = tmap[(test["nodes"], test["global_batch"])]
            errs["full_step"].append(pct(row["step_time_s"], t["step_time_s"]).item())
            errs["full_T"].append(pct(row["train_time_s"], t["train_time_s"]).item())
            errs["full_C_node"].append(pct(row["cost_node"], t["cost_node"]).item())
            errs["full_mem"].append(pct(row["mem_bytes"], t["peak_mem_bytes"]).item())

    wall = m.groupby("repeat").apply(lambda g: pd.Series({
        "full_s": g["wall_s"].sum(),
        "partial_s": g[[(n, b) in {(c.nodes, c.global_batch) for c in corners} for n, b in key(g)]]["wall_s"].sum()}))  # fmt: skip
    result = {
        "workload": {"model": cfg.workload.model, "dataset": cfg.workload.dataset, "grid_points": len(points),
                     "repeats": a.repeats, "train_samples": D, "epochs": cfg.workload.epochs},  # fmt: skip
        "noise_floor": noise,
        "errors": {k: summary(v) for k, v in errs.items()},
        "regret_pct": {k: {"median": float(np.median(v)), "max": float(np.max(v)), "picks": picks[k]}
                       for k, v in regret.items()},
        "probe_cost": {"partial_s": float(wall["partial_s"].median()), "full_s": float(wall["full_s"].median()),
                       "ratio_pct": float(100 * (wall["partial_s"] / wall["full_s"]).median())},  # fmt: skip
        "truth": truth_frame[["nodes", "global_batch", "step_time_s", "compute_time_s", "sync_time_s",
                              "peak_mem_bytes", "train_time_s"]].to_dict("records"),  # fmt: skip
    }
    write_json(out / "fidelity.json", result)
    plots(truth_frame, m, pd.concat(partial_preds), errs, D, cfg, ROOT / "results" / "plots")

    print("\n| measure | median | max |\n|---|---|---|")
    for k, v in result["errors"].items():
        print(f"| {k} abs. error | {v['median_pct']:.1f} % | {v['max_pct']:.1f} % |")
    for k, v in result["regret_pct"].items():
        print(f"| regret, objective {k} | {v['median']:.1f} % | {v['max']:.1f} % |  "
              + ", ".join(f"{p['chosen']} vs oracle {p['oracle']}" for p in v["picks"]))  # fmt: skip
    pc = result["probe_cost"]
    print(f"\nprobe cost: partial {pc['partial_s']:.0f} s vs full {pc['full_s']:.0f} s = {pc['ratio_pct']:.0f} %")
    print(f"noise floor: within-probe step CV median {100 * noise['median_within_probe_cv']:.1f} %, "
          f"repeat-to-repeat spread median {noise['median_across_repeat_spread_pct']:.1f} %")  # fmt: skip


def plots(truth, m, partial, errs, D, cfg, outdir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tula.plots import _save

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (n, g) in enumerate(truth.groupby("nodes")):
        c = colors[i % len(colors)]
        meas = m[m["nodes"] == n].groupby("global_batch")["step_time_s"]
        scale = cfg.workload.epochs * np.ceil(D / g["global_batch"].to_numpy())
        lo = (meas.min().to_numpy() * scale)
        hi = (meas.max().to_numpy() * scale)
        ax.errorbar(g["global_batch"], g["train_time_s"], yerr=[g["train_time_s"] - lo, hi - g["train_time_s"]],
                    fmt="o", color=c, capsize=3, label=f"N={n} measured (median, min-max)")  # fmt: skip
        for r, pr in partial.groupby("repeat"):
            pg = pr[pr["nodes"] == n].sort_values("global_batch")
            ax.plot(pg["global_batch"], pg["train_time_s"], "--", color=c, alpha=0.6,
                    label=f"N={n} partial-search prediction" if r == 0 else None)  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xlabel("global batch size B")
    ax.set_ylabel("training time T (s)")
    ax.set_title("Measured vs predicted training time (partial search: 4 corner probes)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    _save(fig, outdir / "fidelity_time_vs_batch.png")

    fig, ax = plt.subplots(figsize=(7, 4))
    keys = ["partial_step", "full_step", "partial_mem", "full_mem"]
    ax.boxplot([errs[k] for k in keys], tick_labels=["step time\npartial", "step time\nfull (LOO)", "memory\npartial",
                                                     "memory\nfull (LOO)"])  # fmt: skip
    ax.set_ylabel("absolute error (%)")
    ax.set_title("Prediction error on points the fit did not see")
    ax.grid(alpha=0.3, axis="y")
    _save(fig, outdir / "fidelity_errors.png")


if __name__ == "__main__":
    main()
