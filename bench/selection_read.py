"""selection.json read through its type as the code before wrote it. Needs git.

    .venv/bin/python bench/selection_read.py RUN [RUN ...] [--before 3fa81d2]

Each RUN is a workflow folder after a run (its results/ and .snakemake/tula/config.json; or,
as bench/gpu-runs/*/ keep them, results/ and snapshot.json beside it). For each:

- every selection.json under results/ (the choice, and each partition's own) read back
  through :class:`tula.model.selection.Selection` and written again: the same bytes;
- `tula select` run again from the run's own predictions, measurements and fits with this
  checkout's code and with the code at --before (a git worktree), one after the other, for
  the run and for each of its partitions: the same selection.json, byte for byte;
- with partitions, `tula combine` likewise over the partitions' selections: the same
  results/selection.json, byte for byte.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from _harness import ROOT, env, worktree


def _config(run: Path) -> Path:
    for p in (run / ".snakemake" / "tula" / "config.json", run / "snapshot.json"):
        if p.exists():
            return p
    raise SystemExit(f"{run}: no .snakemake/tula/config.json nor snapshot.json")


def _tula(src: Path, args: list[str], cwd: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "tula.cli", *args],
        env=env(PYTHONPATH=str(src)),
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    if r.returncode:
        raise SystemExit(f"tula {args[0]} with {src}: {r.stderr.strip().splitlines()[-1]}")


def _select(src: Path, cfg: Path, res: Path, out: Path) -> None:
    """`tula select` on ``res``'s files; where the run kept no fits (the H200's), this code's
    `tula fit` makes them first (beside ``out``: the same fits for both codes)."""
    fits = res / "model"
    if not (fits / "perf.json").exists():
        fits = out.parent / f"fits-{res.parent.parent.name}-{res.name}"
        if not (fits / "perf.json").exists():
            args = ["fit", "--config", str(cfg), "--measurements", str(res / "measurements.csv")]
            args += ["--memory-out", str(fits / "memory.json")]
            _tula(ROOT / "src", [*args, "--perf-out", str(fits / "perf.json")], res)
    args = ["select", "--config", str(cfg), "--predictions", str(res / "predictions.csv")]
    args += ["--measurements", str(res / "measurements.csv")]
    args += ["--perf", str(fits / "perf.json"), "--memory", str(fits / "memory.json")]
    if (res / "queue.json").exists():
        args += ["--queue", str(res / "queue.json")]
    _tula(src, [*args, "--out", str(out)], res)


def round_trips(res: Path) -> list[str]:
    """The selection.json files under ``res`` that do not come back the same."""
    sys.path.insert(0, str(ROOT / "src"))
    from tula.io import write_json
    from tula.model.selection import Selection

    changed = []
    for p in [res / "selection.json", *sorted(res.glob("partitions/*/selection.json"))]:
        with tempfile.TemporaryDirectory() as tmp:
            again = Path(tmp) / "selection.json"
            write_json(again, Selection.read(p).to_json())
            if again.read_bytes() != p.read_bytes():
                changed.append(str(p.relative_to(res)))
    return changed


def rerun(run: Path, before: Path, tmp: Path) -> list[str]:
    """What `tula select` (and `tula combine`) write differently with the two codes."""
    res, differ = run / "results", []
    parts = sorted(p for p in res.glob("partitions/*") if (p / "selection.json").exists())
    for where in parts or [res]:
        cfg = (
            run / ".snakemake" / "tula" / "partitions" / f"{where.name}.json"
            if parts
            else _config(run)
        )
        got = {}
        for name, src in (("now", ROOT / "src"), ("before", before)):
            _select(src, cfg, where, tmp / f"{where.name}.{name}.json")
            got[name] = (tmp / f"{where.name}.{name}.json").read_bytes()
        if got["now"] != got["before"]:
            differ.append(f"select {where.relative_to(run)}")
    if parts:
        snaps = run / ".snakemake" / "tula" / "partitions"
        got = {}
        for name, src in (("now", ROOT / "src"), ("before", before)):
            out = tmp / f"combined.{name}"
            args = ["combine", "--config", str(_config(run))]
            args += [a for p in parts for a in ("--part", f"{p.name}={p}")]
            _tula(src, [*args, "--snapshots", str(snaps), "--out-dir", str(out)], run)
            got[name] = (out / "selection.json").read_bytes()
        if got["now"] != got["before"]:
            differ.append("combine")
    return differ


def check(run: Path, before: str, tree: Path, tmp: Path) -> int:
    """Print what ``run``'s selections give; the number of them that differ."""
    res = run / "results"
    changed = round_trips(res)
    differ = rerun(run.resolve(), tree / "src", tmp)
    n = 1 + len(list(res.glob("partitions/*/selection.json")))
    again = "tula select" + (" and combine" if n > 1 else "")
    same = (
        f"written differently: {', '.join(differ)}" if differ else f"{again} the same as {before}'s"
    )
    print(f"{run}: {n - len(changed)} of {n} selection.json read back the same; {same}")
    return len(changed) + len(differ)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="workflow folders after a run")
    ap.add_argument("--before", default="3fa81d2", help="the commit to compare with")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, worktree(a.before) as tree:
        return 1 if sum(check(run, a.before, tree, Path(tmp)) for run in a.runs) else 0


if __name__ == "__main__":
    sys.exit(main())
