"""Start-up of each kind of process Tula starts: the seconds to import what it imports, median
of REPEATS fresh interpreters, this checkout against another (``--against PYTHON``, whose
environment has an older checkout installed: the layout before the production job had a
package of its own, e5f8c3f, whose module names are the second column of PROCESSES).

Every probe and training job starts several of these (the launcher, N workers), so a second
here is a second per process in every job.

    .venv/bin/python bench/start_up.py [--repeats 5] [--against /tmp/before-venv/bin/python]
    .venv/bin/python bench/start_up.py --against-src /tmp/before/src   # a worktree, this venv

``--against-src DIR`` runs the other checkout with this Python, its ``src`` first on
PYTHONPATH, importing this layout's module names (the two alternated, run by run).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

# what each process imports in this checkout, and (for --against) in another checkout
PROCESSES = {
    "tula probe (launcher)": ("tula.stages.probe", "tula.stages.probe"),
    "probe worker": ("tula.runtime.probe.probe_worker", "tula.runtime.probe.probe_worker"),
    "memory-probe worker": (
        "tula.runtime.probe.memprobe_worker",
        "tula.runtime.probe.memprobe_worker",
    ),
    "tula launch (launcher)": ("tula.stages.launch", "tula.stages.launch"),
    "production job's task (unpickles the job)": ("tula.production.job", "tula.runtime.job"),
    "training worker": ("tula.production.trainer", "tula.runtime.trainer"),
    "tula fit": ("tula.stages.fit", "tula.stages.fit"),
    "tula select": ("tula.stages.select", "tula.stages.select"),
    "tula --help": ("tula.cli", "tula.cli"),
    "tula check": ("tula.stages.check", "tula.stages.check"),
    "tula memprobe (launcher)": ("tula.stages.memprobe", "tula.stages.memprobe"),
    "tula aggregate": ("tula.stages.aggregate", "tula.stages.aggregate"),
    "tula predict": ("tula.stages.predict", "tula.stages.predict"),
    "tula plot": ("tula.stages.plot", "tula.stages.plot"),
    "tula report": ("tula.stages.report", "tula.stages.report"),
    "tula compare": ("tula.stages.compare.train", "tula.stages.compare"),
}


def once(python: str, modules: str, src: str | None = None) -> float:
    env = {**os.environ, "PYTHONPATH": src} if src else None
    t0 = time.perf_counter()
    subprocess.run([python, "-c", f"import {modules}"], check=True, env=env)
    return time.perf_counter() - t0


def in_checkout(module: str, src: str) -> str:
    """``module``, or the package it was split out of where the other checkout has no such
    module yet (``tula.stages.compare.train`` before the suite's stage became a package)."""

    def exists(name: str) -> bool:
        path = Path(src, *name.split("."))
        return path.with_suffix(".py").exists() or (path / "__init__.py").exists()

    while "." in module and not exists(module):
        module = module.rsplit(".", 1)[0]
    return module


def seconds(python: str, modules: str, repeats: int) -> float:
    return statistics.median(once(python, modules) for _ in range(repeats))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--against",
        help="the Python of an environment with another checkout installed (to compare against)",
    )
    ap.add_argument("--against-src", help="another checkout's src/, run with this Python")
    a = ap.parse_args()
    if a.against_src:
        print("| process | this checkout | before | ratio |\n|---|---:|---:|---:|")
        for name, (now, _) in PROCESSES.items():
            pairs = [
                (
                    once(sys.executable, now),
                    once(sys.executable, in_checkout(now, a.against_src), a.against_src),
                )
                for _ in range(a.repeats)
            ]
            t, b = (statistics.median(p[i] for p in pairs) for i in (0, 1))
            print(f"| {name} | {t:.2f} s | {b:.2f} s | {t / b:.2f} |", flush=True)
        return
    print(
        "| process | this checkout | "
        + ("before | ratio |" if a.against else "")
        + "\n|---|---:|"
        + ("---:|---:|" if a.against else "")
    )
    for name, (now, old) in PROCESSES.items():
        t = seconds(sys.executable, now, a.repeats)
        row = f"| {name} | {t:.2f} s |"
        if a.against:
            b = seconds(a.against, old, a.repeats)
            row += f" {b:.2f} s | {t / b:.2f} |"
        print(row, flush=True)


if __name__ == "__main__":
    main()
