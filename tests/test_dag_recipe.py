"""The whole DAG trained the way most users train (conftest's RECIPE: AdamW with its betas, a
cosine schedule after a one-epoch warm-up, label smoothing, the gradient clipped, norms and
biases exempt from weight decay, an EMA of the weights, a macro-F1 over the epoch, every step
accumulated over two micro-batches, and train.method left to auto, which picks plain large
batch for AdamW), once per session
(``recipe_run``): first `snakemake plan`, which trains nothing and leaves the answer to take
away, then `snakemake`, whose probes time that step and whose production job confirms its
prediction as the default's does."""

import json

import pandas as pd
import pytest

from bounds import COSINE_END, PRODUCTION_BOUND, check_accuracy, log_error
from conftest import RECIPE


def test_the_users_way_of_training_runs_end_to_end_and_confirms_its_prediction(recipe_run):
    """The check names the way of training; every probe and the production job ran it; the
    production step lies within PRODUCTION_BOUND of the prediction's point estimate, as the
    default run's (tests/bounds.py: fixed, from the machine's measured noise); the accuracy at
    its point is its recorded one's (tests/accuracy.json). Its wall time is not bounded here:
    this run's start-up (process start to first step) spread further than the default's
    (bench/suite_bounds.py --recipe: x1.35 of its interval in one clean-clone CI run, its
    start-up 1.52x the prediction there)."""
    wd, _, _ = recipe_run
    res = wd / "results"
    w = json.loads((res / "workload.json").read_text())
    assert w["training"]["optimizer"] == "AdamW" and w["training"]["schedule"] == "cosine"
    assert w["training"]["optimizer_args"] == {"betas": [0.9, 0.99]}
    final = json.loads((res / "train" / "final.json").read_text())
    for key in RECIPE:
        assert final[key] == RECIPE[key], key
    # method auto with AdamW: plain large batch, and why, in the check's record and final.json
    assert final["method"] == w["training"]["method"] == "lbt" and final["ags"] is None
    assert final["method_reason"].startswith("train.method auto: plain large batch with adamw")
    assert final["final_test_acc_ema"] <= 1 and (res / "train" / "model_ema.pt").exists()
    # train.accumulate: 2: every probe ran its steps so, and the prediction priced them so
    probes = pd.read_csv(res / "measurements.csv").query("source == 'probe'")
    assert (probes["accumulate"] == 2).all()
    pred = pd.read_csv(res / "predictions.csv")
    assert (pred["accumulate"] == 2).all() and (
        pred["micro_batch"] == pred["local_batch"] // 2
    ).all()
    e = log_error(final["mean_step_time_s"], final["predicted_step_time_s"])
    assert e <= PRODUCTION_BOUND, (final["mean_step_time_s"], final["predicted_step_time_s"])
    n, b = final["workers"], final["global_batch"]
    check_accuracy(f"recipe digits N{n} B{b}", final["final_test_acc"])
    check_accuracy(f"recipe digits N{n} B{b}, its EMA", final["final_test_acc_ema"])


def test_the_lr_follows_the_warm_up_then_the_cosine(recipe_run):
    """metrics.csv's LR at each epoch's end: the warm-up epoch ends at the peak (train.lr:
    AGS does not scale the LR), and the cosine falls from it to near zero at the run's end."""
    wd, _, _ = recipe_run
    final = json.loads((wd / "results" / "train" / "final.json").read_text())
    lr = pd.read_csv(wd / "results" / "train" / "metrics.csv")["lr"].tolist()
    peak = json.loads((wd / ".snakemake" / "tula" / "config.json").read_text())["train"]["lr"]
    assert len(lr) == final["epochs"] == 2
    assert lr[0] == pytest.approx(peak) and lr[-1] < COSINE_END * peak


def test_the_plan_alone_trains_nothing_and_leaves_the_answer_to_take_away(recipe_run):
    """`snakemake plan` wrote plan.json, train.sbatch and a report that says no training ran,
    left no results/train/, and the terminal's answer said so; plan.json holds the chosen
    point, its LR and schedule and the predictions the later training confirmed."""
    wd, _, plan = recipe_run
    files = set(plan["files"])
    assert {"results/plan/plan.json", "results/plan/train.sbatch"} <= files
    assert "results/plan/report.html" in files and "results/report.html" not in files
    assert not [f for f in files if f.startswith("results/train")]
    assert "no training ran (snakemake plan)" in plan["out"]
    assert "<b>No training ran</b>" in plan["report"] and "Training job" not in plan["report"]
    p = json.loads((wd / "results" / "plan" / "plan.json").read_text())
    sel = json.loads((wd / "results" / "selection.json").read_text())["selected"]
    assert (p["workers"], p["global_batch"]) == (sel["workers"], sel["global_batch"])
    assert p["schedule"] == "cosine" and p["warmup_epochs"] == 1 and p["trained"] is False
    assert p["method"] == "lbt" and p["method_reason"].startswith("train.method auto")
    assert (p["accumulate"], p["micro_batch"]) == (2, -(-p["local_batch"] // 2))
    assert "Trained with <b>lbt</b>: train.method auto" in plan["report"]
    assert p["warmup_steps"] == p["steps_per_epoch"] and p["lr"] > 0
    lo, hi = p["predicted_step_time_interval_s"]
    assert lo <= p["predicted_step_time_s"] <= hi and p["predicted_cost"] > 0
    script = (wd / "results" / "plan" / "train.sbatch").read_text()
    assert f"#SBATCH --nodes={p['nodes']}" in script and "srun torchrun" in script
    assert f"--batch-size {p['local_batch']}" in script and "YOUR_TRAIN_SCRIPT" in script
    assert f"as 2 micro-batches of {p['micro_batch']} a step" in script
