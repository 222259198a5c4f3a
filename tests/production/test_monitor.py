"""The production job keeps measuring: paired compute-only steps that leave training bit for
bit unchanged, steps.csv as they come, and drift recorded (never acted on) under
``launch.replan: record``. Real runs: `tula launch`, submitit's local executor, 2 gloo workers."""

import copy
import json
import math
import statistics

import pandas as pd
import pytest
import yaml

from conftest import TINY, bitwise_equal, load_params, train_from_files
from selections import selection_json
from tula.io import write_json
from tula.production.monitor import COLUMNS, COST_SHARE, FIRST_AFTER, next_auto_pair

D, B = 1437, 64  # digits training samples; the global batch
STEPS1 = math.ceil(D / B)


def _run(tmp_path, tiny_raw, name, predictions=None, **launch_cfg):
    d = tmp_path / name
    d.mkdir()
    tiny_raw["launch"] = {"poll_s": 0.5, "executor": "local", **launch_cfg}
    (d / "config.yaml").write_text(yaml.safe_dump(tiny_raw))
    write_json(d / "selection.json", selection_json(2, B))
    final = train_from_files(
        d / "config.yaml", d / "selection.json", d / "train", predictions=predictions
    )
    return d / "train", final


@pytest.fixture(scope="module")
def unmonitored(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("off"), copy.deepcopy(TINY), "off", replan="off")


@pytest.mark.training
def test_monitored_training_is_bitwise_the_unmonitored_one(
    tmp_path, tiny_raw, unmonitored, venv_path
):
    off_dir, off_final = unmonitored
    out, final = _run(tmp_path, tiny_raw, "every3", monitor_every_steps=3)
    assert bitwise_equal(load_params(out / "model.pt"), load_params(off_dir / "model.pt"))
    assert (
        final["final_test_acc"] == off_final["final_test_acc"]
        and final["steps"] == off_final["steps"]
    )
    rows = pd.read_csv(out / "steps.csv")
    assert list(rows.columns) == COLUMNS
    # every 3rd step from step 3, never an epoch's first step: the pair is taken before the step,
    # so a row's step is the count after it
    expected = [s + 1 for s in range(3, 2 * STEPS1, 3) if s % STEPS1 != 0 and s < 2 * STEPS1]
    assert list(rows["step"]) == expected
    assert (rows["workers"] == 2).all() and (rows["global_batch"] == B).all()
    assert (rows["compute_time_s"] > 0).all() and (rows["step_time_s"] > 0).all()
    assert rows["sync_time_s"].tolist() == pytest.approx(
        (rows["step_time_s"] - rows["compute_time_s"]).clip(lower=0).tolist()
    )
    assert (
        final["monitored_steps"] == len(rows)
        and final["monitor_time_s"] > 0
        and final["drift"] == []
    )
    assert final["monitor_off"] is None and final["monitor_first_due_step"] == 3
    # replan: off, and final.json says that is why no pair was taken
    assert off_final["monitored_steps"] == 0 and pd.read_csv(off_dir / "steps.csv").empty
    assert off_final["monitor_off"] == "launch.replan: off"
    assert off_final["monitor_first_due_step"] is None


@pytest.mark.training
def test_record_writes_the_drift_down_and_never_moves(tmp_path, tiny_raw, venv_path):
    """A prediction of a sync of one second a step (a band from 0.8 s up): the gloo all-reduce
    the job really pays on loopback is a few ms, so every observation lies far below the band,
    a sustained drift whatever the machine's noise, found at the 5th observation (the first
    window of 5) and recorded in drift.json, attempts.json and final.json; the job trains on
    at the same (N, B).

    Not a drift to the slower side from a prediction of no sync (a band up to 0.2 ms):
    whether the real all-reduce shows above such a band rests on the step's noise, since an
    observation is a synced step less a compute-only one, each varying by milliseconds here;
    a few observations above it, scattered, make no window of 5 whose median is above it,
    and the detector, deciding on medians, rightly records no drift then."""
    pred = tmp_path / "predictions.csv"
    pd.DataFrame(
        [
            {
                "workers": 2,
                "global_batch": B,
                "step_time_s": 1.0,
                "compute_time_s": 1e-3,
                "step_time_lo_s": 1.0,
                "step_time_hi_s": 1.0,
                "train_time_s": 1.0,
                "train_time_lo_s": 1.0,
                "train_time_hi_s": 1.0,
            }
        ]
    ).to_csv(pred, index=False)
    out, final = _run(tmp_path, tiny_raw, "rec", predictions=pred, monitor_every_steps=2)
    rows = pd.read_csv(out / "steps.csv")
    lo = 1.0 - 1e-3 - 0.2 * 1.0  # the band the job was given: the predicted sync less 0.2 step
    assert rows["sync_lo_s"].iloc[0] == pytest.approx(lo)
    assert len(rows) >= 5 and (rows["sync_time_s"] < lo).all(), rows  # every one far below
    att = json.loads((out / "attempts.json").read_text())["attempts"]
    assert len(att) == 1 and att[0]["outcome"] == "completed" and att[0]["global_batch"] == B
    drifts = att[0]["drift"]
    assert drifts and drifts == final["drift"] == json.loads((out / "drift.json").read_text())
    first = drifts[0]
    assert (
        first["direction"] == "faster"
        and first["action"] == "recorded"
        and first["predicted_s"] == pytest.approx(1.0 - 1e-3)
    )
    # the first window of 5 (every observation out): its median decides, at the 5th
    assert first["step"] == int(rows["step"].iloc[4]) and first["since_step"] == rows["step"][0]
    assert first["observed_s"] == pytest.approx(statistics.median(rows["sync_time_s"][:5]))
    assert "vs predicted 999.0 ms" in first["reason"]
    # re-armed around what it saw: the same level, with its scatter, is not reported again
    assert len(drifts) == 1


@pytest.mark.parametrize("cost_steps", [0.5, 1.1, 3.0])
def test_auto_monitoring_pays_at_most_one_percent_of_the_steps_all_pairs_counted(cost_steps):
    """Pairs placed by ``auto`` over a long run, each costing ``cost_steps`` steps: at every pair,
    all pairs so far (the first one too) are within COST_SHARE of the steps trained."""
    step_s, since = 0.017, 40  # resumed at step 40: the budget counts this attempt's steps
    at, spent, pairs = since + FIRST_AFTER, 0.0, []
    while at < since + 5000:
        spent += cost_steps * step_s
        pairs.append(at)
        # the first pair's cost is not known before it: assumed one step
        if len(pairs) > 1 or cost_steps <= 1:
            assert spent <= COST_SHARE * (at - since) * step_s + 1e-12
        nxt = next_auto_pair(at, since, spent, cost_steps * step_s, step_s)
        assert nxt > at
        # the next one paid for too
        assert spent + cost_steps * step_s <= COST_SHARE * (nxt - since) * step_s + 1e-12
        at = nxt
    # as often as the budget allows, not less
    assert abs(len(pairs) - 5000 * COST_SHARE / cost_steps) <= 1
