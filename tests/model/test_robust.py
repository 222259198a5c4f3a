"""How firmly the probes' noise holds the choice (tula.model.robust): the knee's share of the
resamples on known curves."""

import numpy as np
import pandas as pd
import pytest

import bounds
from tula import config, model_inputs
from tula.model import memory, robust
from tula.model import perf as perf_mod
from tula.model.linfit import fit_linear
from tula.model.selection import Point, Share

D = 1024 * 100  # every B of the grid divides it: T = E * D / B * t_step exactly
BATCHES = [32, 64, 128, 256, 512, 1024]


def point(workers: int, batch: int) -> Point:
    """A chosen point as the verdict reads it: its (N, B)."""
    return Point(workers, 1, batch, batch // workers, 0.0, 0.0, 0.0, "USD", 0.0, True)


def _measured(c0: float, c1: float, halfwidth: float) -> pd.DataFrame:
    """One worker: compute-only sweep rows at every batch and probes at the two ends, exact
    t_step = c0 + c1 * b, each mean with the given measured precision."""
    rows = [
        dict(
            workers=1,
            global_batch=b if src == "probe" else 32,
            local_batch=b,
            status="ok",
            source=src,
            compute_time_s=c0 + c1 * b,
            step_time_s=c0 + c1 * b if src == "probe" else np.nan,
            sync_time_s=0.0 if src == "probe" else np.nan,
            peak_mem_bytes=1.0,
            compute_time_halfwidth_rel=halfwidth,
            step_time_halfwidth_rel=halfwidth if src == "probe" else np.nan,
            train_samples=D,
        )
        for b in BATCHES
        for src in (("probe", "sweep") if b in (32, 1024) else ("sweep",))
    ]
    return pd.DataFrame(rows)


RESAMPLES = 60


def _shares(c0: float, c1: float, halfwidth: float):
    cfg = config.from_dict(
        {
            "grid": {"workers": [1], "batch_min": 32, "batch_max": 1024},
            "workload": {"epochs": 1},
            "objective": "knee",
            "knee_rule": "marginal",
            "knee_gain": 0.1,
        }
    )
    measured = _measured(c0, c1, halfwidth)
    perf = perf_mod.fit(measured, "ring")
    mem = memory.MemoryModel(fit_linear([1, 2], [1.0, 1.0]), None)
    shares = robust.choice_shares(
        model_inputs.planning(cfg), measured, perf, mem, D, resamples=RESAMPLES
    )
    return cfg, shares


def test_a_knee_far_from_the_threshold_holds_in_every_resample():
    """t_step = 10 ms + 0.1 ms x b: doubling B saves 1 - T(2B)/T(B) = (x/2)/(x+1), x = 100/B:
    14 % from 256 to 512, 8.2 % from 512 to 1024, so the marginal knee (10 %) is B = 512, with
    4 points of gain to spare; timed to +-0.4 %, no resample moves it."""
    cfg, shares = _shares(0.01, 1e-4, 0.004)
    assert shares[0] == Share(workers=1, global_batch=512, share=1.0)
    v = robust.verdict(point(1, 512), shares, RESAMPLES, cfg.probe.precision)
    assert v.settled and v.chosen.share == 1.0 and v.to_settle is None
    assert "to_settle" not in v.to_json()


def test_a_knee_on_the_threshold_is_a_coin_toss_and_is_said_so():
    """c0 / c1 = 64: doubling 256 -> 512 saves exactly 10 % (x = 1/4), 128 -> 256 saves 16.7 %
    and 512 -> 1024 5.6 %: the knee is 256 when noise puts that doubling below 10 %, else 512,
    about half the time each. Timed to +-5 %, neither holds a clear majority of the resamples,
    and the verdict names both points as what to time more precisely."""
    cfg, shares = _shares(0.0064, 1e-4, 0.05)
    got = {r.global_batch: r.share for r in shares}
    assert set(got) <= {256, 512} and sum(got.values()) == pytest.approx(1.0)
    lo, hi = bounds.binomial_band(RESAMPLES, 0.5)  # a fair coin over the resamples
    assert lo <= got.get(256, 0.0) <= hi and lo <= got.get(512, 0.0) <= hi
    v = robust.verdict(point(1, 512), shares, RESAMPLES, cfg.probe.precision)
    assert not v.settled and "B=256" in v.to_settle and "B=512" in v.to_settle
    assert v.chosen.share == max(got.values()) and v.runner_up.share == min(got.values())


def test_a_resample_redraws_each_mean_within_its_own_precision():
    m = _measured(0.01, 1e-4, 0.02)
    m.loc[0, "compute_time_halfwidth_rel"] = 0.2  # one noisy point
    rng = np.random.default_rng(1)
    draws = np.array([robust.resample(m, rng)["compute_time_s"].to_numpy() for _ in range(400)])
    rel = draws.std(axis=0) / m["compute_time_s"].to_numpy()
    assert rel[0] == pytest.approx(0.2 / 1.96, rel=bounds.sd_of_sd(400))
    assert np.median(rel[1:]) == pytest.approx(0.02 / 1.96, rel=bounds.sd_of_sd(400))


def test_a_mean_without_a_measured_precision_is_redrawn_at_five_percent():
    """Older records and measurements from elsewhere carry no half-width: each such mean is
    drawn as mean x (1 + 0.05 z), z the generator's next normals (the step's first, then the
    compute's)."""
    m = _measured(0.01, 1e-4, 0.02).assign(compute_time_halfwidth_rel=np.nan)
    drawn = robust.resample(m, np.random.default_rng(3))["compute_time_s"].to_numpy()
    z = np.random.default_rng(3).standard_normal((2, len(m)))[1]
    assert drawn == pytest.approx(m["compute_time_s"].to_numpy() * (1 + 0.05 * z))


def test_a_fit_that_scatters_beyond_the_measured_precision_widens_the_resamples():
    """Points each timed to +-0.4 % but 5 % off the model (the machine drifted between probes):
    the scatter ratio is about 5 / (0.4 / 1.96) = 25 (less what the fit absorbs), so each
    resample redraws the means that much wider; points on the model give 1."""
    m = _measured(0.01, 1e-4, 0.004)
    rng = np.random.default_rng(3)
    m["compute_time_s"] *= 1 + 0.05 * rng.choice([-1.0, 1.0], len(m))
    m["step_time_s"] = np.where(m["source"] == "probe", m["compute_time_s"], np.nan)
    perf = perf_mod.fit(m, "ring")
    ratio = robust.scatter_ratio(m, perf)
    assert 10 < ratio < 40
    assert (
        robust.scatter_ratio(
            _measured(0.01, 1e-4, 0.004), perf_mod.fit(_measured(0.01, 1e-4, 0.004), "ring")
        )
        == 1.0
    )


def test_a_resample_refitted_from_the_kept_fit_alone_fits_as_well_as_every_start():
    """The resamples refit the kept form from its parameters alone (one start, not the form's
    several): on noisy curves it reaches the least squares every start reaches, to 1 % (where
    the surface is flat, as a saturating form's bend on nearly straight data, at other
    parameters with predictions within 3 %); where that one start fails, the form's own
    starts are used."""
    from dataclasses import replace

    from tula.model import curvefit
    from tula.model.forms import compute_forms

    rng = np.random.default_rng(3)
    b = np.array([16.0, 32, 64, 128, 256, 512, 1024])
    X = {"b": b, "n": np.ones_like(b)}
    truth = 0.004 + 0.0002 * b / (1 + b / 300)
    for form in [f for f in compute_forms(1024.0) if "_shared" not in f.name]:  # one N
        kept = curvefit.fit(form, X, truth * (1 + 0.03 * rng.standard_normal(len(b))))
        for _ in range(10):
            y = truth * (1 + 0.03 * rng.standard_normal(len(b)))
            near = perf_mod._choose(kept, [], X, y, "compute model", None, None)
            every = curvefit.fit(form, X, y)
            assert near.form is form
            cost = [np.sum((form(f.theta, X) / y - 1) ** 2) for f in (near, every)]
            assert cost[0] <= cost[1] * (1 + bounds.SOLVER_FLAT) + 1e-12, (form.name, cost)
            # a flat bottom (1 resample in 10 here) may end a little way off: 1.3 % of a
            # prediction when first measured, 2.3 % with scipy 1.17.1 (the same least squares)
            assert np.allclose(form(near.theta, X), form(every.theta, X), rtol=bounds.SCIPY_DRIFT)

    def refuses_the_kept_start(theta, X):  # a start the fit cannot leave: ValueError
        if theta[0] == 7.0:
            raise ValueError("lost its step at a bound")
        return form.f(theta, X)

    form = compute_forms(1024.0)[0]
    odd = replace(form, f=refuses_the_kept_start)
    kept = replace(curvefit.fit(odd, X, truth), theta=(7.0, *curvefit.fit(odd, X, truth).theta[1:]))
    assert perf_mod._choose(kept, [], X, truth, "compute model", None, None).theta[0] != 7.0


def test_a_resampled_probe_syncs_for_what_its_step_takes_beyond_its_compute():
    """Each probe's step and compute are redrawn apart: its sync is their difference, never
    below zero; a sweep row (no step) keeps no sync."""
    measured = _measured(0.01, 1e-4, 0.05)
    out = robust.resample(measured, np.random.default_rng(3))
    probe = out[out["source"] == "probe"]
    assert (probe["step_time_s"] != measured.loc[probe.index, "step_time_s"]).all()
    expect = np.maximum(probe["step_time_s"] - probe["compute_time_s"], 0.0)
    assert probe["sync_time_s"].tolist() == expect.tolist()
    assert 0.0 in expect.tolist() and (expect > 0).any()  # both sides of the floor
    assert out.loc[out["source"] == "sweep", "sync_time_s"].isna().all()


def test_the_verdict_names_its_threshold_the_precision_to_tighten_and_no_inflation_by_default():
    shares = [Share(1, 256, 0.5), Share(1, 512, 0.5)]
    v = robust.verdict(point(1, 512), shares, 2, 0.05)
    assert v.scatter_ratio == 1.0 and v.threshold == robust.SETTLED
    assert v.rule.endswith(f"more than {100 * robust.SETTLED:.0f} % of them")
    assert "a tighter probe.precision than 5 %" in v.to_settle
    two = robust.verdict(point(2, 512), [Share(2, 512, 0.5), Share(4, 256, 0.5)], 2, 0.05)
    assert two.to_settle.startswith("time N=2 B=512 and N=4 B=256 more precisely")


def test_a_resample_with_no_feasible_point_is_no_points_share(monkeypatch):
    """Where every other resample has no feasible point, the shares sum to one half: the
    infeasible half is said by what is missing, not given to a point."""
    select, calls = robust.choice.select, []

    def every_other(pred, plan):
        calls.append(1)
        if len(calls) % 2:
            raise robust.choice.NoFeasibleConfiguration("the test's")
        return select(pred, plan)

    monkeypatch.setattr(robust.choice, "select", every_other)
    _, shares = _shares(0.01, 1e-4, 0.02)
    assert len(calls) == RESAMPLES and sum(s.share for s in shares) == pytest.approx(0.5)


def test_no_measured_precision_leaves_the_resamples_unwidened():
    m = _measured(0.01, 1e-4, 0.02)
    m[["compute_time_halfwidth_rel", "step_time_halfwidth_rel"]] = np.nan
    assert robust.scatter_ratio(m, perf_mod.fit(m, "ring")) == 1.0


def test_a_failed_probe_is_no_part_of_the_scatter():
    """Probes that failed or timed out keep whatever their timers wrote before they stopped:
    far off the model, they still leave the scatter ratio of the points on the model at 1."""
    m = _measured(0.01, 1e-4, 0.004)
    failed = m.iloc[[0, 0]].assign(status=["error", "timeout"], compute_time_s=1.0, step_time_s=1.0)
    both = pd.concat([m, failed], ignore_index=True)
    assert robust.scatter_ratio(both, perf_mod.fit(m, "ring")) == 1.0


def test_a_mean_timed_with_no_spread_is_redrawn_as_one_of_unknown_precision():
    """A half-width of 0 (every step the timer read came out the same) is no precision the
    machine has: the mean is redrawn at the 5 % of an unknown one, as a missing one is."""
    m = _measured(0.01, 1e-4, 0.02)
    unknown = robust.resample(m.assign(compute_time_halfwidth_rel=np.nan), np.random.default_rng(3))
    for none in (0.0, -0.02):  # nor is a negative one
        zero = robust.resample(m.assign(compute_time_halfwidth_rel=none), np.random.default_rng(3))
        assert zero["compute_time_s"].tolist() == unknown["compute_time_s"].tolist()
    assert (zero["compute_time_s"] != m["compute_time_s"]).all()


def _timed(noise_at: int | None = None, col: str = "") -> pd.DataFrame:
    """Probes at N = 1, 2, 4, 8 on the known curves (conftest.synthetic), each mean timed to
    +-0.4 %; ``col`` at N = ``noise_at`` 5 % off the curve, alternately high and low."""
    from conftest import synthetic

    m = synthetic("ring", np.random.default_rng(0))
    m = m.assign(compute_time_halfwidth_rel=0.004, step_time_halfwidth_rel=0.004)
    if noise_at is not None:
        at = m["workers"] == noise_at
        m.loc[at, col] = m.loc[at, col] * (1 + 0.05 * np.resize([1.0, -1.0], at.sum()))
    return m


def test_the_scatter_counts_every_computes_residual_and_the_multi_worker_steps():
    """Against the curves' own fit: compute scatter measured at N = 1 alone widens the
    resamples (every compute row counts), and so does step scatter at N = 2 (a step at N > 1
    is where the sync model speaks); the same scatter in N = 1's step, which is its compute
    again, is not counted twice."""
    perf = perf_mod.fit(_timed(), "ring")
    # four rows off by 1 / (1 +- 5 %) - 1 in standard errors of 0.4 % / 1.96, among the 16
    # compute rows and the 12 steps at N > 1
    z = (1 / (1 + 0.05 * np.array([1.0, -1.0, 1.0, -1.0])) - 1) / (0.004 / 1.96)
    four_of_28 = np.sqrt(np.sum(z**2) / 28)
    got = robust.scatter_ratio(_timed(1, "compute_time_s"), perf)
    assert got == pytest.approx(four_of_28, rel=bounds.SOLVER)
    got = robust.scatter_ratio(_timed(2, "step_time_s"), perf)
    assert got == pytest.approx(four_of_28, rel=bounds.SOLVER)
    assert robust.scatter_ratio(_timed(1, "step_time_s"), perf) == 1.0
    # a row without a half-width, or with a time of 0, is no residual in standard errors
    odd = _timed(1, "compute_time_s")
    odd = pd.concat([odd, odd.iloc[[0, 1]]], ignore_index=True)
    odd.loc[len(odd) - 2, ["compute_time_halfwidth_rel", "step_time_halfwidth_rel"]] = np.nan
    odd.loc[len(odd) - 1, ["compute_time_s", "step_time_s"]] = 0.0
    got = robust.scatter_ratio(odd, perf)
    assert got == pytest.approx(four_of_28, rel=bounds.SOLVER)


def test_a_resample_leaves_the_rows_that_did_not_run_as_they_were():
    """A failed or timed-out probe is no measurement to redraw: its times and its sync stay
    as written."""
    m = _measured(0.01, 1e-4, 0.05)
    m.loc[[0, 1], "status"] = ["error", "timeout"]
    m.loc[[0, 1], "sync_time_s"] = np.nan
    out = robust.resample(m, np.random.default_rng(3))
    pd.testing.assert_frame_equal(out.loc[[0, 1]], m.loc[[0, 1]])


def test_a_mean_timed_very_imprecisely_is_never_redrawn_at_or_below_zero():
    """Half-widths of 400 % (a probe that timed two steps on a busy machine): many normal draws
    fall below zero, and each is held at a small share of its mean instead, a time still."""
    halfwidth = 4.0
    m = _measured(0.01, 1e-4, halfwidth)
    z = np.random.default_rng(3).standard_normal((2, len(m)))[1]  # the compute's draws
    drawn = 1 + halfwidth / robust.Z95 * z  # each over its mean
    assert (drawn < 0).sum() >= 3  # below zero, as drawn
    out = robust.resample(m, np.random.default_rng(3))
    assert (out["compute_time_s"] > 0).all()


def test_a_choice_won_by_four_resamples_in_five_is_settled():
    """The chosen point won 80 % of the resamples, more than SETTLED (75 %): settled, whatever
    the runner-up's 20 %."""
    v = robust.verdict(point(1, 512), [Share(1, 512, 0.8), Share(1, 256, 0.2)], 5, 0.05)
    assert v.settled and v.to_settle is None and v.runner_up == Share(1, 256, 0.2)


def test_the_runner_up_is_the_second_most_chosen_and_an_unchosen_estimate_has_no_share():
    """Three points share the resamples 50 / 30 / 20: the runner-up is the 30 % one. The
    point estimate (N = 4, B = 64) won no resample: its share is 0."""
    shares = [Share(1, 512, 0.5), Share(1, 256, 0.3), Share(2, 512, 0.2)]
    v = robust.verdict(point(4, 64), shares, 10, 0.05)
    assert v.runner_up == Share(1, 256, 0.3) and "N=1 B=256 more precisely" in v.to_settle
    assert v.point_estimate == Share(4, 64, 0.0) and v.chosen == Share(1, 512, 0.5)


def test_a_choice_won_by_exactly_three_resamples_in_four_is_not_settled():
    """Settled is more than SETTLED: 75 % of the resamples exactly is not."""
    assert robust.SETTLED == 0.75
    v = robust.verdict(point(1, 512), [Share(1, 512, 0.75), Share(1, 256, 0.25)], 4, 0.05)
    assert not v.settled and v.to_settle is not None


def test_no_feasible_point_in_any_resample_settles_nothing():
    """Every resample infeasible (no shares): the point estimate is the chosen point, with a
    share of 0, and nothing is settled."""
    v = robust.verdict(point(2, 256), [], 10, 0.05)
    assert v.chosen == Share(2, 256, 0.0) == v.point_estimate
    assert not v.settled and v.runner_up is None and v.to_settle is None


def test_steps_timed_precisely_widen_the_resamples_though_no_compute_was():
    """Older records: no compute half-width (the column missing, or every cell empty), the
    steps' measured: the step scatter at N = 2 still counts, on its own 12 rows."""
    perf = perf_mod.fit(_timed(), "ring")
    step = _timed(2, "step_time_s")
    z = (1 / (1 + 0.05 * np.array([1.0, -1.0, 1.0, -1.0])) - 1) / (0.004 / 1.96)
    four_of_12 = np.sqrt(np.sum(z**2) / 12)
    for older in (
        step.drop(columns="compute_time_halfwidth_rel"),
        step.assign(compute_time_halfwidth_rel=np.nan),
    ):
        got = robust.scatter_ratio(older, perf)
        assert got == pytest.approx(four_of_12, rel=bounds.SOLVER)
