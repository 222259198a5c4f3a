"""The hour's noise of this machine at the length of window the suite's tiny runs time.

The suite's shared DAGs compare a probe's mean step, timed over about half a second, with a
production job's, timed over about one second in another process a minute later
(tests/bounds.py's DRIFT). This measures how far two such windows of the same work lie
apart here and now: ``--procs`` fresh processes (one torch thread, as the tiny config's
workers), each timing the same AdamW step of a small CNN at B = 128 on 8x8 inputs (the tiny
config's model and batch, without Tula, so nothing of ours is measured) for ``--seconds``; the
steps cut into consecutive windows of ``--window`` seconds. It prints each window's mean, the
CV of the window means, and the 95 % spread of the ratio of two windows drawn from different
processes (the empirical 2.5-97.5 % quantiles of every cross-process pair's log ratio).

    .venv/bin/python bench/machine_noise.py [--procs 5] [--seconds 6] [--window 0.5]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import subprocess
import sys

ONE_PROCESS = """
import json, sys, time, torch
torch.set_num_threads(1)
torch.manual_seed(0)
m = torch.nn.Sequential(
    torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(),
    torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(),
    torch.nn.Flatten(), torch.nn.Linear(64 * 64, 10))
opt = torch.optim.AdamW(m.parameters(), 1e-3)
x, y = torch.randn(128, 1, 8, 8), torch.randint(0, 10, (128,))
def step():
    opt.zero_grad(); torch.nn.functional.cross_entropy(m(x), y).backward(); opt.step()
for _ in range(10):
    step()
seconds, window = float(sys.argv[1]), float(sys.argv[2])
means, t_end = [], time.perf_counter() + seconds
while time.perf_counter() < t_end:
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < window:
        step(); n += 1
    means.append((time.perf_counter() - t0) / n)
print(json.dumps(means))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--window", type=float, default=0.5)
    a = ap.parse_args()
    procs = []
    for i in range(a.procs):
        out = subprocess.run(
            [sys.executable, "-c", ONE_PROCESS, str(a.seconds), str(a.window)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        means = json.loads(out)
        procs.append(means)
        print(f"process {i + 1}: " + " ".join(f"{1e3 * m:.1f}" for m in means) + " ms")
    flat = [m for p in procs for m in p]
    cv = statistics.stdev(flat) / statistics.mean(flat)
    logs = sorted(
        math.log(x / y)
        for p, q in itertools.permutations(procs, 2)
        for x, y in itertools.product(p, q)
    )
    lo, hi = logs[int(0.025 * len(logs))], logs[int(0.975 * len(logs)) - 1]
    print(
        f"{len(flat)} windows of {a.window:g} s in {a.procs} processes: mean "
        f"{1e3 * statistics.mean(flat):.1f} ms, CV of the window means {100 * cv:.1f} %; "
        f"two windows of different processes: 95 % of ratios in x{math.exp(lo):.2f}-"
        f"x{math.exp(hi):.2f} (log half-spread {(hi - lo) / 2:.3f})"
    )


if __name__ == "__main__":
    main()
