"""Network drift during training: does the production job notice that its link got
slower, how soon, does moving pay, does it stay quiet when nothing changes, and what does
monitoring cost?

Part ``netlab`` (root): the network lab (scripts/netlab.sh), 2 nodes x 2 workers, links at 50mbit
(the tests' rate). Real probes (``tula probe``) at N = 1, 2, 4 x B = 32, 128; the perf model fitted
on them (two-level where it wins, as `tula fit` does) gives the predictions.csv rows. Then ``tula
launch`` at N = 4, B = 128 (digits, small_cnn, 60 epochs, objective time, monitored every 5 steps):
``--runs`` runs each of ``launch.replan: move`` and ``record`` whose link is re-shaped to 12mbit (4x
slower) once 30 % of the steps are done (wall time to finish, steps from the slowdown to the
decision, where it moved and why), alternating, and ``--quiet-runs`` runs with the link unchanged
(``move``: false alarms, moves for nothing).

Part ``overhead`` (no root): the default workload's model and data at N = 2, B = 64 on this
machine (one node), probed and fitted the same way. ``tula launch`` with
``launch.replan: off`` and ``record`` (``monitor_every_steps: auto``) alternating, ``--runs``
each: training-step time, wall time, and monitoring's own measured cost; and
``--quiet-runs`` runs monitored every 5 steps (many observations) for false alarms.

    .venv/bin/python bench/drift.py --parts netlab overhead --runs 3 --quiet-runs 5

Writes results/fidelity/drift.json and prints the tables of BENCHMARKS.md "Nodes and networks".
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from _harness import ROOT, tests_helper
from tula.io import write_json
from tula.model import perf as perfmodel
from tula.model.grid import steps_per_epoch
from tula.stages import probe
from tula.stages.aggregate import rows_from_probe

when_step_reached = tests_helper("when_step_reached")  # the tests' watcher of steps.csv
LAB = "tulad"
RATE, SLOWER = (
    "50mbit",
    "12mbit",
)  # as tests/test_netlab.py; at 200 -> 50mbit the band was wider than the change here
BASE = {
    "workload": {"model": "small_cnn", "dataset": "digits", "epochs": 20, "seed": 0},
    "grid": {"workers": [1, 2], "batch_min": 32, "batch_max": 128},
    "probe": {
        "warmup_steps": 2,
        "timed_steps": 10,
        "time_budget_s": 1,
        "timeout_s": 300,
        "sweep_steps": 0,
        "noise_steps": 0,
    },
    "train": {"lr_decay_epochs": []},
}
D = 1437  # digits training samples


def lab(*args: str) -> None:
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "netlab.sh"), *args],
        check=True,
        env={**os.environ, "NETLAB_PREFIX": LAB},
    )


def probe_and_predict(d: Path, raw: dict, points, per_node: int) -> Path:
    """Probe ``points`` for real, fit the perf model on them (as `tula fit`), and write their
    predictions.csv rows (as `tula predict` would, for these points)."""
    cfg_path = d / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    rows = []
    for n, b in points:
        rec = probe.run(cfg_path, n, b, d / f"N{n}_B{b}.json")
        if rec["status"] != "ok":
            raise SystemExit(f"probe N={n} B={b}: {rec['status']}: {rec.get('error')}")
        rows += rows_from_probe(rec, f"N{n}_B{b}")
    perf = perfmodel.fit(pd.DataFrame(rows), "ring", workers_per_node=per_node)
    epochs, out = raw["workload"]["epochs"], []
    for n, b in points:
        lo, hi = (float(x[0]) for x in perf.step_time_interval_s(np.array([n]), np.array([b // n])))
        step, comp, spe = (
            float(perf.step_time_s(n, b // n)),
            float(perf.compute_time_s(n, b // n)),
            steps_per_epoch(D, b),
        )
        out.append(
            {
                "workers": n,
                "nodes": -(-n // per_node),
                "global_batch": b,
                "local_batch": b // n,
                "compute_time_s": comp,
                "sync_time_s": step - comp,
                "step_time_s": step,
                "step_time_lo_s": lo,
                "step_time_hi_s": hi,
                "steps_per_epoch": spe,
                "epochs": epochs,
                "train_time_s": epochs * spe * step,
                "train_time_lo_s": epochs * spe * lo,
                "train_time_hi_s": epochs * spe * hi,
                "cost": epochs * spe * step * n,
                "mem_bytes": 1e6,
                "feasible": True,
                "probe_status": "ok",
                "form": perf.step.form.name if perf.step else None,
            }
        )
    pred = pd.DataFrame(out)
    pred.to_csv(d / "predictions.csv", index=False)
    print(
        pred[
            ["workers", "nodes", "global_batch", "compute_time_s", "sync_time_s", "step_time_s"]
        ].to_string(),
        flush=True,
    )
    return d / "predictions.csv"


def train(
    d: Path,
    raw: dict,
    at: tuple[int, int],
    predictions: Path,
    name: str,
    slow_at: float | None = None,
    **launch_cfg,
) -> dict:
    """One `tula launch`; with ``slow_at``, the lab's link goes to SLOWER once that share of
    the steps is done (a thread watching steps.csv)."""
    run = d / name
    run.mkdir()
    raw = copy.deepcopy(raw)
    raw["launch"] = {"executor": "local", "poll_s": 0.5, **launch_cfg}
    (run / "config.yaml").write_text(yaml.safe_dump(raw))
    write_json(run / "selection.json", {"selected": {"workers": at[0], "global_batch": at[1]}})
    total = raw["workload"]["epochs"] * steps_per_epoch(D, at[1])
    t0 = time.time()
    slow = (
        when_step_reached(run / "train" / "steps.csv", slow_at * total, lambda: lab("rate", SLOWER))
        if slow_at
        else (contextlib.nullcontext({}))
    )
    with slow as slowed:
        try:
            final = tests_helper("train_from_files")(
                run / "config.yaml", run / "selection.json", run / "train", predictions=predictions
            )
        finally:
            if slow_at:
                lab("rate", RATE)
    steps = pd.read_csv(run / "train" / "steps.csv")
    atts = json.loads((run / "train" / "attempts.json").read_text())["attempts"]
    drifts = [x for a in atts for x in a["drift"]]
    out = {
        "attempts": [(a["workers"], a["global_batch"], a["outcome"]) for a in atts],
        "moves": [a["reason"] for a in atts if a["outcome"] == "moved"],
        "decisions": [(x["step"], x["action"]) for x in drifts],
        "wall_s": time.time() - t0,
        "train_time_s": final["train_time_s"],
        "monitor_time_s": final["monitor_time_s"],
        "steps": final["steps"],
        "monitored": final["monitored_steps"],
        "drift": drifts,
        "mean_step_ms": 1e3 * final["mean_step_time_s"],
        "slowed_at_step": slowed.get("step"),
        "sync_ms_median": 1e3 * float(steps["sync_time_s"].median()) if len(steps) else None,
        "band_hi_ms": 1e3 * float(steps["sync_hi_s"].iloc[0]) if len(steps) else None,
    }
    if slowed:
        after = steps[steps["step"] > slowed["step"]]
        first = next(
            (x for x in drifts if x["step"] > slowed["step"] and x["direction"] == "slower"), None
        )
        out.update(
            decision_step=first["step"] if first else None,
            steps_to_decision=(first["step"] - slowed["step"]) if first else None,
            observations_to_decision=int((after["step"] <= first["step"]).sum()) if first else None,
            sync_ms_before=1e3
            * float(steps[steps["step"] <= slowed["step"]]["sync_time_s"].median()),
            sync_ms_after=1e3 * float(after["sync_time_s"].median()) if len(after) else None,
        )
    print(f"{name}: {out}", flush=True)
    return out


def part_netlab(tmp: Path, runs: int, quiet_runs: int) -> dict:
    raw = copy.deepcopy(BASE)
    raw["workload"]["epochs"], raw["objective"] = 60, "time"
    raw["grid"]["workers"] = [1, 2, 4]
    raw["cluster"] = {"workers_per_node": 2, "netlab": LAB}
    d = tmp / "netlab"
    d.mkdir()
    lab("up", "2", RATE)
    try:
        pred = probe_and_predict(d, raw, [(n, b) for n in (1, 2, 4) for b in (32, 128)], per_node=2)
        res = {
            "prediction": pd.read_csv(pred).to_dict("records"),
            "unchanged": [],
            "move": [],
            "record": [],
        }
        for i in range(max(runs, quiet_runs)):  # alternating, so each kind sees the machine alike
            if i < runs:
                res["move"].append(
                    train(
                        d,
                        raw,
                        (4, 128),
                        pred,
                        f"move{i}",
                        slow_at=0.3,
                        monitor_every_steps=5,
                        replan="move",
                    )
                )
                res["record"].append(
                    train(
                        d,
                        raw,
                        (4, 128),
                        pred,
                        f"record{i}",
                        slow_at=0.3,
                        monitor_every_steps=5,
                        replan="record",
                    )
                )
            if i < quiet_runs:
                res["unchanged"].append(
                    train(d, raw, (4, 128), pred, f"same{i}", monitor_every_steps=5, replan="move")
                )
    finally:
        lab("down")
    return res


def part_overhead(tmp: Path, runs: int, quiet_runs: int) -> dict:
    raw = copy.deepcopy(BASE)
    raw["cluster"] = {"workers_per_node": 2}  # this machine: one node of 2 workers
    d = tmp / "overhead"
    d.mkdir()
    pred = probe_and_predict(d, raw, [(n, b) for n in (1, 2) for b in (32, 64, 128)], per_node=2)
    res: dict = {"off": [], "auto": [], "every5": []}
    for i in range(max(runs, quiet_runs)):
        if i < runs:
            res["off"].append(train(d, raw, (2, 64), pred, f"off{i}", replan="off"))
            res["auto"].append(
                train(
                    d, raw, (2, 64), pred, f"auto{i}", replan="record", monitor_every_steps="auto"
                )
            )
        if i < quiet_runs:
            res["every5"].append(
                train(d, raw, (2, 64), pred, f"every5_{i}", replan="record", monitor_every_steps=5)
            )
    return res


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def ratio(a, b, key):
    """The median of ``key`` over runs ``a`` against its median over runs ``b``."""
    return med([x[key] for x in a]) / med([x[key] for x in b])


def report(results: dict) -> None:
    if "netlab" in results:
        r = results["netlab"]
        print(
            f"\nnetlab: N=4 B=128 on 2 nodes x 2 workers, 60 epochs; link {RATE}, re-shaped to "
            f"{SLOWER} at 30 % of the steps"
        )
        print(
            "| run | replan | attempts (N, B, outcome) | drifts: step (action) | sync before / "
            "after the slowdown (ms; after a move: at the new N) | slowed at step | first drift at "
            "step | steps (observations) to it | wall (s) |"
        )
        print("|---|---|---|---|---:|---:|---:|---:|---:|")
        for kind in ("move", "record", "unchanged"):
            for i, x in enumerate(r[kind]):
                sync = (
                    f"{x['sync_ms_before']:.1f} / {x['sync_ms_after']:.1f}"
                    if x.get("slowed_at_step")
                    else f"{x['sync_ms_median']:.1f}"
                )
                att = "; ".join(f"{n}, {b}, {o}" for n, b, o in x["attempts"])
                dec = ", ".join(f"{s} ({a})" for s, a in x["decisions"]) or "none"
                print(
                    f"| {kind} {i + 1} | {'record' if kind == 'record' else 'move'} | {att} | "
                    f"{dec} | {sync} | {x.get('slowed_at_step') or ''} | "
                    f"{x.get('decision_step') or ''} | {x.get('steps_to_decision') or ''} "
                    f"({x.get('observations_to_decision') or ''}) | {x['wall_s']:.0f} |"
                )
        mv, rc = med([x["wall_s"] for x in r["move"]]), med([x["wall_s"] for x in r["record"]])
        if mv and rc:
            print(
                f"wall time, move / record (medians of {len(r['move'])}): {mv:.0f} s / {rc:.0f} s "
                f"= x{mv / rc:.3f}; false alarms in {len(r['unchanged'])} unchanged runs: "
                f"{sum(len(x['drift']) for x in r['unchanged'])}"
            )
        for x in r["move"]:
            for m in x["moves"]:
                print(f"  moved: {m}")
    if "overhead" in results:
        r = results["overhead"]
        off, auto, e5 = r["off"], r["auto"], r["every5"]
        print("\noverhead: digits small_cnn, N=2 B=64 on one node, 20 epochs (medians)")
        print(
            "| replan / monitor | runs | training steps (s) | wall (s) | monitored steps | "
            "monitoring cost (s) | cost / training steps | drifts found |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for name, xs in (("off", off), ("record / auto", auto), ("record / every 5", e5)):
            if not xs:
                continue
            print(
                f"| {name} | {len(xs)} | {med([x['train_time_s'] for x in xs]):.2f} | "
                f"{med([x['wall_s'] for x in xs]):.1f} | {med([x['monitored'] for x in xs])} | "
                f"{med([x['monitor_time_s'] for x in xs]):.3f} | "
                f"{100 * med([x['monitor_time_s'] / x['train_time_s'] for x in xs]):.2f} % | "
                f"{sum(len(x['drift']) for x in xs)} |"
            )
        if off and auto:
            print(
                f"training steps, record/auto vs off: x{ratio(auto, off, 'train_time_s'):.3f}; "
                f"wall x{ratio(auto, off, 'wall_s'):.3f}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--parts", nargs="+", default=["netlab", "overhead"], choices=["netlab", "overhead"]
    )
    ap.add_argument(
        "--runs", type=int, default=3, help="slowed runs per replan mode; off/auto runs"
    )
    ap.add_argument(
        "--quiet-runs", type=int, default=5, help="unperturbed monitored runs (false alarms)"
    )
    a = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="tula-drift-") as tmp:
        for part in a.parts:
            results[part] = {"netlab": part_netlab, "overhead": part_overhead}[part](
                Path(tmp), a.runs, a.quiet_runs
            )
    write_json(ROOT / "results" / "fidelity" / "drift.json", results)
    report(results)


if __name__ == "__main__":
    main()
