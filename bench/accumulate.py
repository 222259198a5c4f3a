"""Gradient accumulation as a grid dimension (``train.accumulate: auto``), on the shipped default
(MNIST-1D, small_cnn, N in {1, 2}, B 64 ... 1,024, full search) with a memory budget that caps
b_max at 64 samples per worker, so that every B past 64 N runs as micro-batches of 64.

1. The budget: the memory probe once without one; ``hardware.device_memory_gb`` set so that
   its fitted line reaches the budget at b = 64.5 (the memory probe then finds b_max = 64).
2. REPEATS runs of the whole DAG (``snakemake --cores 2``, objective ``time``, which trains at
   the largest B: accumulated), each on fresh results:
   - held out: the step model fitted on the one-batch probes alone (k = 1, with the sweep and
     the memory rows), its prediction of every accumulated probe against that probe's own
     measured step (|error| in %); the probes' own within-probe CV beside it, the hour's noise;
   - the production job at its chosen, accumulated point: production / predicted step, and
     production / a direct probe at that point after the DAG (``tula probe``), as
     bench/probe_vs_production.py reports them.

    .venv/bin/python bench/accumulate.py [REPEATS]      # default 3; ~4 min a run on 2 cores

Prints a Markdown table per part (BENCHMARKS.md, "Accuracy: AGS and the baselines": the recipe
rows) and writes results/accumulate/accumulate.json, and each run's measurements.csv beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from _harness import ROOT, copy_workflow, snakemake, tula
from tula.io import write_json
from tula.model import perf as perfmodel
from tula.model.linfit import fit_linear
from tula.model.measurements import accumulated

B_MAX = 64
OWN = Path("results") / "partitions" / "default"  # the one partition's own files
OUT = ROOT / "results" / "accumulate"  # accumulate.json and each run's measurements_<i>.csv


def budget_gb(workdir: Path, cfg: dict) -> float:
    """``hardware.device_memory_gb`` whose budget (after the margin) the memory probe's line
    reaches at b = B_MAX + 0.5."""
    (workdir / "workflow" / "config.yaml").write_text(yaml.safe_dump(cfg))
    snakemake(workdir, "--until", "memprobe", fresh=True)  # the profile names no partition
    mp = json.loads((workdir / OWN / "memory_probe.json").read_text())
    ok = [p for p in mp["points"] if p["status"] == "ok"]
    line = fit_linear([p["local_batch"] for p in ok], [p["peak_mem_bytes"] for p in ok])
    budget = line.intercept + line.slope * (B_MAX + 0.5)
    margin = cfg["hardware"].get("memory_margin", 0.1)
    return budget / (1 - margin) / 1e9


def held_out(measurements: pd.DataFrame, collective: str) -> list[dict]:
    """Each accumulated probe against the step model fitted on the one-batch rows alone."""
    k = accumulated(measurements)
    ok = measurements["status"] == "ok"
    perf = perfmodel.fit(measurements[ok & (k == 1)], collective)
    acc = measurements[ok & (k > 1) & (measurements["source"] == "probe")]
    rows = []
    for r in acc.itertuples(index=False):
        pred = float(
            perf.accumulated(
                np.array([r.workers]), np.array([r.local_batch]), np.array([r.accumulate])
            )["step_time_s"][0]
        )
        rows.append(
            {
                "N": int(r.workers),
                "B": int(r.global_batch),
                "k": int(r.accumulate),
                "measured_ms": 1e3 * r.step_time_s,
                "predicted_ms": 1e3 * pred,
                "error_pct": 100 * abs(pred / r.step_time_s - 1),
            }
        )
    return rows


def one_run(workdir: Path, cfg: dict, keep: Path) -> dict:
    """One run of the whole DAG; its measurements.csv kept as ``keep``."""
    (workdir / "workflow" / "config.yaml").write_text(yaml.safe_dump(cfg))
    wall = snakemake(workdir, "--quiet", fresh=True)
    res = workdir / "results"
    final = json.loads((res / "train" / "final.json").read_text())
    m = pd.read_csv(res / "measurements.csv")
    keep.parent.mkdir(parents=True, exist_ok=True)
    m.to_csv(keep, index=False)
    probes = m[(m["source"] == "probe") & (m["status"] == "ok")]
    mp = json.loads((res / "memory_probe.json").read_text())
    n, b = final["workers"], final["global_batch"]
    out = res / "direct_probe.json"
    cfg_json = ".snakemake/tula/config.json"
    tula(
        "probe",
        "--config",
        cfg_json,
        "--workers",
        str(n),
        "--global-batch",
        str(b),
        "--out",
        str(out),
        "--memory-probe",
        "results/memory_probe.json",
        cwd=workdir,
    )
    direct = json.loads(out.read_text())
    return {
        "b_max": mp["max_local_batch"],
        "held_out": held_out(m, cfg["hardware"].get("collective", "ring")),
        "within_probe_cv_pct": float(100 * probes["step_time_cv"].median()),
        "chosen": {"N": n, "B": b, "k": final["accumulate"]},
        "ratio": final["step_time_ratio"],
        "direct_ratio": final["mean_step_time_s"] / direct["step_time_s"],
        "direct_k": direct.get("accumulate", 1),
        "dag_s": wall,
        "acc": final["final_test_acc"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("repeats", nargs="?", type=int, default=3)
    args = ap.parse_args()
    base = yaml.safe_load((ROOT / "workflow" / "config.yaml").read_text())
    base["objective"] = "time"
    with tempfile.TemporaryDirectory(prefix="tula-accumulate-") as tmp:
        wd = copy_workflow(Path(tmp) / "run")
        gb = budget_gb(wd, base)
        cfg = {**base, "hardware": {**base["hardware"], "device_memory_gb": gb}}
        print(f"hardware.device_memory_gb {gb:.6f} (b_max {B_MAX} by the memory probe's line)")
        runs = []
        for i in range(args.repeats):
            r = one_run(wd, cfg, OUT / f"measurements_{i + 1}.csv")
            runs.append(r)
            errs = [h["error_pct"] for h in r["held_out"]]
            print(
                f"run {i + 1}: b_max {r['b_max']}, {len(errs)} accumulated probes held out, "
                f"|error| median {statistics.median(errs):.1f} % (max {max(errs):.1f}), "
                f"within-probe CV {r['within_probe_cv_pct']:.1f} %; chosen {r['chosen']}, "
                f"production / predicted {r['ratio']:.3f}, production / probe there "
                f"{r['direct_ratio']:.3f}, DAG {r['dag_s']:.0f} s",
                flush=True,
            )
    print(
        "\n| run | b_max | accumulated probes | held-out |error| median (max) | within-probe CV "
        "| chosen (N, B, k) | production / predicted | production / probe there |"
    )
    print("|---|---:|---:|---|---:|---|---:|---:|")
    for i, r in enumerate(runs):
        errs = [h["error_pct"] for h in r["held_out"]]
        c = r["chosen"]
        print(
            f"| {i + 1} | {r['b_max']} | {len(errs)} | {statistics.median(errs):.1f} % "
            f"({max(errs):.1f}) | {r['within_probe_cv_pct']:.1f} % | ({c['N']}, {c['B']}, "
            f"{c['k']}) | {r['ratio']:.3f} | {r['direct_ratio']:.3f} |"
        )
    print(
        "\n| N | B | k | measured ms | predicted ms (held out) | |error| |\n"
        "|---|---|---|---|---|---|"
    )
    for r in runs:
        for h in r["held_out"]:
            print(
                f"| {h['N']} | {h['B']} | {h['k']} | {h['measured_ms']:.2f} | "
                f"{h['predicted_ms']:.2f} | {h['error_pct']:.1f} % |"
            )
    within = sum(abs(r["ratio"] - 1) <= 0.10 for r in runs)
    print(f"\nproduction within +-10 % of its prediction in {within} of {len(runs)} runs")
    out = OUT / "accumulate.json"
    write_json(out, {"device_memory_gb": gb, "runs": runs})
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
