"""Memory model, Eq. 3: M_total = M_param + M_grad + M_opt + M_act(b) + M_batch(b).

The terms are measured by :mod:`tula.runtime.probe.measure` (torch); this module is the model alone
(numpy, statsmodels): peak memory fitted linear in the local batch b (:func:`fit`), which
gives the predicted memory of every grid point and the largest local batch b_max that fits
the configured device budget. fit, predict and select import no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from tula.io import read_json
from tula.model.grid import batch_sizes
from tula.model.inputs import GridSpec
from tula.model.linfit import LinearFit, fit_linear
from tula.model.measurements import memory_batch


@dataclass(frozen=True)
class MemoryModel:
    """Peak memory per worker = intercept + slope * local_batch (bytes)."""

    fit: LinearFit
    budget_bytes: float | None
    oom_local_batch: int | None = None  # a local batch that ran out of memory: b_max stays below it

    def predict_bytes(self, local_batch: float | np.ndarray) -> np.ndarray:
        return np.maximum(self.fit.predict(local_batch), 0.0)

    def max_local_batch(self) -> int | None:
        """Largest local batch whose predicted memory fits the budget and that is below any
        measured OOM (None = unbounded)."""
        limit = None if self.oom_local_batch is None else self.oom_local_batch - 1
        if self.budget_bytes is None:
            return limit
        if self.fit.slope <= 0:
            fits = None if self.fit.intercept <= self.budget_bytes else 0
        else:
            b = (self.budget_bytes - self.fit.intercept) / self.fit.slope
            # tolerate rounding just below a whole batch
            fits = max(int(np.floor(b + 1e-9 * max(abs(b), 1.0))), 0)
        return fits if limit is None else limit if fits is None else min(fits, limit)

    def feasible(self, local_batch: float | np.ndarray) -> np.ndarray:
        """True where the local batch is at most :meth:`max_local_batch`."""
        b = np.asarray(local_batch, dtype=float)
        limit = self.max_local_batch()
        return np.ones_like(b, dtype=bool) if limit is None else b <= limit

    def to_dict(self) -> dict[str, Any]:
        return {
            "equation": "peak_mem_bytes = intercept + slope * local_batch  (Eq. 3, linear in b)",
            "fit": self.fit.to_dict(),
            "budget_bytes": self.budget_bytes,
            "oom_local_batch": self.oom_local_batch,
            "max_local_batch": self.max_local_batch(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "MemoryModel":
        return cls(
            fit=LinearFit.from_dict(d["fit"]),
            budget_bytes=d.get("budget_bytes"),
            oom_local_batch=d.get("oom_local_batch"),
        )


def from_points(ok: list[dict], oom: list[dict], budget_bytes: float | None) -> MemoryModel:
    """The memory model of the memory probe's points: ``ok`` ones (local_batch,
    peak_mem_bytes) fitted, the smallest ``oom`` local batch an upper bound."""
    fit_ = fit_linear(
        [p["local_batch"] for p in ok],
        [p["peak_mem_bytes"] for p in ok],
        what="memory probe (peak_mem_bytes vs local_batch)",
    )
    oom_b = min((int(p["local_batch"]) for p in oom), default=None)
    return MemoryModel(fit=fit_, budget_bytes=budget_bytes, oom_local_batch=oom_b)


def max_local_batch(memory_probe_path) -> int | None:
    """b_max of a results/memory_probe.json (None: unbounded); the error names the file."""
    rec = read_json(memory_probe_path)
    if "max_local_batch" not in rec:
        raise ValueError(
            f"{memory_probe_path}: not a memory probe record (no max_local_batch); re-run `tula "
            "memprobe`"
        )
    b = rec["max_local_batch"]
    return None if b is None else int(b)


def fit(measurements: pd.DataFrame, budget_bytes: float | None) -> MemoryModel:
    """Fit peak memory against local batch over every successful row that measured it
    (timing probes, sweep rows and the memory probe's rows alike); :func:`oom_bound` caps it."""
    ok = measurements[
        (measurements["status"] == "ok")
        & pd.to_numeric(measurements["peak_mem_bytes"], errors="coerce").notna()
    ]
    return MemoryModel(
        fit=fit_linear(
            memory_batch(ok),
            ok["peak_mem_bytes"],
            what="memory model (peak_mem_bytes vs local_batch)",
        ),
        budget_bytes=budget_bytes,
        oom_local_batch=oom_bound(measurements),
    )


def oom_bound(measurements: pd.DataFrame) -> int | None:
    """The smallest local batch that ran out of memory above every local batch that ran:
    b_max stays below it. An OOM at a local batch some other job ran at (or above) bounds
    nothing in general (memory per worker also grows with N: DDP's buckets, a collective's
    buffers); predict marks that one point infeasible instead."""
    status = measurements["status"]
    b = memory_batch(measurements)  # an accumulated row's micro-batch
    oom, ran = b[status == "oom"], b[status == "ok"]
    above = oom[oom > ran.max()] if len(ran) else oom
    return int(above.min()) if len(above) else None


# -- what the memory probe measures -------------------------------------------------------

EXTRA_MEMORY_POINTS = 2  # measurements at the fitted b_max (a second one when the first moved it)


def smaller_batches(batches, below: int, workers: int, floor: int) -> list[int]:
    """After an out-of-memory error at global batch ``below``: the batches to try instead, in
    the order the memory model gives (memory grows with the batch at a fixed N, so the largest
    that may fit first), each splitting over the N workers, at least ``floor`` and one sample
    per worker. The one fallback policy of the probe and the production job."""
    keep = {int(b) for b in batches if floor <= b < below and b % workers == 0 and b >= workers}
    return sorted(keep, reverse=True)


def probe_batches(g: GridSpec, memory_batches: tuple[int, ...] | None = None) -> list[int]:
    """The local batches the memory probe measures: ``memory_batches`` (probe.memory_batches),
    or the grid's smallest local batch, x4 and x16, capped at the grid's largest local batch."""
    if memory_batches:
        return sorted(set(memory_batches))
    lo = max(g.batch_min // max(g.workers), 1)
    hi = g.batch_max // min(g.workers)
    return sorted({min(lo * f, hi) for f in (1, 4, 16)})  # hi < 4 lo: lo and hi


def next_probe_batch(
    g: GridSpec,
    memory_batches: tuple[int, ...] | None,
    budget_bytes: float | None,
    points: list[dict],
) -> int | None:
    """The local batch to measure next, after the first ones, or None when done: the largest
    local batch of the grid that the memory model fitted so far says fits (where partial
    search's largest-B corner will run), when it lies beyond every batch measured and below
    any that ran out of memory (``budget_bytes``: the memory budget per worker; the batches
    measured first: :func:`probe_batches`). The memory model then rests on a measurement at b_max
    instead of a line extrapolated from small batches."""
    ok = [p for p in points if p["status"] == "ok"]
    oom = [p for p in points if p["status"] == "oom"]
    if len(ok) < 2 or len(points) >= len(probe_batches(g, memory_batches)) + EXTRA_MEMORY_POINTS:
        return None
    bmax = from_points(ok, oom, budget_bytes).max_local_batch()
    grid_b = sorted({b // n for n in g.workers for b in batch_sizes(g) if b // n >= 1})
    fits = [b for b in grid_b if bmax is None or b <= bmax]
    if not fits:
        return None
    b = fits[-1]
    return (
        b
        if b > max(p["local_batch"] for p in ok) and b not in {p["local_batch"] for p in points}
        else None
    )
