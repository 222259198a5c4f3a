"""One timer for the training step: the probe's timed steps, its compute sweep, the production
job's monitor and ``bench/gpu_step.py`` all time steps through :class:`StepTimer`.

How it times fits the device, as the measurement tools do (torch.utils.benchmark's blocked
autorange, pyperf, Triton's ``do_bench``):

- **No queue (CPU).** A step runs when the host calls it, so every timed step is timed alone
  (host clock, device drained before and after) and the arms (a synced step, a compute-only
  step) alternate one step at a time: ``sync = step - compute`` is then taken from steps that
  met the same moments of the machine's noise. An untimed synced step leads each round
  (``lead_in``), so that both arms follow a synced step, as every step of training does.
- **A queue (CUDA).** The host only queues work, and a synchronisation costs tens of
  microseconds. Steps are timed in blocks long enough that the block's one synchronisation
  costs under SYNC_SHARE (1 %) of it, sized from the first steps; each block is a pair of
  CUDA events on the step's stream, read only when the timer checks its precision (one host
  wait per check, none between blocks). The arms' blocks alternate.

**A stated precision.** Each arm's samples (a step, or a block's mean step) give a mean and the
95 % confidence half-width of that mean, relative: ``t(0.975, k-1) * sd / sqrt(k) / mean``.
The timer goes on, round after round, until every arm has at least ``min_steps`` steps and
its half-width is at most ``precision``, or until ``budget_s`` seconds of timing are spent;
the result says which ended it. The production job pays its slow steps too, so the figure is
the mean (not the median) and its precision is the mean's. Where training pays other kinds of
step often (an epoch of 3 steps: its first, one plain, its short last batch), the precision is
that of the mean it pays, weighing every kind's samples by its share (:class:`Series`'s
``mix``): the plain steps alone would be a third of the samples, and the others' noise unsaid.

**Every rank alike.** A step's time is the slowest rank's (the step waits for it); at each check
the ranks combine their new samples with an element-wise maximum (``combine``: one small
all-reduce on the host group), so every rank sees the same series and stops at the same round.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from scipy import stats

# a block's one synchronisation may cost at most this share of the block (queued devices)
SYNC_SHARE = 0.01
MAX_BLOCK = 1000  # steps in one block at most
# a run of steps: (steps run, their kind): "plain" (a full batch), or "start" (an epoch's first),
# "refresh" (a mid-epoch AGS refresh), "partial" (the epoch's short last batch), each run alone
Run = Callable[[int], tuple[int, str]]
# Only full batches make the mean. An epoch's short last batch is cheaper: among alternating arms
# it falls on the same arm every epoch (an even number of steps), which it would make look faster
# (8 % at N = 1, B = 128 on digits); it is kept apart, with the epoch's first step.
PLAIN = ("plain",)


@dataclass(frozen=True)
class Target:
    """When a timer stops: every arm's mean within ``precision`` (relative 95 % half-width)
    after at least ``min_steps`` steps of each arm, or ``budget_s`` seconds of timing spent.
    ``max_steps``: no arm times more steps than this (None: the budget alone bounds it)."""

    precision: float
    min_steps: int
    budget_s: float
    max_steps: int | None = None


def half_width_rel(xs: list[float], alpha: float = 0.05) -> float:
    """The 1 - alpha confidence half-width of the mean of ``xs``, relative to the mean
    (inf with fewer than two samples)."""
    if len(xs) < 2:
        return math.inf
    mean = statistics.fmean(xs)
    if mean <= 0:
        return math.inf
    q = float(stats.t.ppf(1 - alpha / 2, len(xs) - 1))
    return q * statistics.stdev(xs) / math.sqrt(len(xs)) / mean


def mix_half_width_rel(groups: list[tuple[float, list[float]]], alpha: float = 0.05) -> float:
    """The 1 - alpha confidence half-width of ``sum(w * mean(xs))`` over ``(w, xs)`` groups,
    relative to it: each group's variance of its mean, weighted, in quadrature; the degrees of
    freedom by Welch-Satterthwaite. One group of weight 1 is :func:`half_width_rel`. inf where
    a group of positive weight has fewer than two samples."""
    parts = [(w, xs) for w, xs in groups if w > 0]
    if not parts or any(len(xs) < 2 for _, xs in parts):
        return math.inf
    mean = sum(w * statistics.fmean(xs) for w, xs in parts)
    if mean <= 0:
        return math.inf
    var = [(w * w * statistics.variance(xs) / len(xs), len(xs) - 1) for w, xs in parts]
    total = sum(v for v, _ in var)
    if total == 0:
        return 0.0
    dof = total**2 / sum(v * v / d for v, d in var if v > 0)
    return float(stats.t.ppf(1 - alpha / 2, dof)) * math.sqrt(total) / mean


@dataclass
class Series:
    """One arm's samples: each sample's seconds per step and the steps it holds. Samples of a
    kind other than plain (an epoch start, a refresh, a short last batch) are kept apart in
    ``other``.

    ``mix``: the share of the steps training pays that are of each other kind (an epoch of 3
    steps: ``{"start": 1/3, "partial": 1/3}``; plain the rest). With it, the precision is the
    one of the mean training pays, ``sum(share * mean of the kind)``, from every sample of every
    kind; without it (or before every kind has two samples), that of the plain steps' mean."""

    times: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    other: dict[str, list[float]] = field(default_factory=dict)
    mix: dict[str, float] | None = None

    @property
    def n_steps(self) -> int:
        return sum(self.steps)

    def mean(self) -> float:
        """Seconds per step over every plain step timed (blocks weighted by their steps)."""
        n = self.n_steps
        return sum(t * k for t, k in zip(self.times, self.steps)) / n if n else math.nan

    def half_width(self) -> float:
        mixed = self.mixed_half_width()
        return mixed if math.isfinite(mixed) else half_width_rel(self.times)

    def mixed_half_width(self) -> float:
        """The half-width of the mean training pays (``mix``); inf where it cannot be judged
        (no mix, no plain step, or a kind with fewer than two samples)."""
        if not (self.mix and self.times):
            return math.inf
        groups = [(1.0 - sum(self.mix.values()), self.times)]
        groups += [(w, self.other.get(kind, [])) for kind, w in sorted(self.mix.items())]
        return mix_half_width_rel(groups)

    def fall_back_to_starts(self) -> None:
        """Where no plain step was timed (every step an epoch's first: B >= D), the epoch
        starts stand in for them."""
        if not self.times:
            starts = self.other.get("start", [])
            self.times, self.steps, self.mix = list(starts), [1] * len(starts), None

    def starts_only(self) -> None:
        """Set the plain samples aside (``other["plain"]``), so that the epoch starts stand in
        for them: where another arm met no plain step, every arm is judged at the same kind."""
        self.other.setdefault("plain", []).extend(self.times)
        self.times, self.steps, self.mix = [], [], None

    def add(self, seconds_per_step: float, steps: int, kind: str) -> None:
        if kind in PLAIN:
            self.times.append(seconds_per_step)
            self.steps.append(steps)
        else:
            self.other.setdefault(kind, []).append(seconds_per_step)


@dataclass
class Timing:
    """What a timer measured: each arm's series (the slowest rank's per sample), whether the
    precision was reached, what stopped it, the seconds it took and the block it timed."""

    arms: dict[str, Series]
    target: Target
    reached: bool
    stopped_by: str  # precision | budget | max_steps
    elapsed_s: float
    block_steps: int
    mode: str  # steps (one at a time, host clock) | blocks (device events)

    def record(self, prefix: str = "") -> dict[str, Any]:
        """The figures a result file keeps: per arm the steps timed and the half-width reached;
        the target, whether it was reached and what ended the timing."""
        out: dict[str, Any] = {}
        for name, s in self.arms.items():
            out[f"{prefix}{name}_timed_steps"] = s.n_steps
            out[f"{prefix}{name}_other_steps"] = {k: len(v) for k, v in sorted(s.other.items())}
            # the shares of the other kinds the half-width weighed in (None: plain steps alone)
            mixed = s.mixed_half_width()
            out[f"{prefix}{name}_halfwidth_mix"] = s.mix if math.isfinite(mixed) else None
            hw = mixed if math.isfinite(mixed) else s.half_width()
            out[f"{prefix}{name}_time_halfwidth_rel"] = hw if math.isfinite(hw) else None
        out.update(
            {
                f"{prefix}precision_target": self.target.precision,
                f"{prefix}precision_reached": self.reached,
                f"{prefix}timing_stopped_by": self.stopped_by,
                f"{prefix}timing_s": self.elapsed_s,
                f"{prefix}timing_budget_s": self.target.budget_s,
                f"{prefix}timing_mode": self.mode,
                f"{prefix}block_steps": self.block_steps,
            }
        )
        return out


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
        import torch  # noqa: PLC0415 - only where a CUDA device exists

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


def _same(values: list[float]) -> list[float]:
    return values


class StepTimer:
    """Times alternating arms of steps until a :class:`Target` is met (module docstring).

    ``combine(values) -> values``: the element-wise maximum over the ranks (identity for one
    process). ``block_steps``: a queued clock's block (None: sized from the first steps)."""

    def __init__(
        self,
        clock: HostClock | EventClock,
        target: Target | None = None,
        combine: Callable[[list[float]], list[float]] = _same,
        block_steps: int | None = None,
        check_every: int = 4,
        mix: dict[str, float] | None = None,
    ):
        self.clock, self.target, self.combine = clock, target, combine
        self.mix = mix  # each arm's :attr:`Series.mix`: the kinds training pays, and how often
        self.block = 1 if not clock.queued else block_steps
        self.check_every = check_every
        self._elapsed = 0.0  # seconds of timing so far, the slowest rank's (at the last check)

    def size_block(self, first_step_s: float) -> int:
        """A queued clock's block, from a step's seconds and the sync's cost, agreed over ranks."""
        if self.block is None:
            own = block_for(first_step_s, self.clock.sync_cost_s())
            self.block = int(max(self.combine([float(own)])))
        return self.block

    def time_once(self, run: Run, steps: int = 1) -> tuple[float, int, str]:
        """One run timed at once, read at once: (seconds per step, steps, kind)."""
        seconds, (n, kind) = self.time_call(lambda: run(steps))
        return seconds / max(n, 1), n, kind

    def time_call(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        """Any call timed as the steps are, read at once: (seconds, what it returned)."""
        mark = self.clock.begin()
        value = fn()
        return self.clock.read(self.clock.end(mark)), value

    def run(
        self,
        arms: dict[str, Run],
        on_check: Callable[[Timing], None] | None = None,
        lead_in: Run | None = None,
    ) -> Timing:
        """Round after round, one sample of each arm in turn, until the target is met or the
        budget is spent, judged every ``check_every`` rounds (one host wait for a queued clock,
        one all-reduce over the ranks). ``on_check`` sees the timing so far (progress).

        ``lead_in``: a step run untimed before each round where steps are timed one by one (a
        clock without a queue), so that the round's first arm follows what it follows in
        training. The probe's is a synced step: its synced arm then follows a synced step, as
        every training step does, not a compute-only one, which on 2 cores made it read 10-18 %
        faster than production (BENCHMARKS.md). A queued clock's blocks follow their own kind
        but for their first step, so there it is left out."""
        assert self.target is not None, "StepTimer.run needs a Target"
        if self.clock.queued:
            lead_in = None
        if self.block is None:
            first, _, _ = self.time_once(next(iter(arms.values())))
            self.size_block(first)
        block = int(self.block or 1)
        t0 = time.perf_counter()
        series = {name: Series(mix=self.mix) for name in arms}
        pending: list[tuple[str, Any, int, str]] = []
        rounds, stopped, reached = 0, "", False
        while not stopped:
            if lead_in is not None:
                lead_in(block)
            for name, run in arms.items():
                mark = self.clock.begin()
                n, kind = run(block)
                pending.append((name, self.clock.end(mark), n, kind))
            rounds += 1
            if rounds % self.check_every:
                continue
            self._settle(pending, series, time.perf_counter() - t0)
            pending = []
            reached, stopped = self._verdict(series)
            if on_check is not None:
                on_check(self._timing(series, reached, stopped or "running", t0, block))
        return self._timing(series, reached, stopped, t0, block)

    def _settle(
        self, pending: list[tuple[str, Any, int, str]], series: dict[str, Series], elapsed: float
    ) -> None:
        """Read the pending samples, take the slowest rank's of each, and add them."""
        own = [self.clock.read(h) / max(n, 1) for _, h, n, _ in pending]
        agreed = self.combine([*own, elapsed])
        self._elapsed = agreed[-1]
        for (name, _, n, kind), t in zip(pending, agreed[:-1]):
            series[name].add(t, n, kind)

    def _verdict(self, series: dict[str, Series]) -> tuple[bool, str]:
        """Reached: every arm has its minimum of plain steps and a half-width within the target.
        Else the budget, once every arm has its minimum of steps of any kind (an epoch whose
        every step is its first still ends), or the step cap."""
        tg = self.target
        assert tg is not None
        if all(
            s.n_steps >= tg.min_steps and s.half_width() <= tg.precision for s in series.values()
        ):
            return True, "precision"
        least = min(s.n_steps + sum(map(len, s.other.values())) for s in series.values())
        if self._elapsed >= tg.budget_s and least >= tg.min_steps:
            return False, "budget"
        if tg.max_steps is not None and least >= tg.max_steps:
            return False, "max_steps"
        return False, ""

    def _timing(
        self, series: dict[str, Series], reached: bool, stopped: str, t0: float, block: int
    ) -> Timing:
        assert self.target is not None
        return Timing(
            series,
            self.target,
            reached,
            stopped,
            time.perf_counter() - t0,
            block,
            "blocks" if self.clock.queued else "steps",
        )
