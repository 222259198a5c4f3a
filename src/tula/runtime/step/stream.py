"""A replica's training data in order: the DataLoader and its sampler at the current global
batch (from the rank's :class:`tula.runtime.input.loader.Loaders`), the device feed over them
(:class:`tula.runtime.input.feed.DeviceFeed`), the iterator the steps are taking batches from, and,
for the sweep's rounds, the loaders of other batch sizes parked where they were left. The
replica owns one; the position in the data is the replica's
(:class:`tula.runtime.step.stepstate.Position`), handed in where it is needed."""

from __future__ import annotations

from typing import Iterator

from tula.runtime.input import decoding
from tula.runtime.input.feed import DeviceFeed
from tula.runtime.input.loader import Loaders
from tula.runtime.step.stepstate import Position


class Stream:
    """One rank's batches of the training set (module docstring)."""

    def __init__(self, loaders: Loaders, global_batch: int, cl: bool):
        self.loaders, self.global_batch, self.cl = loaders, global_batch, cl
        # data.decode auto where both decoders can serve: the faster, measured here (None: as set)
        self.decode: dict | None = None
        if loaders.contested:
            self.decode = decoding.measure(self._read_with)
        self.loader, self.sampler = self._loader(global_batch)
        self.feed = DeviceFeed.of(loaders, self.loader, self.sampler, cl)
        self._batches: Iterator | None = None  # the steps' iterator over this epoch
        self._parked: dict[int, tuple] = {}  # global batch: (loader, sampler, position, iterator)

    def batches(self, epoch: int, offset: int = 0) -> Iterator:
        """This rank's batches, on the device, from ``offset`` samples into ``epoch`` to the
        end of that epoch (the feed prepares the next one while a step runs)."""
        self.sampler.set_position(epoch, offset)
        return iter(self.feed)

    def current(self, pos: Position) -> Iterator:
        """The iterator the steps take batches from, started at ``pos`` if there is none."""
        if self._batches is None:
            self._batches = self.batches(pos.epoch, pos.offset)
        return self._batches

    def forget(self) -> None:
        """The feed was used elsewhere, or the epoch ended: the next step starts a new pass."""
        self._batches = None

    def switch(self, global_batch: int, pos: Position, park: bool) -> Position:
        """Batches of ``global_batch`` from now on: a new loader from the start of the epoch
        in progress, or the parked one where it was left. ``park``: keep the current one
        and ``pos`` for a later return. Returns where the replica now stands."""
        if park:
            self._parked[self.global_batch] = (self.loader, self.sampler, pos, self._batches)
        self.global_batch = global_batch
        if global_batch in self._parked:
            self.loader, self.sampler, left, self._batches = self._parked.pop(global_batch)
            pos = Position(pos.step, left.epoch, left.offset)
        else:
            self.loader, self.sampler = self._loader(global_batch)
            pos, self._batches = Position(pos.step, pos.epoch, 0), None
        self.feed = self.feed.retarget(self.loader, self.sampler)
        return pos

    def forget_parked(self) -> None:
        self._parked.clear()

    def _loader(self, global_batch: int, decode: str | None = None):
        """A training loader and its sampler at ``global_batch``, decoding where it was decided."""
        return self.loaders.train(global_batch, decode or (self.decode or {}).get("chosen"))

    def _read_with(self, decode: str) -> float:
        """Seconds per batch of this rank's feed decoding with ``decode``, read alone."""
        ld, sampler = self._loader(self.global_batch, decode)
        sampler.set_position(1, 0)
        feed = DeviceFeed.of(self.loaders, ld, sampler, self.cl)
        return decoding.seconds_per_batch(feed, self.loaders.device)
