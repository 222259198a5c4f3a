"""One straight-line fit, y = intercept + slope * x, by statsmodels weighted least squares.

Both the memory model (Eq. 3, linear in local batch) and the step-time model (Eq. 2:
compute linear in local batch, sync linear in the collective's N-term) are such fits.
The record keeps 95 % confidence intervals so a user can see how sure a fit is.

Why weighted: timing noise is multiplicative (a roughly constant coefficient of
variation), so the largest batches carry the largest absolute noise and the most
leverage. Plain OLS then gives intervals that are too narrow (measured: 60 % coverage
of nominal 95 % intervals on synthetic data with 3 % noise) and larger errors. A
two-step WLS with weights 1 / fitted^2 fits relative errors: 95.5 % coverage and a
median slope error of 1.1 % against OLS's 1.6 % (tests/test_fits.py checks coverage).
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np


@dataclass(frozen=True)
class LinearFit:
    intercept: float
    slope: float
    intercept_ci: tuple[float, float]
    slope_ci: tuple[float, float]
    r2: float
    n_points: int
    distinct_x: int
    cov: tuple[tuple[float, float], tuple[float, float]] = ((0.0, 0.0), (0.0, 0.0))
    sigma: float = 0.0  # residual scale: relative (weighted fit) or absolute (weight_floor 0)
    weight_floor: float = 0.0  # >0: the noise of a new point is sigma * max(|yhat|, floor)
    df_resid: float = 0.0

    def predict(self, x: float | np.ndarray) -> np.ndarray:
        return self.intercept + self.slope * np.asarray(x, dtype=float)

    def predict_interval(
        self, x: float | np.ndarray, alpha: float = 0.05
    ) -> tuple[np.ndarray, np.ndarray]:
        """(low, high) of the 1 - alpha prediction interval of a new measurement at x."""
        # 0.6 s: only here, not in every process that reads b_max from the memory model
        from scipy import stats

        xa = np.asarray(x, dtype=float)
        yhat = self.predict(xa)
        if self.df_resid <= 0:
            return yhat, yhat
        c = np.asarray(self.cov)
        var_mean = c[0, 0] + 2 * c[0, 1] * xa + c[1, 1] * xa**2
        noise = self.sigma * (
            np.maximum(np.abs(yhat), self.weight_floor) if self.weight_floor > 0 else 1.0
        )
        half = stats.t.ppf(1 - alpha / 2, self.df_resid) * np.sqrt(
            np.maximum(var_mean, 0) + noise**2
        )
        return yhat - half, yhat + half

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LinearFit":
        return cls(
            intercept=float(d["intercept"]),
            slope=float(d["slope"]),
            intercept_ci=tuple(d["intercept_ci"]),
            slope_ci=tuple(d["slope_ci"]),
            r2=float(d["r2"]) if d.get("r2") is not None else float("nan"),
            n_points=int(d["n_points"]),
            distinct_x=int(d["distinct_x"]),
            cov=tuple(tuple(r) for r in d.get("cov", ((0.0, 0.0), (0.0, 0.0)))),
            sigma=float(d.get("sigma", 0.0)),
            weight_floor=float(d.get("weight_floor", 0.0)),
            df_resid=float(d.get("df_resid", 0.0)),
        )


def _r2(res) -> float:
    with warnings.catch_warnings():  # constant y: R^2 is undefined (nan)
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(res.rsquared)


def fit_linear(x: Sequence[float], y: Sequence[float], what: str = "fit") -> LinearFit:
    """OLS of y on [1, x]. With one distinct x the line is flat at mean(y).

    Raises ValueError naming ``what`` when there is no point at all.
    """
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(xa) & np.isfinite(ya)
    xa, ya = xa[keep], ya[keep]
    if len(xa) == 0:
        raise ValueError(f"{what}: no successful measurement to fit")
    distinct = len(np.unique(xa))
    if distinct < 2:
        mean = float(ya.mean())
        return LinearFit(mean, 0.0, (mean, mean), (0.0, 0.0), float("nan"), len(xa), distinct)
    # 1.4-1.8 s: only where a line is fitted, not in every process that reads b_max
    import statsmodels.api as sm

    X = sm.add_constant(xa, has_constant="add")
    with warnings.catch_warnings():  # two points: an exact line, no residual degrees of freedom
        warnings.simplefilter("ignore", RuntimeWarning)
        res = sm.OLS(ya, X).fit()
    floor = 0.0
    if len(xa) > 2 and np.abs(ya).max() > 0:
        # Relative-error weights; the floor keeps near-zero values (tiny sync times) from
        # dominating.
        floor = 0.05 * float(np.abs(ya).max())
        scale = np.maximum(np.abs(res.fittedvalues), floor)
        res = sm.WLS(ya, X, weights=1.0 / scale**2).fit()
    if len(xa) == 2:  # exact line through two points: no residual degrees of freedom
        ci = np.array([[res.params[0]] * 2, [res.params[1]] * 2])
    else:
        ci = np.asarray(res.conf_int(alpha=0.05))
    return LinearFit(
        intercept=float(res.params[0]),
        slope=float(res.params[1]),
        intercept_ci=(float(ci[0, 0]), float(ci[0, 1])),
        slope_ci=(float(ci[1, 0]), float(ci[1, 1])),
        r2=_r2(res) if len(xa) > 2 else 1.0,
        n_points=len(xa),
        distinct_x=distinct,
        cov=tuple(tuple(float(v) for v in row) for row in np.asarray(res.cov_params()))
        if len(xa) > 2
        else ((0.0, 0.0), (0.0, 0.0)),
        sigma=float(np.sqrt(res.scale)) if len(xa) > 2 else 0.0,
        weight_floor=floor,
        df_resid=float(res.df_resid) if len(xa) > 2 else 0.0,
    )
