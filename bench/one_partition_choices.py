"""A config without `cluster.partitions` chooses as the code before the partitions did, on the
same results. Needs git.

    .venv/bin/python bench/one_partition_choices.py RESULTS CONFIG [--before 5794e75] [--predict]
        [--queue QUEUE_JSON]

RESULTS is a one-partition run's results/ (predictions.csv, measurements.csv, model/); CONFIG
its YAML. For each objective, `tula select` (with the measurements and fits: the resamples'
robustness too) runs with this checkout's code and with the code at --before (a git worktree),
one after the other; the choices, runners-up and reasons are compared. predict and fit are
unchanged by the partitions (git diff names the files), so predictions.csv is what both would
have written. With --predict, `tula predict` runs too with each code on the same measurements
and fits: the two predictions.csv are compared cell by cell, each code then selects on its own,
and the whole selection.json (the resamples' shares too) is compared. With --queue, this
checkout's select is given the partition's queue.json as its workflow gives it (every partition
asks its queue); the whole selection.json is then compared without its `queue` block.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import yaml

from _harness import ROOT, env, worktree

OBJECTIVES = ("time", "cost", "knee", "time_to_accuracy", "cost_to_accuracy")
PREDICTION_CODE = (
    "src/tula/model/predictions.py",
    "src/tula/model/perf.py",
    "src/tula/model/forms.py",
    "src/tula/model/curvefit.py",
    "src/tula/model/formchoice.py",
    "src/tula/stages/predict.py",
    "src/tula/stages/fit.py",
)


def predict(src: Path, res: Path, cfg: Path, out: Path) -> None:
    cmd = [sys.executable, "-m", "tula.cli", "predict", "--config", str(cfg)]
    cmd += [
        "--measurements",
        str(res / "measurements.csv"),
        "--workload",
        str(res / "workload.json"),
    ]
    cmd += ["--perf", str(res / "model/perf.json"), "--memory", str(res / "model/memory.json")]
    subprocess.run(cmd + ["--out", str(out)], env=env(PYTHONPATH=str(src)), check=True)


def select(
    src: Path, res: Path, cfg: Path, out: Path, pred: Path | None = None, queue: Path | None = None
) -> dict:
    cmd = [sys.executable, "-m", "tula.cli", "select", "--config", str(cfg)]
    cmd += ["--queue", str(queue)] if queue else []
    cmd += ["--predictions", str(pred or res / "predictions.csv"), "--out", str(out)]
    cmd += ["--measurements", str(res / "measurements.csv")]
    cmd += ["--perf", str(res / "model/perf.json"), "--memory", str(res / "model/memory.json")]
    r = subprocess.run(cmd, env=env(PYTHONPATH=str(src)), capture_output=True, text=True)
    if r.returncode:
        return {"error": (r.stderr or r.stdout).strip().splitlines()[-1]}
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("config", type=Path)
    ap.add_argument("--before", default="5794e75")
    ap.add_argument("--predict", action="store_true", help="predict with each code too")
    ap.add_argument("--queue", type=Path, help="queue.json given to this checkout's select")
    a = ap.parse_args()
    changed = subprocess.run(
        ["git", "diff", "--stat", a.before, "--", *PREDICTION_CODE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    print(f"prediction code changed since {a.before}: {changed or 'nothing'}")
    tmp = Path(tempfile.mkdtemp(prefix="one-partition-"))
    with worktree(a.before) as old:
        print("\n| objective | before | now | runner-up same | reason same |")
        print("|---|---|---|---|---|")
        base = yaml.safe_load(a.config.read_text())
        preds = {"before": None, "now": None}
        if a.predict:
            preds = {k: tmp / f"predictions-{k}.csv" for k in preds}
            for k, src in (("before", old / "src"), ("now", ROOT / "src")):
                predict(src, a.results, a.config, preds[k])
            print(f"predictions.csv, every cell: {same_frames(preds['before'], preds['now'])}")
        same = 0
        for objective in OBJECTIVES:
            cfg = tmp / f"{objective}.yaml"
            cfg.write_text(yaml.safe_dump({**base, "objective": objective}))
            was = select(old / "src", a.results, cfg, tmp / f"{objective}-b.json", preds["before"])
            now = select(
                ROOT / "src", a.results, cfg, tmp / f"{objective}-n.json", preds["now"], a.queue
            )
            asked = now.pop("queue", None) if a.queue else None
            if "error" in was or "error" in now:
                print(f"| {objective} | {was.get('error', 'ok')} | {now.get('error', 'ok')} | | |")
                same += was.get("error") == now.get("error")
                continue

            def pt(s):
                return (s["selected"]["workers"], s["selected"]["global_batch"])

            runner = was["runner_up"] == now["runner_up"]
            reason = was["reason"] == now["reason"]
            same += pt(was) == pt(now) and runner and reason
            whole = f" (whole selection.json: {was == now})" if a.predict else ""
            whole += f" (queue: {asked['error'] or 'waits'})" if asked else ""
            print(f"| {objective} | {pt(was)} | {pt(now)} | {runner} | {reason}{whole} |")
        print(f"\n{same} of {len(OBJECTIVES)} objectives: the same choice, runner-up and reason")


def same_frames(a: Path, b: Path) -> str:
    """'identical', or what differs between two predictions.csv."""
    x, y = pd.read_csv(a), pd.read_csv(b)
    if list(x.columns) != list(y.columns):
        return f"columns differ: {sorted(set(x.columns) ^ set(y.columns))} or their order"
    try:
        pd.testing.assert_frame_equal(x, y, check_exact=True)
    except AssertionError as e:
        return f"differ: {str(e).splitlines()[0]}"
    return f"identical ({len(x)} rows x {len(x.columns)} columns)"


if __name__ == "__main__":
    main()
