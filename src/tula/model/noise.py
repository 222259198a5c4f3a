"""The gradient noise scale (McCandlish et al. 2018, "An Empirical Model of Large-Batch
Training", Appendix A), from gradients that data-parallel training computes anyway.

With per-worker gradients at the local batch b and the all-reduced gradient at the global
batch B = N·b, the expected squared norms are

    E|G_b|² = |G|² + tr(Σ)/b        E|G_B|² = |G|² + tr(Σ)/B

for the true gradient G and the per-sample gradient covariance Σ. Solving the two gives
unbiased estimates of |G|² and tr(Σ):

    |G|²  ≈ (B·|G_B|² − b·|G_b|²) / (B − b)
    tr(Σ) ≈ (|G_b|² − |G_B|²) / (1/b − 1/B)

Each step's pair is noisy (a single step's |G|² estimate can be negative), so the
estimates are averaged over steps first and the noise scale is the ratio of the averages,
B_noise = tr(Σ) / |G|², as in the paper. ``|G_b|²`` is the mean over the N workers of each
worker's own squared norm. N = 1 gives no second batch size, hence no estimate.

Tula's sampler draws a step's samples without replacement from the D training samples, so
the workers' shards are disjoint and slightly anti-correlated: E|G_b|² = |G|² + tr(Σ)(1/b − 1/D)
(the finite-population correction), and likewise for B. The trace estimate is unchanged;
|G|² = |G_B|² − tr(Σ)(1/B − 1/D). Ignoring it biases |G|² low by tr(Σ)/D, which is enough to
make it negative late in a small data set (seen on the shipped default: 7 standard errors
below zero at B = 512). ``population=D`` applies it; None is McCandlish's infinite case.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class NoiseScale:
    """Estimates averaged over ``steps`` steps, with their standard errors over the steps."""

    grad_sq: float  # |G|^2
    trace: float  # tr(Sigma)
    # tr(Sigma) / |G|^2; None when either estimate is not positive (too noisy to tell)
    b_noise: float | None
    grad_sq_se: float
    trace_se: float
    b_noise_se: float | None  # delta method from the two standard errors (their covariance ignored)
    steps: int
    small_batch: int
    big_batch: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate(
    small_sq, big_sq, small_batch: int, big_batch: int, population: int | None = None
) -> NoiseScale:
    """The noise scale from per-step squared norms: ``small_sq[i]`` = |G_b|² at step i (the
    workers' mean), ``big_sq[i]`` = |G_B|² of the same step, b = ``small_batch`` samples per
    worker, B = ``big_batch`` samples in all, drawn without replacement from ``population``
    samples (None: with replacement, or an unlimited stream)."""
    s, g = np.asarray(small_sq, dtype=float), np.asarray(big_sq, dtype=float)
    if s.shape != g.shape or s.size == 0:
        raise ValueError(f"need one |G_b|^2 and one |G_B|^2 per step (got {s.size} and {g.size})")
    b, B = float(small_batch), float(big_batch)
    if not 0 < b < B:
        raise ValueError(
            f"the noise scale needs two batch sizes 0 < b < B (got b={small_batch}, "
            f"B={big_batch}): it cannot be estimated from one worker"
        )
    if population is not None and not B <= population:
        raise ValueError(f"a step of B={big_batch} samples cannot be drawn from {population}")
    trace = (s - g) / (1.0 / b - 1.0 / B)
    grad = g - trace * (1.0 / B - (1.0 / population if population else 0.0))
    n = s.size
    se = lambda x: float(np.std(x, ddof=1) / math.sqrt(n)) if n > 1 else float("nan")  # noqa: E731
    g2, tr = float(grad.mean()), float(trace.mean())
    g2_se, tr_se = se(grad), se(trace)
    b_noise = tr / g2 if g2 > 0 and tr > 0 else None
    b_noise_se = (
        abs(b_noise) * math.hypot(tr_se / tr if tr else float("nan"), g2_se / g2)
        if b_noise is not None
        else None
    )
    return NoiseScale(
        g2, tr, b_noise, g2_se, tr_se, b_noise_se, n, int(small_batch), int(big_batch)
    )


def statistical_efficiency(global_batch, b_noise: float):
    """What a sample is worth at batch B against a small batch: 1 / (1 + B / B_noise)
    (McCandlish et al. 2018, Eq. 2.11). Scalars or arrays."""
    return 1.0 / (1.0 + global_batch / b_noise)


def epochs_to_accuracy(epochs: float, global_batch, base_batch: int, b_noise: float):
    """Epochs batch B needs to reach the accuracy ``epochs`` reach at ``base_batch``: reaching a
    given loss takes E = E_min (1 + B / B_noise) samples, so the epochs scale by
    (1 + B / B_noise) / (1 + base_batch / B_noise). Scalars or arrays."""
    return (
        epochs
        * statistical_efficiency(base_batch, b_noise)
        / statistical_efficiency(global_batch, b_noise)
    )


def pool(measured) -> dict[str, Any] | None:
    """One noise scale from every multi-worker probe of a measurements table: |G|² and
    tr(Σ) each averaged over the probes with inverse-variance weights (equal weights where
    a probe has no standard error), then B_noise = tr(Σ) / |G|². None when no probe has
    the two estimates, or when the pooled |G|² is not positive (noise dominates)."""
    df = pd.DataFrame(measured)
    if "grad_sq" not in df.columns or "grad_trace" not in df.columns:
        return None
    src = df["source"] if "source" in df.columns else pd.Series("probe", index=df.index)
    rows = df[
        (src == "probe") & (df["status"] == "ok") & df["grad_sq"].notna() & df["grad_trace"].notna()
    ]
    if rows.empty:
        return None

    def weighted(value: str, se: str) -> tuple[float, float]:
        x = rows[value].to_numpy(float)
        s = rows[se].to_numpy(float) if se in rows.columns else np.full(len(x), np.nan)
        if np.all(np.isfinite(s) & (s > 0)):
            w = 1.0 / s**2
            return float((w * x).sum() / w.sum()), float(1.0 / math.sqrt(w.sum()))
        se_mean = float(np.std(x, ddof=1) / math.sqrt(len(x))) if len(x) > 1 else float("nan")
        return float(x.mean()), se_mean

    g2, g2_se = weighted("grad_sq", "grad_sq_se")
    tr, tr_se = weighted("grad_trace", "grad_trace_se")
    if not (g2 > 0 and tr > 0):
        return None
    b = tr / g2
    b_se = abs(b) * math.hypot(tr_se / tr if tr else float("nan"), g2_se / g2)
    return {
        "b_noise": b,
        "b_noise_se": b_se,
        "grad_sq": g2,
        "grad_sq_se": g2_se,
        "grad_trace": tr,
        "grad_trace_se": tr_se,
        "probes": [
            {
                "workers": int(r.workers),
                "global_batch": int(r.global_batch),
                "b_noise": float(r.grad_trace / r.grad_sq) if r.grad_sq > 0 else None,
            }
            for r in rows.itertuples()
        ],
    }
