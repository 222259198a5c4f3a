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
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class NoiseScale:
    """Estimates averaged over ``steps`` steps, with their standard errors over the steps."""

    grad_sq: float  # |G|^2
    trace: float  # tr(Sigma)
    b_noise: float | None  # tr(Sigma) / |G|^2; None when |G|^2 is not positive (noise dominates)
    grad_sq_se: float
    trace_se: float
    b_noise_se: float | None  # delta method from the two standard errors (their covariance ignored)
    steps: int
    small_batch: int
    big_batch: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate(small_sq, big_sq, small_batch: int, big_batch: int) -> NoiseScale:
    """The noise scale from per-step squared norms: ``small_sq[i]`` = |G_b|² at step i (the
    workers' mean), ``big_sq[i]`` = |G_B|² of the same step, b = ``small_batch`` samples per
    worker, B = ``big_batch`` samples in all."""
    s, g = np.asarray(small_sq, dtype=float), np.asarray(big_sq, dtype=float)
    if s.shape != g.shape or s.size == 0:
        raise ValueError(f"need one |G_b|^2 and one |G_B|^2 per step (got {s.size} and {g.size})")
    b, B = float(small_batch), float(big_batch)
    if not 0 < b < B:
        raise ValueError(f"the noise scale needs two batch sizes 0 < b < B (got b={small_batch}, B={big_batch}): "
                         "it cannot be estimated from one worker")  # fmt: skip
    grad = (B * g - b * s) / (B - b)
    trace = (s - g) / (1.0 / b - 1.0 / B)
    n = s.size
    se = (lambda x: float(np.std(x, ddof=1) / math.sqrt(n)) if n > 1 else float("nan"))  # noqa: E731
    g2, tr = float(grad.mean()), float(trace.mean())
    g2_se, tr_se = se(grad), se(trace)
    b_noise = tr / g2 if g2 > 0 else None
    b_noise_se = (abs(b_noise) * math.hypot(tr_se / tr if tr else float("nan"), g2_se / g2)
                  if b_noise is not None else None)  # fmt: skip
    return NoiseScale(g2, tr, b_noise, g2_se, tr_se, b_noise_se, n, int(small_batch), int(big_batch))
