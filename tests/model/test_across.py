"""The choice across partitions: by the objective's measure, with the runner-up's ratio; the
queue's wait added for time_to_result; what the probes say of two partitions' compute."""

import pandas as pd
import pytest

from conftest import prediction_table as table
from selections import point
from tula import config, model_inputs
from tula.model import across
from tula.model.choice import select

TIMES = {(1, 64): 400.0, (2, 64): 300.0, (2, 128): 200.0, (4, 128): 120.0}


def planned(scale: float, price: float, waits=None, objective="time"):
    """One partition: TIMES scaled, priced per worker-hour, its own choice."""
    pred = table({k: v * scale for k, v in TIMES.items()})
    pred["nodes"] = [max(1, n // 2) for n in pred["workers"]]
    pred["cost"] = pred["train_time_s"] / 3600 * pred["workers"] * price
    if waits is not None:
        pred = across.with_waits(pred, waits)
    cfg = config.from_dict({"objective": objective})
    return pred, select(pred, model_inputs.planning(cfg))


def choose(parts, objective, knee_on="time"):
    frames = {n: p[0] for n, p in parts.items()}
    sels = {n: p[1] for n, p in parts.items()}
    return across.choose(frames, sels, objective, knee_on, "USD")


def test_time_chooses_the_faster_partition_and_cost_the_cheaper():
    fast, slow = planned(1.0, 4.0), planned(2.0, 1.0)
    by_time = choose({"fast": fast, "slow": slow}, "time")
    assert by_time.partition == "fast" == by_time.selected.partition
    run = by_time.across_partitions.runner_up
    assert run.partition == "slow" and run.ratio == pytest.approx(2.0)
    assert "runner-up slow N=4 B=128" in by_time.reason and "2.00x" in by_time.reason
    # slow takes twice the time at a quarter of the price: half the cost
    fast_c, slow_c = planned(1.0, 4.0, objective="cost"), planned(2.0, 1.0, objective="cost")
    by_cost = choose({"fast": fast_c, "slow": slow_c}, "cost")
    assert by_cost.partition == "slow"
    assert by_cost.across_partitions.runner_up.ratio == pytest.approx(2.0)


def test_time_to_result_adds_the_queue_and_moves_when_the_fast_one_is_blocked():
    free = {1: 0.0, 2: 0.0, 4: 0.0}
    parts = {
        "fast": planned(1.0, 1.0, free, "time_to_result"),
        "slow": planned(2.0, 1.0, free, "time_to_result"),
    }
    assert choose(parts, "time_to_result").partition == "fast"
    # fast's advantage is 120 s; a 500-s wait on it is longer than that
    blocked = {1: 500.0, 2: 500.0, 4: 500.0}
    parts["fast"] = planned(1.0, 1.0, blocked, "time_to_result")
    sel = choose(parts, "time_to_result")
    assert sel.partition == "slow"
    assert sel.across_partitions.partitions[1].value == pytest.approx(620.0)
    assert "queue wait 500 s" in sel.reason


def test_within_a_partition_a_shorter_wait_can_beat_a_faster_shape():
    # N=4 is fastest (120 s) but waits 1000 s; N=2 B=128 takes 200 s and starts now
    pred, sel = planned(1.0, 1.0, {1: 0.0, 2: 0.0, 4: 1000.0}, "time_to_result")
    assert (sel.selected.workers, sel.selected.global_batch) == (2, 128)
    assert sel.selected.queue_wait_s == 0.0 and "queue wait + training time" in sel.reason
    # no wait known: time alone, and the reason says so
    pred, sel = planned(1.0, 1.0, None, "time_to_result")
    assert sel.selected.workers == 4 and "no queue wait known" in sel.reason


def test_knee_compares_the_partitions_knees_by_their_time():
    parts = {"a": planned(1.5, 1.0, objective="knee"), "b": planned(1.0, 1.0, objective="knee")}
    sel = choose(parts, "knee")
    assert sel.partition == "b" and sel.across_partitions.what == "training time T"


def test_compute_ratios_and_shared_gpus():
    def probes(scale):
        return pd.DataFrame(
            {
                "source": "probe",
                "status": "ok",
                "workers": [1, 2, 2],
                "global_batch": [64, 64, 128],
                "compute_time_s": [0.1 * scale, 0.05 * scale, 0.1 * scale],
            }
        )

    ratios = across.compute_ratios({"lab0": probes(1.0), "lab1": probes(2.0)})
    assert ratios == [{"partition": "lab1", "versus": "lab0", "points": 3, "compute_ratio": 2.0}]
    groups = across.same_gpu({"a": "h100", "b": "H100", "c": "a100-40gb", "cpu": None})
    assert groups == [["a", "b"]]


def test_at_submission_a_grown_wait_puts_the_runner_up_first_only_in_time():
    parts = {"fast": planned(1.0, 1.0), "slow": planned(2.0, 1.0)}
    block = choose(parts, "time").across_partitions  # fast: 120 s, slow: 240 s
    assert not across.after_wait(block, {"fast": 100.0, "slow": 0.0})["runner_first"]
    grown = across.after_wait(block, {"fast": 200.0, "slow": 0.0})
    assert grown["runner_first"] and grown["finish_s"] == {"fast": 320.0, "slow": 240.0}
    assert "80 s sooner" in grown["reason"] and "ahead by 120 s" in grown["reason"]
    cost = choose(
        {"fast": planned(1.0, 4.0, objective="cost"), "slow": planned(2.0, 1.0, objective="cost")},
        "cost",
    ).across_partitions
    assert not across.after_wait(cost, {"slow": 1e6})["runner_first"]


def test_a_partitions_point_is_read_at_its_own_n_and_b_whatever_the_rows_order():
    """The chosen point's row, read at its N and B exactly: a larger batch listed first at the
    same N is another point; a point the partition never predicted is an error naming it."""
    pred = table({(2, 256): 50.0, (2, 64): 300.0, (1, 64): 400.0})
    assert across._row(pred, point(2, 64))["train_time_s"] == 300.0
    assert across._row(pred, point(1, 64))["train_time_s"] == 400.0
    with pytest.raises(ValueError, match="N=4 B=64 is not in its partition's predictions"):
        across._row(pred, point(4, 64))


def test_the_measure_reads_the_objective_by_its_value_not_its_identity():
    """An objective read from a file is an equal string, not the literal itself."""
    knee = "".join(["kn", "ee"])  # equal to "knee", another object
    assert across.measure(knee, "cost") == ("cost", "cost C")


def test_a_wait_never_moves_a_choice_made_in_money_whatever_the_currency_is_called():
    """A cost in any currency (its name is the user's: "USD", "usd", "€") gains nothing from a
    wait: at submission, however long the chosen partition's queue, the runner-up is not put
    first, and the reason says there is nothing to compare in time."""
    parts = {
        "fast": planned(1.0, 4.0, objective="cost"),
        "slow": planned(2.0, 1.0, objective="cost"),
    }
    frames, sels = {n: p[0] for n, p in parts.items()}, {n: p[1] for n, p in parts.items()}
    for currency in ("USD", "usd", "€"):
        block = across.choose(frames, sels, "cost", "time", currency).across_partitions
        assert block.unit == currency
        after = across.after_wait(block, {block.chosen: 1e6})
        assert not after["runner_first"] and "in time" in after["reason"], currency
