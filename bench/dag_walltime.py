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

``--against DIR`` alone runs the other checkout in this environment, its ``src/`` first on
PYTHONPATH (its dependencies must be this one's).

Each run also prints what the probe campaign spent timing: the timed steps' seconds
(:func:`tula.stages.aggregate.timed_seconds`, this checkout's, applied to either run's probe
records) against the probe jobs' seconds (Snakemake's benchmark files) and their workers' wall
(the records' wall_s), and their ratio, the campaign's efficiency.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from _harness import ROOT, copy_workflow, snakemake
from tula.stages.aggregate import timed_seconds


def run_dag(workdir: Path, python: Path, src: Path | None = None) -> float:
    """The whole DAG from empty results with the environment of ``python`` (``src`` first on
    PYTHONPATH); its wall time."""
    extra = {"PYTHONPATH": str(src)} if src else None
    return snakemake(workdir, "--quiet", fresh=True, python=python, extra_env=extra)


def campaign(wd: Path, probe_s: list[float]) -> dict[str, float]:
    """The probe records' timed seconds and wall, and the probe jobs' seconds."""
    # one record per point, one folder per N (one job each), under the partition's folder
    # (results/probes/ before it had one)
    files = [
        *(wd / "results").glob("probes/*.json"),
        *(wd / "results").glob("probes/N*/B*.json"),
        *(wd / "results").glob("partitions/*/probes/N*/B*.json"),
    ]
    recs = [json.loads(p.read_text()) for p in files]
    timed = sum(timed_seconds(r) or 0.0 for r in recs)
    return {
        "timed_s": timed,
        "wall_s": sum(r.get("wall_s") or 0.0 for r in recs),
        "job_s": sum(probe_s),
        "efficiency": timed / sum(probe_s) if probe_s else float("nan"),
    }


def chosen(wd: Path) -> str:
    """The point the run chose and trained at (results/selection.json), e.g. ``N=2 B=512``."""
    sel = json.loads((wd / "results/selection.json").read_text())["selected"]
    return f"N={int(sel['workers'])} B={int(sel['global_batch'])}"


def rule_times(wd: Path) -> tuple[list[float], float]:
    probe_s = [
        float(p.read_text().splitlines()[1].split()[0])
        for p in [
            *(wd / "results").glob("benchmarks/probe/*.tsv"),
            *(wd / "results").glob("partitions/*/benchmarks/probe/*.tsv"),
        ]
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
    variants = {"this checkout": (ROOT, Path(sys.executable), None)}
    if a.against:
        d, _, py = a.against.partition(":")
        other = (
            (Path(d), Path(py), None) if py else (Path(d), Path(sys.executable), Path(d) / "src")
        )
        variants = {"before (--against)": other, **variants}
    with tempfile.TemporaryDirectory(prefix="tula-bench-") as tmp:
        dirs = {
            name: copy_workflow(Path(tmp) / f"wf{i}", root)
            for i, (name, (root, _, _)) in enumerate(variants.items())
        }
        walls: dict[str, list[float]] = {name: [] for name in variants}
        spent: dict[str, list[dict]] = {name: [] for name in variants}
        for i in range(a.repeats):
            for name, (_, py, src) in variants.items():  # interleaved
                walls[name].append(run_dag(dirs[name], py, src))
                probe_s, train_s = rule_times(dirs[name])
                c = campaign(dirs[name], probe_s)
                spent[name].append(c)
                print(
                    f"run {i + 1}/{a.repeats} {name}: {walls[name][-1]:.1f} s ({len(probe_s)} "
                    "probe jobs "
                    f"{sum(probe_s):.1f} s, median {statistics.median(probe_s):.1f} s each, "
                    f"{c['timed_s']:.1f} s timed: efficiency {100 * c['efficiency']:.0f} % of the "
                    f"jobs' seconds, {100 * c['timed_s'] / c['wall_s']:.0f} % of their workers' "
                    f"wall; train {train_s:.1f} s at {chosen(dirs[name])})",
                    flush=True,
                )
        for name, w in walls.items():
            eff = statistics.median(c["efficiency"] for c in spent[name])
            job = statistics.median(c["job_s"] for c in spent[name])
            print(
                f"{name}: median DAG wall time over {a.repeats} runs {statistics.median(w):.1f} s "
                f"(min {min(w):.1f}, max {max(w):.1f}); probe jobs {job:.1f} s, efficiency "
                f"{100 * eff:.0f} % (median)"
            )
        if a.against:
            before, after = (statistics.median(w) for w in walls.values())
            print(f"after / before: {after / before:.3f}")


if __name__ == "__main__":
    main()
