"""Weighted linear fits (tula.model.linfit): known answers, edge cases, 95 % intervals."""

from dataclasses import replace

import numpy as np
import pytest

import bounds
from tula.model.linfit import LinearFit, fit_linear


def test_single_distinct_x_gives_flat_fit():
    f = fit_linear([64, 64, 64], [1.0, 2.0, 3.0])
    assert f.slope == 0.0 and f.intercept == 2.0 and f.distinct_x == 1


def test_all_zero_measurements_fit_flat_zero():
    # e.g. sync times on one machine where communication is too fast to see
    f = fit_linear([0.5, 0.75, 0.875], [0.0, 0.0, 0.0])
    assert f.intercept == pytest.approx(0.0) and f.slope == pytest.approx(0.0)


def test_fit_without_points_names_what():
    with pytest.raises(ValueError, match="memory model"):
        fit_linear([], [], what="memory model")


def test_linear_fit_prediction_interval_covers_new_measurements():
    """95 % prediction intervals of the weighted fit cover ~95 % of fresh noisy measurements."""
    rng = np.random.default_rng(7)
    x = np.array([16, 32, 64, 128, 256, 512] * 2, dtype=float)
    truth = lambda b: 0.004 + 0.0002 * b  # noqa: E731
    inside = total = 0
    for _ in range(100):
        f = fit_linear(x, truth(x) * rng.normal(1, 0.05, x.size))
        new_x = np.array([24.0, 96.0, 384.0])
        lo, hi = f.predict_interval(new_x)
        y_new = truth(new_x) * rng.normal(1, 0.05, new_x.size)
        inside += int(((lo <= y_new) & (y_new <= hi)).sum())
        total += new_x.size
    lo, hi = bounds.binomial_band(total, 0.95)
    assert lo <= inside / total <= hi


def test_interval_round_trips_through_json():
    import json

    f = fit_linear([1, 2, 3, 4], [1.1, 1.9, 3.2, 3.9])
    g = LinearFit.from_dict(json.loads(json.dumps(f.to_dict())))
    assert np.allclose(g.predict_interval([2.5]), f.predict_interval([2.5]))


def test_two_points_give_the_exact_line_with_no_scatter_to_widen_it():
    """Two points: the line through them, its intervals the values themselves, no covariance
    and no residual degrees of freedom, so a prediction interval is the prediction."""
    f = fit_linear([16, 32], [1.0, 2.0])
    assert (f.intercept, f.slope) == pytest.approx((0.0, 1 / 16), abs=1e-12)
    assert f.intercept_ci == pytest.approx((f.intercept,) * 2, abs=1e-12)
    assert f.slope_ci == pytest.approx((f.slope,) * 2, abs=1e-12)
    assert (f.r2, f.n_points, f.sigma, f.df_resid) == (1.0, 2, 0.0, 0.0)
    assert f.cov == ((0.0, 0.0), (0.0, 0.0))
    lo, hi = f.predict_interval(64.0)
    assert float(lo) == float(hi) == pytest.approx(4.0, rel=1e-12)


def test_a_fit_saved_before_it_kept_its_covariance_reads_back_without_one():
    """memory_probe.json of an older Tula holds no cov, sigma or df_resid: it reads back as a fit
    without scatter (its interval the line), as a fit built without them."""
    old = {
        "intercept": 1.0,
        "slope": 2.0,
        "intercept_ci": [1.0, 1.0],
        "slope_ci": [2.0, 2.0],
        "r2": None,
        "n_points": 2,
        "distinct_x": 2,
    }
    f = LinearFit.from_dict(old)
    built = LinearFit(1.0, 2.0, (1.0, 1.0), (2.0, 2.0), float("nan"), 2, 2)
    for fit in (f, built):
        assert fit.cov == ((0.0, 0.0), (0.0, 0.0)) and fit.sigma == fit.df_resid == 0.0
        assert [float(v) for v in fit.predict_interval(3.0)] == [7.0, 7.0]
    assert np.isnan(f.r2)
    assert replace(f, r2=0.0) == replace(built, r2=0.0)  # every field as built, weights too


def test_the_interval_far_from_the_data_is_statsmodels_own():
    """A new measurement's 95 % interval of the weighted line, far beyond the points fitted
    (where the mean's variance grows with x²): statsmodels' prediction interval of the same
    WLS fit, with the new point's weight from its predicted size."""
    import statsmodels.api as sm

    x = np.arange(1.0, 9.0)
    y = 3.0 + 0.5 * x + np.array([0.1, -0.2, 0.15, -0.05, 0.2, -0.1, 0.05, -0.15])
    f = fit_linear(x, y)
    X = sm.add_constant(x)
    scale = np.maximum(np.abs(sm.OLS(y, X).fit().fittedvalues), f.weight_floor)
    res = sm.WLS(y, X, weights=1.0 / scale**2).fit()
    new = np.array([20.0, 50.0, 100.0])  # three: statsmodels refuses as many weights as columns
    yhat = res.params[0] + res.params[1] * new
    frame = res.get_prediction(
        sm.add_constant(new), weights=1.0 / np.maximum(np.abs(yhat), f.weight_floor) ** 2
    ).summary_frame(alpha=0.05)
    lo, hi = f.predict_interval(new)
    assert lo == pytest.approx(frame["obs_ci_lower"].to_numpy(), rel=bounds.ROUNDING)
    assert hi == pytest.approx(frame["obs_ci_upper"].to_numpy(), rel=bounds.ROUNDING)


def test_a_flat_fit_is_sure_of_its_zero_slope():
    f = fit_linear([3.0, 3.0], [1.0, 2.0])
    assert (f.slope, f.slope_ci, f.intercept_ci) == (0.0, (0.0, 0.0), (1.5, 1.5))


def test_three_points_leave_one_degree_of_freedom_for_an_interval():
    f = fit_linear([1, 2, 3], [1.0, 2.2, 2.9])
    assert f.df_resid == 1 and f.sigma > 0 and 0 < f.r2 < 1  # not the exact line of two
    # and weighted by relative error, as every fit with a residual degree of freedom is, with
    # the covariance of its two parameters kept (the predicted interval's own)
    assert f.weight_floor > 0 and np.linalg.det(np.array(f.cov)) > 0
    x = 2.0
    lo, hi = f.predict_interval(x)
    assert lo < f.predict(x) < hi
