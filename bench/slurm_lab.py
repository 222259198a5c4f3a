"""The two-node SLURM cluster on the network lab, measured as a user runs Tula on it. Needs root.

    .venv/bin/python bench/slurm_lab.py [--rates 200mbit 50mbit] [--intervals 4 44]   # ~20 min

1. **The campaign at each link rate**: the whole workflow through `snakemake --profile` on
   `scripts/slurm-cluster.sh up --nodes 2` (tests/conftest.py's lab_workdir: grid.workers 1, 2,
   4, two workers a node, partition `lab`; here B = 32..256 and `search: full`, so that every
   point has a measurement to be held out against; production held at N = 4, on both nodes,
   by constraints.min_workers). From its own probe records:
   - held-out step-time error, partial (fit on the points Tula's partial search probes,
     predict the others) and full (leave one out), for Tula's one- and two-level models and
     AdaptDL's, on the same probe rows (bench/netlab_fidelity.py's ``errors``);
   - the production job's step and wall time over their prediction at N = 4, B (two nodes);
   - SLURM's own cost per probe job: submission (sacct Submit) to the job's start (Start),
     and to its first timed step (the record's started_at, to the second, plus the worker's
     own start-up to its first step).
2. **The node-loss drill**, at the first rate, for each checkpoint interval k (steps):
   `tula launch` at the campaign's N = 4 point from its predictions, 8 epochs, once clean and
   once with tula-n1 killed after two epochs (every process on it, the node marked down) and
   revived 5 s later. Lost time = the drilled run's wall time - the clean one's.

Prints Markdown tables (BENCHMARKS.md "Nodes and networks") and writes
results/fidelity/slurm_lab.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from _harness import ROOT, env, tests_helper
from netlab_fidelity import errors
from tula import config as config_mod
from tula.io import write_json
from tula.stages.aggregate import rows_from_probe

CLUSTER = ["bash", str(ROOT / "scripts" / "slurm-cluster.sh")]
DRILL_BATCH = 32  # N = 4 at B = 32: 45 steps an epoch of digits, so an interval of k steps counts


def sh(*cmd: str, **kw) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True, **kw).stdout


def campaign(where: Path, rate: str) -> dict:
    """The whole workflow at ``rate``; what section 1 reports."""
    lab_workdir = tests_helper("lab_workdir")
    cmd, run_env = lab_workdir(
        where,
        held_polls=False,  # the user's snakemake, its status checks backed off as theirs are
        grid={"batch_max": 256},
        search="full",
        workload={"epochs": 10},
        probe={"timed_steps": 10, "time_budget_s": 2},
    )
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "netlab.sh"), "rate", rate],
        env={**os.environ, "NETLAB_PREFIX": "tula"},
        check=True,
        capture_output=True,
    )
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=where, env=run_env, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"the workflow failed at {rate}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    dag_s = time.perf_counter() - t0
    res = where / "results"
    rows, cost = [], []
    jobs = sh("sacct", "-n", "-X", "-P", "-a", "-S", "now-1hours", "-o", "Comment,Submit,Start")
    when = {c: (s, st) for c, s, st in (j.split("|") for j in jobs.split()) if "rule_probe_" in c}
    # the profile's partition's records: partitions/<name>/probes/N{n}/B{b}.json, one job per N
    for f in sorted(res.glob("partitions/*/probes/N*/B*.json")):
        rec = json.loads(f.read_text())
        point, part = f"{f.parent.name}_{f.stem}", f.parents[2].name
        rows += rows_from_probe(rec, point)
        submit, start = when.get(f"rule_probe_wildcards_{part}_{f.parent.name[1:]}", (None, None))
        if submit and rec.get("started_at"):
            t_sub = datetime.fromisoformat(submit).timestamp()
            t_start = datetime.fromisoformat(start).timestamp()
            t_run = datetime.fromisoformat(rec["started_at"]).timestamp()
            first = t_run - t_sub + rec.get("startup_time_s", 0.0)
            cost.append({"point": point, "to_start_s": t_start - t_sub, "to_first_step_s": first})
    df = pd.DataFrame(rows)
    df = df[df["source"] == "probe"].reset_index(drop=True)
    df["point"] = [f"N{w}_B{b}" for w, b in zip(df["workers"], df["global_batch"])]
    # held out: what a partial search would not have probed (the campaign probed every point)
    raw = json.loads((where / ".snakemake/tula/config.json").read_text())
    cfg = config_mod.from_dict({**raw, "search": "partial"})
    final = json.loads((res / "train" / "final.json").read_text())
    return {
        "dag_s": dag_s,
        "errors": errors(df, cfg),
        "noise_pct": 100 * float(df["step_time_cv"].median()),
        "probes": len(df),
        "slurm_cost": cost,
        "production": {
            k: final.get(k)
            for k in ("workers", "global_batch", "step_time_ratio", "wall_time_ratio", "wall_check")
        },
    }


def drill(where: Path, interval: int, kill: bool) -> dict:
    """`tula launch` at N = 4 (both nodes), B = 32 (45 steps an epoch), checkpointing every
    ``interval`` steps and at epoch ends; with ``kill``, tula-n1 dies half an epoch after the
    first epoch ended (so the work since the last checkpoint depends on the interval) and
    comes back 5 s later."""
    out = where / f"drill_k{interval}_{'kill' if kill else 'clean'}"
    out.mkdir()
    cmd = tests_helper("lab_launch_command")(
        where, out, checkpoint_every_steps=interval, node_wait_min=5
    )
    (out / "selection.json").write_text(
        json.dumps({"selected": {"workers": 4, "global_batch": DRILL_BATCH}})
    )
    cmd[cmd.index("--selection") + 1] = "selection.json"
    t0 = time.perf_counter()
    with open(out / "launch.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=out, stdout=log, stderr=subprocess.STDOUT, env=env())
    metrics, killed_at = out / "train" / "metrics.csv", None
    while kill and killed_at is None and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            time.sleep(pd.read_csv(metrics)["epoch_time_s"].iloc[0] / 2)
            sh(*CLUSTER, "kill-node", "tula-n1", "bench drill")
            killed_at = time.perf_counter() - t0
            time.sleep(5)
            sh(*CLUSTER, "revive-node", "tula-n1")
        time.sleep(0.1)
    if proc.wait(timeout=900):
        sys.exit(f"tula launch failed:\n{(out / 'launch.log').read_text()[-3000:]}")
    wall = time.perf_counter() - t0
    attempts = json.loads((out / "train" / "attempts.json").read_text())["attempts"]
    final = json.loads((out / "train" / "final.json").read_text())
    return {
        "wall_s": wall,
        "killed_at_s": killed_at,
        "attempts": [(a["outcome"], a["start_step"], a["checkpoint_step"]) for a in attempts],
        "resumed_from": attempts[-1]["start_step"] if len(attempts) > 1 else None,
        "steps_per_epoch": final["steps"] // final["epochs"],
        "step_s": final["mean_step_time_s"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", nargs="+", default=["200mbit", "50mbit"])
    ap.add_argument("--intervals", nargs="+", type=int, default=[4, 1000])
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/slurm_lab.py needs root (it makes the network lab and starts slurmd)")
    had_one_node = subprocess.run(["scontrol", "ping"], capture_output=True).returncode == 0
    results: dict = {"campaign": {}, "drill": {}}
    sh(*CLUSTER, "up", "--nodes", "2", "--rate", a.rates[0], "--slots", "2")
    try:
        with tempfile.TemporaryDirectory(prefix="tula-slurm-lab-") as tmp:
            for rate in a.rates:
                where = Path(tmp) / rate
                where.mkdir()
                results["campaign"][rate] = campaign(where, rate)
                print(f"{rate}: campaign done", flush=True)
            subprocess.run(
                ["bash", str(ROOT / "scripts" / "netlab.sh"), "rate", a.rates[0]],
                env={**os.environ, "NETLAB_PREFIX": "tula"},
                check=True,
            )
            for k in a.intervals:
                where = Path(tmp) / a.rates[0]
                results["drill"][k] = {m: drill(where, k, m == "kill") for m in ("clean", "kill")}
                print(f"drill k={k}: {results['drill'][k]}", flush=True)
    finally:
        sh(*CLUSTER, "up") if had_one_node else sh(*CLUSTER, "down")
    write_json(ROOT / "results" / "fidelity" / "slurm_lab.json", results)
    report(results)


def report(results: dict) -> None:
    print("\n| link | search | Tula one-level | Tula two-level | AdaptDL | probes' noise (CV) |")
    print("|---|---|---:|---:|---:|---:|")
    for rate, r in results["campaign"].items():
        for search in ("partial", "full"):
            cells = [
                f"{r['errors'][m][search]:.1f} % (max {r['errors'][m][search + '_max']:.0f} %)"
                for m in ("tula_one_level", "tula_two_level", "adaptdl")
            ]
            print(f"| {rate} | {search} | " + " | ".join(cells) + f" | {r['noise_pct']:.1f} % |")
    print(
        "\n| link | DAG | production (N, B) | step paid / predicted | wall paid / predicted "
        "| SLURM: submission to start, median (range) | submission to first step |"
    )
    print("|---|---:|---|---:|---:|---:|---:|")
    for rate, r in results["campaign"].items():
        p, c = r["production"], pd.DataFrame(r["slurm_cost"])

        def med(col: str) -> str:
            v = c[col].to_numpy() if len(c) else np.array([np.nan])
            return f"{np.median(v):.1f} s ({v.min():.0f}-{v.max():.0f})"

        print(
            f"| {rate} | {r['dag_s']:.0f} s | {p['workers']}, {p['global_batch']} | "
            f"{p['step_time_ratio']:.3f} | {p['wall_time_ratio']:.3f} | {med('to_start_s')} | "
            f"{med('to_first_step_s')} |"
        )
    print(
        "\n| checkpoint every | clean wall | drilled wall | lost | steps redone (at most) "
        "| attempts (outcome, from step) |"
    )
    print("|---:|---:|---:|---:|---:|---|")
    for k, d in results["drill"].items():
        kill = d["kill"]
        lost = kill["wall_s"] - d["clean"]["wall_s"]
        att = ", ".join(f"{o} from {s}" for o, s, _ in kill["attempts"])
        spe = d["clean"]["steps_per_epoch"]
        every = f"{k} steps" if int(k) < spe else "epoch ends only"
        redo = min(int(k), spe)
        print(
            f"| {every} | {d['clean']['wall_s']:.1f} s | {kill['wall_s']:.1f} s | {lost:.1f} s "
            f"| {redo} ({redo * kill['step_s']:.1f} s of steps) | {att} |"
        )


if __name__ == "__main__":
    main()
