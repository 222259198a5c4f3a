"""Two partitions on the lab, chosen between as a user's site would be. Needs root.

    .venv/bin/python bench/lab_partitions.py [--slow 2] [--plans-only]   # ~25 min

`scripts/slurm-cluster.sh up --nodes 2 --partitions 2 --slow lab1:F`: lab0 and lab1, one lab
node each (2 slots), every task on lab1 under a CPU quota of 1/F of a core. The workflow runs
through `snakemake --profile profiles/slurm --jobs 1` (the shipped profile, copied, with mem_mb
set to what a lab node holds; one job at a time, since the lab's two nodes share this machine's
two cores), with `cluster.partitions` listing both (the lab's account), in turn:

1. `plan`, objective time, equal prices: the probes of both partitions (search full, so every
   (N, B) is probed on both), the compute step of lab1's probes over lab0's at the same
   (N, B) (target: F +- 0.3), and the choice (target: lab0);
2. `plan`, objective knee (the same probes): target lab0;
3. `plan`, objective cost with lab1 at a quarter of lab0's price: target lab1;
4. `plan`, objective time_to_result with lab0 held by a 30-minute job (`--forcerun queue`: both
   partitions' queue rules, so that the wait is asked now): target lab1, and why;
5. the same with lab0 free again: target lab0;
6. the whole workflow (production) at 3.'s choice (cost: lab1) and at 1.'s (time: lab0): the
   production step over its own partition's prediction, and inside its interval or not.

Prints Markdown tables (BENCHMARKS.md "Where to train: partitions") and writes
results/fidelity/lab_partitions.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from _harness import ROOT, copy_workflow, env, tests_helper
from tula.io import write_json

CLUSTER = ["bash", str(ROOT / "scripts" / "slurm-cluster.sh")]
CONFIG = {
    "workload": {"model": "small_cnn", "dataset": "digits", "epochs": 2, "seed": 0},
    "grid": {"workers": [1, 2], "batch_min": 32, "batch_max": 128},
    "search": "full",
    "hardware": {"device": "cpu"},
    "probe": {"warmup_steps": 1, "timed_steps": 3, "timeout_s": 120, "time_budget_s": 1.0},
    "train": {"lr_decay_epochs": []},
    "launch": {"timeout_min": 30},
}


def parts(lab1_price: float) -> dict:
    return {
        "workers_per_node": 2,
        "partitions": [
            {"name": "lab0", "per_worker_hour": 1.0, "account": "root"},
            {"name": "lab1", "per_worker_hour": lab1_price, "account": "root"},
        ],
    }


def workdir(where: Path) -> None:
    copy_workflow(where)
    shutil.copytree(ROOT / "profiles" / "slurm", where / "profiles" / "slurm")
    prof_path = where / "profiles" / "slurm" / "config.yaml"
    prof = yaml.safe_load(prof_path.read_text())
    prof["default-resources"]["mem_mb"] = 1000  # a lab node shares this machine's memory
    prof_path.write_text(yaml.safe_dump(prof))


def plan(where: Path, objective: str, lab1_price: float, *extra: str, target="plan") -> dict:
    cfg = {**CONFIG, "objective": objective, "cluster": parts(lab1_price)}
    (where / "bench.yaml").write_text(yaml.safe_dump(cfg))
    # --jobs 1: the lab's two nodes share this machine's two cores, so one partition's probes
    # would slow the other's if they ran at once; one job at a time, each has the machine alone
    cmd = ["snakemake", *([target] if target else []), "--profile", "profiles/slurm", "--jobs", "1"]
    t0 = time.perf_counter()
    r = subprocess.run(
        [*cmd, "--configfile", "bench.yaml", *extra],
        cwd=where,
        env=env(),
        capture_output=True,
        text=True,
    )
    if r.returncode:
        sys.exit(f"{objective} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    sel = json.loads((where / "results" / "selection.json").read_text())
    block = sel["across_partitions"]
    return {
        "objective": objective,
        "lab1_price": lab1_price,
        "chosen": sel["partition"],
        "point": (sel["selected"]["workers"], sel["selected"]["global_batch"]),
        "runner_up": block["runner_up"]["partition"],
        "ratio": block["runner_up"]["ratio"],
        "values": {p["partition"]: p["value"] for p in block["partitions"]},
        "compute_ratios": block["compute_ratios"],
        "reason": sel["reason"],
        "wall_s": time.perf_counter() - t0,
    }


def production(where: Path, objective: str, lab1_price: float) -> dict:
    """The whole workflow (production included) at this objective; the job against its own
    partition's prediction."""
    plan(where, objective, lab1_price, target=None)
    res = where / "results"
    final = json.loads((res / "train" / "final.json").read_text())
    sel = json.loads((res / "selection.json").read_text())
    return {
        "objective": objective,
        "partition": sel["partition"],
        "point": (final["workers"], final["global_batch"]),
        "step_s": final["mean_step_time_s"],
        "predicted_step_s": final["predicted_step_time_s"],
        "ratio": final["step_time_ratio"],
        "interval": tuple(final["predicted_step_time_interval_s"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slow", type=float, default=2.0, help="lab1's slowdown F")
    ap.add_argument(
        "--plans-only",
        action="store_true",
        help="1.-5. only, no production (a change that moves nothing after the choice)",
    )
    a = ap.parse_args()
    holding = tests_helper("holding")
    subprocess.run(
        [
            *CLUSTER,
            "up",
            "--nodes",
            "2",
            "--slots",
            "2",
            "--partitions",
            "2",
            "--slow",
            f"lab1:{a.slow:g}",
        ],
        check=True,
        capture_output=True,
    )
    where = Path(tempfile.mkdtemp(prefix="lab-partitions-"))
    workdir(where)
    queues = ["--forcerun", "queue"]  # every partition's queue asked again
    out: dict = {"slow": a.slow, "plans": [], "production": []}
    try:
        out["plans"].append(plan(where, "time", 1.0))
        out["plans"].append(plan(where, "knee", 1.0))
        out["plans"].append(plan(where, "cost", 0.25))
        with holding("lab0", minutes=30):
            out["plans"].append(plan(where, "time_to_result", 1.0, *queues))
        out["plans"].append(plan(where, "time_to_result", 1.0, *queues))
        if not a.plans_only:
            out["production"].append(production(where, "cost", 0.25))
            out["production"].append(production(where, "time", 1.0))
    finally:
        subprocess.run([*CLUSTER, "slow", "none"], capture_output=True)
    write_json(ROOT / "results" / "fidelity" / "lab_partitions.json", out)
    ratios = out["plans"][0]["compute_ratios"][0]
    print(
        f"lab1's probes' compute step over lab0's: x{ratios['compute_ratio']:.2f} "
        f"(median of {ratios['points']} (N, B); quota 1/{a.slow:g} of a core)"
    )
    print("\n| objective | lab1 price | chosen | (N, B) | runner-up, ratio | wall |")
    print("|---|---|---|---|---|---|")
    for p in out["plans"]:
        print(
            f"| {p['objective']} | {p['lab1_price']:g} | {p['chosen']} | {p['point']} | "
            f"{p['runner_up']} x{p['ratio']:.2f} | {p['wall_s']:.0f} s |"
        )
    print("\n| objective | partition | (N, B) | step / predicted | interval |")
    print("|---|---|---|---|---|")
    for p in out["production"]:
        lo, hi = p["interval"]
        print(
            f"| {p['objective']} | {p['partition']} | {p['point']} | x{p['ratio']:.3f} | "
            f"{lo * 1e3:.1f}-{hi * 1e3:.1f} ms, measured {p['step_s'] * 1e3:.1f} ms |"
        )
    for p in out["plans"]:
        print(f"\n{p['objective']}: {p['reason'][:400]}")


if __name__ == "__main__":
    main()
