"""How long the choice's robustness takes in `tula select`: its RESAMPLES resamples of the
probes' timings (tula.model.robust.choice_shares: every mean redrawn, the step model refitted,
every point predicted, the objective chosen again), on the H200 campaign's record
(bench/gpu-runs/h200-2026-11-28: its measurements, fitted here once). Each run is a fresh
process; with ``--before SRC`` (another checkout's src/, e.g. a git worktree of the commit
before) the two alternate, run by run, and the ratio of their medians is printed.

    .venv/bin/python bench/select_time.py [--before /tmp/before/src] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _harness import ROOT, python_on

RECORD = ROOT / "bench" / "gpu-runs" / "h200-2026-11-28"

TIMED = """
import json, sys, time
from tula import config as config_mod, model_inputs
from tula.io import read_json
from tula.model import measurements, robust
from tula.model.memory import MemoryModel
from tula.model.perf import PerfModel
record, models = sys.argv[1], sys.argv[2]
cfg = config_mod.load(record + "/config.yaml")
measured = measurements.load(record + "/results/measurements.csv")
perf = PerfModel.from_dict(read_json(models + "/perf.json"))
mem = MemoryModel.from_dict(read_json(models + "/memory.json"))
d = int(measured["train_samples"].dropna().iloc[0])
t = time.perf_counter()
shares = robust.choice_shares(model_inputs.planning(cfg), measured, perf, mem, d)
shares = [getattr(s, "to_json", lambda s=s: s)() for s in shares[:2]]  # a Share, or a dict
print(json.dumps({"s": time.perf_counter() - t, "shares": shares}))
"""


def fit(models: Path) -> None:
    """The record's memory and step-time models, as `tula fit` makes them."""
    subprocess.run(
        [
            str(Path(sys.executable).parent / "tula"),
            "fit",
            "--config",
            str(RECORD / "config.yaml"),
            "--measurements",
            str(RECORD / "results" / "measurements.csv"),
            "--memory-out",
            str(models / "memory.json"),
            "--perf-out",
            str(models / "perf.json"),
        ],
        check=True,
        capture_output=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="another checkout's src/, timed alternately")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fit(Path(tmp))
        sides = {"this checkout": None, **({"before": a.before} if a.before else {})}
        seconds: dict[str, list[float]] = {k: [] for k in sides}
        for i in range(a.runs):
            for name, src in sides.items():
                out = json.loads(python_on(src, TIMED, str(RECORD), tmp).splitlines()[-1])
                seconds[name].append(out["s"])
                print(f"[select_time] run {i + 1} {name}: {out['s']:.2f} s, {out['shares']}")
    for name, xs in seconds.items():
        print(f"[select_time] {name}: median {statistics.median(xs):.2f} s of {len(xs)} runs")
    if a.before:
        ratio = statistics.median(seconds["this checkout"]) / statistics.median(seconds["before"])
        print(f"[select_time] this checkout / before: x{ratio:.2f}")


if __name__ == "__main__":
    main()
