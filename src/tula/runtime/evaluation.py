"""Evaluation on the test set, sharded over the ranks, surviving an out-of-memory error on any
of them by evaluating again at half the evaluation batch."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from tula.runtime import loader
from tula.runtime.agreement import StepOOM, agree

if TYPE_CHECKING:
    from tula.runtime.replica import Replica


def evaluate(replica: Replica) -> tuple[float, float]:
    """(test loss, test accuracy) over the whole test set, sharded over the ranks.

    Out of memory on any rank: the ranks learn it from the one all-reduce of the sums
    (a flag per rank rides along) and evaluate again at half the evaluation batch, down
    to one sample per worker; below that, :class:`StepOOM` (``where="eval"``)."""
    while True:
        if replica._eval_loader is None:
            replica._eval_loader = loader.eval_loader(
                replica.cfg,
                replica.data,
                replica.rank,
                replica.world,
                replica.device,
                batch_size=replica.eval_batch,
            )
        t0 = time.perf_counter()
        sums, oom = _test_sums(replica)
        if oom:
            replica.free_cached_memory()
        sums, failed = agree(bool(oom), sums)
        if not failed:
            n = max(sums[2].item(), 1.0)
            return sums[0].item() / n, sums[1].item() / n
        if replica.eval_batch == 1:
            raise StepOOM(failed, oom, where="eval")
        smaller = replica.eval_batch // 2
        replica.eval_retries.append(
            {
                "step": replica.pos.step,
                "eval_batch": replica.eval_batch,
                "retry_batch": smaller,
                "ranks": failed,
                "seconds_lost": time.perf_counter() - t0,
            }
        )
        if replica.rank == 0:
            print(
                f"[train] out of memory in evaluation on rank(s) {failed} at {replica.eval_batch} "
                f"samples per worker: evaluating again at {smaller}",
                flush=True,
            )
        replica.eval_batch, replica._eval_loader = smaller, None


def _test_sums(replica: Replica) -> tuple[torch.Tensor, str]:
    """This rank's (loss sum, correct, count) over its shard of the test set, and the
    out-of-memory message if it ran out ("" if not)."""
    sums = torch.zeros(3, dtype=torch.float64, device=replica.device)  # loss, correct, count
    oom = ""
    replica.ddp.eval()
    replica.phase = "eval"
    try:
        with torch.no_grad():
            for x, y in replica._eval_loader:
                x, y = replica.to_device(x, y)
                with replica.autocast():
                    logits = replica.ddp.module(x)
                sums[0] += torch.nn.functional.cross_entropy(
                    logits.float(), y, reduction="sum"
                ).double()
                sums[1] += (logits.argmax(1) == y).sum().double()
                sums[2] += len(y)
    except torch.OutOfMemoryError as exc:
        oom = str(exc) or "out of memory"
    finally:
        replica.ddp.train()
        replica.phase = "forward"
    return sums, oom
