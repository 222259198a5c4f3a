"""The training step itself, this code against another checkout's, alternated: each side in a
fresh process (one gloo rank, one torch thread), small_cnn on digits at B = 128, STEPS steps of
`Replica.walk.next_timed_step` after 10 unmeasured ones, the mean printed; PAIRS pairs, the ratio
after / before pair by pair (the machine's drift hits both sides of a pair alike).

    git worktree add /tmp/before <commit>
    .venv/bin/python bench/step_pair.py --before /tmp/before/src [--pairs 4] [--steps 150]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

ONE_SIDE = """
import tempfile, time, torch, torch.distributed as dist
from tula import config
from tula.runtime.step.replica import Replica
torch.set_num_threads(1)
f = tempfile.NamedTemporaryFile()
dist.init_process_group("gloo", init_method=f"file://{f.name}", rank=0, world_size=1)
cfg = config.from_dict({"workload": {"epochs": 50}, "train": {"lr_decay_epochs": []}})
r = Replica(cfg, torch.device("cpu"), BATCH, 0, 1)
for _ in range(10):
    r.walk.next_timed_step()
t0 = time.perf_counter()
for _ in range(STEPS):
    r.walk.next_timed_step()
print((time.perf_counter() - t0) / STEPS)
"""


def one(src: str | None, steps: int, batch: int) -> float:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    code = ONE_SIDE.replace("STEPS", str(steps)).replace("BATCH", str(batch))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the other checkout's src/ directory")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch", type=int, default=128)
    a = ap.parse_args()
    ratios = []
    for i in range(a.pairs):
        before = one(a.before, a.steps, a.batch)
        after = one(None, a.steps, a.batch)
        ratios.append(after / before)
        print(
            f"pair {i + 1}: before {1e3 * before:.3f} ms, after {1e3 * after:.3f} ms, "
            f"after / before {after / before:.3f}",
            flush=True,
        )
    print(f"median after / before {statistics.median(ratios):.3f} over {a.pairs} pairs")


if __name__ == "__main__":
    main()
