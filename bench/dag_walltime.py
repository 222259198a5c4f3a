"""Wall time of the whole default DAG (`make run` minus the install), from empty results.

Runs `snakemake --cores 2` on the shipped workflow/config.yaml in a scratch copy of the
workflow (so results/ is untouched), REPEATS times, and prints each wall time, the median,
and the probes' and training's time (from Snakemake's benchmark files).

    .venv/bin/python bench/dag_walltime.py [REPEATS]

Before/after: ``--against DIR:PYTHON`` interleaves runs of another checkout (DIR, e.g. a
`git worktree` of an older commit) run with another environment (PYTHON, whose bin/ holds
that checkout's `snakemake` and `tula`), and prints both medians and their ratio:

    git worktree add /tmp/before a9bfaaf
    python3 -m venv /tmp/before-venv
    /tmp/before-venv/bin/pip install -c /tmp/before/constraints.txt -e '/tmp/before[dev]'
    .venv/bin/python bench/dag_walltime.py 3 --against /tmp/before:/tmp/before-venv/bin/python
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from _harness import ROOT, copy_workflow, snakemake


def run_dag(workdir: Path, python: Path) -> float:
    """The whole DAG from empty results with the environment of ``python``; its wall time."""
    return snakemake(workdir, "--quiet", fresh=True, python=python)


def rule_times(wd: Path) -> tuple[list[float], float]:
    probe_s = [
        float(p.read_text().splitlines()[1].split()[0])
        for p in (wd / "results/benchmarks/probe").glob("*.tsv")
    ]
    bench = next(
        p
        for p in (wd / "results/benchmarks/launch.tsv", wd / "results/benchmarks/train.tsv")
        if p.exists()
    )
    # older checkouts named the rule `train`
    train_s = float(bench.read_text().splitlines()[1].split()[0])
    return probe_s, train_s


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("repeats", nargs="?", type=int, default=3)
    ap.add_argument(
        "--against", help="DIR:PYTHON of another checkout and environment, run interleaved"
    )
    a = ap.parse_args()
    variants = {"this checkout": (ROOT, Path(sys.executable))}
    if a.against:
        d, py = a.against.split(":", 1)
        variants = {"before (--against)": (Path(d), Path(py)), **variants}
    with tempfile.TemporaryDirectory(prefix="tula-bench-") as tmp:
        dirs = {
            name: copy_workflow(Path(tmp) / f"wf{i}", root)
            for i, (name, (root, _)) in enumerate(variants.items())
        }
        walls: dict[str, list[float]] = {name: [] for name in variants}
        for i in range(a.repeats):
            for name, (_, py) in variants.items():  # interleaved
                walls[name].append(run_dag(dirs[name], py))
                probe_s, train_s = rule_times(dirs[name])
                print(
                    f"run {i + 1}/{a.repeats} {name}: {walls[name][-1]:.1f} s ({len(probe_s)} "
                    "probes "
                    f"{sum(probe_s):.1f} s, median {statistics.median(probe_s):.1f} s each; train "
                    f"{train_s:.1f} s)",
                    flush=True,
                )
        for name, w in walls.items():
            print(
                f"{name}: median DAG wall time over {a.repeats} runs {statistics.median(w):.1f} s "
                f"(min {min(w):.1f}, max {max(w):.1f})"
            )
        if a.against:
            before, after = (statistics.median(w) for w in walls.values())
            print(f"after / before: {after / before:.3f}")


if __name__ == "__main__":
    main()
