"""Why the epoch's short last batch is kept out of the probe's mean: with synced and
compute-only steps alternating, it falls on the same arm every epoch of an even number of steps.

One process (gloo, N = 1: sync is nothing but DDP's local bookkeeping), digits, B = 128 (an
epoch of 11 full batches and a short one of 29 samples: 12 steps), the probe's own timer
(`tula.runtime.timer.timing.StepTimer`) to +-0.5 % after 200 steps of each arm. Prints each arm's
mean over full batches only (what the probe now takes) and with the short batches it met counted in
(what it took before): the arm that meets them looks faster, and `sync = step - compute` with it.

    .venv/bin/python bench/arm_bias.py [--batch 128] [--method ags]     # ~30 s
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch
import torch.distributed as dist

from tula import config
from tula.runtime.step.replica import Replica
from tula.runtime.timer.clocks import HostClock
from tula.runtime.timer.timing import StepTimer, Target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--method", default="ags")
    a = ap.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29597")
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.set_num_threads(1)
    r = Replica(
        config.from_dict({"train": {"method": a.method}}), torch.device("cpu"), a.batch, 0, 1
    )
    for _ in range(5):
        r.walk.next_steps(1)

    def compute(n: int) -> tuple[int, str]:
        with r.ddp.no_sync():
            return r.walk.next_steps(n)

    t = StepTimer(HostClock(), Target(0.005, 200, 30.0)).run(
        {"step": r.walk.next_steps, "compute": compute}
    )
    print(f"N=1 B={a.batch} {a.method}: {r.steps_per_epoch} steps an epoch")
    print("| arm | full batches: mean ms (steps) | short batches met | with them counted in: ms |")
    print("|---|---:|---:|---:|")
    for name, s in t.arms.items():
        short = s.other.get("partial", [])
        both = statistics.fmean(s.times + short)
        print(f"| {name} | {1e3 * s.mean():.2f} ({s.n_steps}) | {len(short)} | {1e3 * both:.2f} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
