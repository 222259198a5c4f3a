"""The clocks the step timer (:mod:`tula.runtime.timer.timing`) reads, one per kind of device.

- :class:`HostClock` (no queue: CPU): the host's clock around each run, the device drained
  before and after.
- :class:`EventClock` (a queue: CUDA): a pair of CUDA events on the step's stream around each
  block, read only when the timer judges its precision; :func:`block_for` sizes the block so
  that its one synchronisation costs under ``SYNC_SHARE`` of it.

A queued clock also lets the timer see the host's own time to queue a block (``queued``): where,
on a drained device, it is as long as the block's time between the events, the device waited for
the host (:mod:`tula.runtime.timer.timing`).

:class:`Spans` times parts of a step on the step's clock, while switched on (the probe's
compute-only arm times the part of each step an accumulated step pays once per micro-batch).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from typing import Any, Callable, Iterator

# a block's one synchronisation may cost at most this share of the block (queued devices)
SYNC_SHARE = 0.01
MAX_BLOCK = 1000  # steps in one block at most


class HostClock:
    """No queue: the host's clock around each run, the device drained before and after."""

    queued = False

    def __init__(self, drain: Callable[[], None] = lambda: None):
        self.drain = drain

    def begin(self) -> float:
        self.drain()
        return time.perf_counter()

    def end(self, mark: float) -> float:
        self.drain()
        return time.perf_counter() - mark

    def read(self, handle: Any) -> float:
        return float(handle)

    def sync_cost_s(self) -> float:
        return 0.0


class EventClock:
    """A CUDA stream's clock: a pair of events around each block, read later."""

    queued = True

    def __init__(self, device: Any):
        import torch  # here only: where a CUDA device exists

        self.torch, self.device = torch, device

    def begin(self) -> Any:
        e = self.torch.cuda.Event(enable_timing=True)
        e.record(self.torch.cuda.current_stream(self.device))
        return e

    def end(self, mark: Any) -> Any:
        e = self.torch.cuda.Event(enable_timing=True)
        e.record(self.torch.cuda.current_stream(self.device))
        return mark, e

    def read(self, handle: Any) -> float:
        start, stop = handle
        stop.synchronize()  # returns at once for every block but the newest
        return start.elapsed_time(stop) / 1000.0

    def sync_cost_s(self, tries: int = 20) -> float:
        """What a block's one synchronisation costs it (median of ``tries``): the device's idle
        gap between the host's wait and the next work it queues, measured as a round trip of
        one tiny kernel queued and waited for."""
        one = self.torch.zeros(1, device=self.device)
        self.torch.cuda.synchronize(self.device)
        costs = []
        for _ in range(tries):
            t0 = time.perf_counter()
            one.add_(1)
            self.torch.cuda.synchronize(self.device)
            costs.append(time.perf_counter() - t0)
        return statistics.median(costs)


def clock_for(device: Any, drain: Callable[[], None] = lambda: None) -> HostClock | EventClock:
    """The clock that fits the device: events on CUDA, the host's clock elsewhere."""
    if getattr(device, "type", str(device)) == "cuda":
        return EventClock(device)
    return HostClock(drain)


def block_for(step_s: float, sync_cost_s: float, share: float = SYNC_SHARE) -> int:
    """Steps in a block whose one synchronisation costs at most ``share`` of it."""
    if step_s <= 0 or sync_cost_s <= 0:
        return 1
    return max(1, min(MAX_BLOCK, math.ceil(sync_cost_s / (share * step_s))))


class Spans:
    """Parts of steps timed on the step's own clock (events on CUDA, read later: no wait inside
    the step), only while ``on``: the probe's compute-only arm times each step's micro-batches
    (their move to the device, forward and backward), so that what a step pays once (the
    optimizer's step, the flags' all-reduce, the batch's fetch) is its time less theirs."""

    def __init__(self, clock: HostClock | EventClock):
        self.clock, self.on, self.handles = clock, False, []

    @contextlib.contextmanager
    def span(self) -> Iterator[None]:
        if not self.on:
            yield
            return
        mark = self.clock.begin()
        yield
        self.handles.append(self.clock.end(mark))

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        """Time the spans inside this block (and only there)."""
        self.on = True
        try:
            yield
        finally:
            self.on = False

    def take(self) -> float:
        """Seconds of every span since the last take (which it forgets)."""
        total = sum(self.clock.read(h) for h in self.handles)
        self.handles = []
        return total
