"""Fault drill: an out-of-memory error injected at each place of the production
job, 3 runs each, 2 workers (gloo, submitit's local executor), small_cnn on digits, 2 epochs
at B=64 (23 steps per epoch), a checkpoint every 5 steps and at each epoch's end.

For each place (TULA_INJECT_FAULT ``oom:...,where=W``, rank 1, only at B=64):

- outcome: the attempts' outcomes, and whether the run completed;
- steps redone: steps the failed attempt had taken past the checkpoint the next one resumed
  from (0 for evaluation, which retries in place);
- seconds from the fault to resumed training: from the failing rank's record (``oom/``,
  written when the error is caught) to the resumed attempt's first training step
  (``segments.json``: process start, restore, first step). Evaluation: from the start of
  the failed evaluation pass to its retry (``eval_oom_retries``);
- wall time of the whole `tula launch` against a fault-free run (interleaved, medians).

    .venv/bin/python bench/fault_drill.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

STEPS1 = 23  # steps of epoch 1 at B=64 on digits' 1437 training samples
PLACES = {  # place: (fault spec, what the next attempt resumes from)
    "none": "",
    "forward": "oom:step=7,rank=1,batch=64,where=forward",
    "backward": "oom:step=7,rank=1,batch=64,where=backward",
    "refresh": f"oom:step={STEPS1},rank=1,batch=64,where=refresh",
    "eval": f"oom:step={STEPS1},rank=1,batch=64,where=eval",
    "checkpoint": "oom:step=10,rank=1,batch=64,where=checkpoint",
}


def drill(out: Path) -> dict:
    """What one run's records say about the fault and the recovery."""
    rec = json.loads((out / "attempts.json").read_text())
    final = json.loads((out / "final.json").read_text())
    atts = rec["attempts"]
    row = {
        "outcomes": " → ".join(f"{a['outcome']} (B={a['global_batch']})" for a in atts),
        "completed": rec["outcome"] == "completed",
        "steps_redone": 0,
        "recovery_s": None,
    }
    if len(atts) > 1:
        marker = json.loads(next((out / "oom").glob("attempt1-rank*.json")).read_text())
        segs = json.loads((out / "segments.json").read_text())
        resumed = next(s for s in segs if s["attempt"] == 2)
        row["steps_redone"] = marker["step"] - atts[1]["start_step"]
        row["recovery_s"] = resumed["first_step_time"] - marker["time"]
    elif final["eval_oom_retries"]:
        row["recovery_s"] = final["eval_oom_retries"][0]["seconds_lost"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    tula = str(Path(sys.executable).parent / "tula")
    results: dict[str, list[dict]] = {p: [] for p in PLACES}
    with tempfile.TemporaryDirectory() as d:
        cfgp = Path(d) / "c.yaml"
        cfgp.write_text(
            yaml.safe_dump(
                {
                    "workload": {"model": "small_cnn", "dataset": "digits", "epochs": 2},
                    "grid": {"workers": [1, 2], "batch_min": 32, "batch_max": 128},
                    "launch": {"checkpoint_every_steps": 5, "poll_s": 0.5, "executor": "local"},
                }
            )
        )
        sel = Path(d) / "sel.json"
        sel.write_text('{"selected": {"workers": 2, "global_batch": 64}}')
        for i in range(a.runs):
            for place, fault in PLACES.items():  # interleaved
                out = Path(d) / f"{place}-{i}"
                env = dict(os.environ, TULA_INJECT_FAULT=fault)
                t0 = time.perf_counter()
                r = subprocess.run(
                    [
                        tula,
                        "launch",
                        "--config",
                        str(cfgp),
                        "--selection",
                        str(sel),
                        "--out-dir",
                        str(out),
                    ],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                wall = time.perf_counter() - t0
                row = (
                    drill(out)
                    if r.returncode == 0
                    else {
                        "outcomes": f"launch failed: {r.stderr[-300:]}",
                        "completed": False,
                        "steps_redone": None,
                        "recovery_s": None,
                    }
                )
                results[place].append({**row, "wall_s": wall})
                print(
                    f"run {i + 1} {place}: {row['outcomes']}, redone {row['steps_redone']}, "
                    f"recovery {row['recovery_s']}, wall {wall:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
    base = statistics.median(r["wall_s"] for r in results["none"])
    print(
        f"\n## Fault drill: OOM at each place, {a.runs} runs each, 2 workers, digits, 2 epochs, "
        "B=64\n"
    )
    print(
        "| place | outcome (every run) | completed | steps redone | fault → resumed training "
        "(median, range) | wall time (median) | vs no fault |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for place, rows in results.items():
        outcomes = sorted({r["outcomes"] for r in rows})
        rec = [r["recovery_s"] for r in rows if r["recovery_s"] is not None]
        rec_s = f"{statistics.median(rec):.2f} s ({min(rec):.2f}–{max(rec):.2f})" if rec else "—"
        redone = sorted({r["steps_redone"] for r in rows}, key=str)
        wall = statistics.median(r["wall_s"] for r in rows)
        print(
            f"| {place} | {' / '.join(outcomes)} | {sum(r['completed'] for r in rows)}/{len(rows)} "
            f"| {', '.join(map(str, redone))} | {rec_s} | {wall:.1f} s | {wall / base:.2f}x |"
        )


if __name__ == "__main__":
    main()
