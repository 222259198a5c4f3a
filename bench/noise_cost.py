"""What the gradient noise scale costs a probe: real 2-worker probes (gloo,
small_cnn on digits, the test suite's tiny probe settings) at a few global batches; per
point the median over --runs of the noise steps' time per step against the probe's
training step, their total against the probe's wall time, and the estimate itself.

    .venv/bin/python bench/noise_cost.py [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import yaml

from tula.stages import probe

CONFIG = {
    "workload": {"model": "small_cnn", "dataset": "digits", "epochs": 2, "seed": 0},
    "grid": {"workers": [1, 2], "batch_min": 32, "batch_max": 256},
    "probe": {
        "warmup_steps": 1,
        "timed_steps": 3,
        "time_budget_s": 0.5,
        "timeout_s": 300,
        "noise_steps": 16,
    },
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "c.yaml"
        cfg.write_text(yaml.safe_dump(CONFIG))
        for batch in (64, 256):
            recs = [
                probe.run(cfg, 2, batch, Path(d) / f"N2_B{batch}-{i}.json") for i in range(a.runs)
            ]
            gn = [r["gradient_noise"] for r in recs]
            med = statistics.median
            rows.append(
                (
                    batch,
                    med(g["time_per_step_s"] for g in gn),
                    med(r["step_time_s"] for r in recs),
                    med(g["time_s"] for g in gn),
                    med(r["wall_s"] for r in recs),
                    [(r["grad_noise_scale"], r["gradient_noise"]["b_noise_se"]) for r in recs],
                )
            )
    print(
        "\n## Gradient noise scale in the probe: cost (N=2, small_cnn on digits, 16 noise steps, "
        f"median of {a.runs})\n"
    )
    print(
        "| B | noise step | training step | ratio | noise steps in all | probe wall time | share | "
        "B_noise ± s.e. (each run) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    for b, per, step, tot, wall, est in rows:
        runs = ", ".join(f"{v:.0f} ± {se:.0f}" if v is not None else "none" for v, se in est)
        print(
            f"| {b} | {1e3 * per:.1f} ms | {1e3 * step:.1f} ms | {per / step:.2f}x | {tot:.2f} s | "
            f"{wall:.1f} s | {100 * tot / wall:.1f} % | {runs} |"
        )


if __name__ == "__main__":
    main()
