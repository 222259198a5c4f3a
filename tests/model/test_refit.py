"""Re-fitting the sync part from the job's observation, and the grid for the work left."""

import pandas as pd
import pytest

from tula.model import refit


def _pred():
    rows = []
    for n, nodes in ((1, 1), (2, 1), (4, 2), (8, 4)):
        for b in (64, 128):
            compute, sync = 0.1 / n * b / 64, 0.0 if n == 1 else (0.002 if nodes == 1 else 0.01)
            step = compute + sync
            rows.append(
                {
                    "workers": n,
                    "nodes": nodes,
                    "global_batch": b,
                    "local_batch": b // n,
                    "compute_time_s": compute,
                    "sync_time_s": sync,
                    "step_time_s": step,
                    "steps_per_epoch": 1000 // b,
                    "epochs": 10,
                    "train_time_s": 10 * (1000 // b) * step,
                    "cost": 10 * (1000 // b) * step * n,
                    "epochs_to_accuracy": 12.0,
                    "time_to_accuracy_s": 12 * (1000 // b) * step,
                }
            )
    return pd.DataFrame(rows)


def test_a_drift_between_nodes_scales_the_multi_node_sync_only():
    p = _pred()
    out, fit = refit.refit(p, 4, 128, observed_sync_s=0.04)
    assert (fit.factor, fit.level) == (pytest.approx(4.0), "between nodes")
    multi, one = out["nodes"] > 1, out["nodes"] == 1
    assert out.loc[multi, "sync_time_s"].tolist() == pytest.approx([0.04] * 4)
    # within a node: as predicted
    assert out.loc[one, "sync_time_s"].tolist() == p.loc[one, "sync_time_s"].tolist()
    assert out["step_time_s"].tolist() == pytest.approx(
        (out["compute_time_s"] + out["sync_time_s"]).tolist()
    )
    assert out["compute_time_s"].tolist() == p["compute_time_s"].tolist()  # the compute part stays


def test_a_drift_within_a_node_scales_one_node_multi_worker_points_only():
    out, fit = refit.refit(_pred(), 2, 64, observed_sync_s=0.006)
    assert (fit.factor, fit.level) == (pytest.approx(3.0), "within a node")
    assert out[(out["workers"] == 2)]["sync_time_s"].tolist() == pytest.approx([0.006, 0.006])
    assert out[out["nodes"] > 1]["sync_time_s"].tolist() == pytest.approx([0.01] * 4)
    assert (out[out["workers"] == 1]["sync_time_s"] == 0).all()


def test_nothing_predicted_there_takes_the_observed_sync_itself():
    p = _pred()
    p.loc[p["nodes"] > 1, "sync_time_s"] = 0.0
    out, fit = refit.refit(p, 4, 64, observed_sync_s=0.03)
    assert fit.factor == float("inf") and (out[out["nodes"] > 1]["sync_time_s"] == 0.03).all()


def test_the_remaining_work_rescales_time_costs_and_time_to_accuracy():
    p = _pred()
    rest = refit.remaining(p, epochs_left=2.5)
    assert rest["train_time_s"].tolist() == pytest.approx(
        (2.5 * p["steps_per_epoch"] * p["step_time_s"]).tolist()
    )
    assert rest["cost"].tolist() == pytest.approx((p["cost"] * 0.25).tolist())  # 2.5 of 10 epochs
    assert rest["time_to_accuracy_s"].tolist() == pytest.approx(
        (p["time_to_accuracy_s"] * 0.25).tolist()
    )
    with pytest.raises(ValueError, match="no row for N=3 B=64"):
        refit.refit(p, 3, 64, 0.01)


def test_the_current_point_is_read_at_its_own_n_and_b_whatever_the_rows_order():
    pred = pd.DataFrame(
        {"workers": [2, 2, 1], "global_batch": [256, 64, 64], "train_time_s": [50.0, 300.0, 400.0]}
    )
    assert refit._row(pred, 2, 64)["train_time_s"] == 300.0
    assert refit._row(pred, 1, 64)["train_time_s"] == 400.0
    with pytest.raises(ValueError, match="predictions.csv has no row for N=4 B=64"):
        refit._row(pred, 4, 64)
