"""Does this checkout train exactly as another one does? Each side, in a fresh process (one gloo
rank, one torch thread), builds the shipped default's replica (AGS) at B = 256 and walks
STEPS steps through an epoch's end and AGS's refreshes, then a compute-only step undone (the
monitor's), then puts the checkpoint it would write into a new replica at B = 128 (a relaunch
at a smaller batch: the optimizer and the schedule follow it) and walks 10 more. It prints a
SHA-256 of the weights and of the optimizer's state at each stage, each step's loss, the LR
and AGS's counters; the two sides must agree bit for bit.

    git worktree add /tmp/before <commit>
    .venv/bin/python bench/same_steps.py --before /tmp/before/src [--steps 90]
"""

from __future__ import annotations

import argparse
import json
import sys

from _harness import python_on

ONE_SIDE = """
import hashlib, json, tempfile, torch, torch.distributed as dist
from tula import config
try:
    from tula.runtime.step.replica import Replica
except ImportError:  # a checkout from before the runtime's rooms
    from tula.runtime.replica import Replica
torch.set_num_threads(1)
f = tempfile.NamedTemporaryFile()
dist.init_process_group("gloo", init_method=f"file://{f.name}", rank=0, world_size=1)
cfg = config.from_dict({"workload": {"epochs": 3}})

def saved(r):  # the replica's checkpoint part: state_dict(), or state() before 2553081
    return getattr(r, "state_dict", getattr(r, "state", None))()

def feed(h, obj):
    if torch.is_tensor(obj):
        h.update(obj.detach().cpu().contiguous().numpy().tobytes())
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            h.update(str(k).encode())
            feed(h, obj[k])
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            feed(h, v)
    else:
        h.update(repr(obj).encode())

def digest(r):
    h = hashlib.sha256()
    st = saved(r)
    for part in ("model", "optimizer", "ags", "scheduler", "position", "noise_pairs"):
        feed(h, st[part])
    return h.hexdigest()[:16]

def walk(r, steps):
    losses = []
    for _ in range(steps):
        r.walk.next_timed_step()
        losses.append(float(r.last_step[0]))
    return losses

out = {}
r = Replica(cfg, torch.device("cpu"), 256, 0, 1)
out["losses"] = walk(r, STEPS)
out["after_walk"] = digest(r)
with r.undone():
    walk(r, 1)
out["after_undone"] = digest(r)
state = {**saved(r), "global_batch": 256}
stats = r.walk.stats.clone()
r2 = Replica(cfg, torch.device("cpu"), 128, 0, 1)
getattr(r2, "load_state_dict", getattr(r2, "load", None))(state, stats)
out["relaunch_losses"] = walk(r2, 10)
out["after_relaunch"] = digest(r2)
out["steps"] = r2.steps_done
print(json.dumps(out))
"""


def one(src: str | None, steps: int) -> dict:
    out = python_on(src, ONE_SIDE.replace("STEPS", str(steps)))
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the other checkout's src/ directory")
    ap.add_argument("--steps", type=int, default=90)
    a = ap.parse_args()
    before, after = one(a.before, a.steps), one(None, a.steps)
    for key in before:
        same = before[key] == after.get(key)
        shown = before[key] if not isinstance(before[key], list) else f"{len(before[key])} losses"
        print(f"{key:>16}: {'identical' if same else 'DIFFERENT'} ({shown})")
    print("bitwise identical" if before == after else "the two checkouts differ")
    sys.exit(0 if before == after else 1)


if __name__ == "__main__":
    main()
