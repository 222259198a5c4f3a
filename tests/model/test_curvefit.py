"""Bounded fits with intervals (tula.model.curvefit) and the choice among forms
(tula.model.formchoice): known answers on data made from a known form, intervals that cover
at their stated rate, bounds that keep predictions physical, and a more complex form chosen
only when it predicts held-out points clearly better."""

import math

import numpy as np
import pytest

import bounds
from tula.model import curvefit, formchoice
from tula.model import forms as forms_mod

FORMS = {f.name: f for f in forms_mod.compute_forms(max_b=128.0)}  # as perf.fit builds them


def _b(*values):
    b = np.asarray(values, dtype=float)
    return {"b": b, "n": np.ones_like(b)}


def test_exact_data_gives_back_its_parameters_and_a_zero_width_interval():
    X = _b(1, 2, 4, 8, 16, 32)
    y = 0.004 + 0.0002 * X["b"]
    f = curvefit.fit(FORMS["linear"], X, y)
    assert f.params() == pytest.approx({"c0": 0.004, "c1": 0.0002}, rel=1e-9)
    assert f.sigma == pytest.approx(0.0, abs=1e-9) and (f.dof, f.n_points) == (4, 6)
    assert f.half_width(_b(64)) == pytest.approx([0.0], abs=1e-12)


def test_a_start_where_scipy_loses_its_step_is_skipped_and_the_others_fit(monkeypatch):
    """scipy's trf can raise ValueError ("`x` is not within the trust region") from one start at
    a bound (seen in CI on the network lab's sync points): that start is skipped, the fit is the
    other starts' best; only when every start fails is it an error, naming the form."""
    X = _b(1, 2, 4, 8, 16, 32)
    y = 0.004 + 0.0002 * X["b"]
    form = FORMS["linear"]
    assert len(list(form.starts(X, y))) > 1
    real, calls = curvefit.least_squares, []

    def first_start_fails(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("`x` is not within the trust region.")
        return real(*args, **kwargs)

    monkeypatch.setattr(curvefit, "least_squares", first_start_fails)
    assert curvefit.fit(form, X, y).params() == pytest.approx({"c0": 0.004, "c1": 0.0002})

    def every_start_fails(*args, **kwargs):
        raise ValueError("`x` is not within the trust region.")

    monkeypatch.setattr(curvefit, "least_squares", every_start_fails)
    with pytest.raises(ValueError, match="linear: no start of the fit converged"):
        curvefit.fit(form, X, y)


def test_bounds_keep_compute_from_falling_as_the_batch_grows():
    X = _b(1, 2, 4, 8)
    f = curvefit.fit(FORMS["linear"], X, 0.01 - 0.0005 * X["b"])  # decreasing data
    # at the bound, never negative
    assert f.params()["c1"] == pytest.approx(0.0, abs=1e-12) and f.params()["c0"] > 0


def test_95_percent_intervals_cover_the_truth_at_their_rate():
    """200 data sets of 8 points with 3 % multiplicative noise: the 95 % interval of c1 holds
    the true value in 95 % of them, give or take the binomial spread of 200 draws."""
    rng = np.random.default_rng(7)
    X = _b(1, 2, 4, 8, 16, 32, 64, 128)
    hits = 0
    for _ in range(200):
        y = (0.004 + 0.0002 * X["b"]) * rng.normal(1, 0.03, len(X["b"]))
        lo, hi = curvefit.fit(FORMS["linear"], X, y).intervals()["c1"]
        hits += lo <= 0.0002 <= hi
    lo, hi = bounds.binomial_band(200, 0.95)
    assert lo <= hits / 200 <= hi


def test_held_out_errors_leave_one_out_and_ten_fold_above_forty_points():
    X = _b(*range(1, 11))
    err, how = formchoice.held_out_errors(FORMS["linear"], X, 0.5 + 0.1 * X["b"])
    assert how == "leave-one-out" and err.shape == (10,) and np.abs(err).max() < 1e-6
    X = _b(*range(1, 42))
    assert formchoice.held_out_errors(FORMS["linear"], X, 0.5 + 0.1 * X["b"])[1] == "10-fold"


def test_a_complex_form_is_chosen_only_when_it_predicts_clearly_better():
    X = _b(1, 2, 4, 8, 16, 32, 64, 128)
    flat_then_linear = 0.01 + 0.001 * np.maximum(X["b"] - 16, 0)  # a GPU under-used below b = 16
    forms = [FORMS["linear"], FORMS["saturating"]]
    chosen = formchoice.choose(forms, X, flat_then_linear, "compute")
    assert chosen.form.name == "saturating" and chosen.params()["b0"] == pytest.approx(
        16, rel=bounds.SOLVER
    )
    assert chosen.extra["criterion"] == "held_out" and "linear:" in chosen.extra["why"]
    # the simpler form is named once, as simpler, not again among those that did not beat it
    assert chosen.extra["why"].count("linear:") == 1 and "did not cut it" not in chosen.extra["why"]
    straight = 0.004 + 0.0002 * X["b"]
    # parsimony: no gain, no extra parameter
    kept = formchoice.choose(forms, X, straight, "compute")
    assert kept.form.name == "linear"
    assert "; other forms did not cut it by 10 % (saturating: " in kept.extra["why"]


def test_too_few_points_choose_by_aic_with_the_measured_noise():
    """Two probes cannot hold a point out for a 2-parameter step form; with each probe's own
    noise measured, AIC (chi^2 + 2p) picks the form whose residuals fit that noise."""
    X, y = _two_probes(1.0)
    forms = forms_mod.step_forms("ring", latency=False)
    chosen = formchoice.choose(forms, X, y, "step", noise=np.array([0.02, 0.02]))
    assert chosen.form.name == "additive" and chosen.extra["criterion"] == "aic_known_noise"
    assert chosen.params()["s1"] == pytest.approx(0.02, rel=1e-6)
    assert "AIC with the probes' measured noise (2.0 % median)" in chosen.extra["why"]
    # each form's chi^2 and AIC by hand: 1 % off at each probe, the additive fit in between
    off = y * np.array([1.01, 0.99])
    chosen = formchoice.choose(forms, X, off, "step", noise=np.array([0.02, 0.02]))
    row = next(r for r in chosen.extra["candidates"] if r["form"] == "additive")
    s1 = formchoice.fit(forms[0], X, off).params()["s1"]
    chi2 = float(np.sum(((X["c"] + s1 * X["x"] - off) / off / 0.02) ** 2))
    assert chi2 > 0 and row["chi2"] == pytest.approx(chi2, rel=bounds.SOLVER)
    assert row["aic_known_noise"] == pytest.approx(row["chi2"] + 2, rel=bounds.ROUNDING)


def test_aicc_by_hand():
    X = _b(1, 2, 3, 4, 5)
    y = np.array([1.0, 2.1, 2.9, 4.2, 4.9])
    f = curvefit.fit(FORMS["linear"], X, y)
    rss = float(np.sum(((f.predict(X) - y) / y) ** 2))
    assert formchoice.aicc(f) == pytest.approx(5 * math.log(rss / 5) + 4 + 12 / 2)
    assert math.isnan(
        formchoice.aicc(curvefit.fit(FORMS["linear"], _b(1, 2), np.array([1.0, 2.0])))
    )
    # the fewest points it is defined on: n = p + 2, its correction 2p(p + 1) / 1
    X4, y4 = _b(1, 2, 3, 4), np.array([1.0, 2.1, 2.9, 4.2])
    f4 = curvefit.fit(FORMS["linear"], X4, y4)
    rss4 = float(np.sum(((f4.predict(X4) - y4) / y4) ** 2))
    assert formchoice.aicc(f4) == pytest.approx(4 * math.log(rss4 / 4) + 4 + 12 / 1)


def test_weighting_by_measured_precision_recovers_a_known_model_better():
    """Points of unequal noise (half of them 1 %, half 15 %), each with the half-width its own
    timing would report: over 200 data sets the weighted fit's prediction error at an unprobed
    batch is clearly smaller than the unweighted fit's, and its interval covers the truth."""
    rng = np.random.default_rng(7)
    X = _b(1, 2, 4, 8, 16, 32, 64, 128)
    truth = 0.004 + 0.0002 * X["b"]
    rel_sd = np.array([0.01, 0.15] * 4)
    at = _b(256)
    true_at = 0.004 + 0.0002 * 256
    err_w, err_u, covered = [], [], 0
    for _ in range(200):
        y = truth * (1 + rel_sd * rng.standard_normal(len(truth)))
        w = curvefit.weights_from(1.96 * rel_sd)
        fw = curvefit.fit(FORMS["linear"], X, y, weights=w)
        fu = curvefit.fit(FORMS["linear"], X, y)
        err_w.append(abs(fw.predict(at)[0] / true_at - 1))
        err_u.append(abs(fu.predict(at)[0] / true_at - 1))
        lo, hi = fw.predict(at)[0] - fw.half_width(at)[0], fw.predict(at)[0] + fw.half_width(at)[0]
        covered += lo <= true_at <= hi
    assert np.median(err_w) < bounds.CLEARLY_SMALLER * np.median(err_u)
    lo, _ = bounds.binomial_band(200, 0.95)
    assert covered >= lo * 200


def test_weights_floor_the_error_and_fill_the_unknown():
    w = curvefit.weights_from(np.array([0.0001, 0.02, np.nan, 0.2]))
    # standard error = half-width / 1.96, floored at 0.5 % (the first); the unknown point gets the
    # median half-width of the known ones (0.02)
    se = np.array([0.005, 0.02 / 1.96, 0.02 / 1.96, 0.2 / 1.96])
    expect = (1 / se) / np.sqrt(np.mean((1 / se) ** 2))
    assert w == pytest.approx(expect)
    assert curvefit.weights_from(np.array([np.nan, np.nan])) is None
    # a half-width of 0 or below is no precision measured: the median fills it, as for NaN
    for unknown in (0.0, -0.02):
        assert curvefit.weights_from(np.array([0.0001, 0.02, unknown, 0.2])) == pytest.approx(w)


def test_few_degrees_of_freedom_take_the_measured_noise_and_many_their_scatter():
    """Under FEW_DOF residual degrees of freedom a scatter estimated from so few residuals is
    itself unknown: the probes' measured noise (its RMS) sets the scale, with normal quantiles,
    unless the scatter is larger; with enough residuals the scatter alone, as without noise."""
    rng = np.random.default_rng(5)
    few = _b(1, 2, 4, 8)  # 2 degrees of freedom for a line
    y = (0.004 + 0.0002 * few["b"]) * (1 + 0.001 * rng.standard_normal(4))
    noise = np.full(4, 0.05)
    f = curvefit.fit(FORMS["linear"], few, y, noise=noise)
    assert f.sigma == pytest.approx(0.05, rel=1e-12) and f.dof == curvefit.NOISE_DOF
    assert f.extra["interval_from"].startswith("the probes' measured noise (5.0 %): 2 residual")
    many = _b(*range(1, 13))  # 10 degrees of freedom: the scatter's own
    y = (0.004 + 0.0002 * many["b"]) * (1 + 0.02 * rng.standard_normal(12))
    plain = curvefit.fit(FORMS["linear"], many, y)
    f = curvefit.fit(FORMS["linear"], many, y, noise=np.full(12, 0.05))
    assert (f.sigma, f.dof) == (plain.sigma, plain.dof) == (plain.sigma, 10)
    assert "interval_from" not in f.extra


def test_a_scatter_larger_than_the_noise_is_said_with_both_figures():
    """Two residual degrees of freedom, the points 10 % off a line, the probes' noise 1 %: the
    scatter sets the interval, and the words give both in percent."""
    few = _b(1, 2, 4, 8)
    y = (0.004 + 0.0002 * few["b"]) * np.array([1.1, 0.9, 1.1, 0.9])
    noise = np.full(4, 0.01)
    f = curvefit.fit(FORMS["linear"], few, y, noise=noise)
    assert f.sigma > noise[0] and f.dof == curvefit.NOISE_DOF
    said = f.extra["interval_from"]
    assert said == (
        f"the residual scatter ({100 * f.sigma:.1f} %), larger than the probes' measured "
        "noise (1.0 %), with normal quantiles"
    )


def _two_probes(second: float = 1.1):
    """Two probes' step inputs (compute c, sync feature x, latency l, N) and an additive step,
    its sync at the second probe ``second`` times the first's line."""
    X = {k: np.array(v) for k, v in dict(c=[0.01, 0.012], x=[0.5, 0.75]).items()}
    X |= {"l": np.array([1.0, 3.0]), "n": np.array([2.0, 4.0])}
    return X, X["c"] + 0.02 * X["x"] * np.array([1.0, second])


def test_held_out_error_judges_a_form_only_on_a_point_more_than_its_parameters():
    """Without a measured noise the forms are judged by held-out error, which needs p + 1
    points: on two probes the two-parameter form is not judged, and says why."""
    X, y = _two_probes()
    chosen = formchoice.choose(forms_mod.step_forms("ring", latency=False), X, y, "step")
    rows = {r["form"]: r for r in chosen.extra["candidates"]}
    assert rows["overlap"]["note"] == "needs 3 points, has 2" and chosen.form.name == "additive"
    assert rows["additive"]["held_out_rms_pct"] is not None


def test_each_form_judged_by_aic_records_its_largest_relative_residual():
    """The AIC choice's record: each form's largest residual relative to the measured value,
    in percent."""
    X, y = _two_probes()
    forms = forms_mod.step_forms("ring", latency=False)
    chosen = formchoice.choose(forms, X, y, "step", noise=np.array([0.02, 0.02]))
    for row, form in zip(chosen.extra["candidates"], forms, strict=True):
        fit = curvefit.fit(form, X, y, noise=np.array([0.02, 0.02]))
        assert row["max_abs_residual_pct"] == pytest.approx(
            100 * np.max(np.abs((fit.predict(X) - y) / y)), rel=bounds.ROUNDING, abs=bounds.ROUNDING
        )


def test_five_residual_degrees_of_freedom_estimate_their_own_scatter():
    """FEW_DOF is where the scatter's own estimate takes over from the measured noise: a line
    on 7 points (5 degrees of freedom) keeps its own, with its t quantiles."""
    b = _b(*range(1, 8))
    y = (0.004 + 0.0002 * b["b"]) * np.array([1.01, 0.99, 1.02, 0.98, 1.0, 1.01, 0.99])
    f = curvefit.fit(FORMS["linear"], b, y, noise=np.full(7, 0.05))
    assert f.dof == 5 == curvefit.FEW_DOF and "interval_from" not in f.extra


def test_no_point_to_fit_is_named_and_one_point_is_no_error():
    empty = {"b": np.array([]), "n": np.array([])}
    with pytest.raises(ValueError, match="compute: no successful measurement to fit"):
        formchoice.choose([FORMS["linear"]], empty, np.array([]), "compute")
    one = formchoice.choose([FORMS["linear"]], _b(64), np.array([0.01]), "compute")
    assert one.form.name == "linear" and one.n_points == 1
    # fewer points than parameters (dof < 0): no spread to speak of, each interval its value
    assert one.dof < 0 and all(
        lo == hi == v for (lo, hi), v in zip(one.intervals().values(), one.theta)
    )
    assert not one.half_width(_b(128)).any()


def test_the_why_lists_a_simpler_form_once_and_the_others_apart():
    """The held-out choice's words: the forms simpler than the winner, then those that did not
    beat it by PARSIMONY; a form is named in one of the two lists only."""
    X = _b(1, 2, 4, 8, 16, 32, 64, 128)
    kept = formchoice.choose(
        [FORMS["linear"], FORMS["saturating"]], X, 0.004 + 0.0002 * X["b"], "c"
    )
    assert kept.form.name == "linear" and kept.extra["why"].count("saturating:") == 1


def test_p_plus_one_points_are_judged_by_held_out_error_even_with_a_measured_noise():
    """Three probes and forms of at most two parameters: each form can be judged on a point it
    did not see, so held-out error decides, not AIC."""
    X = {k: np.array(v) for k, v in dict(c=[0.01, 0.012, 0.014], x=[0.5, 0.75, 0.875]).items()}
    X |= {"l": np.array([1.0, 3.0, 7.0]), "n": np.array([2.0, 4.0, 8.0])}
    y = X["c"] + 0.02 * X["x"] * np.array([1.0, 1.1, 0.95])
    forms = forms_mod.step_forms("ring", latency=False)
    assert max(len(f.params) for f in forms) + 1 == len(y)
    chosen = formchoice.choose(forms, X, y, "step", noise=np.full(3, 0.02))
    assert chosen.extra["criterion"] == "held_out"


def test_intervals_are_students_t_quantiles_of_the_fits_own_spread():
    """A parameter's interval: theta ± t(1 - alpha/2, dof) x its standard deviation; a new
    measurement's half-width scales with the same quantile, so two alphas' half-widths are in
    the ratio of their quantiles."""
    from scipy import stats

    X = _b(1, 2, 4, 8, 16, 32)
    y = (0.004 + 0.0002 * X["b"]) * np.array([1.02, 0.97, 1.01, 0.99, 1.03, 0.98])
    f = curvefit.fit(FORMS["linear"], X, y)
    t = stats.t.ppf(0.975, f.dof)
    for (name, (lo, hi)), v, var in zip(f.intervals().items(), f.theta, np.diag(f.cov)):
        assert (lo, hi) == pytest.approx((v - t * np.sqrt(var), v + t * np.sqrt(var)))
    wide, narrow = f.half_width(_b(64), 0.05), f.half_width(_b(64), 0.5)
    assert wide / narrow == pytest.approx(t / stats.t.ppf(0.75, f.dof))


def test_one_residual_degree_of_freedom_still_gives_an_interval():
    """Three points on a line that is not quite straight: one degree of freedom, a wide but
    finite 95 % interval (Student's t at 1 degree is 12.7), not the zero width of an exact
    fit."""
    pts = _b(1, 2, 4)
    f = curvefit.fit(FORMS["linear"], pts, np.array([1.0, 2.1, 3.9]))
    assert f.dof == 1 and f.sigma > 0
    assert (f.half_width(pts) > 0).all() and np.isfinite(f.half_width(pts)).all()


def test_a_measured_noise_equal_to_the_scatter_is_said_as_the_noise():
    """A tie between the probes' measured noise and the residual scatter: the measured noise
    is the better known of the two, and the record says it set the interval."""
    sigma, dof, extra = curvefit._scatter(0.25, 2, np.array([0.25, 0.25]))
    assert (sigma, dof) == (0.25, curvefit.NOISE_DOF)
    assert extra["interval_from"].startswith("the probes' measured noise (25.0 %)")


def test_held_out_errors_are_in_percent_of_the_point_left_out():
    """Points on a line but one 10 % high: left out, that point is predicted by the line the
    others lie on, an error of 1 / 1.1 - 1 (the line's value over the point's, less one),
    given in percent: -9.1."""
    X = _b(1, 2, 3, 4, 5)
    y = 0.5 + 0.1 * X["b"]
    y[2] *= 1.1
    err, _ = formchoice.held_out_errors(FORMS["linear"], X, y)
    assert err[2] == pytest.approx(100 * (1 / 1.1 - 1), rel=bounds.SOLVER)


def test_a_noise_that_is_not_positive_is_not_taken_for_a_measured_one():
    """A negative (or zero) relative noise is no measurement: with two probes, the choice falls
    back to the simplest form and says so, as with no noise at all, instead of weighing
    residuals by it in AIC."""
    X, y = _two_probes(1.0)
    forms = forms_mod.step_forms("ring", latency=False)
    for bad in ([0.02, -0.02], [0.0, 0.02]):
        chosen = formchoice.choose(forms, X, y, "step", noise=np.array(bad))
        assert chosen.extra["criterion"] != "aic_known_noise", bad
        none = formchoice.choose(forms, X, y, "step")
        assert (chosen.form.name, chosen.extra["criterion"]) == (
            none.form.name,
            none.extra["criterion"],
        )


def test_held_out_errors_weigh_each_fit_as_the_full_fit_is():
    """Each held-out point is predicted by a fit on the others with the others' own weights: a
    wild point given almost no weight barely moves the fits that include it."""
    X = _b(8, 16, 32, 64, 128, 256)
    y = 0.004 + 0.0002 * X["b"]
    y[2] *= 3.0  # the wild one
    w = np.array([1.0, 1.0, 1e-6, 1.0, 1.0, 1.0])
    err, how = formchoice.held_out_errors(FORMS["linear"], X, y, weights=w)
    assert how == "leave-one-out"
    for k in range(len(y)):
        rest = np.arange(len(y)) != k
        f = curvefit.fit(FORMS["linear"], curvefit.subset(X, rest), y[rest], weights=w[rest])
        expected = 100.0 * (f.predict(curvefit.subset(X, ~rest)) - y[~rest]) / y[~rest]
        assert err[k] == pytest.approx(expected[0], rel=bounds.SOLVER), k
    # the points beside the wild one are predicted as if it were not there
    clean = [k for k in range(len(y)) if k != 2]
    assert np.all(np.abs(err[clean]) < np.abs(err[2]))


def test_a_curved_forms_half_width_takes_its_exact_gradient():
    """The prediction interval of a form curved in its parameters (a power law a b^p) carries
    the parameters' covariance through the form's gradient in theta, [b^p, a b^p ln b],
    computed by small central differences: equal to the gradient by hand."""
    from scipy import stats

    power = curvefit.Form(
        "power", ("a", "p"), lambda t, X: t[0] * X["b"] ** t[1], (0.0, 0.0), (1.0, 2.0), None
    )
    # a small exponent: a step relative to it must stay small to read the curvature right
    a, p, cov = 0.002, 1e-5, np.array([[1e-8, 2e-7], [2e-7, 4e-4]])
    f = curvefit.Fitted(power, (a, p), tuple(map(tuple, cov)), 0.0, 4, 6)
    X = _b(4, 64)
    g = np.stack([X["b"] ** p, a * X["b"] ** p * np.log(X["b"])], axis=1)
    by_hand = stats.t.ppf(0.975, 4) * np.sqrt(np.einsum("ij,jk,ik->i", g, cov, g))
    assert f.half_width(X) == pytest.approx(by_hand, rel=bounds.SOLVER)
