"""What the suite's numeric bounds (tests/bounds.py) rest on, measured: the shared default DAG
of the suite (conftest's finished_run: the tests' tiny config, `snakemake --cores 2`, an
injected OOM at N2_B128 rank 1) run RUNS times, each in a fresh directory; or the accuracy
each test that judges one is held to.

    .venv/bin/python bench/suite_bounds.py [--runs 4] [--load] [--out DIR] [--recipe]
    .venv/bin/python bench/suite_bounds.py --accuracy     # writes tests/accuracy.json

``--accuracy`` records the accuracy every test that judges one is held to
(tests/bounds.py's check_accuracy): the three shared DAGs' configs trained at every grid point
(the point their choice lands on varies with the machine), and the tests that train at a
fixed point run once with bounds.RECORD_ENV set, so that they record instead of judging.
Training at a point is deterministic here, so a figure is recorded once, with when, on what
CPU and by which commit.

``--recipe`` runs the suite's other shared DAG instead (conftest's recipe_run: the tiny config
trained with RECIPE, AdamW with its betas, a cosine schedule after a one-epoch warm-up and
label smoothing; no injected OOM).

``--load`` runs a busy process on one core beside each DAG, as `make test`'s other xdist
worker loads the machine while the shared run is made.

Per run it prints the chosen (N, B); the production step and wall time over the prediction's
point estimate; the fit error (the median |log(predicted / measured)| over the probed points);
the N = 2, B = 64 probe left out of the fit (its whole launch, and the kept launch's sweep at
its local batch) and predicted by the rest, its log error; the widest probe half-width; and
the accuracy. Then the worst of each against tests/bounds.py's fixed bound.
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

import pandas as pd
import yaml

from _harness import ROOT, copy_workflow, env, snakemake, tests_helper
from tula.faults import ENV as FAULT_ENV
from tula.model import measurements as measurements_mod

TINY = tests_helper("TIMED_TINY")  # the suite's tiny config, as its timed shared runs use it
RECIPE = tests_helper("RECIPE")  # the way of training of the suite's recipe_run
# tests/bounds.py: the bounds this measures
BOUNDS = (
    "PRODUCTION_BOUND",
    "WALL_BOUND",
    "HELD_OUT_BOUND",
    "FIT_BOUND",
    "fit_error",
    "held_out_prediction",
    "log_error",
    "RECORD_ENV",
    "ACCURACY_FILE",
)
bounds = dict(zip(BOUNDS, (tests_helper(name, "bounds") for name in BOUNDS)))


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
    held = None
    if not recipe:
        pred, meas = bounds["held_out_prediction"](m, 2, 64, "ring")
        held = math.log(pred / meas)
    ok = m[(m["source"] == "probe") & (m["status"] == "ok")]
    return {
        "dag_s": wall,
        "point": (final["workers"], final["global_batch"]),
        "step_ratio": final["mean_step_time_s"] / final["predicted_step_time_s"],
        "wall_ratio": final["wall_time_s"] / final["predicted_wall_time_s"],
        "held_out_log_error": held,
        "fit_error": bounds["fit_error"](pd.read_csv(res / "predictions.csv")),
        "widest_probe_halfwidth": float(ok["step_time_halfwidth_rel"].max()),
        "accuracy": final["final_test_acc"],
    }


OOM = "oom:point=N2_B128,rank=1"
# the tests that judge an accuracy at a fixed point (each calls bounds.check_accuracy)
FIXED_POINT_TESTS = [
    "tests/production/test_trainer.py::test_image_folder_trains_with_two_gloo_and_two_loader_workers",
    "tests/production/test_trainer.py::test_bf16_adamw_onecycle_trains_and_resumes_bitwise",
    "tests/production/test_trainer.py::test_two_process_training",
    "tests/production/test_trainer.py::test_a_users_loss_and_metric_run_end_to_end",
    "tests/production/test_launcher.py::test_every_baseline_trains_on_two_processes_and_resumes_bitwise",
    "tests/production/test_launcher.py::test_compiled_training_relaunches_after_an_oom_and_resumes_from_the_checkpoint",
    "tests/stages/test_compare.py::test_compare_run_trains_one_run_and_records_an_oom_without_relaunching",
]


def grid_accuracy(where: Path, kind: str) -> dict:
    """final_test_acc (and the EMA's, where there is one) of a shared DAG's config trained at
    every grid point: ``tiny`` (finished_run), ``recipe`` (recipe_run: RECIPE's way of
    training), ``uint8`` (test_dag_slurm's dag_on_slurm: digits stored as uint8)."""
    from tula import config
    from tula.production import launcher

    raw = {**TINY, "launch": {"executor": "local", "poll_s": 0.5}}
    if kind == "recipe":
        raw["train"] = {**TINY["train"], **RECIPE}
    if kind == "uint8":
        u8 = tests_helper("digits_uint8")(where / "digits_u8.npz")
        raw["workload"] = {**TINY["workload"], "dataset": f"npz:{u8}"}
    cfg_path = where / f"{kind}.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    cfg = config.load(cfg_path)
    out = {}
    for n in (1, 2):
        for b in (32, 64, 128):
            final = launcher.train(cfg, (n, b), where / f"{kind}_N{n}_B{b}", fresh=True)
            out[f"{kind} digits N{n} B{b}"] = final["final_test_acc"]
            if final.get("final_test_acc_ema") is not None:
                out[f"{kind} digits N{n} B{b}, its EMA"] = final["final_test_acc_ema"]
            print(f"[suite_bounds] {kind} N={n} B={b}: {final['final_test_acc']:.4f}", flush=True)
    return out


def fixed_point_accuracy(where: Path) -> dict:
    """What the tests that train at a fixed point reach: each run once, recording."""
    record = where / "recorded.jsonl"
    record.unlink(missing_ok=True)
    e = {**env(), bounds["RECORD_ENV"]: str(record)}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *FIXED_POINT_TESTS]
    r = subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"the fixed-point tests failed while recording:\n{r.stdout[-3000:]}")
    out = {}
    for line in record.read_text().splitlines():
        out.update(json.loads(line))
    return out


def record_accuracy(where: Path) -> None:
    figures = {}
    for kind in ("tiny", "recipe", "uint8"):
        figures |= grid_accuracy(where, kind)
    figures |= fixed_point_accuracy(where)
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in open("/proc/cpuinfo")
            if ln.startswith("model name")
        ),
        "unknown",
    )
    made = {
        "when": time.strftime("%Y-%m-%d %H:%M %Z"),
        "commit": commit,
        "cpu": cpu,
        "command": ".venv/bin/python bench/suite_bounds.py --accuracy",
    }
    doc = {"made": made, "figures": dict(sorted(figures.items()))}
    bounds["ACCURACY_FILE"].write_text(json.dumps(doc, indent=1) + "\n")
    for k, v in doc["figures"].items():
        print(f"  {v:.4f}  {k}")
    print(f"[suite_bounds] {len(figures)} figures -> {bounds['ACCURACY_FILE']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--load", action="store_true", help="a busy process on one core beside")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--recipe", action="store_true", help="the recipe DAG (AdamW, cosine)")
    ap.add_argument("--accuracy", action="store_true", help="record tests/accuracy.json")
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="suite_bounds_"))
    out.mkdir(parents=True, exist_ok=True)
    os.environ["PATH"] = env()["PATH"]  # tula, torchrun, snakemake of this environment
    if a.accuracy:
        record_accuracy(out)
        return
    print(
        f"[suite_bounds] {time.strftime('%Y-%m-%d %H:%M')}, {a.runs} runs, load={a.load}, "
        f"recipe={a.recipe}"
    )
    rows = []
    for i in range(a.runs):
        r = dag_once(out / f"run{i}", a.load, a.recipe)
        rows.append(r)
        held = r["held_out_log_error"]
        print(
            f"run {i}: N={r['point'][0]} B={r['point'][1]}  step x{r['step_ratio']:.3f}  "
            f"wall x{r['wall_ratio']:.3f}  fit error {r['fit_error']:.3f}  held-out "
            + ("-" if held is None else f"{held:+.3f}")
            + f"  widest probe +-{100 * r['widest_probe_halfwidth']:.0f} %  "
            f"accuracy {r['accuracy']:.4f}  DAG {r['dag_s']:.0f} s",
            flush=True,
        )
    b, worst = bounds, lambda key: max(abs(math.log(r[key])) for r in rows)
    held = [abs(r["held_out_log_error"]) for r in rows if r["held_out_log_error"] is not None]
    print(
        f"worst |log|: step {worst('step_ratio'):.3f} (bound {b['PRODUCTION_BOUND']:.3f}), wall "
        f"{worst('wall_ratio'):.3f} (bound {b['WALL_BOUND']:.3f}), fit "
        f"{max(r['fit_error'] for r in rows):.3f} (bound {b['FIT_BOUND']:.3f}), held-out "
        f"{max(held, default=float('nan')):.3f} (bound {b['HELD_OUT_BOUND']:.3f}); widest probe "
        f"+-{100 * max(r['widest_probe_halfwidth'] for r in rows):.0f} %"
    )
    (out / "suite_bounds.json").write_text(json.dumps({"runs": rows}, indent=1, default=str))
    print(f"[suite_bounds] {out}")


if __name__ == "__main__":
    main()
