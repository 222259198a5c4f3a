"""Has the job's communication drifted from its prediction? (paper §VI's open problem)

The production job times a paired compute-only step now and then (:mod:`tula.production.monitor`),
so it knows its sync time (the slowest rank's synced step minus its compute-only step) while it
trains. One such observation is noisy: a difference of two step times, each with the probe's
7-11 % step-to-step scatter on this machine, and now and then one slow step. So the detector
decides on the **median of the last** ``window`` observations: one or two slow steps in five
cannot move it, a change that holds for most of the window does. It fires when that median is
out of the band

    predicted sync interval  widened by  ``tolerance`` x the predicted step

on either side (slower *or* faster: a network that recovers is drift too). The widening is
the part that matters for a plan: a sync change worth less than ``tolerance`` of a step
cannot move the choice of (N, B) by much, and it absorbs the probe-to-production difference
of the step (BENCHMARKS.md "Production confirms the prediction") that the interval of the fit
does not know about.

After firing, the detector re-arms around what it observed (a band as wide as the predicted one): a
later change is a new drift, the same level with its scatter is not reported again. Each drift
records the level it left (``from_s``: the prediction, or the level an earlier drift re-armed at)
and that level's band: whether it held, and what it changed, are judged against the level the job
was at, not against a prediction an earlier drift already corrected. No torch here: the launcher
and the report use it too."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

WINDOW = 5  # observations in the median: 3 of 5 beyond the band fire, 2 slow steps do not
TOLERANCE = 0.2  # x the predicted step, either side of the sync interval
# The widest the prediction's interval may make the band, either side of the predicted sync, x
# the predicted step: a fit too unsure to bound the sync within a step (a handful of probes and
# one degree of freedom left, where the t quantile is 12.7: a CI run's lab fit gave 0-859 ms
# around 44 ms) would leave the detector blind to a link four times slower.
MAX_HALF = 1.0
CONFIRM = 3  # observations after a drift whose median must still be beyond the band to move


@dataclass(frozen=True)
class Band:
    """The sync time the model predicts at the job's (N, B): centre, 95 % interval, and the
    band the detector accepts (the interval widened by ``tolerance`` x the predicted step)."""

    predicted_s: float
    lo_s: float
    hi_s: float
    step_s: float
    tolerance: float = TOLERANCE

    @property
    def accept_lo_s(self) -> float:
        return max(self.lo_s - self.tolerance * self.step_s, 0.0)

    @property
    def accept_hi_s(self) -> float:
        return self.hi_s + self.tolerance * self.step_s

    def contains(self, sync_s: float) -> bool:
        return self.accept_lo_s <= sync_s <= self.accept_hi_s

    @staticmethod
    def from_prediction(row: dict[str, Any], tolerance: float = TOLERANCE) -> Band:
        """From a predictions.csv row: sync = step - compute, its interval the step's, cut to
        MAX_HALF x the step either side."""
        step, compute = float(row["step_time_s"]), float(row["compute_time_s"])
        sync = max(step - compute, 0.0)
        lo = max(float(row["step_time_lo_s"]) - compute, sync - MAX_HALF * step, 0.0)
        hi = min(max(float(row["step_time_hi_s"]) - compute, sync), sync + MAX_HALF * step)
        return Band(sync, min(lo, sync), hi, step, tolerance)


@dataclass
class Drift:
    """One decision: from ``since_step`` to ``step`` the median sync was ``observed_s``."""

    step: int
    since_step: int
    observed_s: float
    predicted_s: float
    lo_s: float
    hi_s: float
    direction: str  # "slower" or "faster"
    observations: int
    # the level it left (the prediction, or where an earlier drift re-armed) and its accepted band
    from_s: float | None = None
    accept_lo_s: float | None = None
    accept_hi_s: float | None = None

    def describe(self) -> str:
        since = (
            f", left the {1e3 * self.from_s:.1f} ms level an earlier drift set"
            if self.from_s is not None and self.from_s != self.predicted_s
            else ""
        )
        return (
            f"sync {1e3 * self.observed_s:.1f} ms vs predicted {1e3 * self.predicted_s:.1f} ms "
            f"({1e3 * self.lo_s:.1f}-{1e3 * self.hi_s:.1f}){since} for "
            f"{self.step - self.since_step} steps (median of the last {self.observations} "
            f"observations, steps {self.since_step}-{self.step})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "reason": self.describe()}


@dataclass
class Detector:
    """Feed it ``observe(step, sync_s)``; it returns a :class:`Drift` when the windowed median
    leaves the band (then re-arms around the new level), else None."""

    band: Band
    window: int = WINDOW
    seen: list[tuple[int, float]] = field(default_factory=list)
    level: Band | None = None  # after a drift: the band around the level observed

    def observe(self, step: int, sync_s: float) -> Drift | None:
        self.seen.append((step, float(sync_s)))
        if len(self.seen) < self.window:
            return None
        last = self.seen[-self.window :]
        med = statistics.median(s for _, s in last)
        ref = self.level or self.band
        if ref.contains(med):
            return None
        b = self.band
        drift = Drift(
            step=step,
            since_step=last[0][0],
            observed_s=med,
            predicted_s=b.predicted_s,
            lo_s=b.lo_s,
            hi_s=b.hi_s,
            direction="slower" if med > ref.accept_hi_s else "faster",
            observations=self.window,
            from_s=ref.predicted_s,
            accept_lo_s=ref.accept_lo_s,
            accept_hi_s=ref.accept_hi_s,
        )
        # re-arm around what is observed now, as wide as the predicted interval was: the same
        # level, with its own scatter, is not a new drift
        w = (b.hi_s - b.lo_s) / 2
        self.level = (
            Band(med, max(med - w, 0.0), med + w, b.step_s, b.tolerance)
            if not b.contains(med)
            else None
        )
        self.seen = self.seen[-1:]
        return drift


def held(
    direction: str, later_s: list[float], accept_lo_s: float, accept_hi_s: float
) -> tuple[bool, float]:
    """Whether a drift held, and the median it was judged on: the median of the ``CONFIRM``
    observations after it is still beyond the band it left on the drift's side (``later_s``:
    at least that many). A move costs a relaunch, so `tula launch` moves only on a level that
    held; a transient that fills one window (the machine busy for a dozen steps) and goes does
    not move the job."""
    med = statistics.median(later_s[:CONFIRM])
    return (med > accept_hi_s if direction == "slower" else med < accept_lo_s), med
