"""What starting loader workers from a forkserver costs, against forking them.

On an interpreter whose fork can deadlock the child (CPython before 3.11.8:
:func:`tula.runtime.input.loader.fork_deadlocks`) the loaders' workers start from a forkserver. This
measures, in fresh interpreters (each run one process, as a probe or training worker is), the
training loader of an image folder (PNGs written with Pillow, 64 px, 2 loader workers, batch
32) with each start method:

- ``first``: seconds from building the loader to its first batch (the forkserver's own start,
  which imports torch and the loader once, is paid here);
- ``epoch``: the rest of that epoch;
- ``next epoch``: a second epoch's first batch and the rest (workers started again: not
  persistent, the shipped default).

Median of --repeats runs each, the two methods alternated.

    .venv/bin/python bench/loader_start.py [--repeats 5] [--images 40]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _harness import ROOT, tests_helper

CHILD = """
import json, sys, time
t0 = time.perf_counter()
import torch
from tula import config
from tula.runtime.input import data, loader
root, method = sys.argv[1], sys.argv[2]
cfg = config.from_dict({"workload": {"dataset": "imagefolder:" + root, "seed": 0},
                        "data": {"image_size": 64, "num_workers": 2}})
ds = data.load_config(cfg)
dl, sampler = loader.Loaders(cfg, ds, 0, 1, torch.device("cpu")).train(32)
dl.multiprocessing_context = method
out = {}
for epoch in (0, 1):
    sampler.set_position(epoch, 0)
    t = time.perf_counter()
    it = iter(dl)
    next(it)
    first = time.perf_counter() - t
    for _ in it:
        pass
    out[epoch] = (first, time.perf_counter() - t - first)
print(json.dumps({"first": out[0][0], "epoch": out[0][1], "next": sum(out[1])}))
"""


def run(root: Path, method: str) -> dict:
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), method],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--images", type=int, default=40, help="training images per class (10)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = tests_helper("make_image_folder")(
            Path(tmp) / "folder", train_per_class=a.images, size=64
        )
        runs: dict[str, list[dict]] = {"fork": [], "forkserver": []}
        for _ in range(a.repeats):
            for method in runs:
                runs[method].append(run(root, method))
    print("| start method | first batch (s) | rest of the epoch (s) | next epoch (s) |")
    print("|---|---:|---:|---:|")
    for method, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("first", "epoch", "next")}
        print(f"| {method} | {med['first']:.2f} | {med['epoch']:.2f} | {med['next']:.2f} |")
    print(f"\n{a.repeats} runs each, alternated; {10 * a.images} training images of 64 px")


if __name__ == "__main__":
    main()
