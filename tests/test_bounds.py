"""The suite's own bounds (tests/bounds.py): an accuracy is judged against its point's recorded
figure, recorded instead under bench/suite_bounds.py --accuracy, and a test whose figure was
never recorded says how to record it."""

import json
import math

import pandas as pd
import pytest

import bounds


def test_an_accuracy_is_judged_against_its_own_points_recorded_figure(monkeypatch):
    monkeypatch.delenv(bounds.RECORD_ENV, raising=False)
    key = next(iter(json.loads(bounds.ACCURACY_FILE.read_text())["figures"]))
    figure = bounds.recorded_accuracy(key)
    bounds.check_accuracy(key, figure)
    bounds.check_accuracy(key, bounds.ACCURACY_SHARE * figure + 1e-12)
    with pytest.raises(AssertionError, match="below 0.95 of its recorded"):
        bounds.check_accuracy(key, 0.9 * figure)  # 90 % of normal fails
    with pytest.raises(AssertionError, match="suite_bounds.py --accuracy"):
        bounds.check_accuracy("a test nobody recorded", 1.0)


def test_under_the_recording_bench_an_accuracy_is_recorded_not_judged(monkeypatch, tmp_path):
    out = tmp_path / "recorded.jsonl"
    monkeypatch.setenv(bounds.RECORD_ENV, str(out))
    bounds.check_accuracy("a test nobody recorded", 0.25)
    bounds.check_accuracy("another", 0.5)
    assert [json.loads(ln) for ln in out.read_text().splitlines()] == [
        {"a test nobody recorded": 0.25},
        {"another": 0.5},
    ]


def test_the_recorded_accuracies_say_how_they_were_made():
    doc = json.loads(bounds.ACCURACY_FILE.read_text())
    assert set(doc["made"]) == {"when", "commit", "cpu", "command"}
    assert "bench/suite_bounds.py --accuracy" in doc["made"]["command"]
    # every figure a test accuracy above chance (10 classes everywhere here: 0.1)
    assert doc["figures"] and all(bounds.CHANCE < v <= 1.0 for v in doc["figures"].values())
    # every point a shared DAG's choice can land on has its figure
    for kind in ("tiny", "recipe", "uint8"):
        for n in (1, 2):
            for b in (32, 64, 128):
                assert f"{kind} digits N{n} B{b}" in doc["figures"]


def test_the_fit_error_is_the_median_over_the_probed_points_only():
    p = pd.DataFrame(
        {
            "probe_status": ["ok", "ok", "ok", "oom", ""],
            "step_time_s": [1.0, 1.0, 1.3, 1.0, 1.0],
            "measured_step_time_s": [1.0, 1.1, 1.0, float("nan"), float("nan")],
        }
    )
    assert bounds.fit_error(p) == pytest.approx(math.log(1.1))
    assert (
        bounds.fit_error(p.assign(step_time_s=p["step_time_s"] * bounds.BREAK_UP))
        > bounds.FIT_BOUND
    )


def test_each_bound_is_what_its_noise_gives_and_catches_a_prediction_x2():
    """Fixed widths, from the committed noise (never from a run): three standard deviations of
    the sources in quadrature, each a 95 % figure."""
    sd = math.hypot(bounds.PROBE_HALFWIDTH, bounds.DRIFT) / 1.96
    assert bounds.PRODUCTION_BOUND == pytest.approx(bounds.Z * sd)
    assert bounds.LAB_BOUND == bounds.PRODUCTION_BOUND
    for bound in (bounds.PRODUCTION_BOUND, bounds.WALL_BOUND, bounds.HELD_OUT_BOUND):
        assert bound < math.log(2)
    assert bounds.FIT_BOUND < math.log(bounds.BREAK_UP)
    assert bounds.FIT_BOUND < -math.log(bounds.BREAK_DOWN)
