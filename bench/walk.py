"""Following the selected batch through `tula launch`: which of the package's modules the
launcher process calls into, and how its calls move between them. A profile hook records every
call from one module of the package to another while `tula launch` trains the shipped default
at the point of an existing selection.json (the job's own processes are not traced: this is
the login-node side a reader follows). Each call is a *stay* (same module), a move *across*
(another module of the same room), *down* (a lower room: cli > stages > production > runtime >
model > shared modules) or a *climb* (a higher room).

    .venv/bin/python bench/walk.py RESULTS_DIR     # with selection.json and predictions.csv

Run it with another checkout's Python (e.g. /tmp/before-venv/bin/python) for its walk.
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

FLOORS = ("cli", "stages", "production", "runtime", "model")


def floor(module: str) -> int:
    parts = module.split(".")
    return FLOORS.index(parts[1]) if len(parts) > 1 and parts[1] in FLOORS else len(FLOORS)


def main() -> None:
    results = Path(sys.argv[1])
    config = Path(__file__).resolve().parents[1] / "workflow" / "config.yaml"
    calls: Counter = Counter()

    def hook(frame, event, arg):
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        if callee.startswith("tula.") and caller.startswith("tula."):
            calls[(caller, callee)] += 1

    from tula.cli import main as tula_main

    with tempfile.TemporaryDirectory() as out:
        args = ["launch", "--config", str(config), "--selection", str(results / "selection.json")]
        args += ["--predictions", str(results / "predictions.csv"), "--out-dir", out]
        sys.setprofile(hook)
        try:
            tula_main(args)
        finally:
            sys.setprofile(None)
    kinds: Counter = Counter()
    rooms: Counter = Counter()  # calls between two modules, by the rooms they join
    for (a, b), n in calls.items():
        fa, fb = floor(a), floor(b)
        kind = "stay" if a == b else "across" if fa == fb else "down" if fb > fa else "climb"
        kinds[kind] += n
        if a != b:
            rooms[f"{(FLOORS + ('shared',))[fa]} -> {(FLOORS + ('shared',))[fb]}"] += n
    modules = sorted({m for pair in calls for m in pair})
    print(f"modules called: {len(modules)}: {', '.join(modules)}")
    print("calls: " + ", ".join(f"{k} {kinds[k]}" for k in ("stay", "across", "down", "climb")))
    print("between modules, by room: " + ", ".join(f"{k} {n}" for k, n in sorted(rooms.items())))
    for (a, b), n in sorted(calls.items()):
        if a != b and floor(b) < floor(a):
            print(f"  climb: {a} -> {b} ({n})")


if __name__ == "__main__":
    main()
