"""Production / probe at the same point, batch by batch: the shipped default config (digits,
small_cnn, AGS), N = 2, for each B: `tula probe` at (2, B), then `tula launch` training
there for a few epochs, repeats interleaved. No fit is involved, so the ratio says only
whether the probe's step is the production step at that batch.

    .venv/bin/python bench/probe_vs_production_by_batch.py [--batches 32,64,128] \
        [--repeats 2] [--epochs 4]          # ~1 min per (B, repeat)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import pandas as pd
import yaml

from _harness import ROOT, tula


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="32,64,128")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=4)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="tula-pvpb-") as tmp:
        wd = Path(tmp)
        cfg = yaml.safe_load((ROOT / "workflow" / "config.yaml").read_text())
        cfg["workload"]["epochs"] = args.epochs
        (wd / "config.yaml").write_text(yaml.safe_dump(cfg))
        for rep in range(args.repeats):
            for b in batches:
                probe = wd / f"probe_{b}_{rep}.json"
                tula(
                    "probe",
                    "--config",
                    "config.yaml",
                    "--workers",
                    "2",
                    "--global-batch",
                    str(b),
                    "--out",
                    str(probe),
                    cwd=wd,
                )
                (wd / "sel.json").write_text(
                    json.dumps({"selected": {"workers": 2, "global_batch": b}})
                )
                out = wd / f"prod_{b}_{rep}"
                tula(
                    "launch",
                    "--config",
                    "config.yaml",
                    "--selection",
                    "sel.json",
                    "--out-dir",
                    str(out),
                    "--fresh",
                    cwd=wd,
                )
                p, f = json.loads(probe.read_text()), json.loads((out / "final.json").read_text())
                epochs = pd.read_csv(out / "metrics.csv")["epoch_time_s"]
                per_step = [t / f["steps"] * args.epochs for t in epochs]  # each epoch's mean step
                row = {
                    "B": b,
                    "repeat": rep + 1,
                    "probe_ms": 1e3 * p["step_time_s"],
                    "probe_median_ms": 1e3 * p["step_time_median_s"],
                    "production_ms": 1e3 * f["mean_step_time_s"],
                    "ratio": f["mean_step_time_s"] / p["step_time_s"],
                    "epoch_step_ms": [round(1e3 * t, 2) for t in per_step],
                }
                rows.append(row)
                print(
                    f"repeat {rep + 1} B={b:4d}: probe {row['probe_ms']:.2f} ms (median "
                    f"{row['probe_median_ms']:.2f}), production {row['production_ms']:.2f} ms, "
                    f"ratio {row['ratio']:.3f}; production's mean step by epoch "
                    f"{row['epoch_step_ms']} ms",
                    flush=True,
                )
    print("\n| B | production / probe, median | runs | probe step (ms) | production step (ms) |")
    print("|---:|---:|---|---|---|")
    for b in batches:
        rs = [r for r in rows if r["B"] == b]

        def listed(key: str, fmt: str) -> str:
            return ", ".join(format(r[key], fmt) for r in rs)  # rs: read at once, in the loop

        med = statistics.median(r["ratio"] for r in rs)
        print(
            f"| {b} | **{med:.3f}** | {listed('ratio', '.3f')} | {listed('probe_ms', '.1f')} | "
            f"{listed('production_ms', '.1f')} |"
        )


if __name__ == "__main__":
    main()
