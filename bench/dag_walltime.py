"""Wall time of the whole default DAG (`make run` minus the install), from empty results.

Runs `snakemake --cores 2` on the shipped workflow/config.yaml in a scratch copy of the
workflow (so results/ is untouched), REPEATS times, and prints each wall time, the
median, and the median time per rule (from Snakemake's benchmark files and job logs).

    .venv/bin/python bench/dag_walltime.py [REPEATS]
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_run(workdir: Path) -> float:
    shutil.rmtree(workdir / "results", ignore_errors=True)
    shutil.rmtree(workdir / ".snakemake", ignore_errors=True)
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    t0 = time.perf_counter()
    r = subprocess.run(["snakemake", "--cores", "2", "--quiet"], cwd=workdir, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"snakemake failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return wall


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    with tempfile.TemporaryDirectory(prefix="tula-bench-") as tmp:
        wd = Path(tmp)
        for name in ("Snakefile", "rules", "envs", "workflow"):
            src = ROOT / name
            (shutil.copytree(src, wd / name, symlinks=False) if src.is_dir() else shutil.copy(src, wd / name))
        walls = []
        for i in range(repeats):
            walls.append(one_run(wd))
            print(f"run {i + 1}/{repeats}: {walls[-1]:.1f} s", flush=True)
        probe_s = [float(p.read_text().splitlines()[1].split()[0]) for p in (wd / "results/benchmarks/probe").glob("*.tsv")]
        train_s = float((wd / "results/benchmarks/train.tsv").read_text().splitlines()[1].split()[0])
        print(f"\nmedian DAG wall time over {repeats} runs: {statistics.median(walls):.1f} s "
              f"(min {min(walls):.1f}, max {max(walls):.1f})")  # fmt: skip
        print(f"last run: {len(probe_s)} probes, {sum(probe_s):.1f} s in total "
              f"(median {statistics.median(probe_s):.1f} s each); train {train_s:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
