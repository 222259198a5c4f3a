"""Where training stands in its epoch, and the kind of step that comes next: the walk the
step timer times through (:mod:`tula.runtime.timer.timing`), each step "plain", "start" (an epoch's
first), "refresh" (a mid-epoch AGS refresh) or "partial" (the epoch's short last batch); the
epoch closed between steps, as training closes it; a step timed alone wherever training stands.

:class:`EpochWalk` is a part of :class:`tula.runtime.step.replica.Replica` (``replica.walk``) and
owns what it says: the position (:class:`Position`), the epoch's sums, the last step's batch
and loss, whether that step refreshed AGS's factors and whether the next one must, and the
global batch the steps run at. The replica's step reports each step to it
(:meth:`EpochWalk.stepped`); its checkpoint puts it back (:meth:`EpochWalk.moved_to`). It
changes with the kinds of step the precision rule weighs (:mod:`tula.runtime.timer.precision`) and
the probe's lead-in (:mod:`tula.runtime.probe.probe_timing`), not with the step itself.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch
import torch.distributed as torch_dist

from tula.runtime.input import loader
from tula.runtime.step.stepstate import Position

if TYPE_CHECKING:  # what the replica gives its walk (types only)
    from tula.runtime.input.data import WorkloadData
    from tula.runtime.step.stream import Stream
    from tula.runtime.timer.timing import StepTimer
    from tula.runtime.train.loss_metric import EpochMetric
    from tula.runtime.train.methods import Cadence

# what a step changes of the walk (undone with the step: EpochWalk.saved, EpochWalk.put_back)
STEP_FIELDS = ("pos", "stats", "last_chunk", "last_loss", "refreshed", "force_refresh")


class EpochWalk:
    """Where one replica stands in its epoch, and the walk through it (``step``: the replica's
    training step, which reports each step back through :meth:`stepped`)."""

    def __init__(
        self,
        data: WorkloadData,
        stream: Stream,
        timer: StepTimer,
        cadence: Cadence,
        batches: tuple[int, int],
        step: Callable[[torch.Tensor, torch.Tensor], int],
        device: torch.device,
        metric: EpochMetric | None = None,
    ):
        self.data, self.stream, self.timer, self.cadence = data, stream, timer, cadence
        # train.metric as a torchmetrics metric: its states are the epoch's too (None: the
        # metric is a per-sample mean, summed in stats)
        self.metric = metric
        self.global_batch, self.world = batches  # the global batch and the workers sharing it
        self.step = step
        self.pos = Position()
        self.stats = torch.zeros(3, dtype=torch.float64, device=device)  # loss*n, correct, n
        self.last_chunk = 0  # samples (all ranks) of the last step's batch
        self.last_loss = torch.zeros((), device=device)  # the last step's loss, on the device
        self.refreshed = False  # did the last step refresh AGS's factors?
        self.force_refresh = False  # must the next one (asked for, or a non-finite retry)?

    # -- what the step reports, and what puts the walk elsewhere -----------------------
    @property
    def refreshes_next(self) -> bool:
        """Will the next step refresh AGS's factors (asked for, or due by the cadence)?"""
        return self.force_refresh or self.cadence.refresh_due(self.pos.offset == 0, self.pos.step)

    def next_chunk(self) -> int:
        """Samples (all ranks) of the next step's batch."""
        return loader.next_chunk(
            self.data.train_size, self.global_batch, self.pos.offset, self.world
        )

    def stepped(self, chunk: int, loss: torch.Tensor, sums: torch.Tensor, n: int) -> None:
        """A step was taken over ``chunk`` samples (``n`` of them this rank's): its loss and
        this rank's (loss*n, correct) ``sums``."""
        self.pos.step += 1
        self.pos.offset += chunk
        self.last_chunk, self.last_loss = chunk, loss
        self.stats[:2] += sums
        self.stats[2] += n

    def refreshing(self, now: bool) -> None:
        """Whether the step under way refreshes AGS's factors (the walk's next kind of step)."""
        self.refreshed = now

    def refresh_next(self, due: bool = True) -> None:
        """The next step refreshes AGS's factors (``due``), or need not."""
        self.force_refresh = due

    def moved_to(
        self, pos: Position, stats: torch.Tensor | None = None, metric: list | None = None
    ) -> None:
        """Stand at ``pos`` (a checkpoint's, a switched batch's) with the epoch's ``stats``
        and the epoch metric's states ``metric`` (:meth:`EpochMetric.load_state_dict`; None:
        the epoch's sums start over)."""
        self.pos = pos
        if stats is None:
            self.stats.zero_()
        else:
            self.stats = stats.to(self.stats.device)
        if self.metric is not None:
            self.metric.load_state_dict(metric or [])

    def at_batch(self, global_batch: int) -> None:
        self.global_batch = global_batch

    def saved(self) -> dict[str, Any]:
        """What a step changes of the walk, copied (:meth:`put_back` undoes the steps since)."""
        saved = {k: copy.deepcopy(getattr(self, k)) for k in STEP_FIELDS}
        return {**saved, "metric": self.metric.state_dict()} if self.metric else saved

    def put_back(self, saved: dict[str, Any]) -> None:
        self.__dict__.update({k: saved[k] for k in STEP_FIELDS})
        if self.metric is not None:
            self.metric.load_state_dict([saved["metric"]])

    # -- the walk ----------------------------------------------------------------------

    def epoch_batches(self) -> Iterator:
        """This rank's batches, on the device, from the current position to the end of the
        epoch (:class:`tula.runtime.step.stream.Stream`)."""
        return self.stream.batches(self.pos.epoch, self.pos.offset)

    def next_steps(self, steps: int) -> tuple[int, str]:
        """Run the next steps wherever training stands, untimed: up to ``steps`` plain steps
        queued back to back (full batches, not an epoch's first nor a mid-epoch AGS refresh),
        or else one step of its own kind. An epoch that ran out is closed first (as training
        does it, between steps). Returns (steps run, kind): "plain", or "start" (an epoch's
        first step), "refresh" (a mid-epoch AGS refresh), "partial" (an epoch's short last
        batch). The timer (:mod:`tula.runtime.timer.timing`) times around it."""
        if self.pos.offset > 0 and self.epoch_over():
            self.restart_epoch()
        batches = self.stream.current(self.pos)
        ahead = self.plain_steps_ahead()
        if steps > 1 and ahead > 1:
            n = min(steps, ahead)
            for _ in range(n):
                self.run_step(batches)
            return n, "plain"
        start = self.pos.offset == 0
        self.run_step(batches)
        short = self.last_chunk < self.global_batch
        kind = (
            "start" if start else "refresh" if self.refreshed else "partial" if short else "plain"
        )
        return 1, kind

    def epoch_over(self) -> bool:
        """Has this epoch no batch left (the next step starts another)?"""
        return (
            loader.next_chunk(self.data.train_size, self.global_batch, self.pos.offset, self.world)
            == 0
        )

    def next_timed_step(self) -> tuple[float, str]:
        """Time the next training step alone by the device's clock, wherever training stands
        (an epoch that ran out closed first, untimed): (seconds, kind)."""
        if self.pos.offset > 0 and self.epoch_over():
            self.restart_epoch()
        seconds, (_, kind) = self.timer.time_call(lambda: self.next_steps(1))
        return seconds, kind

    def first_short_step_time(self) -> float:
        """Seconds of the first step at the epoch's short last batch (a new shape's one-off cost),
        0.0 where there is none; run from that batch's position, fetched before the clock starts
        (a new loader's start, which training, streaming already, does not pay there)."""
        tail = self.data.train_size % self.global_batch
        if tail < self.world:
            return 0.0
        self.pos.offset = self.data.train_size - tail
        self.stream.forget()
        batch = next(self.stream.current(self.pos))
        return self.timer.time_call(lambda: self.step(*batch))[0]

    def restart_epoch(self) -> None:
        """Close the epoch in progress; the next step starts a new one."""
        self.end_epoch()
        self.stream.forget()

    def run_step(self, batches: Iterator) -> int | None:
        """Fetch the next batch and run :meth:`step`, queued without waiting for the device;
        its stop code, or None when the epoch has no batch left."""
        batch = next(batches, None)
        return None if batch is None else self.step(*batch)

    def plain_steps_ahead(self) -> int:
        """Steps from here that are plain: full batches of this epoch before its short last one,
        not the epoch's first, nor a mid-epoch AGS refresh."""
        if self.pos.offset == 0 or self.force_refresh:
            return 0
        n = (self.data.train_size - self.pos.offset) // self.global_batch
        k = self.cadence.refresh_every
        if not k:
            return n
        into = self.pos.step % k  # the step after k-1 plain ones refreshes (refresh_due)
        return min(n, k - into) if into else 0

    def cycle_place(self) -> tuple[int, int]:
        """The next step's samples into its epoch (0: its first), its place between refreshes."""
        k = self.cadence.refresh_every or 0
        return 0 if self.epoch_over() else self.pos.offset, self.pos.step % k if k else 0

    def end_epoch(self) -> tuple[float, float, int]:
        """Close the epoch: (train loss, train accuracy, samples) over every rank; the next
        starts."""
        torch_dist.all_reduce(self.stats)
        samples = int(self.stats[2].item())
        loss, acc = (self.stats[:2] / max(samples, 1)).tolist()
        if self.metric is not None:  # over the epoch's batches of every rank (torchmetrics)
            acc = self.metric.compute()
        self.stats.zero_()
        self.pos.epoch, self.pos.offset = self.pos.epoch + 1, 0
        return loss, acc, samples
