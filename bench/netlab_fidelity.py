"""Held-out step-time error on the network lab: real 4-worker gloo probes
on 2 "nodes" x 2 workers (scripts/netlab.sh: network namespaces joined by tbf-shaped links),
at two link rates; Tula's one-level model, Tula's two-level model and AdaptDL's performance
model (``adaptdl.goodput.fit_perf_params``, the ``bench`` extra) fitted on the same rows.

Grid: N in {1, 2, 4} (N = 4 crosses the node boundary), B in {32, 64, 128, 256}: 12 points,
each probed once per rate with the real probe (`tula.stages.probe.run`, sweep and noise
steps off: the probe rows only, what every model gets). Partial search = the points Tula's
search_set picks (here N = 1, 2, 4 at B = 32 and 256); held out = the other six. Full =
leave one point out. Error = |predicted / measured - 1|; the measured points' own noise
(step-time CV, median) is printed beside it. Needs root.

    .venv/bin/python bench/netlab_fidelity.py [--rates 200mbit 50mbit] [--budget 3]  # ~6 min

Prints a Markdown table (BENCHMARKS.md "Nodes and networks") and writes
results/fidelity/netlab.json.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from _harness import ROOT
from tula import config as config_mod
from tula import model_inputs
from tula.io import write_json
from tula.model.grid import grid, search_set
from tula.stages import probe
from tula.stages.aggregate import rows_from_probe
from two_level import adaptdl, tula

PER_NODE = 2
RAW = {
    "workload": {"model": "small_cnn", "dataset": "digits", "epochs": 1, "seed": 0},
    "grid": {"workers": [1, 2, 4], "batch_min": 32, "batch_max": 256},
    "cluster": {"workers_per_node": PER_NODE, "netlab": "tula"},
    "probe": {
        "warmup_steps": 2,
        "timed_steps": 10,
        "time_budget_s": 3,
        "timeout_s": 300,
        "sweep_steps": 0,
        "noise_steps": 0,
    },
    "train": {"lr_decay_epochs": []},
}


def lab(*args: str) -> None:
    subprocess.run(["bash", str(ROOT / "scripts" / "netlab.sh"), *args], check=True)


def measure(cfg_path: Path, out: Path) -> pd.DataFrame:
    cfg = config_mod.load(cfg_path)
    rows = []
    for p in grid(model_inputs.grid_spec(cfg)):
        rec = probe.run(cfg_path, p.workers, p.global_batch, out / f"{p.name}.json")
        if rec["status"] != "ok":
            raise SystemExit(f"{p.name}: {rec['status']}: {rec.get('error')}")
        rows += rows_from_probe(rec, p.name)
    df = pd.DataFrame(rows)
    df["point"] = [f"N{w}_B{b}" for w, b in zip(df["workers"], df["global_batch"])]
    return df


def models(per_node: int):
    return {
        "tula_one_level": lambda t: tula(t, False, per_node),
        "tula_two_level": lambda t: tula(t, True, per_node),
        "adaptdl": lambda t: adaptdl(t, per_node),
    }


def errors(df: pd.DataFrame, cfg) -> dict:
    corners = {p.name for p in search_set(model_inputs.grid_spec(cfg))}
    out = {}
    for name, make in models(PER_NODE).items():
        train, held = df[df["point"].isin(corners)], df[~df["point"].isin(corners)]
        pred, form = make(train)
        part = np.abs(
            pred(held["workers"], held["local_batch"]) / held["step_time_s"].to_numpy() - 1
        )
        full = []
        for i in range(len(df)):
            p_i, _ = make(df.drop(index=df.index[i]))
            full.append(
                abs(
                    p_i(df["workers"].iloc[[i]], df["local_batch"].iloc[[i]])[0]
                    / df["step_time_s"].iloc[i]
                    - 1
                )
            )
        out[name] = {
            "partial": 100 * float(np.median(part)),
            "partial_max": 100 * float(part.max()),
            "full": 100 * float(np.median(full)),
            "full_max": 100 * float(max(full)),
            "form": form,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", nargs="+", default=["200mbit", "50mbit"])
    ap.add_argument(
        "--budget",
        type=float,
        default=RAW["probe"]["time_budget_s"],
        help="probe.time_budget_s: seconds of timing per probe (the precision's trade-off)",
    )
    a = ap.parse_args()
    RAW["probe"]["time_budget_s"] = a.budget
    results = {}
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="tula-netlab-") as tmp:
        cfg_path = Path(tmp) / "config.yaml"
        cfg_path.write_text(yaml.safe_dump(RAW))
        cfg = config_mod.load(cfg_path)
        lab("up", "2", a.rates[0])
        try:
            for rate in a.rates:
                lab("rate", rate)
                t_rate = time.time()
                out = Path(tmp) / rate
                out.mkdir()
                df = measure(cfg_path, out)
                (ROOT / "results" / "fidelity").mkdir(parents=True, exist_ok=True)
                df.to_csv(ROOT / "results" / "fidelity" / f"netlab_rows_{rate}.csv", index=False)
                sync4 = df[df["workers"] == 4]["sync_time_s"].median()
                sync2 = df[df["workers"] == 2]["sync_time_s"].median()
                results[rate] = {
                    "errors": errors(df, cfg),
                    "noise_pct": 100 * float(df["step_time_cv"].median()),
                    "halfwidth_pct": 100 * float(df["step_time_halfwidth_rel"].median())
                    if "step_time_halfwidth_rel" in df
                    else None,
                    "reached": int(df["precision_reached"].fillna(False).astype(bool).sum())
                    if "precision_reached" in df
                    else None,
                    "seconds": time.time() - t_rate,
                    "sync_ms_one_node_N2": 1e3 * sync2,
                    "sync_ms_two_nodes_N4": 1e3 * sync4,
                    "rows": df.drop(columns=["error"], errors="ignore").to_dict("records"),
                }
                print(f"{rate}: measured in {time.time() - t0:.0f} s", flush=True)
        finally:
            lab("down")
    write_json(ROOT / "results" / "fidelity" / "netlab.json", results)
    print(
        "\n| link | search | Tula one-level | Tula two-level | AdaptDL | probes' noise (CV) | sync "
        "N=2 (1 node) / N=4 (2 nodes) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for rate, r in results.items():
        for search in ("partial", "full"):
            cells = [
                f"{r['errors'][m][search]:.1f} % (max {r['errors'][m][search + '_max']:.0f} %)"
                for m in ("tula_one_level", "tula_two_level", "adaptdl")
            ]
            print(
                f"| {rate} | {search} | " + " | ".join(cells) + f" | {r['noise_pct']:.1f} % | "
                f"{r['sync_ms_one_node_N2']:.1f} / {r['sync_ms_two_nodes_N4']:.1f} ms |"
            )
    for rate, r in results.items():
        if r.get("halfwidth_pct") is not None:
            print(
                f"{rate}: probes' precision (95 % half-width of the mean step) median "
                f"{r['halfwidth_pct']:.1f} %, target reached at {r['reached']} of "
                f"{len([x for x in r['rows'] if x.get('source') == 'probe'])} points; "
                f"{r['seconds']:.0f} s of probing (probe.time_budget_s {a.budget:g})"
            )
    print(
        "\nforms (two-level): "
        + "; ".join(f"{k}: {r['errors']['tula_two_level']['form']}" for k, r in results.items())
    )


if __name__ == "__main__":
    main()
