"""Bounded non-linear least squares on relative errors, with intervals and model choice.

The step-time model (:mod:`tula.model.perf`) is a choice among a few candidate forms (linear,
flat-then-linear, shared-machine, ...). Each candidate is a :class:`Form`: a function of
named parameters and named inputs, with bounds that keep its predictions physical (no
negative time, no time that falls as the batch grows). :func:`fit` fits it with
``scipy.optimize.least_squares`` on relative residuals (timing noise is multiplicative),
from several starts; the parameter covariance is ``sigma^2 (J^T J)^-1`` at the optimum,
so every parameter has a 95 % interval and every prediction a 95 % prediction interval
(delta method plus the residual noise). :func:`choose` compares candidates by held-out
error (leave-one-out, or k-fold for many points) and AICc, and keeps a more complex form
only when it predicts held-out points clearly better.
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

# A more complex form must cut the held-out error by this fraction to be chosen over a
# simpler one: with few points, a small gain in cross-validation is noise.
PARSIMONY = 0.10
MIN_GAIN_PCT = 0.1  # ... and by at least this many percentage points (exact data: both near zero)
KFOLD_ABOVE = 40  # more points than this: 10-fold instead of leave-one-out
KFOLDS = 10
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


def _subset(X: Inputs, idx: np.ndarray) -> Inputs:
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


def held_out_errors(
    form: Form, X: Inputs, y: np.ndarray, weights: np.ndarray | None = None
) -> tuple[np.ndarray, str]:
    """Relative error (%) of each point predicted by a fit on the others (weighted as the full
    fit is): leave-one-out, or 10-fold (deterministic folds) for many points."""
    n = len(y)
    if n > KFOLD_ABOVE:
        folds, how = np.arange(n) % KFOLDS, f"{KFOLDS}-fold"
    else:
        folds, how = np.arange(n), "leave-one-out"
    err = np.empty(n)
    for k in np.unique(folds):
        test = folds == k
        f = fit(
            form, _subset(X, ~test), y[~test], weights=None if weights is None else weights[~test]
        )
        err[test] = 100.0 * (f.predict(_subset(X, test)) - y[test]) / y[test]
    return err, how


def aicc(fitted: Fitted) -> float:
    n, p = fitted.n_points, len(fitted.theta)
    if n - p - 1 <= 0 or fitted.sigma <= 0:
        return float("nan")
    rss = fitted.sigma**2 * fitted.dof
    return n * math.log(rss / n) + 2 * p + 2 * p * (p + 1) / (n - p - 1)


def choose(
    forms: list[Form],
    X: Inputs,
    y: np.ndarray,
    what: str,
    noise: np.ndarray | None = None,
    weights: np.ndarray | None = None,
) -> Fitted:
    """Fit the candidates and keep the best; ``forms`` are listed simplest first.

    With enough points for every candidate (p + 1: a held-out point predicted from p
    others), by held-out error: a more complex form is kept only when its held-out RMS error
    is at least PARSIMONY lower. With fewer points and a measured noise level per point
    (relative, ``noise``), by AIC with that known noise, chi^2 + 2p, over the forms the
    points determine (p <= n): a simple form whose residuals are far beyond the measured
    noise loses to one that fits. Otherwise the simplest form, and the record says why."""
    y = np.asarray(y, dtype=float)
    n = len(y)
    if n == 0:
        raise ValueError(f"{what}: no successful measurement to fit")
    has_noise = (
        noise is not None
        and len(noise) == n
        and bool(np.all(np.isfinite(noise) & (np.asarray(noise) > 0)))
    )
    if all(n >= len(f.params) + 1 for f in forms) or not has_noise:
        return _by_held_out(forms, X, y, noise, weights)
    return _by_aic(forms, X, y, np.asarray(noise), weights)


def _by_aic(
    forms: list[Form], X: Inputs, y: np.ndarray, noise: np.ndarray, weights: np.ndarray | None
) -> Fitted:
    """Too few points to hold any out: AIC with the known (measured) noise, chi^2 + 2p, over
    the forms the points determine."""
    n = len(y)
    rows, best = [], None
    for form in forms:
        if n < len(form.params):
            rows.append(
                {
                    "form": form.name,
                    "n_params": len(form.params),
                    "note": f"needs {len(form.params)} points",
                }
            )
            continue
        f = fit(form, X, y, noise, weights)
        chi2 = float(np.sum(((f.predict(X) - y) / y / np.asarray(noise)) ** 2))
        score = chi2 + 2 * len(form.params)
        rows.append(
            {
                "form": form.name,
                "n_params": len(form.params),
                "chi2": chi2,
                "aic_known_noise": score,
                "max_abs_residual_pct": float(100 * np.max(np.abs((f.predict(X) - y) / y))),
            }
        )
        if best is None or score < best[1]:
            best = (f, score)
    assert best is not None
    f = best[0]
    why = (
        f"{n} points cannot judge every form by held-out error; AIC with the probes' measured "
        f"noise ({100 * float(np.median(noise)):.1f} % median) picks {f.form.name}: "
        + ", ".join(f"{r['form']}: chi2 {r['chi2']:.1f} + 2p" for r in rows if "chi2" in r)
    )
    extra = {**f.extra, "criterion": "aic_known_noise", "candidates": rows, "why": why}
    return Fitted(f.form, f.theta, f.cov, f.sigma, f.dof, f.n_points, extra)


def _by_held_out(
    forms: list[Form],
    X: Inputs,
    y: np.ndarray,
    noise: np.ndarray | None,
    weights: np.ndarray | None,
) -> Fitted:
    n = len(y)
    rows: list[dict[str, Any]] = []
    best: tuple[Form, float] | None = None
    how = "none"
    for form in forms:
        if n < len(form.params) + 1:
            rows.append(
                {
                    "form": form.name,
                    "n_params": len(form.params),
                    "held_out_rms_pct": None,
                    "note": f"needs {len(form.params) + 1} points, has {n}",
                }
            )
            continue
        err, how = held_out_errors(form, X, y, weights)
        rms = float(np.sqrt(np.mean(err**2)))
        full = fit(form, X, y, weights=weights)
        rows.append(
            {
                "form": form.name,
                "n_params": len(form.params),
                "held_out_rms_pct": rms,
                "held_out_median_abs_pct": float(np.median(np.abs(err))),
                "aicc": aicc(full),
            }
        )
        if best is None or (rms < (1 - PARSIMONY) * best[1] and best[1] - rms > MIN_GAIN_PCT):
            best = (form, rms)
    if best is None:
        form = forms[0]
        chosen = fit(form, X, y, noise, weights)
        why = (
            f"too few points ({n}) to compare forms by held-out error: the simplest form, "
            f"{form.name}"
        )
    else:
        form = best[0]
        chosen = fit(form, X, y, noise, weights)
        why = _held_out_why(rows, form, best[1], how, n)
    extra = {"criterion": "held_out", "cross_validation": how, "candidates": rows, "why": why}
    c = chosen
    return Fitted(c.form, c.theta, c.cov, c.sigma, c.dof, c.n_points, {**c.extra, **extra})


def _held_out_why(rows: list[dict[str, Any]], form: Form, rms: float, how: str, n: int) -> str:
    """Why ``form`` won: its held-out error, the simpler forms' errors, and the forms that did
    not beat it by PARSIMONY."""
    judged = [r for r in rows if r["held_out_rms_pct"] is not None and r["form"] != form.name]
    simpler = [r for r in judged if r["n_params"] < len(form.params)]
    others = [r for r in judged if r["n_params"] >= len(form.params)]
    why = f"{how} error {rms:.2f} % RMS over {n} points"
    if simpler:
        why += "; " + ", ".join(f"{r['form']}: {r['held_out_rms_pct']:.2f} %" for r in simpler)
    if others:
        why += (
            f"; other forms did not cut it by {100 * PARSIMONY:.0f} % ("
            + ", ".join(f"{r['form']}: {r['held_out_rms_pct']:.2f} %" for r in others)
            + ")"
        )
    return why
