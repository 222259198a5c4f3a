"""Does this checkout fit the step-time model exactly as another one does? Each side, in a
fresh process, fits `tula.model.perf.fit` to the known-answer data of tests/model/test_perf.py
(seeds 0-11, the ring and the tree sync, one worker count and three) and prints every fitted
model as JSON; the two must agree byte for byte.

    git worktree add /tmp/before <commit>
    .venv/bin/python bench/same_fits.py --before /tmp/before/src
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _harness import ROOT, python_on

ONE_SIDE = """
import json, sys
sys.path[:0] = [sys.argv[1] + "/tests", sys.argv[1] + "/tests/model"]
import numpy as np
import test_perf as tp
from tula.model import perf
out = []
for seed in range(12):
    rng = np.random.default_rng(seed)
    for several in (False, True):
        for sync in ("ring", "tree"):
            df = tp.synthetic(sync, rng) if several else tp.gpu_like((1,), (64, 512), rng, 0.05)[0]
            out.append(perf.fit(df, sync).to_dict())
print(json.dumps(out, sort_keys=True, default=str))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="the other checkout's src/")
    a = ap.parse_args()
    now, before = python_on(None, ONE_SIDE, str(ROOT)), python_on(a.before, ONE_SIDE, str(ROOT))
    same = now == before
    print(f"{len(now):,} bytes of fitted models: {'identical' if same else 'DIFFERENT'}")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
