"""The test suite's time by module, one run beside another.

Reads what a run left: pytest's JUnit XML (``--junitxml``; any commit, the suite's own
plugin not needed) or tests/suite_time.py's JSON (``--suite-time-json``, or
TULA_SUITE_TIME_JSON=path make test). Prints each module's tests and
seconds in each run, the ratio, the totals and the slowest tests of the last run.

    python bench/suite_time.py before.xml after.json [more runs ...]

A CI run's own total (a clean clone's `CI=true bash .ci/run`, install included) is what
`time` prints around it; this script splits what pytest timed."""

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from suite_time import by_module


def read(path: Path) -> dict[str, float]:
    """nodeid-like name -> seconds (setup, call and teardown) of one run."""
    if path.suffix == ".json":
        return {k: v["s"] for k, v in json.loads(path.read_text())["tests"].items()}
    seconds: dict[str, float] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        if parts and parts[-1][:1].isupper():  # a test class: keep the file's part only
            parts = parts[:-1]
        seconds[f"{'/'.join(parts)}.py::{case.get('name')}"] = float(case.get("time", 0))
    return seconds


def cpu(path: Path) -> dict[str, float]:
    """nodeid -> CPU seconds, where the run recorded them (a JSON from 2026-12-07 on)."""
    if path.suffix != ".json":
        return {}
    return {k: v["cpu"] for k, v in json.loads(path.read_text())["tests"].items() if "cpu" in v}


def main(paths: list[str]) -> None:
    runs = [read(Path(p)) for p in paths]
    mods = [{m: (n, s) for m, n, s in by_module(r)} for r in runs]
    names = sorted(set().union(*mods), key=lambda m: -mods[0].get(m, (0, 0.0))[1])
    head = " | ".join(f"run {i + 1}: tests, s" for i in range(len(runs)))
    print(f"| module | {head} | last / first |")
    print("|---|" + "---|" * (len(runs) + 1))
    for m in names:
        cells = [mods[i].get(m) for i in range(len(runs))]
        txt = " | ".join(f"{c[0]}, {c[1]:.1f}" if c else "-" for c in cells)
        ratio = (
            f"{cells[-1][1] / cells[0][1]:.2f}" if cells[0] and cells[-1] and cells[0][1] else "-"
        )
        print(f"| {m} | {txt} | {ratio} |")
    tot = [(len(r), sum(r.values())) for r in runs]
    txt = " | ".join(f"**{n}, {s:.0f}**" for n, s in tot)
    print(f"| **all** | {txt} | **{tot[-1][1] / tot[0][1]:.2f}** |")
    print("\nslowest tests of the last run:")
    for k, v in sorted(runs[-1].items(), key=lambda kv: -kv[1])[:25]:
        print(f"  {v:7.1f} s  {k}")
    used = cpu(Path(paths[-1]))
    if used:
        print(f"\nCPU seconds of the last run: {sum(used.values()):.0f} in all; by module:")
        for m, n, s in by_module(used)[:15]:
            print(f"  {s:7.0f} CPU s  {n:4d} tests  {m}")
        print("the most CPU:")
        for k, v in sorted(used.items(), key=lambda kv: -kv[1])[:15]:
            print(f"  {v:7.0f} CPU s  {k}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
