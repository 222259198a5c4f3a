"""Does a point probed after another in its probe job's process read as it does alone?

The probe job at N measures its batches in turn in one process (tula.stages.probe). This
times B (default 128) at N = 1 as the second point of a job (after B / 2) and alone in a job
of its own, alternated REPEATS times, on the default config's full search (or --config), and
prints each step time and the medians.

    .venv/bin/python bench/probe_job_order.py [REPEATS] [--batch 128] [--config C]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import yaml

from _harness import ROOT
from tula.stages import probe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("repeats", nargs="?", type=int, default=3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--config", help="a config file (default: workflow/config.yaml)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tula-order-") as tmp:
        d = Path(tmp)
        cfg = Path(a.config) if a.config else d / "config.yaml"
        if not a.config:
            cfg.write_text((ROOT / "workflow" / "config.yaml").read_text())
        yaml.safe_load(cfg.read_text())  # a config that does not parse stops here
        b, first = a.batch, a.batch // 2
        ms: dict[str, list[float]] = {"second in its job": [], "alone": []}
        for i in range(a.repeats):
            job = probe.run_batches(cfg, 1, [first, b], {first: d / "f.json", b: d / "s.json"})
            ms["second in its job"].append(job[b]["step_time_s"] * 1e3)
            ms["alone"].append(probe.run(cfg, 1, b, d / "a.json")["step_time_s"] * 1e3)
            print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f} ms" for k, v in ms.items()))
        for k, v in ms.items():
            print(f"B={b} at N=1, {k}: median {statistics.median(v):.2f} ms ({len(v)} runs)")


if __name__ == "__main__":
    main()
