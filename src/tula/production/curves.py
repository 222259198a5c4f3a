"""The production job's curves in TensorBoard: rank 0 writes them with torch's own
``SummaryWriter`` to ``<out>/tensorboard/`` (``results/train/tensorboard/``; read them with
``tensorboard --logdir results/train/tensorboard``).

- Per step: ``train/loss``, ``train/lr``, ``time/step_s``, ``time/samples_per_s`` and, with
  AGS or static scaling, ``ags/scaled_share`` (the share of steps so far it scaled) and
  ``ags/mean_factor`` (the mean of its factors; static scaling: s).
- Per epoch, at the step it ends: ``epoch/train_loss``, ``epoch/test_loss`` and the metric,
  ``epoch/train_<metric>`` and ``epoch/test_<metric>`` (train.metric's name).

The steps are not synchronised one by one (that would slow them): their losses and AGS counts
stay on the device until the trainer synchronises anyway (a stretch's end: the epoch's end, a
checkpoint, a timed step), and each step of a stretch is given the stretch's mean time. A
resumed attempt opens the writer with ``purge_step`` just after its checkpoint's step:
TensorBoard drops what an earlier attempt logged from there on, so the curves continue with
no step twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tula.config import metric_name


class Curves:
    """Rank 0's TensorBoard writer for one attempt of a run."""

    def __init__(self, log_dir: Path, resumed_step: int | None, metric: str):
        """``resumed_step``: the checkpoint's step this attempt resumed from (logged, with its
        epoch's row if it ended one, before the checkpoint); from the next one on, what an
        earlier attempt logged is replaced."""
        from torch.utils.tensorboard import SummaryWriter  # rank 0 only

        purge = resumed_step + 1 if resumed_step is not None else None
        self.writer = SummaryWriter(str(log_dir), purge_step=purge)
        self.metric = metric_name(metric)
        # the stretch's steps: (step, loss on the device, lr, samples, AGS's scaled count)
        self.pending: list[tuple[int, torch.Tensor, float, int, torch.Tensor | None]] = []

    def note(self, replica: Any) -> None:
        """The step just queued, read without waiting for the device."""
        loss, chunk = replica.last_step
        self.note_step(
            replica.steps_done, loss, replica.update.lr, chunk, replica.update.ags_scaled_so_far()
        )

    def note_step(
        self, step: int, loss: Any, lr: float, samples: int, scaled: torch.Tensor | None = None
    ) -> None:
        """A step's loss (a tensor on the device, a number, or None where the step returned
        none), LR, samples over every rank and AGS's scaled count so far."""
        self.pending.append((step, loss, lr, samples, scaled))

    def flush(self, seconds: float, factor: float | None = None) -> None:
        """The stretch noted since the last flush took ``seconds`` (the device synchronised):
        each of its steps written; ``factor``: AGS's mean factor now."""
        if not self.pending:
            return
        per_step = seconds / len(self.pending)
        losses = [
            None if p[1] is None else float(p[1]) if not torch.is_tensor(p[1]) else p[1].float()
            for p in self.pending
        ]
        if any(torch.is_tensor(x) for x in losses):  # one read of the device for the stretch
            on_device = [x for x in losses if torch.is_tensor(x)]
            read = iter(torch.stack(on_device).tolist())
            losses = [next(read) if torch.is_tensor(x) else x for x in losses]
        scaled = [None] * len(self.pending)
        if self.pending[0][4] is not None:  # AGS or static scaling counted its scaled steps
            scaled = torch.stack([p[4] for p in self.pending]).tolist()
        w = self.writer
        for (step, _, lr, samples, _), loss, sc in zip(self.pending, losses, scaled):
            if loss is not None:
                w.add_scalar("train/loss", loss, step)
            w.add_scalar("train/lr", lr, step)
            w.add_scalar("time/step_s", per_step, step)
            w.add_scalar("time/samples_per_s", samples / max(per_step, 1e-12), step)
            if sc is not None:
                w.add_scalar("ags/scaled_share", sc / max(step, 1), step)
            if factor is not None:
                w.add_scalar("ags/mean_factor", factor, step)
        self.pending.clear()

    def epoch(self, row: dict[str, Any]) -> None:
        """An epoch's row of metrics.csv, at the step it ended; written to disk now."""
        step, w = row["step"], self.writer
        for tag, key in (
            ("epoch/train_loss", "train_loss"),
            ("epoch/test_loss", "test_loss"),
            (f"epoch/train_{self.metric}", "train_acc"),
            (f"epoch/test_{self.metric}", "test_acc"),
            (f"epoch/test_{self.metric}_ema", "test_acc_ema"),
        ):
            if row.get(key) is not None:  # a user's script may report only some
                w.add_scalar(tag, row[key], step)
        w.flush()

    def close(self) -> None:
        self.writer.close()
