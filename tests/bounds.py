"""The numbers Tula promises, as the suite holds them: how far a production job may land from
its prediction, how far a point left out of the fit may, and what accuracy a short run must
reach. Each bound is derived from this machine's measured noise (bench/suite_bounds.py
measures it; BENCHMARKS.md "The test suite" has the figures and the command),
wide enough that noise does not turn CI red and narrow enough that a gross regression does:
a prediction off by x2, a run that trains to chance.

The noise the bounds are made of:

- DRIFT: the speed of this 2-core machine between two processes minutes apart, the hour's
  noise, 5-15 % (one standard deviation up to 0.15 / 1.96 at 95 %): the production job and
  the probes it was predicted from are different processes.
- a probe's own 95 % half-width (its record's ``step_time_halfwidth_rel``), 2-23 % here.

Three standard deviations of their sum in quadrature leaves a false alarm below 0.3 % per
check where the sources are normal. What they do not hold is another test's processes coming
and going beside the run: with a busy process on one core the production wall time needed
x1.23 of its interval (bench/suite_bounds.py --load), near the bound. So the test that makes
a run these bounds read runs alone (tests/sharing.py's TIMED_RUNS), as a user's run would.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

DRIFT = 0.15  # the hour's noise between two processes, 95 % (relative)
Z = 3.0  # standard deviations a bound allows
# the production job against its prediction: the measured step (or wall time) lies inside
# the prediction's own 95 % interval widened by this factor either way. The interval holds
# the fit's uncertainty; what it does not hold is the drift between the probes' processes
# and the production job's: exp(Z * DRIFT / 1.96) = 1.26.
INTERVAL_MULTIPLE = math.exp(Z * DRIFT / 1.96)


def interval_multiple(measured: float, lo: float, hi: float) -> float:
    """By what factor [lo, hi] must be widened (lo / m, hi * m) to hold ``measured``: 1 inside."""
    return max(1.0, measured / hi, lo / measured)


def held_out_bound(left_halfwidth: float, fit_halfwidth: float) -> float:
    """The largest |log(predicted / measured)| a point left out of the fit may show: Z standard
    deviations of, in quadrature, the left-out probe's own half-width, the fit's (no better
    than the least precise probe it rests on: the largest half-width among them) and DRIFT,
    each a 95 % figure (/ 1.96)."""
    return Z * math.sqrt(left_halfwidth**2 + fit_halfwidth**2 + DRIFT**2) / 1.96


def held_out_prediction(
    measurements: pd.DataFrame, workers: int, global_batch: int, collective: str
) -> tuple[float, float, float, float]:
    """The step at (N, B) predicted by a fit made without it (every row that (N, B)'s probe
    job measured left out: the probe and the compute-only sweep it timed): (predicted s,
    measured s, the left-out probe's half-width, the fit's: the largest half-width among the
    kept rows at the same N, probes' steps and sweeps' compute, which that prediction rests on
    most)."""
    from tula.model import perf

    at = (measurements["workers"] == workers) & (measurements["global_batch"] == global_batch)
    ok = measurements[measurements["status"] == "ok"]
    left = ok[
        (ok["source"] == "probe")
        & (ok["workers"] == workers)
        & (ok["global_batch"] == global_batch)
    ]
    kept = ok[~at[ok.index] & (ok["workers"] == workers) & ok["source"].isin(["probe", "sweep"])]
    fit_halfwidth = max(
        kept["step_time_halfwidth_rel"].where(
            kept["source"] == "probe", kept["compute_time_halfwidth_rel"]
        )
    )
    model = perf.fit(measurements[~at], collective)
    n, b = np.array([workers]), np.array([global_batch // workers])
    return (
        float(model.step_time_s(n, b)[0]),
        float(left["step_time_s"].item()),
        float(left["step_time_halfwidth_rel"].item()),
        float(fit_halfwidth),
    )


# final test accuracy of a short run of the tiny config (digits, 10 classes: chance 0.10):
# training at a point is deterministic (same seed, same order, same gloo sums), and its 2
# epochs reach 0.76-0.98 across the grid points the choice can land on (0.76 at N = 1,
# B = 128: 24 steps; bench/suite_bounds.py trains each). Half of the highest, 5x chance, well
# below the lowest: room for another CPU's float rounding, and far above a run that learns
# nothing (labels shuffled, or a set standardised twice in training: near 0.10)
ACCURACY_FLOOR = 0.50


# the two-node lab (tests/test_slurm_lab.py): its two "nodes" share this machine's two cores
# with the probe jobs' Snakemake, srun and SLURM's daemons, so the production job and the probes
# it was predicted from ran beside different neighbours: the production step came at 0.77-0.92
# of its prediction (bench/slurm_lab.py, BENCHMARKS.md "Nodes and networks"), a drift up to
# 25 % at 95 %
LAB_DRIFT = 0.25


def lab_step_bound(probe_halfwidth: float) -> float:
    """The largest |log(production step / predicted step)| on the lab: Z standard deviations
    of the N = 4 probes' half-width (their largest) and LAB_DRIFT in quadrature."""
    return Z * math.sqrt(probe_halfwidth**2 + LAB_DRIFT**2) / 1.96
