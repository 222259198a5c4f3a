"""Known-answer tests: fits recover the coefficients of the model that generated the data."""

import numpy as np
import pandas as pd
import pytest

from tula import config, memory, perfmodel
from tula.linfit import LinearFit, fit_linear


def synthetic(collective: str, rng, noise: float = 0.0) -> pd.DataFrame:
    c0, c1, s0, s1 = 0.004, 0.0002, 0.001, 0.05
    rows = []
    for n in (1, 2, 4, 8):
        for B in (32, 64, 128, 256):
            b = B // n
            comp = c0 + c1 * b
            sync = 0.0 if n == 1 else s0 + s1 * perfmodel.sync_feature(collective, np.array([n]))[0]
            e = rng.normal(1, noise, 2) if noise else (1, 1)
            rows.append(dict(nodes=n, global_batch=B, local_batch=b, compute_time_s=comp * e[0],
                             sync_time_s=sync * e[1], step_time_s=comp + sync, peak_mem_bytes=1e6 + 5e4 * b,
                             status="ok"))  # fmt: skip
    return pd.DataFrame(rows)


@pytest.mark.parametrize("collective", ["ring", "ps", "tree"])
def test_perf_fit_recovers_coefficients(collective):
    df = synthetic(collective, np.random.default_rng(0))
    m = perfmodel.fit(df, collective)
    assert m.compute.intercept == pytest.approx(0.004) and m.compute.slope == pytest.approx(0.0002)
    assert m.sync.intercept == pytest.approx(0.001) and m.sync.slope == pytest.approx(0.05)
    assert m.sync_time_s([1])[0] == 0.0


@pytest.mark.parametrize("collective", ["ring", "ps", "tree"])
def test_perf_fit_with_noise_is_close_and_its_ci_covers(collective):
    covered = {"compute": 0, "sync": 0}
    seeds = range(60)
    for seed in seeds:
        m = perfmodel.fit(synthetic(collective, np.random.default_rng(seed), noise=0.03), collective)
        assert m.compute.slope == pytest.approx(0.0002, rel=0.1)
        assert m.sync.slope == pytest.approx(0.05, rel=0.3)  # (N-1)/N spans only 0.5..0.875
        covered["compute"] += m.compute.slope_ci[0] <= 0.0002 <= m.compute.slope_ci[1]
        covered["sync"] += m.sync.slope_ci[0] <= 0.05 <= m.sync.slope_ci[1]
    # 95 % intervals: coverage over 60 noisy data sets well above chance, near 0.95
    assert covered["compute"] / len(seeds) >= 0.85
    assert covered["sync"] / len(seeds) >= 0.85


def test_failed_probes_are_not_fitted():
    df = synthetic("ring", np.random.default_rng(0))
    df.loc[0, "status"] = "oom"
    df.loc[0, "compute_time_s"] = 99.0
    assert perfmodel.fit(df, "ring").compute.slope == pytest.approx(0.0002)


def test_predictions_never_negative():
    fit = fit_linear([10, 20], [0.001, 0.0005])  # falling line crosses zero at b=30
    m = perfmodel.PerfModel("ring", fit, fit_linear([0.5], [0.0]))
    assert (m.compute_time_s([100, 1000]) >= 0).all()


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


def test_memory_fit_and_max_feasible_batch_by_hand():
    df = synthetic("ring", np.random.default_rng(0))
    # budget 2e6 bytes: 1e6 + 5e4 * b <= 2e6  ->  b <= 20
    mm = memory.fit(df, budget_bytes=2e6)
    assert mm.fit.intercept == pytest.approx(1e6) and mm.fit.slope == pytest.approx(5e4)
    assert mm.max_local_batch() == 20
    assert list(mm.feasible([20, 21])) == [True, False]
    assert memory.MemoryModel(mm.fit, None).max_local_batch() is None


def test_predict_eq4_arithmetic():
    cfg = config.from_dict({"grid": {"nodes": [2], "batch_min": 64, "batch_max": 64}, "workload": {"epochs": 3},
                            "pricing": {"per_node_hour": 3.6}})  # fmt: skip
    perf = perfmodel.PerfModel("ring", fit_linear([1, 2], [0.1, 0.1]), fit_linear([0.5], [0.0]))
    mem = memory.MemoryModel(fit_linear([1, 2], [1e9, 1e9]), None)
    row = perfmodel.predict(cfg, perf, mem, train_samples=1000).iloc[0]
    assert row["steps_per_epoch"] == 16  # ceil(1000 / 64)
    assert row["train_time_s"] == pytest.approx(3 * 16 * 0.1)
    assert row["cost_node"] == pytest.approx(4.8 / 3600 * 2 * 3.6)
    assert row["cost_memory"] == pytest.approx(4.8 / 3600 * 2 * 1.0 * 0.15)


def test_measured_oom_marks_point_infeasible():
    cfg = config.from_dict({"grid": {"nodes": [1], "batch_min": 32, "batch_max": 64}})
    perf = perfmodel.PerfModel("ring", fit_linear([1, 2], [0.1, 0.1]), fit_linear([0.5], [0.0]))
    mem = memory.MemoryModel(fit_linear([1, 2], [1.0, 1.0]), None)
    measured = pd.DataFrame([dict(nodes=1, global_batch=64, status="oom", step_time_s=np.nan)])
    pred = perfmodel.predict(cfg, perf, mem, 100, measured)
    assert list(pred["feasible"]) == [True, False] and list(pred["probe_status"]) == ["", "oom"]


def test_prediction_interval_covers_new_measurements():
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
