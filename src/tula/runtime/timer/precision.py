"""How precise a series of step times is: the 95 % confidence half-width of its mean, of the
mean training pays over several kinds of step, and the spread it is judged by.

**The spread.** The half-width is ``t(0.975, k-1) * sd / sqrt(k) / mean``. On a device with a
queue (the step timer's blocks on CUDA), where a few samples spike (over SPIKE_K robust
standard deviations above the median, at most SPIKE_SHARE of them: a step that waited for
Python among steps that did not), the precision rule judges the robust spread instead, 1.4826
x the median absolute deviation: the spikes stay in the mean (the production job pays them),
but do not keep the timer running for a precision that their rarity, not the step, denies.
The record says which spread was judged and how many samples spiked
(:meth:`tula.runtime.timer.timing.Timing.figures`). A host clock's steps (CPU) are judged by their
standard deviation: the predictions on this machine rest on it, and in the same hour the
robust rule's runs could not be told from it (BENCHMARKS.md "Probe precision").
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from scipy import special

# A sample is a spike where it lies over SPIKE_K robust standard deviations (1.4826 x the median
# absolute deviation) above the median; where a few (at most SPIKE_SHARE of the samples) spike,
# the precision rule judges the robust spread (``spread``); the mean keeps them.
SPIKE_K = 5.0
SPIKE_SHARE = 0.1
# Only full batches make the mean. An epoch's short last batch is cheaper: among alternating arms
# it falls on the same arm every epoch (an even number of steps), which it would make look faster
# (8 % at N = 1, B = 128 on digits); it is kept apart, with the epoch's first step.
PLAIN = ("plain",)


def spikes(xs: list[float]) -> int:
    """How many samples lie over SPIKE_K robust standard deviations above the median."""
    if len(xs) < 3:
        return 0
    med = statistics.median(xs)
    robust = 1.4826 * statistics.median(abs(x - med) for x in xs)
    return sum(x > med + SPIKE_K * robust for x in xs) if robust > 0 else 0


def spread(xs: list[float], robust: bool = False) -> tuple[float, str]:
    """The samples' standard deviation and which: ``sd``, or with ``robust`` where a few
    samples spike (at most SPIKE_SHARE of them), ``mad``, 1.4826 x the median absolute
    deviation: the spread of the steps that do not spike."""
    k = spikes(xs) if robust else 0
    if 0 < k <= SPIKE_SHARE * len(xs):
        med = statistics.median(xs)
        return 1.4826 * statistics.median(abs(x - med) for x in xs), "mad"
    return statistics.stdev(xs), "sd"


def half_width_rel(xs: list[float], alpha: float = 0.05, robust: bool = False) -> float:
    """The 1 - alpha confidence half-width of the mean of ``xs``, relative to the mean
    (inf with fewer than two samples); with ``robust``, from :func:`spread`'s robust spread
    where a few samples spike."""
    if len(xs) < 2:
        return math.inf
    mean = statistics.fmean(xs)
    if mean <= 0:
        return math.inf
    q = float(special.stdtrit(len(xs) - 1, 1 - alpha / 2))
    return q * spread(xs, robust)[0] / math.sqrt(len(xs)) / mean


def mix_half_width_rel(
    groups: list[tuple[float, list[float]]], alpha: float = 0.05, robust: bool = False
) -> float:
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
    var = [(w * w * spread(xs, robust)[0] ** 2 / len(xs), len(xs) - 1) for w, xs in parts]
    total = sum(v for v, _ in var)
    if total == 0:
        return 0.0
    dof = total**2 / sum(v * v / d for v, d in var if v > 0)
    return float(special.stdtrit(dof, 1 - alpha / 2)) * math.sqrt(total) / mean


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
    # a queued clock's, for the blocks queued onto a drained device: (the host's seconds to
    # queue a step, the step's seconds between its events)
    host: list[tuple[float, float]] = field(default_factory=list)

    @property
    def n_steps(self) -> int:
        return sum(self.steps)

    def mean(self) -> float:
        """Seconds per step over every plain step timed (blocks weighted by their steps)."""
        n = self.n_steps
        return sum(t * k for t, k in zip(self.times, self.steps)) / n if n else math.nan

    def half_width(self, robust: bool = False) -> float:
        """The mean's relative 95 % half-width; ``robust``: as the precision rule judges it,
        from the robust spread of a kind whose steps spike (:func:`spread`)."""
        mixed = self.mixed_half_width(robust)
        return mixed if math.isfinite(mixed) else half_width_rel(self.times, robust=robust)

    def judged_steps(self) -> int:
        """The steps the judged half-width is over: with the mix judged, every kind's in it (an
        epoch of 6 steps at B = 1,024: 5 plain in 6); else the plain steps alone."""
        if not math.isfinite(self.mixed_half_width()):
            return self.n_steps
        assert self.mix is not None
        return self.n_steps + sum(len(self.other.get(kind, [])) for kind in self.mix)

    def spikes(self) -> int:
        """Samples that spike, over every kind."""
        return spikes(self.times) + sum(spikes(v) for v in self.other.values())

    def host_share(self) -> float | None:
        """The host's time to queue a step over the same step's time on the device (a queued
        clock's plain samples queued onto a drained device): near 1, the device waited for
        the host."""
        if not self.host:
            return None
        return sum(h for h, _ in self.host) / sum(t for _, t in self.host)

    def mixed_half_width(self, robust: bool = False) -> float:
        """The half-width of the mean training pays (``mix``); inf where it cannot be judged
        (no mix, no plain step, or a kind with fewer than two samples)."""
        if not (self.mix and self.times):
            return math.inf
        groups = [(1.0 - sum(self.mix.values()), self.times)]
        groups += [(w, self.other.get(kind, [])) for kind, w in sorted(self.mix.items())]
        return mix_half_width_rel(groups, robust=robust)

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

    def add(
        self, seconds_per_step: float, steps: int, kind: str, host_s: float | None = None
    ) -> None:
        if kind in PLAIN:
            self.times.append(seconds_per_step)
            self.steps.append(steps)
            if host_s is not None:
                self.host.append((host_s, seconds_per_step))
        else:
            self.other.setdefault(kind, []).append(seconds_per_step)
