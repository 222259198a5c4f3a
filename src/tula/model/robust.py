"""How firmly the probes' timings hold the choice: the choice made again on resamples of them.

Each resample redraws every measured mean (a probe's step and compute time, a swept batch's
compute time) from its own sampling distribution: normal, centred on the measured mean, with
the standard error its timer measured (``*_halfwidth_rel`` / 1.96; the parametric bootstrap of
the mean of the steps it timed), times the fit's scatter ratio where the residuals exceed
those errors (identical runs of this machine differ by more than one probe's precision says:
:func:`scatter_ratio`). The step-time model's chosen forms are fitted again on the
resample (:func:`tula.model.perf.fit` with ``keep``), every grid point predicted again
(:func:`tula.model.predictions.predict`) and the objective chosen again
(:func:`tula.model.choice.select`). The share of resamples that choose each point says how
far the noise could move the choice.

The choice is the point chosen in most resamples (ties to the smaller B: less memory, less
generalization gap). Where no point wins a clear majority (more than SETTLED, three resamples
in four), the choice is not settled at this noise, and the record says what would settle it.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from tula.model import across, choice
from tula.model import perf as perf_mod
from tula.model.inputs import Planning
from tula.model.memory import MemoryModel
from tula.model.predictions import predict
from tula.model.selection import Point, Robustness, Share

RESAMPLES = 100
SETTLED = 0.75  # a settled choice wins more than this share of the resamples
SEED = 0
Z95 = 1.96
# a mean without a measured precision (older records, measurements from elsewhere): this
# relative standard error
UNKNOWN_REL_SE = 0.05

_REDRAWN = (
    ("step_time_s", "step_time_halfwidth_rel"),
    ("compute_time_s", "compute_time_halfwidth_rel"),
)


def scatter_ratio(measured: pd.DataFrame, perf: perf_mod.PerfModel) -> float:
    """How far the fitted model's residuals exceed the measurements' own standard errors (the
    Birge ratio, sqrt(mean((residual / standard error)^2)), at least 1). Identical runs scatter
    more than one probe's precision says (the machine drifts between probes); a resample with
    each standard error times this ratio covers the scatter the fit saw."""
    ok = measured[(measured["status"] == "ok") & measured["source"].isin(["probe", "sweep"])]
    z = []
    for col, hw, model in (
        ("compute_time_s", "compute_time_halfwidth_rel", perf.compute_time_s),
        ("step_time_s", "step_time_halfwidth_rel", perf.model_step_time_s),
    ):
        if hw not in ok:
            continue
        rows = ok[np.isfinite(pd.to_numeric(ok[hw], errors="coerce")) & (ok[col] > 0)]
        if col == "step_time_s":
            rows = rows[rows["workers"] > 1]
        if rows.empty:
            continue
        y = rows[col].to_numpy(float)
        r = model(rows["workers"].to_numpy(float), rows["local_batch"].to_numpy(float)) / y - 1
        z += list(r / (rows[hw].to_numpy(float) / Z95))
    return max(1.0, float(np.sqrt(np.mean(np.square(z))))) if z else 1.0


def resample(
    measured: pd.DataFrame, rng: np.random.Generator, inflate: float = 1.0
) -> pd.DataFrame:
    """The measurements with every ok probe and sweep mean redrawn from its sampling law, each
    standard error times ``inflate`` (:func:`scatter_ratio`)."""
    out = measured.copy()
    ok = (out["status"] == "ok") & out["source"].isin(["probe", "sweep"])
    for col, hw in _REDRAWN:
        mean = pd.to_numeric(out[col], errors="coerce").to_numpy(float)
        rel = (
            pd.to_numeric(out[hw], errors="coerce").to_numpy(float) / Z95
            if hw in out
            else np.full(len(out), np.nan)
        )
        rel = inflate * np.where(np.isfinite(rel) & (rel > 0), rel, UNKNOWN_REL_SE)
        drawn = mean * (1 + rel * rng.standard_normal(len(out)))
        use = ok.to_numpy() & np.isfinite(mean)
        out[col] = np.where(use, np.maximum(drawn, 1e-3 * mean), mean)
    probe = (out["source"] == "probe") & ok
    out.loc[probe, "sync_time_s"] = np.maximum(
        out.loc[probe, "step_time_s"] - out.loc[probe, "compute_time_s"], 0.0
    )
    return out


def choice_shares(
    plan: Planning,
    measured: pd.DataFrame,
    perf: perf_mod.PerfModel,
    mem: MemoryModel,
    train_samples: int,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    inflate: float | None = None,
    waits: dict[int, float] | None = None,
) -> list[Share]:
    """Each point chosen in some resample and its share, most chosen first; standard errors
    times ``inflate`` (default: the fit's :func:`scatter_ratio`); ``waits``: the queue's
    expected wait by N, as the choice itself had it (objective time_to_result)."""
    rng = np.random.default_rng(seed)
    counts: Counter = Counter()
    inflate = scatter_ratio(measured, perf) if inflate is None else inflate
    for _ in range(resamples):
        m = resample(measured, rng, inflate)
        p = perf_mod.fit(m, perf.collective, perf.workers_per_node, keep=perf)
        try:
            pred = predict(plan, p, mem, train_samples, m, wall=False)
            pred = across.with_waits(pred, waits) if waits else pred
            counts[choice.select(pred, plan).point] += 1
        except ValueError:  # no feasible point in this resample: it is no point's share
            continue
    rows = [Share(k[0], k[1], v / resamples) for k, v in counts.items()]
    return sorted(rows, key=lambda r: (-r.share, r.global_batch, r.workers))


def verdict(
    selected: Point,
    shares: list[Share],
    resamples: int,
    precision: float,
    inflate: float = 1.0,
) -> Robustness:
    """selection.json's ``robustness``: the chosen point's share, the runner-up's, whether the
    choice is settled, the rule used when it is not, and what would settle it."""
    key = selected.key
    share_of = {r.key: r.share for r in shares}
    mode = shares[0].key if shares else key
    others = [r for r in shares if r.key != mode]
    runner = others[0] if others else None
    settled = bool(shares) and shares[0].share > SETTLED
    to_settle = None
    if not settled and runner is not None:
        to_settle = (
            f"time N={mode[0]} B={mode[1]} and N={runner.workers} "
            f"B={runner.global_batch} more precisely: a longer probe.time_budget_s (or a "
            f"tighter probe.precision than {100 * precision:g} %) for the probes "
            "that missed their precision, or search: full, which probes both points directly"
        )
    return Robustness(
        resamples=resamples,
        method=(
            "every measured mean redrawn from its own sampling law (normal, the standard error "
            "its timer measured, times the fit's scatter ratio), the step model's forms "
            "refitted, every point predicted and the objective chosen again"
        ),
        scatter_ratio=inflate,
        shares=tuple(shares),
        point_estimate=Share(*key, share_of.get(key, 0.0)),
        chosen=Share(*mode, share_of.get(mode, 0.0)),
        runner_up=runner,
        settled=settled,
        threshold=SETTLED,
        rule=(
            f"the point chosen in most resamples (ties: the smaller B); settled when it wins "
            f"more than {100 * SETTLED:.0f} % of them"
        ),
        to_settle=to_settle,
    )
