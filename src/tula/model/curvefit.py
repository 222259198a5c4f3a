"""Bounded non-linear least squares on relative errors, with intervals.

The step-time model (:mod:`tula.model.perf`) is a choice among a few candidate forms (linear,
flat-then-linear, shared-machine, ...). Each candidate is a :class:`Form`: a function of
named parameters and named inputs, with bounds that keep its predictions physical (no
negative time, no time that falls as the batch grows). :func:`fit` fits it with
``scipy.optimize.least_squares`` on relative residuals (timing noise is multiplicative),
from several starts; the parameter covariance is ``sigma^2 (J^T J)^-1`` at the optimum,
so every parameter has a 95 % interval and every prediction a 95 % prediction interval
(delta method plus the residual noise). Which candidate to keep is
:mod:`tula.model.formchoice`'s.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from scipy import stats
from scipy.optimize import least_squares

Inputs = dict[str, np.ndarray]

NOISE_DOF = 1000  # intervals from a measured noise level: effectively normal quantiles
FEW_DOF = 5  # below this many residual degrees of freedom, a measured noise level sets the scale
MIN_REL_SE = 0.005  # a point's weight counts its standard error as at least 0.5 % (model error)


@dataclass(frozen=True)
class Form:
    """One candidate: ``f(theta, X) -> y`` with named parameters and bounds."""

    name: str
    params: tuple[str, ...]
    f: Callable[[np.ndarray, Inputs], np.ndarray]
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    starts: Callable[[Inputs, np.ndarray], list[np.ndarray]]
    text: str = ""  # the equation, for perf.json and the report

    def __call__(self, theta: np.ndarray, X: Inputs) -> np.ndarray:
        return self.f(np.asarray(theta, dtype=float), X)


@dataclass(frozen=True)
class Fitted:
    """A fitted form: parameters, their covariance, the relative residual scale."""

    form: Form
    theta: tuple[float, ...]
    cov: tuple[tuple[float, ...], ...]
    sigma: float  # relative residual scale (0 with no residual degree of freedom)
    dof: int
    n_points: int
    extra: dict[str, Any] = field(default_factory=dict)  # cross-validation, candidates, why

    def predict(self, X: Inputs) -> np.ndarray:
        return self.form(np.asarray(self.theta), X)

    def half_width(self, X: Inputs, alpha: float = 0.05) -> np.ndarray:
        """Half-width of the 1 - alpha prediction interval of a new measurement at X."""
        y = self.predict(X)
        if self.dof <= 0:
            return np.zeros_like(y)
        g = _jacobian(self.form, np.asarray(self.theta), X)
        var_mean = np.einsum("ij,jk,ik->i", g, np.asarray(self.cov), g)
        var = np.maximum(var_mean, 0.0) + (self.sigma * y) ** 2
        return stats.t.ppf(1 - alpha / 2, self.dof) * np.sqrt(var)

    def params(self) -> dict[str, float]:
        return dict(zip(self.form.params, self.theta))

    def intervals(self, alpha: float = 0.05) -> dict[str, tuple[float, float]]:
        if self.dof <= 0:
            return {p: (v, v) for p, v in zip(self.form.params, self.theta)}
        t = stats.t.ppf(1 - alpha / 2, self.dof)
        sd = np.sqrt(np.maximum(np.diag(np.asarray(self.cov)), 0.0))
        return {p: (v - t * s, v + t * s) for p, v, s in zip(self.form.params, self.theta, sd)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "form": self.form.name,
            "equation": self.form.text,
            "params": self.params(),
            "params_ci95": {k: list(v) for k, v in self.intervals().items()},
            "cov": [list(r) for r in self.cov],
            "sigma_rel": self.sigma,
            "dof": self.dof,
            "n_points": self.n_points,
            **self.extra,
        }


def _jacobian(form: Form, theta: np.ndarray, X: Inputs) -> np.ndarray:
    """d f / d theta by central differences (n_points x n_params)."""
    y0 = form(theta, X)
    cols = []
    for j in range(len(theta)):
        h = 1e-6 * max(abs(theta[j]), 1e-6)
        tp, tm = theta.copy(), theta.copy()
        tp[j] += h
        tm[j] -= h
        cols.append((form(tp, X) - form(tm, X)) / (2 * h))
    return np.stack(cols, axis=1) if cols else np.zeros((len(y0), 0))


def subset(X: Inputs, idx: np.ndarray) -> Inputs:
    """The points ``idx`` of each input."""
    return {k: v[idx] for k, v in X.items()}


def weights_from(halfwidth_rel: np.ndarray | None) -> np.ndarray | None:
    """Each point's weight from its measured precision (the 95 % half-width of its mean,
    relative): 1 / standard error, the error floored at MIN_REL_SE (a model is not exact to
    better than that); a point without one gets the median; scaled to a root mean square of 1,
    so the residual scale stays a relative error. None where no point has one."""
    if halfwidth_rel is None:
        return None
    hw = np.asarray(halfwidth_rel, dtype=float)
    known = np.isfinite(hw) & (hw > 0)
    if not known.any():
        return None
    se = np.where(known, hw, np.median(hw[known])) / 1.96
    w = 1.0 / np.maximum(se, MIN_REL_SE)
    return w / np.sqrt(np.mean(w**2))


def fit(
    form: Form,
    X: Inputs,
    y: np.ndarray,
    noise: np.ndarray | None = None,
    weights: np.ndarray | None = None,
) -> Fitted:
    """Least squares of (f - y) / y within the form's bounds, best of its starts; with
    ``weights`` (:func:`weights_from`), each relative residual weighted by its point's
    measured precision (weighted least squares: a noisy point pulls less).

    ``noise``: each point's measured relative noise; with fewer than FEW_DOF residual degrees
    of freedom the intervals use the larger of it and the residual scatter, with normal
    quantiles."""
    y = np.asarray(y, dtype=float)
    w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=float)
    lo, hi = np.asarray(form.lower, float), np.asarray(form.upper, float)
    best, failed = None, None
    for x0 in form.starts(X, y):
        x0 = np.clip(np.asarray(x0, float), lo, hi)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            try:
                res = least_squares(
                    lambda th: w * (form(th, X) - y) / y,
                    x0,
                    bounds=(lo, hi),
                    method="trf",
                    x_scale="jac",
                    max_nfev=2000,
                )
            except ValueError as exc:  # scipy's trf losing its step at a bound: the next start
                failed = exc
                continue
        if best is None or res.cost < best.cost:
            best = res
    if best is None:
        raise ValueError(f"{form.name}: no start of the fit converged ({failed})")
    n, p = len(y), len(form.params)
    dof = n - p
    rss = float(np.sum(best.fun**2))
    sigma = math.sqrt(rss / dof) if dof > 0 else 0.0
    sigma, dof, extra = _scatter(sigma, dof, noise)
    J = best.jac
    try:
        cov = np.linalg.pinv(J.T @ J) * sigma**2
    except np.linalg.LinAlgError:
        cov = np.zeros((p, p))
    return Fitted(
        form,
        tuple(float(v) for v in best.x),
        tuple(tuple(float(v) for v in r) for r in cov),
        sigma,
        dof,
        n,
        extra,
    )


def _scatter(sigma: float, dof: int, noise: np.ndarray | None) -> tuple[float, int, dict[str, Any]]:
    """The residual scale and its degrees of freedom for the intervals: with fewer than
    FEW_DOF residual degrees of freedom and a measured noise per point, the larger of that
    noise and the scatter, with normal quantiles (and why, for the record)."""
    if not (dof < FEW_DOF and noise is not None and len(noise) and np.all(np.isfinite(noise))):
        return sigma, dof, {}
    # A scatter estimated from 0-4 residuals is itself unknown (t quantile 12.7 at one degree
    # of freedom); the probes' noise, measured over many steps each, is known far better.
    # The larger of the two is kept, so a misfit beyond the noise still widens the interval.
    measured = float(np.sqrt(np.mean(np.asarray(noise, float) ** 2)))
    why = (
        (
            f"the probes' measured noise ({100 * measured:.1f} %): {max(dof, 0)} residual "
            "degree(s) of freedom are too few to estimate the scatter"
        )
        if measured >= sigma
        else (
            f"the residual scatter ({100 * sigma:.1f} %), larger than the probes' measured "
            f"noise ({100 * measured:.1f} %), with normal quantiles"
        )
    )
    return max(sigma, measured), NOISE_DOF, {"interval_from": why}
