"""Weighted linear fits (tula.model.linfit): known answers, edge cases, 95 % intervals."""

import numpy as np
import pytest

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
    assert 0.88 <= inside / total <= 0.995


def test_interval_round_trips_through_json():
    import json

    f = fit_linear([1, 2, 3, 4], [1.1, 1.9, 3.2, 3.9])
    g = LinearFit.from_dict(json.loads(json.dumps(f.to_dict())))
    assert np.allclose(g.predict_interval([2.5]), f.predict_interval([2.5]))
