"""A metric over the whole epoch against scikit-learn: Tula's macro-F1 (train.metric:
torchmetrics' MulticlassF1Score, average macro) on an imbalanced set of 557 8x8 images, two
gloo workers, three epochs of training, then the test set's value synced across the workers,
beside scikit-learn's f1_score(average="macro") on the same predictions, one worker's own
value, and the mean of per-batch values (what train.metric took before). The run is the one
tests/runtime/test_epoch_metric.py asserts on; this prints its figures for
BENCHMARKS.md, "Accuracy: AGS and the baselines".

    .venv/bin/python bench/epoch_metric.py        # ~15 s
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch.multiprocessing as mp
from sklearn.metrics import f1_score

from _harness import ROOT

sys.path[:0] = [str(ROOT / "tests" / "runtime"), str(ROOT / "tests")]
import test_epoch_metric as run  # noqa: E402  (the test's own run, not a copy of it)


def main() -> None:
    d = Path(tempfile.mkdtemp(prefix="tula-epoch-metric-"))
    npz, out = d / "imbalanced.npz", str(d / "got")
    run._imbalanced_npz(npz)
    mp.spawn(run._ranks, args=(2, str(d / "store"), str(npz), out), nprocs=2, join=True)
    r0, r1 = (json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1))
    y, pred = r0["y"] + r1["y"], r0["pred"] + r1["pred"]
    want = f1_score(y, pred, average="macro")
    batches = [
        f1_score(y[i : i + 16], pred[i : i + 16], average="macro") for i in range(0, 301, 16)
    ]
    print("| value | macro-F1 |\n|---|---:|")
    print(f"| Tula, 2 workers, synced | {r0['f1']:.7f} |")
    print(f"| scikit-learn on the same predictions | {want:.7f} |")
    print(f"| difference | {abs(r0['f1'] - want):.1e} |")
    print(f"| rank 0's own shard alone | {f1_score(r0['y'], r0['pred'], average='macro'):.4f} |")
    print(f"| mean of per-batch values (16 a batch) | {np.mean(batches):.4f} |")


if __name__ == "__main__":
    main()
