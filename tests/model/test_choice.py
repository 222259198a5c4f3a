import numpy as np
import pandas as pd
import pytest

import bounds
from conftest import prediction_table as table
from tula import config, model_inputs
from tula.model.choice import NoFeasibleConfiguration, knee_of, marginal_knee, select

CURVE = {b: 1000 / b * (1 + b / 2048) for b in (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)}


def test_knee_of_l_shaped_curve_is_the_corner():
    # time halves with each doubling up to B=512, then barely moves: the knee is 512
    b = np.array([32, 64, 128, 256, 512, 1024, 2048, 4096])
    t = np.array([100, 50, 25, 12.5, 6.25, 6.0, 5.9, 5.8])
    assert knee_of(b, t) == 512


def test_knee_of_paper_shaped_curve_is_where_it_flattens():
    """T = 1000/B * (1 + B/2048) saturates around B0 = 2048. A deterministic curve has one
    answer, derived here without kneed: Kneedle (Satopaa et al., 2011) normalises B and T to
    [0, 1] and, for a convex decreasing curve, takes the point farthest below the chord from
    (0, 1) to (1, 0), the largest (1 - B_n) - T_n. T's constant 1000/2048 drops out of T_n,
    and the difference is 0.851, 0.882, 0.851 at B = 256, 512, 1024: the knee is B = 512."""
    b = np.array(sorted(CURVE))
    t = np.array([CURVE[x] for x in b])
    bn, tn = (b - b.min()) / (b.max() - b.min()), (t - t.min()) / (t.max() - t.min())
    difference = (1 - bn) - tn
    assert difference[[3, 4, 5]] == pytest.approx([217 / 255, 15 / 17, 217 / 255], rel=1e-12)
    assert b[np.argmax(difference)] == 512
    assert knee_of(b, t) == 512


@pytest.mark.parametrize("times", [[5.0, 5.0, 5.0, 5.0], [3.0, 2.0]], ids=["flat", "two-points"])
def test_no_knee_cases(times):
    b = np.array([32, 64, 128, 256][: len(times)])
    assert knee_of(b, np.array(times)) is None


def hyperbola(lo=32, hi=8192, workers=2):
    """T = 1000/B + 1: a doubling from B saves 500/(1000+B) of T, under 10 % once B > 4000."""
    return {
        (workers, b): 1000 / b + 1 for b in 2 ** np.arange(int(np.log2(lo)), int(np.log2(hi)) + 1)
    }


def test_marginal_knee_is_where_doubling_stops_paying_and_says_so():
    sel = select(table(hyperbola()), model_inputs.planning(config.from_dict({"objective": "knee"})))
    k = sel.knee
    assert (
        k["rule"] == "marginal"
        and k["found"]
        and k["global_batch"] == 4096 == sel.selected.global_batch
    )
    assert (
        k["marginal"]["global_batch"] == 4096
        and k["marginal"]["flattened"]
        and k["kneedle"]["found"]
    )
    assert sel.runner_up.global_batch == 8192
    # the sentence is true: 4096 -> 8192 saves 500/5096 = 9.8 %, 2048 -> 4096 saved 500/3048 = 16.4
    # %
    assert "knee at B=4096: doubling to B=8192 saves 9.8 % of T (< 10 %)" in sel.reason
    assert "the doubling from B=2048 saved 16.4 %" in sel.reason
    # T(4096) = 1.244 s over T(8192) = 1.122 s
    assert "T = 1.244 s, 10.9 % above the lowest point (1.122 s)" in sel.reason
    assert f"(Kneedle would pick B={k['kneedle']['global_batch']})" in sel.reason
    gains = {e["global_batch"]: e["gain_of_next_doubling"] for e in k["envelope"]}
    assert gains[2048] == pytest.approx(500 / 3048) and gains[8192] is None


def test_marginal_knee_does_not_move_with_the_batch_range_but_kneedle_does():
    knees = {}
    for hi in (8192, 16384, 65536):
        k = select(
            table(hyperbola(hi=hi)), model_inputs.planning(config.from_dict({"objective": "knee"}))
        ).knee
        knees[hi] = (k["marginal"]["global_batch"], k["kneedle"]["global_batch"])
    assert {m for m, _ in knees.values()} == {4096}
    assert len({kn for _, kn in knees.values()}) == 3  # kneed #170: the knee follows the range


def test_marginal_knee_cut_by_the_grid_takes_the_largest_batch_and_says_why():
    sel = select(
        table(hyperbola(hi=2048)), model_inputs.planning(config.from_dict({"objective": "knee"}))
    )
    assert sel.selected.global_batch == 2048 and not sel.knee["marginal"]["flattened"]
    # 500/(1000+1024)
    assert "still falls by 24.7 % (>= 10 %) on the last doubling" in sel.reason
    assert "raise grid.batch_max" in sel.reason
    assert sel.runner_up.global_batch == 1024  # the knee is the last point: the one before


def test_knee_gain_is_the_threshold():
    sel = select(
        table(hyperbola()),
        model_inputs.planning(config.from_dict({"objective": "knee", "knee_gain": 0.2})),
    )
    # 500/(1000+2048) = 16.4 % < 20 %; 1024 -> 2048 saved 24.7 %
    assert sel.selected.global_batch == 2048
    assert (
        sel.knee["marginal"]["rule"] == "smallest B beyond which every doubling saves < 20 % of T"
    )


def test_kneedle_rule_is_the_papers_knee():
    cfg = config.from_dict({"objective": "knee", "knee_rule": "kneedle"})
    sel = select(table({(2, b): t for b, t in CURVE.items()}), model_inputs.planning(cfg))
    knee = sel.knee["global_batch"]
    assert sel.knee["rule"] == "kneedle" and knee == sel.knee["kneedle"]["global_batch"] == knee_of(
        np.array(sorted(CURVE)), np.array([CURVE[b] for b in sorted(CURVE)])
    )
    assert sel.selected.global_batch == knee and sel.runner_up.global_batch == 2 * knee
    assert f"Kneedle knee of T vs B at B={knee}" in sel.reason and "would save" in sel.reason
    marginal = sel.knee["marginal"]["global_batch"]
    assert marginal != knee and f"(the marginal rule would pick B={marginal})" in sel.reason
    # one N: its own knees are the envelope's
    assert sel.knee["per_nodes"] == {"2": {"marginal": marginal, "kneedle": knee}}


def test_knee_on_cost_uses_the_cost_curve():
    # time keeps falling to B=8192 but cost (2 workers here) flattens at B=512
    times = {(2, b): t for b, t in CURVE.items()}
    df = table(times)
    df["cost"] = [100 / b + 1 if b <= 512 else 1.19 - b / 1e6 for b in df["global_batch"]]
    sel = select(
        df, model_inputs.planning(config.from_dict({"objective": "knee", "knee_on": "cost"}))
    )
    assert sel.knee["on"].startswith("cost") and "of C" in sel.reason
    assert sel.selected.global_batch <= 512


def test_flat_curve_knee_is_the_smallest_batch_or_no_kneedle_knee():
    flat = table({(1, 32): 5.0, (1, 64): 5.0, (1, 128): 5.0})
    sel = select(flat, model_inputs.planning(config.from_dict({"objective": "knee"})))
    # more batch never pays
    assert sel.selected.global_batch == 32 and "saves 0.0 %" in sel.reason
    sel = select(
        flat, model_inputs.planning(config.from_dict({"objective": "knee", "knee_rule": "kneedle"}))
    )
    assert not sel.knee["found"] and "no Kneedle knee" in sel.reason


def test_knee_uses_fastest_n_per_batch():
    times = {(1, b): 2 * t for b, t in CURVE.items()} | {(2, b): t for b, t in CURVE.items()}
    sel = select(table(times), model_inputs.planning(config.from_dict({"objective": "knee"})))
    assert sel.selected.workers == 2
    assert all(p["workers"] == 2 for p in sel.knee["envelope"])


def test_time_and_cost_objectives_differ():
    t = {(1, 64): 10.0, (4, 64): 4.0}  # 4 workers: faster (4 s) but dearer (16 node-s vs 10)
    assert (
        select(
            table(t), model_inputs.planning(config.from_dict({"objective": "time"}))
        ).selected.workers
        == 4
    )
    sel = select(table(t), model_inputs.planning(config.from_dict({"objective": "cost"})))
    assert sel.selected.workers == 1 and sel.runner_up.workers == 4
    fast = select(table(t), model_inputs.planning(config.from_dict({"objective": "time"})))
    assert fast.reason == "minimum training time T: 4 s; runner-up N=1 B=64 at 10 s"
    alone = select(
        table({(1, 64): 10.0}), model_inputs.planning(config.from_dict({"objective": "time"}))
    )
    assert alone.reason == "minimum training time T: 10 s" and alone.runner_up is None


def test_constraints_and_infeasible_points_are_excluded():
    t = {(1, 64): 10.0, (2, 64): 6.0, (4, 64): 4.0, (4, 128): 2.0}
    cfg = config.from_dict({"objective": "time", "constraints": {"max_workers": 2}})
    assert select(table(t), model_inputs.planning(cfg)).selected.workers == 2
    sel = select(
        table(t, feasible={(4, 128): False}),
        model_inputs.planning(config.from_dict({"objective": "time"})),
    )
    assert (sel.selected.workers, sel.selected.global_batch) == (4, 64)
    assert sel.excluded["infeasible_memory_or_oom"] == 1


def test_nothing_feasible_is_a_clear_error():
    cfg = config.from_dict({"objective": "time", "constraints": {"min_batch": 4096}})
    with pytest.raises(
        NoFeasibleConfiguration,
        match=r"every grid point is excluded \(below_min_batch: 1\)\. Widen",
    ):
        select(table({(1, 64): 1.0}), model_inputs.planning(cfg))


def _with_noise(
    df: pd.DataFrame, b_noise: float, base: int = 128, epochs: int = 10
) -> pd.DataFrame:
    df = df.copy()
    df["b_noise"], df["b_noise_se"] = b_noise, 0.1 * b_noise
    df["epochs_to_accuracy"] = epochs * (1 + df["global_batch"] / b_noise) / (1 + base / b_noise)
    df["time_to_accuracy_s"] = df["train_time_s"] * df["epochs_to_accuracy"] / epochs
    df["cost_to_accuracy"] = df["cost"] * df["epochs_to_accuracy"] / epochs
    return df


def test_time_to_accuracy_stops_where_more_batch_costs_more_epochs():
    """T (fixed epochs) keeps falling with B (CURVE), but past B_noise = 256 each doubling needs
    nearly twice the epochs: time to accuracy is least near the critical batch, and the
    objective says how the time and knee choices compare."""
    pred = _with_noise(table({(2, b): t for b, t in CURVE.items()}), b_noise=256)
    sel = select(pred, model_inputs.planning(config.from_dict({"objective": "time_to_accuracy"})))
    tta = {int(r.global_batch): r.time_to_accuracy_s for r in pred.itertuples()}
    best = min(tta, key=tta.get)
    assert sel.selected.global_batch == best and 128 <= best <= 1024
    nz = sel.noise
    assert nz["b_noise"] == nz["critical_batch"] == 256 and nz["chosen_over_critical"] == best / 256
    assert nz["statistical_efficiency"] == pytest.approx(1 / (1 + best / 256))
    time_b = select(
        pred, model_inputs.planning(config.from_dict({"objective": "time"}))
    ).selected.global_batch
    assert time_b == 8192 and nz["versus"]["time"]["global_batch"] == 8192
    assert (
        nz["versus"]["time"]["ratio_to_chosen"] == pytest.approx(tta[8192] / tta[best])
        and tta[8192] > tta[best]
    )
    assert (
        f"objective time would pick N=2 B=8192, {100 * (tta[8192] / tta[best] - 1):.0f} % slower"
        in sel.reason
    )
    assert "B_noise = 256" in sel.reason and "near the start of training" in nz["assumption"]
    assert f"statistical efficiency {100 / (1 + best / 256):.0f} %" in sel.reason


def test_time_to_accuracy_without_a_noise_scale_names_what_is_missing():
    pred = table({(2, b): t for b, t in CURVE.items()})
    with pytest.raises(
        ValueError,
        match="objective.: time_to_accuracy needs the gradient noise scale.*probe.noise_steps",
    ):
        select(pred, model_inputs.planning(config.from_dict({"objective": "time_to_accuracy"})))


def test_the_constraints_bounds_are_inclusive():
    """constraints.max_batch, min_batch, max_workers, min_workers: a point on the bound is in."""
    on_b = {"min_batch": 128, "max_batch": 128}
    t = {(2, 64): 10.0, (2, 128): 6.0, (2, 256): 4.0}
    sel = select(table(t), model_inputs.planning(config.from_dict({"constraints": on_b})))
    assert sel.selected.global_batch == 128
    assert sel.excluded["above_max_batch"] == 1 and sel.excluded["below_min_batch"] == 1
    on_n = {"min_workers": 2, "max_workers": 2}
    t = {(1, 128): 10.0, (2, 128): 6.0, (4, 128): 4.0}
    sel = select(table(t), model_inputs.planning(config.from_dict({"constraints": on_n})))
    assert sel.selected.workers == 2
    assert sel.excluded["above_max_workers"] == 1 and sel.excluded["below_min_workers"] == 1


def test_a_knee_says_how_little_the_doublings_after_it_save():
    """T = 1/B + 0.01: a doubling from B saves 1 / (2 + 0.02 B): 14.0 % from 256, 8.2 % from
    512, 4.4 % from 1024 and 2.3 % from 2048. The knee at 10 % is B = 512, and the doublings
    after its own save at most 4.4 %."""
    t = {(1, b): 1 / b + 0.01 for b in (128, 256, 512, 1024, 2048, 4096)}
    sel = select(table(t), model_inputs.planning(config.from_dict({"objective": "knee"})))
    assert sel.point == (1, 512)
    assert sel.reason.startswith(
        "knee at B=512: doubling to B=1024 saves 8.2 % of T (< 10 %), and no further doubling "
        "saves more than 4.4 %; the doubling from B=256 saved 14.0 %"
    )


def test_a_single_batch_has_no_knee_to_flatten_past():
    """One batch size: the marginal rule's answer is that batch, and it cannot say the curve
    flattened there (flattened: a doubling after it saved less than the gain)."""
    assert marginal_knee(np.array([256]), np.array([3.0]), 0.1) == (256, False)
    sel = select(
        table({(2, 256): 3.0}), model_inputs.planning(config.from_dict({"objective": "knee"}))
    )
    assert not sel.knee["marginal"]["flattened"] and sel.reason.startswith("a single batch size")
    assert sel.runner_up is None  # the one point is not its own runner-up


def test_kneedle_needs_three_batches_and_finds_the_corner_of_three():
    """Three batches are the fewest a curve has a corner on: T = 100, 10, 9 s at B = 64, 128,
    256 bends at 128; two batches have none."""
    assert knee_of(np.array([64, 128, 256]), np.array([100.0, 10.0, 9.0])) == 128
    assert knee_of(np.array([64, 128]), np.array([100.0, 10.0])) is None


def test_a_max_workers_bound_keeps_every_smaller_n():
    """constraints.max_workers alone: the N below it stay candidates (the fastest is one)."""
    t = {(1, 64): 1.0, (2, 64): 6.0, (4, 64): 0.5, (8, 64): 0.4}
    cfg = config.from_dict({"objective": "time", "constraints": {"max_workers": 2}})
    sel = select(table(t), model_inputs.planning(cfg))
    assert sel.selected.key == (1, 64) and sel.excluded["above_max_workers"] == 2


def test_time_to_accuracy_names_the_second_least_time_as_runner_up():
    pred = _with_noise(table({(2, b): t for b, t in CURVE.items()}), b_noise=256)
    sel = select(pred, model_inputs.planning(config.from_dict({"objective": "time_to_accuracy"})))
    ranked = pred.sort_values(["time_to_accuracy_s", "workers", "global_batch"])
    second = ranked.iloc[1]
    assert sel.runner_up.key == (int(second["workers"]), int(second["global_batch"]))


def test_a_knee_past_which_more_batch_only_slows_says_no_doubling_saves_anything():
    """T falls to B = 512 and rises after: past the knee no doubling saves time, and the reason
    says 0.0 %, not a negative saving."""
    t = {(1, 128): 4.0, (1, 256): 2.0, (1, 512): 1.9, (1, 1024): 2.0, (1, 2048): 2.2}
    sel = select(table(t), model_inputs.planning(config.from_dict({"objective": "knee"})))
    assert sel.point == (1, 256)
    assert ", and no further doubling saves more than 0.0 %;" in sel.reason


def test_time_to_accuracy_states_the_statistical_efficiency_of_its_batch():
    """B_noise = 700 and the least time to accuracy at B = 1024: a sample there is worth
    1 / (1 + 1024 / 700) = 41 % of one at a small batch, and the reason says so."""
    pred = _with_noise(table({(2, b): t for b, t in CURVE.items()}), b_noise=700)
    sel = select(pred, model_inputs.planning(config.from_dict({"objective": "time_to_accuracy"})))
    assert sel.selected.global_batch == 1024
    assert "B = 1.46x B_noise, statistical efficiency 41 %" in sel.reason


def test_time_to_accuracy_with_one_candidate_has_no_runner_up():
    pred = _with_noise(table({(2, 512): 3.0}), b_noise=256)
    sel = select(pred, model_inputs.planning(config.from_dict({"objective": "time_to_accuracy"})))
    assert sel.point == (2, 512) and sel.runner_up is None


def test_a_goal_names_a_word_it_does_not_know_and_the_choice_knows_every_objective():
    """Goal takes only the names the choice acts on, so a misspelt objective, curve or rule
    (from a caller that bypassed the config's schema) is an error naming the key, never a
    silent fall-back to the time curve or the Kneedle rule."""
    from tula.model.choice import OBJECTIVES
    from tula.model.inputs import GOAL_NAMES, Goal

    assert set(OBJECTIVES) == set(GOAL_NAMES["objective"])
    for key, wrong in (("objective", "fastest"), ("knee_on", "Cost"), ("knee_rule", "kneed")):
        with pytest.raises(ValueError, match=f"^{key}: '{wrong}' is not one of"):
            Goal(**{key: wrong})
    for key, names in GOAL_NAMES.items():
        assert all(getattr(Goal(**{key: n}), key) == n for n in names)


def test_a_gap_of_two_doublings_counts_as_two_equal_steps():
    """T falls from 100 to 25 between B = 32 and 128 (two doublings, a quarter): each doubling
    saved half, as it would have on a grid that probed B = 64 too."""
    from tula.model.choice import doubling_gains

    got = doubling_gains(np.array([32, 128, 256]), np.array([100.0, 25.0, 20.0]))
    assert got == pytest.approx([0.5, 0.2], rel=bounds.ROUNDING)
    # three doublings to an eighth: half each time too
    got = doubling_gains(np.array([128, 1024]), np.array([100.0, 12.5]))
    assert got == pytest.approx([0.5], rel=bounds.ROUNDING)


def test_kneedles_reason_says_what_the_next_doubling_would_save_and_what_marginal_picks():
    """CURVE's Kneedle knee is B = 512 (T = 2.441 s); B = 1024 takes 1.465 s, 40.0 % less. The
    marginal rule at 10 % keeps doubling to the grid's end (every doubling saves >= 16.7 %)."""
    cfg = config.from_dict({"objective": "knee", "knee_rule": "kneedle"})
    sel = select(table({(2, b): t for b, t in CURVE.items()}), model_inputs.planning(cfg))
    assert sel.point == (2, 512)
    assert "; doubling to B=1024 would save 40.0 % (the marginal rule would pick B=8192)" in (
        sel.reason
    )


def test_when_both_rules_find_the_same_knee_the_reason_names_no_other():
    """The L-shaped curve bends at B = 512 for Kneedle and for the marginal rule (the doubling
    after it saves 4 %): the reason has no "would pick"."""
    b = [32, 64, 128, 256, 512, 1024, 2048, 4096]
    t = [100, 50, 25, 12.5, 6.25, 6.0, 5.9, 5.8]
    sel = select(
        table({(1, x): y for x, y in zip(b, t)}),
        model_inputs.planning(config.from_dict({"objective": "knee"})),
    )
    assert sel.point == (1, 512) and sel.knee["kneedle"]["global_batch"] == 512
    assert "would pick" not in sel.reason


def test_no_kneedle_knee_falls_back_to_the_fastest_point():
    """Two batch sizes have no Kneedle knee: the choice is the least T of the two."""
    cfg = config.from_dict({"objective": "knee", "knee_rule": "kneedle"})
    sel = select(table({(1, 64): 5.0, (1, 128): 3.0}), model_inputs.planning(cfg))
    assert sel.point == (1, 128) and sel.reason.startswith("no Kneedle knee")


def test_a_max_batch_bound_alone_keeps_every_smaller_batch():
    t = {(2, 64): 10.0, (2, 128): 6.0, (2, 256): 4.0, (2, 512): 3.0}
    cfg = config.from_dict({"objective": "time", "constraints": {"max_batch": 256}})
    sel = select(table(t), model_inputs.planning(cfg))
    assert sel.point == (2, 256) and sel.excluded["above_max_batch"] == 1
    assert sel.candidates == 3 and sel.runner_up.key == (2, 128)


def test_time_to_accuracy_with_two_candidates_names_the_other_as_runner_up():
    pred = _with_noise(table({(2, 512): 3.0, (2, 1024): 2.0}), b_noise=4096)
    sel = select(pred, model_inputs.planning(config.from_dict({"objective": "time_to_accuracy"})))
    assert sel.point == (2, 1024) and sel.runner_up.key == (2, 512)


def test_time_to_accuracy_compares_with_the_other_objectives_picks_whatever_the_rows_order():
    """B_noise far above the grid: epochs do not grow with B, so time to accuracy picks what
    time picks, B = 4096 on the L-shaped curve (the reason says so), and the knee's pick,
    B = 512, is found as itself, not as the first row at or above its batch, in a table whose
    rows run from the largest B down."""
    b = [32, 64, 128, 256, 512, 1024, 2048, 4096]
    t = [100, 50, 25, 12.5, 6.25, 6.0, 5.9, 5.8]
    pred = _with_noise(table({(2, x): y for x, y in zip(b, t)}), b_noise=1e9)
    pred = pred.iloc[::-1].reset_index(drop=True)
    sel = select(pred, model_inputs.planning(config.from_dict({"objective": "time_to_accuracy"})))
    versus = sel.noise["versus"]
    assert sel.point == (2, 4096)
    assert (versus["time"]["global_batch"], versus["knee"]["global_batch"]) == (4096, 512)
    assert "; objective time picks the same point; objective knee would pick N=2 B=512" in (
        sel.reason
    )


def test_a_curve_flat_to_within_numpys_closeness_has_no_knee_whatever_its_noise():
    """T = 5 s at every B, but for an L-shaped wobble of under 40 us: Kneedle, normalising it,
    would find the L's corner (kneed says B = 128); Tula reads the curve as flat: no knee."""
    b = np.array([64, 128, 256, 512])
    assert knee_of(b, 5.0 + 4e-7 * np.array([100.0, 10.0, 9.0, 8.0])) is None


def test_a_doubling_that_saves_exactly_the_gain_still_pays():
    """knee_gain is the least saving that pays: from B = 64 to 128 T halves (a saving of
    exactly 0.5), so at a gain of 0.5 the knee is 128, where the next doubling saves 25 %."""
    assert marginal_knee(np.array([64, 128, 256]), np.array([1.0, 0.5, 0.375]), 0.5) == (128, True)


def test_the_accuracy_objectives_state_their_own_unit():
    """Time to accuracy in seconds, cost to accuracy in the price's currency."""
    pred = _with_noise(table({(2, b): t for b, t in CURVE.items()}), b_noise=700)
    sel = select(pred, model_inputs.planning(config.from_dict({"objective": "time_to_accuracy"})))
    assert sel.reason.startswith("minimum predicted time to accuracy: 3.05 s (")
    cfg = config.from_dict({"objective": "cost_to_accuracy", "pricing": {"currency": "EUR"}})
    sel = select(pred, model_inputs.planning(cfg))
    assert sel.reason.startswith("minimum predicted cost to accuracy: 6.1 EUR (")


def test_an_unknown_queue_wait_counts_as_none_not_as_a_gain():
    """time_to_result where one N's wait is unknown (NaN): it adds nothing to T, so the faster
    point with a known wait of 0 still wins by its 0.5 s."""
    plan = model_inputs.planning(config.from_dict({"objective": "time_to_result"}))
    pred = table({(1, 64): 10.0, (2, 64): 10.5})
    pred["queue_wait_s"] = [0.0, float("nan")]
    sel = select(pred, plan)
    assert sel.point == (1, 64) and sel.runner_up.key == (2, 64)
    pred["queue_wait_s"] = [float("nan"), 0.0]  # nor as a cost: the unknown one is still faster
    assert select(pred, plan).point == (1, 64)


def test_a_knee_at_the_first_batch_names_kneedles_later_corner_and_no_doubling_before_it():
    """T = 100 - 0.005 B up to B = 2048, flat after: no doubling saves 10 %, so the marginal
    knee is the first batch (nothing before it to name), while Kneedle's corner is B = 2048."""
    b = 2 ** np.arange(5, 13)
    t = 100 - 0.005 * np.minimum(b, 2048)
    assert marginal_knee(b, t, 0.1) == (32, True) and knee_of(b, t) == 2048
    sel = select(
        table({(1, int(x)): float(y) for x, y in zip(b, t)}),
        model_inputs.planning(config.from_dict({"objective": "knee"})),
    )
    assert sel.point == (1, 32) and sel.reason.startswith("knee at B=32: doubling to B=64 saves")
    assert sel.reason.endswith("(Kneedle would pick B=2048)")
    assert "the doubling from" not in sel.reason


def test_two_batches_have_a_marginal_knee():
    """Two batch sizes make one doubling: saving 5 % (< 10 %), the knee is the first and the
    curve flattened there."""
    assert marginal_knee(np.array([64, 128]), np.array([1.0, 0.95]), 0.1) == (64, True)


def test_the_words_of_a_parsed_config_choose_as_the_literals_do():
    """A config file's objective and knee rule are strings parsed from text, not the literals
    of the code: the choice compares them by value. With no queue wait in play, time ignores
    a waits column that time_to_result adds."""
    import json

    words = json.loads(
        '{"time": "time", "ttr": "time_to_result", "kneedle": "kneedle", "cost": "cost"}'
    )
    pred = table({(1, 64): 10.0, (2, 64): 9.0})
    pred["queue_wait_s"] = [0.0, 5.0]
    sel = select(pred, model_inputs.planning(config.from_dict({"objective": words["time"]})))
    assert sel.point == (2, 64) and sel.reason.startswith("minimum training time T: 9 s")
    sel = select(pred, model_inputs.planning(config.from_dict({"objective": words["ttr"]})))
    assert sel.point == (1, 64) and sel.reason.startswith("minimum queue wait + training time")
    cfg = config.from_dict({"objective": "knee", "knee_rule": words["kneedle"]})
    sel = select(table({(2, b): t for b, t in CURVE.items()}), model_inputs.planning(cfg))
    assert sel.reason.startswith("Kneedle knee of T vs B at B=512")
    cfg = config.from_dict({"objective": "knee", "knee_on": words["cost"]})
    sel = select(table({(2, b): t for b, t in CURVE.items()}), model_inputs.planning(cfg))
    assert sel.knee["on"] == "cost (best N per B)"


def test_the_other_objectives_picks_are_found_at_their_own_n_in_a_table_of_several_n():
    """N = 1, 2 and 4 at every B, N = 2 the fastest: time to accuracy's comparison with time's
    and the knee's picks finds each at its own N and B, whichever way the rows run."""
    b = [32, 64, 128, 256, 512, 1024, 2048, 4096]
    t = [100, 50, 25, 12.5, 6.25, 6.0, 5.9, 5.8]
    times = {(n, x): y * f for n, f in ((1, 1.5), (2, 1.0), (4, 1.2)) for x, y in zip(b, t)}
    pred = _with_noise(table(times), b_noise=1e9)
    for rows in (pred, pred.iloc[::-1].reset_index(drop=True)):
        sel = select(
            rows, model_inputs.planning(config.from_dict({"objective": "time_to_accuracy"}))
        )
        v = sel.noise["versus"]
        assert (v["time"]["workers"], v["time"]["global_batch"]) == (2, 4096)
        assert (v["knee"]["workers"], v["knee"]["global_batch"]) == (2, 512)


def test_two_batches_through_the_choice_keep_doubling_or_stop_and_name_the_other():
    """Two batch sizes: T falling 40 % keeps the larger (the knee lies beyond the grid) with the
    smaller as runner-up; T falling 5 % stops at the smaller, with the larger as runner-up."""
    plan = model_inputs.planning(config.from_dict({"objective": "knee"}))
    sel = select(table({(1, 64): 1.0, (1, 128): 0.6}), plan)
    assert sel.point == (1, 128) and sel.runner_up.key == (1, 64)
    assert sel.reason.startswith("T still falls by 40.0 % (>= 10 %) on the last doubling")
    sel = select(table({(1, 64): 1.0, (1, 128): 0.95}), plan)
    assert sel.point == (1, 64) and sel.runner_up.key == (1, 128)
    assert sel.reason.startswith("knee at B=64: doubling to B=128 saves 5.0 % of T (< 10 %). T")


def test_a_knee_two_doublings_from_the_end_bounds_the_one_after_its_own():
    """At a 30 % gain: T halves from 64 to 128, then falls 20 % per doubling: the knee is 128,
    and the reason bounds the one doubling after its own (256 to 512) by 20.0 %."""
    cfg = config.from_dict({"objective": "knee", "knee_gain": 0.3})
    t = {(1, 64): 1.0, (1, 128): 0.5, (1, 256): 0.4, (1, 512): 0.32}
    sel = select(table(t), model_inputs.planning(cfg))
    assert sel.point == (1, 128)
    assert sel.reason.startswith(
        "knee at B=128: doubling to B=256 saves 20.0 % of T (< 30 %), and no further doubling "
        "saves more than 20.0 %; the doubling from B=64 saved 50.0 %"
    )
