"""Start-up of each kind of process Tula starts: the seconds to import what it imports, median
of REPEATS fresh interpreters, this checkout against another (``--against PYTHON``, whose
environment has an older checkout installed: the layout before the production job had a
package of its own, e5f8c3f, whose module names are the second column of PROCESSES).

Every probe and training job starts several of these (the launcher, N workers), so a second
here is a second per process in every job.

    .venv/bin/python bench/start_up.py [--repeats 5] [--against /tmp/before-venv/bin/python]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

# what each process imports in this checkout, and (for --against) in another checkout
PROCESSES = {
    "tula probe (launcher)": ("tula.stages.probe", "tula.stages.probe"),
    "probe worker": ("tula.runtime.probe_worker", "tula.runtime.probe_worker"),
    "memory-probe worker": ("tula.runtime.memprobe_worker", "tula.runtime.memprobe_worker"),
    "tula launch (launcher)": ("tula.stages.launch", "tula.stages.launch"),
    "production job's task (unpickles the job)": ("tula.production.job", "tula.runtime.job"),
    "training worker": ("tula.production.trainer", "tula.runtime.trainer"),
    "tula fit": ("tula.stages.fit", "tula.stages.fit"),
    "tula select": ("tula.stages.select", "tula.stages.select"),
    "tula --help": ("tula.cli", "tula.cli"),
}


def seconds(python: str, modules: str, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([python, "-c", f"import {modules}"], check=True)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--against",
        help="the Python of an environment with another checkout installed (to compare against)",
    )
    a = ap.parse_args()
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
