"""Following the selected batch through `tula launch`: which of the package's modules the
launcher process calls into, and how its calls move between them. A profile hook records every
call from one module of the package to another while `tula launch` trains the shipped default
at the point of an existing selection.json (the job's own processes are not traced: this is
the login-node side a reader follows). Each call is a *stay* (same module), a move *across*
(another module of the same room), *down* (a lower room: cli > stages > production > runtime >
model > shared modules) or a *climb* (a higher room).

    .venv/bin/python bench/walk.py RESULTS_DIR     # with selection.json and predictions.csv

Run it with another checkout's Python (e.g. /tmp/before-venv/bin/python) for its walk.

It also follows the config itself, as a newcomer reading the launch path does: each of the
package's functions that takes the config, or one of its sections (a dataclass of
``tula.config``), as an argument or in a field of one (``self.cfg``), in the order of its
first call (a reader reads a function once), in the launcher process and in the production
job's rank 0 (its processes trace themselves through a ``sitecustomize`` on PYTHONPATH).
Consecutive calls in one module are one *stay*; a stay in a module the walk has left before
is a *return* (so returns = stays - modules); the names are the parameters the config and
its sections arrive under.
With ``--src DIR``, that checkout's ``src`` is imported first (its dependencies must be this
environment's):

    .venv/bin/python bench/walk.py RESULTS_DIR --src /tmp/before/src

``--functions`` lists each function of the walk (module, function, the names it took).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

FLOORS = ("cli", "stages", "production", "runtime", "model")


def floor(module: str) -> int:
    parts = module.split(".")
    return FLOORS.index(parts[1]) if len(parts) > 1 and parts[1] in FLOORS else len(FLOORS)


def carries_config(value) -> bool:
    """The config or one of its sections (the frozen dataclasses of ``tula.config``)."""
    return dataclasses.is_dataclass(value) and type(value).__module__ == "tula.config"


def config_names(name: str, value) -> list[str]:
    """The names under which an argument carries the config: itself, or the fields of one of
    the package's objects that hold it or a section (``self.cfg``, ``launch.cfg``)."""
    if carries_config(value):
        return [name]
    if not type(value).__module__.startswith("tula.") or not hasattr(value, "__dict__"):
        return []
    return [f"{name}.{k}" for k, v in vars(value).items() if carries_config(v)]


def stays(path: list[str]) -> list[str]:
    """The modules of a walk, consecutive calls in one module counted once."""
    return [m for i, m in enumerate(path) if i == 0 or path[i - 1] != m]


class Tracer:
    """A profile hook's record of one process: the calls between the package's modules, and the
    config's walk (each call that takes it: when, the module, the names it came under)."""

    def __init__(self) -> None:
        self.calls: Counter = Counter()
        self.walk: list[tuple] = []  # (when, module, names, function)
        self.seen: set[str] = set()

    def hook(self, frame, event, arg):
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        if callee.startswith("tula.") and caller.startswith("tula."):
            self.calls[(caller, callee)] += 1
        if callee.startswith("tula.") and callee != "tula.config":
            code = frame.f_code
            params = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
            held = [n for p in params for n in config_names(p, frame.f_locals.get(p))]
            where = f"{callee}:{code.co_firstlineno}"
            if held and where not in self.seen:  # a reader reads a function once
                self.seen.add(where)
                self.walk.append((time.time(), callee, held, code.co_name))

    def dump(self, path: Path) -> None:
        """This process's walk, for the launcher's run to merge (a job's task, rank RANK)."""
        rank = os.environ.get("RANK") or os.environ.get("SUBMITIT_LOCAL_GLOBALID") or "?"
        path.write_text(json.dumps({"rank": rank, "walk": self.walk}))


# put on the job's PYTHONPATH: each of its processes traces itself and leaves its walk
SITECUSTOMIZE = """
import atexit, os, sys, threading
from pathlib import Path
sys.path.insert(0, {bench!r})
import walk
_t = walk.Tracer()
sys.setprofile(_t.hook)
atexit.register(lambda: (sys.setprofile(None), _t.dump(Path({out!r}) / f"{{os.getpid()}}.json")))
"""


def job_walk(folder: Path) -> list[tuple]:
    """Rank 0's walk in the production job's processes (its task's, the one that trains)."""
    dumps = [json.loads(f.read_text()) for f in sorted(folder.glob("*.json"))]
    rank0 = [d for d in dumps if d["rank"] == "0" and d["walk"]]
    return [tuple(w) for d in rank0 for w in d["walk"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="a folder with selection.json and predictions.csv")
    ap.add_argument("--src", type=Path, help="import this checkout's src/ first")
    ap.add_argument(
        "--functions", action="store_true", help="list each function that takes the config"
    )
    a = ap.parse_args()
    if a.src:
        sys.path.insert(0, str(a.src.resolve()))
    results = a.results
    root = a.src.resolve().parent if a.src else Path(__file__).resolve().parents[1]
    config = root / "workflow" / "config.yaml"  # the checkout's own shipped config
    tracer = Tracer()

    from tula.cli import main as tula_main

    with tempfile.TemporaryDirectory() as out, tempfile.TemporaryDirectory() as site:
        Path(site, "sitecustomize.py").write_text(
            SITECUSTOMIZE.format(bench=str(Path(__file__).resolve().parent), out=site)
        )
        path = [site, str(a.src.resolve())] if a.src else [site]
        os.environ["PYTHONPATH"] = os.pathsep.join(path + [os.environ.get("PYTHONPATH", "")])
        args = ["launch", "--config", str(config), "--selection", str(results / "selection.json")]
        args += ["--predictions", str(results / "predictions.csv"), "--out-dir", out]
        sys.setprofile(tracer.hook)
        try:
            tula_main(args)
        finally:
            sys.setprofile(None)
        job = job_walk(Path(site))
    calls = tracer.calls
    kinds: Counter = Counter()
    rooms: Counter = Counter()  # calls between two modules, by the rooms they join
    for (x, y), n in calls.items():
        fa, fb = floor(x), floor(y)
        kind = "stay" if x == y else "across" if fa == fb else "down" if fb > fa else "climb"
        kinds[kind] += n
        if x != y:
            rooms[f"{(FLOORS + ('shared',))[fa]} -> {(FLOORS + ('shared',))[fb]}"] += n
    modules = sorted({m for pair in calls for m in pair})
    print(f"modules called: {len(modules)}: {', '.join(modules)}")
    print("calls: " + ", ".join(f"{k} {kinds[k]}" for k in ("stay", "across", "down", "climb")))
    print("between modules, by room: " + ", ".join(f"{k} {n}" for k, n in sorted(rooms.items())))
    for (x, y), n in sorted(calls.items()):
        if x != y and floor(y) < floor(x):
            print(f"  climb: {x} -> {y} ({n})")
    for title, walk in (
        ("the launcher process", tracer.walk),
        ("the launcher and the job's rank 0, in time order", sorted(tracer.walk + job)),
    ):
        path = stays([m for _, m, *_ in walk])
        visits = Counter(path)
        names = {n for _, _, held, *_ in walk for n in held}
        print(
            f"the config's walk, {title}: {len(walk)} calls take it, {len(path)} stays in "
            f"{len(visits)} modules, {len(path) - len(visits)} returns; under {len(names)} names"
        )
        print("  most visited: " + ", ".join(f"{m} {n}" for m, n in visits.most_common(6)))
        print("  path: " + " > ".join(m.removeprefix("tula.") for m in path))
        print("  names: " + ", ".join(sorted(names)))
        if a.functions:
            for _, module, held, *name in walk:
                print(f"    {module.removeprefix('tula.')}.{''.join(name)} ({', '.join(held)})")


if __name__ == "__main__":
    main()
