"""Probe records read through their type as the code before read them. Needs git.

    .venv/bin/python bench/probe_records_read.py RESULTS [RESULTS ...] [--before c1f3895]

Each RESULTS is a run's results/ (probes/N*/job.json and the records beside them; its
memory_probe.json if there). For each: every probe record read back through
:class:`tula.model.probe_record.ProbeRecord` and written again gives the same JSON, key for
key and value for value (none lost, none added but the fields an older record lacks, read back
as null); and `tula aggregate` run with this
checkout's code and with the code at --before (a git worktree), one after the other, writes
the same measurements.csv, byte for byte.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from _harness import ROOT, env, worktree


def aggregate(src: Path, res: Path, out: Path) -> None:
    cmd = [sys.executable, "-m", "tula.cli", "aggregate", *map(str, res.glob("probes/N*/job.json"))]
    if (res / "memory_probe.json").exists():
        cmd += ["--memory-probe", str(res / "memory_probe.json")]
    subprocess.run(
        cmd + ["--out", str(out)], env=env(PYTHONPATH=str(src)), check=True, capture_output=True
    )


def round_trips(res: Path) -> tuple[int, list[str], set[str]]:
    """(records read, those whose JSON changed on the way through the type, the keys it added:
    fields an older record lacks, read back as null)."""
    sys.path.insert(0, str(ROOT / "src"))
    from tula.model.probe_record import ProbeRecord

    changed, added, paths = [], set(), sorted(res.glob("probes/N*/B*.json"))
    for p in paths:
        d = json.loads(p.read_text())
        e = ProbeRecord.from_json(d).to_json()
        new = {k for k in set(e) - set(d) if e[k] is None}
        added |= new
        if json.dumps(d, sort_keys=True) != json.dumps(
            {k: e[k] for k in e if k not in new}, sort_keys=True
        ):
            changed.append(p.name)
    return len(paths), changed, added


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--before", default="c1f3895")
    a = ap.parse_args()
    bad = 0
    with tempfile.TemporaryDirectory() as tmp, worktree(a.before) as old:
        for res in a.results:
            n, changed, added = round_trips(res)
            aggregate(old / "src", res, Path(tmp) / "old.csv")
            aggregate(ROOT / "src", res, Path(tmp) / "new.csv")
            same = (Path(tmp) / "old.csv").read_bytes() == (Path(tmp) / "new.csv").read_bytes()
            rows = len((Path(tmp) / "new.csv").read_text().splitlines()) - 1
            print(
                f"{res}: {n} records, {n - len(changed)} read back unchanged"
                f"{' (changed: ' + ', '.join(changed) + ')' if changed else ''}"
                f"{' (null, older: ' + ', '.join(sorted(added)) + ')' if added else ''}; "
                f"measurements.csv {'identical' if same else 'DIFFERS'} ({rows} rows)"
            )
            bad += bool(changed) + (not same)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
