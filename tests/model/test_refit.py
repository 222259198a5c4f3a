"""Re-fitting the sync part from the job's observation, the grid for the work left, and the
decision launch.replan takes on it: move when the saving pays for the relaunch and more than the
margin beyond what the move was predicted to save undrifted; onto the worker counts left after
a node is lost."""

import pandas as pd
import pytest

import bounds
from conftest import REPLAN_B as B
from conftest import drift_entry, replan_config, replan_table
from tula import config, model_inputs
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


def test_a_slow_sync_moves_to_the_point_that_finishes_the_rest_sooner(tmp_path):
    replan_table().to_csv(tmp_path / "p.csv", index=False)
    d = refit.decide(
        model_inputs.planning(replan_config()),
        pd.read_csv(tmp_path / "p.csv"),
        2,
        B,
        drift_entry(0.085),
        relaunch_s=8.0,
    )
    # left: 18 epochs x 23 steps; at N=2 40 + 85 ms a step = 51.8 s, at N=1 60 ms = 24.8 s; minus 8
    # s relaunch: 37 %
    assert (d.move, d.workers, d.global_batch) == (True, 1, B)
    assert d.saving == pytest.approx((18 * 23 * (0.125 - 0.060) - 8.0) / (18 * 23 * 0.125))
    assert (
        "moved from N=2 B=64 to N=1 B=64, predicted to save 37 % of the remaining time" in d.reason
    )
    assert d.reason.startswith(
        "sync 85.0 ms vs predicted 5.0 ms; re-fitted sync within a node x17.00, 18.00 epochs left"
    )


def test_it_stays_when_the_saving_does_not_pay_for_the_relaunch(tmp_path):
    replan_table().to_csv(tmp_path / "p.csv", index=False)
    late = refit.decide(
        model_inputs.planning(replan_config()),
        pd.read_csv(tmp_path / "p.csv"),
        2,
        B,
        drift_entry(0.085, epochs_done=19.5),
        relaunch_s=8.0,
    )
    assert not late.move and "not more than the 10 % margin; stayed" in late.reason
    mild = refit.decide(
        model_inputs.planning(replan_config()),
        pd.read_csv(tmp_path / "p.csv"),
        2,
        B,
        drift_entry(0.012),
        relaunch_s=0.0,
    )  # 52 ms a step: still best
    assert not mild.move and "is still the time choice; stayed" in mild.reason


def test_a_cost_objective_weighs_the_price_of_the_workers(tmp_path):
    # N=2 costs two workers: at 40 + 25 ms against 60 ms on one worker, one worker is cheaper by far
    replan_table().to_csv(tmp_path / "p.csv", index=False)
    d = refit.decide(
        model_inputs.planning(replan_config("cost")),
        pd.read_csv(tmp_path / "p.csv"),
        2,
        B,
        drift_entry(0.025),
        relaunch_s=1.0,
    )
    assert (d.move, d.workers) == (True, 1) and "of the remaining cost" in d.reason


def test_a_drift_moves_the_job_only_by_what_it_changed(tmp_path):
    """A job put at a point the predictions already disfavoured (N = 2 at 45 ms against N = 1 at
    30 ms: 33 % predicted to be saved by moving) is not moved off it by a sync that came out
    *faster* than predicted; a slower one that adds more than the margin to that saving moves it."""
    pred = replan_table(compute1=0.030)
    faster = refit.decide(
        model_inputs.planning(replan_config()), pred, 2, B, drift_entry(0.002), relaunch_s=0.0
    )
    assert (faster.move, faster.workers) == (False, 2), faster.reason
    assert faster.saving == pytest.approx(1 - 0.030 / 0.042)
    assert (
        "N=1 B=64 would save 29 % of the remaining time after the relaunch (0 s), 33 % of it "
        "predicted before the drift: the drift adds -5 %, not more than the 10 % margin; stayed"
    ) in faster.reason
    slower = refit.decide(
        model_inputs.planning(replan_config()), pred, 2, B, drift_entry(0.030), relaunch_s=0.0
    )
    assert (slower.move, slower.workers) == (True, 1), slower.reason
    assert slower.saving == pytest.approx(1 - 0.030 / 0.070)  # 57 %: 24 points more than before
    # a little slower (9 ms against 5: 39 % against 33 %, within the margin of it): stays
    mild = refit.decide(
        model_inputs.planning(replan_config()), pred, 2, B, drift_entry(0.009), relaunch_s=0.0
    )
    assert not mild.move and "the drift adds 5 %" in mild.reason, mild.reason


def test_after_a_faster_drift_a_slowdown_counts_from_the_level_the_job_was_at(tmp_path):
    """The job's sync came out at 0.5 ms, far under the 5 ms predicted (a first drift, faster:
    stayed); then it slows to 9 ms. Against the prediction that is the mild drift above (adds 5
    %: stays); from the level the job was at, it adds 13 %: moves. What the network lab saw in
    CI: a 4x slower link judged against a prediction the first drift had already corrected."""
    pred = replan_table(compute1=0.030)
    d = refit.decide(
        model_inputs.planning(replan_config()),
        pred,
        2,
        B,
        {**drift_entry(0.009), "from_s": 0.0005},
        relaunch_s=0.0,
    )
    assert (d.move, d.workers) == (True, 1), d.reason
    assert d.saving == pytest.approx(1 - 0.030 / 0.049)
    # the level the prediction itself set: as before (the mild case of the test above)
    same = refit.decide(
        model_inputs.planning(replan_config()),
        pred,
        2,
        B,
        {**drift_entry(0.009), "from_s": 0.005},
        relaunch_s=0.0,
    )
    assert not same.move and "the drift adds 5 %" in same.reason, same.reason


def test_a_node_lost_for_good_replans_onto_the_worker_counts_left():
    """A node lost under N = 2 (one node of two workers here): the rest goes where the
    objective chooses among the N that can still run; a min_workers the nodes left cannot
    hold is dropped, and the reason says so."""
    cfg = config.from_dict(
        {
            "workload": {"epochs": 20},
            "grid": {"workers": [1, 2], "batch_min": 64, "batch_max": 64},
            "objective": "time",
            "cluster": {"workers_per_node": 2},
            "constraints": {"min_workers": 2},
        }
    )
    d = refit.onto(model_inputs.planning(cfg), replan_table(), 2, B, allowed=[1])
    assert (d.move, d.workers, d.global_batch) == (True, 1, B)
    assert "N=2 B=64 cannot run on the nodes left (N <= 1 can)" in d.reason
    assert "constraints.min_workers=2 cannot hold on them: dropped" in d.reason
    assert d.saving == 0.0  # a forced move saves nothing it could be weighed by
    # where both can run, the objective's own choice (N = 2 is faster) and nothing dropped
    d = refit.onto(model_inputs.planning(cfg), replan_table(), 2, B, allowed=[1, 2])
    assert d.workers == 2 and "dropped" not in d.reason


def test_a_drift_that_leaves_the_choice_where_it_is_stays_and_says_so():
    """Sync 6 ms against a predicted 5: N = 2 is still the fastest point; nothing to weigh."""
    d = refit.decide(
        model_inputs.planning(replan_config()), replan_table(), 2, B, drift_entry(0.006), 8.0
    )
    assert (d.move, d.workers, d.global_batch, d.saving) == (False, 2, B, 0.0)
    assert d.reason.endswith("N=2 B=64 is still the time choice; stayed"), d.reason


def test_a_time_objective_prices_the_relaunch_in_seconds_whatever_the_workers():
    """What moving saves under ``time``: the remaining T here less T there, less the relaunch's
    seconds as they are (not scaled by the workers, as a cost objective scales them)."""
    rest = replan_table()
    t = dict(zip(rest["workers"], rest["train_time_s"], strict=True))
    plan = model_inputs.planning(replan_config())
    got = refit._saving(rest, plan, (1, B), (2, B), 8.0)
    assert got == pytest.approx((t[1] - t[2] - 8.0) / t[1], rel=bounds.ROUNDING)


def test_a_cost_objective_prices_the_relaunch_at_the_new_points_rate():
    """Under ``cost`` the relaunch's seconds are paid at the point moved to: its C over its T
    per second; each point read at its own B though a smaller and a larger B of the same N
    come first."""
    one = replan_table()
    other = [one.assign(global_batch=b, train_time_s=1.0, cost=1.0) for b in (B // 2, 2 * B)]
    rest = pd.concat([*other, one])
    c = dict(zip(one["workers"], one["cost"], strict=True))
    rate = c[2] / float(one.loc[one["workers"] == 2, "train_time_s"].iloc[0])
    got = refit._saving(rest, model_inputs.planning(replan_config("cost")), (1, B), (2, B), 8.0)
    assert got == pytest.approx((c[1] - c[2] - 8.0 * rate) / c[1], rel=bounds.ROUNDING)


def test_nothing_left_to_train_here_saves_nothing_by_moving():
    """With no time left at the current point, a move saves no share of it: 0, not less."""
    rest = replan_table()
    rest.loc[rest["workers"] == 1, "train_time_s"] = 0.0
    plan = model_inputs.planning(replan_config())
    assert refit._saving(rest, plan, (1, B), (2, B), 8.0) == 0.0


def test_a_move_to_a_point_with_nothing_left_prices_the_relaunch_as_it_is():
    """Under ``cost``, the point moved to has no time left to train (its T is 0): its rate
    per second is undefined, and the relaunch's seconds count as they are."""
    rest = replan_table()
    rest.loc[rest["workers"] == 2, ["train_time_s", "cost"]] = 0.0
    c1 = float(rest.loc[rest["workers"] == 1, "cost"].iloc[0])
    got = refit._saving(rest, model_inputs.planning(replan_config("cost")), (1, B), (2, B), 8.0)
    assert got == pytest.approx((c1 - 8.0) / c1, rel=bounds.ROUNDING)
