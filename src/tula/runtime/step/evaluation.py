"""Evaluation on the test set, sharded over the ranks, surviving an out-of-memory error on any
of them by evaluating again at half the evaluation batch.

:class:`Evaluator` owns what evaluation keeps between epochs: its batch per worker (halved
after an out-of-memory error, and kept for the rest of the run, across requeues through the
checkpoint), its loader at that batch, and the record of each retry. The replica builds one
and hands it the model to evaluate (:class:`Evaluated`), so this module needs nothing of the
replica's own module."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Protocol

import torch

from tula.runtime.group.agreement import StepOOM, agree
from tula.runtime.input.loader import Loaders
from tula.runtime.train.loss_metric import EpochMetric


class Evaluated(Protocol):
    """What evaluation asks of the model it evaluates
    (:class:`tula.runtime.step.replica.Replica`)."""

    ddp: torch.nn.parallel.DistributedDataParallel
    # train.loss (mean over a batch) and train.metric (summed over a batch, or an
    # EpochMetric updated with it), as training's
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    eval_metric: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

    def to_device(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def autocast(self) -> contextlib.AbstractContextManager: ...

    def in_phase(self, phase: str) -> contextlib.AbstractContextManager: ...

    def free_cached_memory(self) -> None: ...


class Evaluator:
    """One rank's evaluation: its batch, loader and retries."""

    def __init__(self, loaders: Loaders):
        self._loader_at: Callable[[int], Any] = loaders.eval
        self.rank, self.device = loaders.rank, loaders.device
        self.batch = loaders.eval_batch  # per worker; halved after an out-of-memory error
        self.retries: list[dict[str, Any]] = []
        self._loader = None

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of it."""
        return {"eval_batch": self.batch, "eval_retries": list(self.retries)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """From a checkpoint: a batch found too large stays smaller; its retries are kept."""
        self.batch = min(self.batch, state.get("eval_batch", self.batch))
        self.retries, self._loader = list(state.get("eval_retries", [])), None

    def evaluate(
        self, model: Evaluated, step: int, net: torch.nn.Module | None = None
    ) -> tuple[float, float]:
        """(test loss, test metric) over the whole test set, sharded over the ranks, of the
        model's weights or of ``net`` (the weights' moving average).

        Out of memory on any rank: the ranks learn it from the one all-reduce of the sums
        (a flag per rank rides along) and evaluate again at half the evaluation batch, down
        to one sample per worker; below that, :class:`StepOOM` (``where="eval"``)."""
        while True:
            if self._loader is None:
                self._loader = self._loader_at(self.batch)
            t0 = time.perf_counter()
            sums, oom = self._test_sums(model, net)
            if oom:
                model.free_cached_memory()
            sums, failed = agree(bool(oom), sums)
            if not failed:
                n = max(sums[2].item(), 1.0)
                if isinstance(model.eval_metric, EpochMetric):  # over the whole test set
                    return sums[0].item() / n, model.eval_metric.compute()
                return sums[0].item() / n, sums[1].item() / n
            if self.batch == 1:
                raise StepOOM(failed, oom, where="eval")
            smaller = self.batch // 2
            self.retries.append(
                {
                    "step": step,
                    "eval_batch": self.batch,
                    "retry_batch": smaller,
                    "ranks": failed,
                    "seconds_lost": time.perf_counter() - t0,
                }
            )
            if self.rank == 0:
                print(
                    f"[train] out of memory in evaluation on rank(s) {failed} at {self.batch} "
                    f"samples per worker: evaluating again at {smaller}",
                    flush=True,
                )
            self.batch, self._loader = smaller, None

    def _test_sums(self, model: Evaluated, net: torch.nn.Module | None) -> tuple[torch.Tensor, str]:
        """This rank's (loss sum, correct, count) over its shard of the test set, and the
        out-of-memory message if it ran out ("" if not)."""
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss, correct, count
        oom = ""
        if isinstance(model.eval_metric, EpochMetric):
            model.eval_metric.reset()  # an evaluation again at a smaller batch starts over
        model.ddp.eval()
        try:
            with model.in_phase("eval"), torch.no_grad():
                for x, y in self._loader:
                    x, y = model.to_device(x, y)
                    with model.autocast():
                        logits = (model.ddp.module if net is None else net)(x)
                    logits = logits.float()
                    sums[0] += model.loss_fn(logits, y).double() * len(y)
                    sums[1] += model.eval_metric(logits, y)
                    sums[2] += len(y)
        except torch.OutOfMemoryError as exc:
            oom = str(exc) or "out of memory"
        finally:
            model.ddp.train()
        return sums, oom
