"""Where training stands in its epoch, and the kind of step that comes next: the walk the
step timer times through (:mod:`tula.runtime.timing`), each step "plain", "start" (an epoch's
first), "refresh" (a mid-epoch AGS refresh) or "partial" (the epoch's short last batch); the
epoch closed between steps, as training closes it; a step timed alone wherever training stands.

:class:`tula.runtime.replica.Replica` inherits this half, as it inherits its checkpointed half
(:mod:`tula.runtime.replica_state`), so its position, sums and feed are still changed by the
replica's own methods only. It changes with the kinds of step the precision rule weighs
(:mod:`tula.runtime.precision`) and the probe's lead-in (:mod:`tula.runtime.probe_timing`),
not with the step itself (:meth:`tula.runtime.replica.Replica.step`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator

import torch
import torch.distributed as torch_dist

from tula.runtime import loader

if TYPE_CHECKING:  # the fields Replica.__init__ sets (types only)
    from tula.runtime.data import WorkloadData
    from tula.runtime.methods import Cadence
    from tula.runtime.stepstate import Position
    from tula.runtime.stream import Stream
    from tula.runtime.timing import StepTimer


class EpochWalk:
    """The epoch-walking half of :class:`tula.runtime.replica.Replica`."""

    pos: Position
    data: WorkloadData
    stream: Stream
    timer: StepTimer
    cadence: Cadence
    stats: torch.Tensor
    global_batch: int
    world: int
    force_refresh: bool
    refreshed: bool
    last_chunk: int
    step: Callable[[torch.Tensor, torch.Tensor], int]  # Replica's training step

    def epoch_batches(self) -> Iterator:
        """This rank's batches, on the device, from the current position to the end of the
        epoch (:class:`tula.runtime.stream.Stream`)."""
        return self.stream.batches(self.pos.epoch, self.pos.offset)

    def next_steps(self, steps: int) -> tuple[int, str]:
        """Run the next steps wherever training stands, untimed: up to ``steps`` plain steps
        queued back to back (full batches, not an epoch's first nor a mid-epoch AGS refresh),
        or else one step of its own kind. An epoch that ran out is closed first (as training
        does it, between steps). Returns (steps run, kind): "plain", or "start" (an epoch's
        first step), "refresh" (a mid-epoch AGS refresh), "partial" (an epoch's short last
        batch). The timer (:mod:`tula.runtime.timing`) times around it."""
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
        self.stats.zero_()
        self.pos.epoch, self.pos.offset = self.pos.epoch + 1, 0
        return loss, acc, samples
