"""Does it matter which process hosts the process group's store? A one-worker gloo group,
the default's model (small_cnn on 8 x 8 digits) at B = 32 under DDP, one tiny all-reduce per
step as Tula's step makes (the agreed OOM/stop flags): the median of 600 steps after 50,
with the TCPStore hosted

- ``self``: by the worker itself (rank 0 of ``init_process_group`` without an agent's store):
  what a production job's rank 0 does under submitit, an srun task's rank 0, and the memory
  probe's one worker (started without torchrun);
- ``agent``: by another process (as torchrun's agent hosts it: TORCHELASTIC_USE_AGENT_STORE),
  what a torchrun worker does.

    .venv/bin/python bench/store_host.py [ROUNDS]     # default 3 rounds, the two in turn

Prints each run's median and mean step (ms), then each mode's median and the ratio of the
medians, self / agent.
"""

from __future__ import annotations

import statistics
import subprocess
import sys

ONE = r"""
import os, socket, subprocess, sys, time
mode = sys.argv[1]
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
host = None
if mode == "agent":
    host = subprocess.Popen([sys.executable, "-c", "import time; from torch.distributed import "
        f"TCPStore; s = TCPStore('127.0.0.1', {port}, 1, True); time.sleep(600)"])
    time.sleep(4)  # its torch import
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tula.runtime.step.nets import build_model
torch.set_num_threads(2)
dist.init_process_group("gloo", rank=0, world_size=1)
m = DDP(build_model("small_cnn", (1, 8, 8), 10))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
x, y, flags = torch.randn(32, 1, 8, 8), torch.randint(0, 10, (32,)), torch.zeros(2)
def step():
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(m(x), y)
    dist.all_reduce(flags)
    loss.backward()
    opt.step()
for _ in range(50):
    step()
ts = []
for _ in range(600):
    t = time.perf_counter(); step(); ts.append(time.perf_counter() - t)
print(1e3 * sorted(ts)[len(ts) // 2], 1e3 * sum(ts) / len(ts))
dist.destroy_process_group()
if host:
    host.kill()
"""


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    got: dict[str, list[float]] = {"self": [], "agent": []}
    for r in range(rounds):
        for mode in got:
            out = subprocess.run(
                [sys.executable, "-c", ONE, mode], capture_output=True, text=True, check=True
            ).stdout.split()
            median, mean = float(out[-2]), float(out[-1])
            got[mode].append(median)
            print(f"round {r + 1} {mode:5s}: median {median:.2f} ms, mean {mean:.2f} ms")
    mid = {k: statistics.median(v) for k, v in got.items()}
    print(
        f"median of the medians: self {mid['self']:.2f} ms, agent {mid['agent']:.2f} ms; "
        f"self / agent {mid['self'] / mid['agent']:.3f}"
    )


if __name__ == "__main__":
    main()
