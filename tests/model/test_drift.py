"""The drift detector: a sustained change fires, one or two slow steps do not."""

import pytest

from tula.model.drift import WINDOW, Band, Detector, Drift

BAND = Band(predicted_s=0.010, lo_s=0.008, hi_s=0.012, step_s=0.100)  # accepts 0-32 ms


def _feed(det, values, start=0, every=10):
    return [
        (start + i * every, d)
        for i, v in enumerate(values)
        if (d := det.observe(start + i * every, v))
    ]


def test_the_band_is_the_interval_widened_by_the_tolerance_times_the_step():
    assert (BAND.accept_lo_s, BAND.accept_hi_s) == (0.0, pytest.approx(0.032))
    row = {
        "step_time_s": 0.1,
        "compute_time_s": 0.09,
        "step_time_lo_s": 0.095,
        "step_time_hi_s": 0.104,
    }
    b = Band.from_prediction(row)
    assert (b.predicted_s, b.lo_s, b.hi_s, b.step_s) == pytest.approx((0.01, 0.005, 0.014, 0.1))


def test_spikes_do_not_fire_a_sustained_change_does():
    det = Detector(BAND)
    # two slow steps in every window of five: the median stays in the band
    assert _feed(det, [0.011, 0.2, 0.011, 0.3, 0.011] * 6) == []
    fired = _feed(det, [0.05] * 10, start=300)
    assert len(fired) == 1  # once: then the detector re-arms around 50 ms
    step, d = fired[0]
    # the window [0.2, 0.011, 0.3, 0.011, 0.05]: three of five above the band at the first 50 ms
    # step
    assert (step, d.direction, d.since_step, d.observations) == (300, "slower", 260, WINDOW)
    assert d.observed_s == pytest.approx(0.05) and d.predicted_s == 0.010
    assert "sync 50.0 ms vs predicted 10.0 ms (8.0-12.0)" in d.describe()


def test_fires_at_the_third_of_five_slow_observations():
    det = Detector(BAND)
    _feed(det, [0.011] * 5)
    fired = _feed(det, [0.05] * 5, start=100)
    assert [s for s, _ in fired] == [120]  # 0.011 0.011 0.05 0.05 0.05: the median is slow now


def test_the_network_recovering_is_a_drift_back_and_then_quiet():
    det = Detector(BAND)
    _feed(det, [0.011] * 5)
    slow = _feed(det, [0.06] * 8, start=100)
    back = _feed(det, [0.011] * 8, start=200)
    assert [d.direction for _, d in slow] == ["slower"] and [d.direction for _, d in back] == [
        "faster"
    ]
    assert _feed(det, [0.012] * 10, start=300) == []  # in the original band again: nothing new


def test_a_level_shift_is_reported_once_not_every_window():
    det = Detector(BAND)
    assert len(_feed(det, [0.05] * 40)) == 1


def test_a_noisy_new_level_is_not_reported_again_and_again():
    """At a slower link the sync scatters more (measured on the lab: 166-209 ms medians at one
    level); the re-armed band is as wide as the predicted one, so that is one drift."""
    det = Detector(Band(predicted_s=0.048, lo_s=0.0, hi_s=0.111, step_s=0.135))
    assert len(_feed(det, [0.17, 0.21, 0.16, 0.19, 0.2, 0.17, 0.21, 0.18, 0.16, 0.2] * 4)) == 1


def test_a_drift_records_the_level_it_left_and_that_levels_band():
    """The second drift of a run left the level the first re-armed at, not the prediction: it
    says so, and carries that level's band (what `tula launch` judges it against)."""
    det = Detector(BAND)
    (_, first), (_, second) = _feed(det, [0.05] * 10 + [0.2] * 10)
    assert (first.from_s, first.accept_lo_s, first.accept_hi_s) == pytest.approx((0.01, 0.0, 0.032))
    assert "earlier drift" not in first.describe()
    # re-armed around 50 ms as wide as the predicted interval (+-2 ms), widened by 20 ms
    assert (second.from_s, second.accept_lo_s, second.accept_hi_s) == pytest.approx(
        (0.05, 0.028, 0.072)
    )
    assert second.predicted_s == 0.010 and "left the 50.0 ms level an earlier drift set" in (
        second.describe()
    )
    assert second.to_dict()["from_s"] == pytest.approx(0.05)


def test_an_interval_too_wide_to_see_a_slowdown_is_cut_to_a_step_either_side():
    """A CI run's lab fit (one degree of freedom left) predicted sync 44 ms in 0-859 ms at a
    93 ms step: a link four times slower (sync 180-200 ms) stayed inside. Cut to the step
    either side, the band accepts up to 155 ms and the slowdown fires."""
    row = {
        "step_time_s": 0.0929,
        "compute_time_s": 0.0493,
        "step_time_lo_s": 0.0001,
        "step_time_hi_s": 0.9117,
    }
    b = Band.from_prediction(row)
    assert (b.lo_s, b.hi_s) == pytest.approx((0.0, 0.0436 + 0.0929))
    assert b.accept_hi_s == pytest.approx(0.0436 + 1.2 * 0.0929)
    det = Detector(b)
    fired = _feed(det, [0.045] * 10 + [0.19] * 5)
    assert [d.direction for _, d in fired] == ["slower"]
    # an interval narrower than that is kept as it is
    tight = Band.from_prediction({**row, "step_time_lo_s": 0.085, "step_time_hi_s": 0.1})
    assert (tight.lo_s, tight.hi_s) == pytest.approx((0.0357, 0.0507))


def test_a_drift_from_the_predicted_level_does_not_say_it_left_another():
    """The level left is told apart by value, not by which float object holds it."""
    kw = dict(step=20, since_step=10, observed_s=0.05, lo_s=0.0, hi_s=0.02, direction="slower")
    first = Drift(**kw, predicted_s=0.01, observations=5, from_s=float("0.01"))
    assert "level an earlier drift set" not in first.describe()
    later = Drift(**kw, predicted_s=0.01, observations=5, from_s=0.03)
    assert ", left the 30.0 ms level an earlier drift set for 10 steps" in later.describe()


def test_a_drift_holds_on_the_median_of_the_three_observations_after_it():
    """`tula launch` moves a job only when the median of the three observations after a
    drift is still beyond the band: two slow and one back inside hold; a fourth observation,
    later, does not enter the judgement (the caller may hand more than three)."""
    from tula.model.drift import held

    lo, hi = 0.08, 0.12  # the band
    ok, med = held("slower", [0.2, 0.2, 0.1, 0.1], lo, hi)
    assert ok and med == 0.2
    ok, med = held("faster", [0.05, 0.1, 0.05, 0.1, 0.1], lo, hi)
    assert ok and med == 0.05
    ok, med = held("slower", [0.2, 0.1, 0.1, 0.2], lo, hi)  # a transient: back inside
    assert not ok and med == 0.1


def test_a_drift_to_a_level_below_its_intervals_half_width_re_arms_from_zero():
    """Predicted 300 ms +-50 ms, the step fell to 10 ms (the input was the bottleneck and was
    fixed): the band re-armed around 10 ms as wide as before starts at 0, not at -40 ms."""
    det = Detector(Band(predicted_s=0.3, lo_s=0.25, hi_s=0.35, step_s=0.3))
    fired = _feed(det, [0.3] * 10 + [0.01] * 10)
    assert [d.direction for _, d in fired] == ["faster"]
    assert (det.level.lo_s, det.level.hi_s) == pytest.approx((0.0, 0.06))
