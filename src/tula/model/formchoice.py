"""Choosing among fitted candidate forms (:mod:`tula.model.curvefit`): by held-out error
(leave-one-out, or k-fold for many points), keeping a more complex form only when it predicts
held-out points clearly better; with too few points to hold any out, by AIC with the probes'
measured noise. The record says which criterion chose and why (perf.json, the report).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tula.model.curvefit import Fitted, Form, Inputs, fit, subset

# A more complex form must cut the held-out error by this fraction to be chosen over a
# simpler one: with few points, a small gain in cross-validation is noise.
PARSIMONY = 0.10
MIN_GAIN_PCT = 0.1  # ... and by at least this many percentage points (exact data: both near zero)
KFOLD_ABOVE = 40  # more points than this: 10-fold instead of leave-one-out
KFOLDS = 10


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
            form, subset(X, ~test), y[~test], weights=None if weights is None else weights[~test]
        )
        err[test] = 100.0 * (f.predict(subset(X, test)) - y[test]) / y[test]
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
