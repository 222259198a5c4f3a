"""What the suite's numeric bounds (tests/bounds.py) rest on, measured: the shared default DAG
of the suite (conftest's finished_run: the tests' tiny config, `snakemake --cores 2`, an
injected OOM at N2_B128 rank 1) run RUNS times, each in a fresh directory, and the final
test accuracy that tiny config's 2 epochs reach at every feasible grid point.

    .venv/bin/python bench/suite_bounds.py [--runs 4] [--load] [--out DIR] [--no-grid] [--recipe]

``--recipe`` runs the suite's other shared DAG instead (conftest's recipe_run: the tiny config
trained with RECIPE, AdamW with its betas, a cosine schedule after a one-epoch warm-up and
label smoothing; no injected OOM).

``--load`` runs a busy process on one core beside each DAG, as `make test`'s other xdist
worker loads the machine while the shared run is made.

Per run it prints the chosen (N, B); the production step and wall time over the prediction
and by what factor the prediction's 95 % interval must be widened to hold them (1: inside),
against tests/bounds.py's INTERVAL_MULTIPLE; the N = 2, B = 64 probe left out of the fit
(its whole launch: probe and sweep) and predicted by the rest, |log error| against its
noise-derived bound; and the accuracy. Then the accuracy at every grid point.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from _harness import ROOT, copy_workflow, env, snakemake, tests_helper
from tula.faults import ENV as FAULT_ENV
from tula.model import measurements as measurements_mod

TINY = tests_helper("TIMED_TINY")  # the suite's tiny config, as its timed shared runs use it
RECIPE = tests_helper("RECIPE")  # the way of training of the suite's recipe_run
# tests/bounds.py: the bounds this measures
interval_multiple, held_out_bound, held_out_prediction, INTERVAL_MULTIPLE = (
    tests_helper(name, "bounds")
    for name in ("interval_multiple", "held_out_bound", "held_out_prediction", "INTERVAL_MULTIPLE")
)


def dag_once(where: Path, load: bool, recipe: bool = False) -> dict:
    copy_workflow(where)
    (where / "workflow" / "config.yaml").write_text((ROOT / "workflow" / "config.yaml").read_text())
    tiny = {**TINY, "train": {**TINY["train"], **RECIPE}} if recipe else TINY
    (where / "tiny.yaml").write_text(yaml.safe_dump(tiny))
    burner = (
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load else None
    )  # one core kept busy, as the other xdist worker's tests do
    try:
        faults = {} if recipe else {FAULT_ENV: OOM}
        wall = snakemake(where, "--configfile", "tiny.yaml", extra_env=faults)
    finally:
        if burner:
            burner.kill()
    res = where / "results"
    final = json.loads((res / "train" / "final.json").read_text())
    m = measurements_mod.load(res / "measurements.csv")
    # the N = 2, B = 64 probe is the OOM corner's fallback: probed only with the OOM injected
    held = {"held_out_log_error": None, "held_out_bound": None, "held_out_halfwidths": None}
    if not recipe:
        pred, meas, left_hw, fit_hw = held_out_prediction(m, 2, 64, "ring")
        held = {
            "held_out_log_error": math.log(pred / meas),
            "held_out_bound": held_out_bound(left_hw, fit_hw),
            "held_out_halfwidths": [left_hw, fit_hw],
        }
    return {
        "dag_s": wall,
        "point": (final["workers"], final["global_batch"]),
        "step_ratio": final["step_time_ratio"],
        "step_multiple": interval_multiple(
            final["mean_step_time_s"], *final["predicted_step_time_interval_s"]
        ),
        "wall_ratio": final["wall_time_ratio"],
        "wall_multiple": interval_multiple(
            final["wall_time_s"], *final["predicted_wall_time_interval_s"]
        ),
        **held,
        "accuracy": final["final_test_acc"],
    }


OOM = "oom:point=N2_B128,rank=1"


def grid_accuracy(where: Path) -> dict:
    """final_test_acc of the tiny config's 2 epochs at every grid point but the OOM corner."""
    from tula import config
    from tula.production import launcher

    out = {}
    cfg_path = where / "tiny.yaml"
    cfg_path.write_text(yaml.safe_dump({**TINY, "launch": {"executor": "local", "poll_s": 0.5}}))
    cfg = config.load(cfg_path)
    for n in (1, 2):
        for b in (32, 64, 128):
            if (n, b) == (2, 128):
                continue
            final = launcher.train(cfg, (n, b), where / f"train_N{n}_B{b}", fresh=True)
            out[(n, b)] = final["final_test_acc"]
            print(f"[suite_bounds] accuracy at N={n} B={b}: {final['final_test_acc']:.4f}")
    return out


def _held_out(r: dict) -> str:
    if r["held_out_bound"] is None:
        return "held-out: none (no OOM corner, no N = 2, B = 64 probe)"
    hw = " / ".join(f"{100 * h:.0f}" for h in r["held_out_halfwidths"])
    return (
        f"held-out log error {r['held_out_log_error']:+.3f} (bound {r['held_out_bound']:.3f}; "
        f"left out / fit +-{hw} %)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--load", action="store_true", help="a busy process on one core beside")
    ap.add_argument("--no-grid", action="store_true", help="skip the accuracy at every point")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--recipe", action="store_true", help="the recipe DAG (AdamW, cosine)")
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="suite_bounds_"))
    out.mkdir(parents=True, exist_ok=True)
    os.environ["PATH"] = env()["PATH"]  # tula, torchrun, snakemake of this environment
    print(
        f"[suite_bounds] {time.strftime('%Y-%m-%d %H:%M')}, {a.runs} runs, load={a.load}, "
        f"recipe={a.recipe}"
    )
    rows = []
    for i in range(a.runs):
        r = dag_once(out / f"run{i}", a.load, a.recipe)
        rows.append(r)
        print(
            f"run {i}: N={r['point'][0]} B={r['point'][1]}  step x{r['step_ratio']:.3f} "
            f"(interval x{r['step_multiple']:.3f})  wall x{r['wall_ratio']:.3f} "
            f"(interval x{r['wall_multiple']:.3f})  {_held_out(r)}  "
            f"accuracy {r['accuracy']:.4f}  DAG {r['dag_s']:.0f} s",
            flush=True,
        )
    held_out_share = [
        abs(r["held_out_log_error"]) / r["held_out_bound"] for r in rows if r["held_out_bound"]
    ] or [float("nan")]
    print(
        f"worst: step interval x{max(r['step_multiple'] for r in rows):.3f}, wall interval "
        f"x{max(r['wall_multiple'] for r in rows):.3f} (bound x{INTERVAL_MULTIPLE:.3f}); "
        f"held-out |log error| / bound {max(held_out_share):.2f}; "
        f"accuracy {min(r['accuracy'] for r in rows):.4f}"
    )
    if not a.no_grid:
        acc = grid_accuracy(out)
        print(f"grid accuracy: min {min(acc.values()):.4f}, max {max(acc.values()):.4f}")
    (out / "suite_bounds.json").write_text(json.dumps({"runs": rows}, indent=1, default=str))
    print(f"[suite_bounds] {out}")


if __name__ == "__main__":
    main()
