"""launch.replan: move — the decision (re-fit, re-predict, re-select, pay for the relaunch) and a
real run that moves. The drift is a real delay in every synced step (fault ``slowsync``: what a
slower network does to the all-reduce; the network lab's real link is in test_netlab.py), the
processes, checkpoints, monitor and relaunch are the production job's own."""

import json
import math

import pandas as pd
import pytest
import yaml

from conftest import train_from_files
from tula import config, faults, model_inputs
from tula.io import write_json
from tula.model import refit

D, B = 1437, 64


def _pred(compute2=0.040, sync2=0.005, compute1=0.060):
    """Two points of a one-node grid: N = 2 (with a little sync) and N = 1, at B = 64."""
    spe = math.ceil(D / B)
    rows = []
    for n, comp, sync in ((1, compute1, 0.0), (2, compute2, sync2)):
        step = comp + sync
        rows.append(
            {
                "workers": n,
                "nodes": 1,
                "global_batch": B,
                "local_batch": B // n,
                "compute_time_s": comp,
                "sync_time_s": sync,
                "step_time_s": step,
                "step_time_lo_s": step - 0.002,
                "step_time_hi_s": step + 0.005,
                "steps_per_epoch": spe,
                "epochs": 20,
                "train_time_s": 20 * spe * step,
                "train_time_lo_s": 20 * spe * (step - 0.002),
                "train_time_hi_s": 20 * spe * (step + 0.005),
                "cost": 20 * spe * step * n,
                "mem_bytes": 1e6,
                "feasible": True,
                "probe_status": "ok",
            }
        )
    return pd.DataFrame(rows)


def _cfg(objective="time"):
    return config.from_dict(
        {
            "workload": {"epochs": 20},
            "grid": {"workers": [1, 2], "batch_min": 64, "batch_max": 64},
            "objective": objective,
            "cluster": {"workers_per_node": 2},
        }
    )


def _drift(observed, epochs_done=2.0):
    return {
        "observed_s": observed,
        "epochs_done": epochs_done,
        "reason": f"sync {1e3 * observed:.1f} ms vs predicted 5.0 ms",
    }


def test_a_slow_sync_moves_to_the_point_that_finishes_the_rest_sooner(tmp_path):
    _pred().to_csv(tmp_path / "p.csv", index=False)
    d = refit.decide(
        model_inputs.planning(_cfg()),
        pd.read_csv(tmp_path / "p.csv"),
        2,
        B,
        _drift(0.085),
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
    _pred().to_csv(tmp_path / "p.csv", index=False)
    late = refit.decide(
        model_inputs.planning(_cfg()),
        pd.read_csv(tmp_path / "p.csv"),
        2,
        B,
        _drift(0.085, epochs_done=19.5),
        relaunch_s=8.0,
    )
    assert not late.move and "not more than the 10 % margin; stayed" in late.reason
    mild = refit.decide(
        model_inputs.planning(_cfg()),
        pd.read_csv(tmp_path / "p.csv"),
        2,
        B,
        _drift(0.012),
        relaunch_s=0.0,
    )  # 52 ms a step: still best
    assert not mild.move and "is still the time choice; stayed" in mild.reason


def test_a_cost_objective_weighs_the_price_of_the_workers(tmp_path):
    # N=2 costs two workers: at 40 + 25 ms against 60 ms on one worker, one worker is cheaper by far
    _pred().to_csv(tmp_path / "p.csv", index=False)
    d = refit.decide(
        model_inputs.planning(_cfg("cost")),
        pd.read_csv(tmp_path / "p.csv"),
        2,
        B,
        _drift(0.025),
        relaunch_s=1.0,
    )
    assert (d.move, d.workers) == (True, 1) and "of the remaining cost" in d.reason


def test_a_drift_moves_the_job_only_by_what_it_changed(tmp_path):
    """A job put at a point the predictions already disfavoured (N = 2 at 45 ms against N = 1 at
    30 ms: 33 % predicted to be saved by moving) is not moved off it by a sync that came out
    *faster* than predicted; a slower one that adds more than the margin to that saving moves it."""
    pred = _pred(compute1=0.030)
    faster = refit.decide(model_inputs.planning(_cfg()), pred, 2, B, _drift(0.002), relaunch_s=0.0)
    assert (faster.move, faster.workers) == (False, 2), faster.reason
    assert faster.saving == pytest.approx(1 - 0.030 / 0.042)
    assert (
        "N=1 B=64 would save 29 % of the remaining time after the relaunch (0 s), 33 % of it "
        "predicted before the drift: the drift adds -5 %, not more than the 10 % margin; stayed"
    ) in faster.reason
    slower = refit.decide(model_inputs.planning(_cfg()), pred, 2, B, _drift(0.030), relaunch_s=0.0)
    assert (slower.move, slower.workers) == (True, 1), slower.reason
    assert slower.saving == pytest.approx(1 - 0.030 / 0.070)  # 57 %: 24 points more than before
    # a little slower (9 ms against 5: 39 % against 33 %, within the margin of it): stays
    mild = refit.decide(model_inputs.planning(_cfg()), pred, 2, B, _drift(0.009), relaunch_s=0.0)
    assert not mild.move and "the drift adds 5 %" in mild.reason, mild.reason


def test_after_a_faster_drift_a_slowdown_counts_from_the_level_the_job_was_at(tmp_path):
    """The job's sync came out at 0.5 ms, far under the 5 ms predicted (a first drift, faster:
    stayed); then it slows to 9 ms. Against the prediction that is the mild drift above (adds 5
    %: stays); from the level the job was at, it adds 13 %: moves. What the network lab saw in
    CI: a 4x slower link judged against a prediction the first drift had already corrected."""
    pred = _pred(compute1=0.030)
    d = refit.decide(
        model_inputs.planning(_cfg()),
        pred,
        2,
        B,
        {**_drift(0.009), "from_s": 0.0005},
        relaunch_s=0.0,
    )
    assert (d.move, d.workers) == (True, 1), d.reason
    assert d.saving == pytest.approx(1 - 0.030 / 0.049)
    # the level the prediction itself set: as before (the mild case of the test above)
    same = refit.decide(
        model_inputs.planning(_cfg()),
        pred,
        2,
        B,
        {**_drift(0.009), "from_s": 0.005},
        relaunch_s=0.0,
    )
    assert not same.move and "the drift adds 5 %" in same.reason, same.reason


def _observed(out, drift_step, direction, observed_ms, later_ms, left=None):
    """drift.json with one drift of attempt 1 at ``drift_step``, and steps.csv with the
    observations after it, against a band of 0-12 ms (as the job's rank 0 writes them);
    ``left``: the (lo, hi) ms band of the level the drift left, where it records one."""
    from tula.io import write_csv

    write_json(
        out / "drift.json",
        [
            {
                "step": drift_step,
                "since_step": drift_step - 8,
                "observed_s": observed_ms / 1e3,
                "direction": direction,
                "attempt": 1,
                "epochs_done": 2.0,
                "reason": f"sync {observed_ms:.1f} ms vs predicted 5.0 ms",
                **({"accept_lo_s": left[0] / 1e3, "accept_hi_s": left[1] / 1e3} if left else {}),
            }
        ],
    )
    rows = [
        {"step": drift_step + 2 * (i + 1), "attempt": 1, "sync_time_s": ms / 1e3}
        for i, ms in enumerate(later_ms)
    ]
    write_csv(
        out / "steps.csv",
        pd.DataFrame(rows).assign(sync_lo_s=0.0, sync_hi_s=0.012),
    )


def test_a_drift_moves_the_job_only_once_the_next_observations_confirm_it(tmp_path):
    """A move costs a relaunch: tula launch waits for the next drift.CONFIRM observations; a
    slow spell that goes (the machine busy for a dozen steps, seen in CI) stays, a slowdown
    that holds moves."""
    from tula.model import drift as drift_mod
    from tula.production.attempts import Attempt
    from tula.production.replan import Replan

    _pred().to_csv(tmp_path / "p.csv", index=False)
    cfg = config.from_dict(
        {
            "workload": {"epochs": 20},
            "grid": {"workers": [1, 2], "batch_min": 64, "batch_max": 64},
            "objective": "time",
            "cluster": {"workers_per_node": 2},
            "launch": {"replan": "move"},
        }
    )
    att = Attempt(attempt=1, global_batch=B, local_batch=B // 2, job_id="1", start_step=0)
    for later, moves in (([9.0, 10.0, 8.0], False), ([90.0, 85.0, 95.0], True)):
        out = tmp_path / f"run{int(moves)}"
        out.mkdir()
        replan = Replan(cfg, tmp_path / "p.csv", out)
        _observed(out, 40, "slower", 85.0, later[: drift_mod.CONFIRM - 1])
        check = replan.watch(att, 2)
        assert check() is False and replan.decisions == {}  # not yet: one observation short
        _observed(out, 40, "slower", 85.0, later)
        assert check() is moves
        d = replan.decided({"step": 40, "reason": "x"})
        assert d["action"] == ("moved" if moves else "stayed"), d
        if moves:
            assert "held: the next 3 observations' median 90.0 ms (steps 42-46)" in d["reason"]
            assert (out / "move.request").exists()
        else:
            assert d["reason"].endswith(
                "did not hold: the next 3 observations' median 9.0 ms (steps 42-46), not beyond "
                "the band (0.0-12.0 ms); stayed"
            )
            assert not (out / "move.request").exists()
    # the attempt ended before a drift could be confirmed: said
    left = Replan(cfg, tmp_path / "p.csv", tmp_path / "run0").decided({"step": 99})
    assert left["action"].startswith("not decided: the attempt ended before")


def test_a_drift_holds_against_the_band_of_the_level_it_left(tmp_path):
    """After a faster level (0-3 ms accepted), 9 ms holds as a slowdown, though it is inside
    the predicted 0-12 ms band that steps.csv carries."""
    from tula.production.replan import Replan

    _observed(tmp_path, 40, "slower", 9.0, [9.0, 10.0, 8.0], left=(0.0, 3.0))
    rows = pd.read_csv(tmp_path / "steps.csv")
    (d,) = json.loads((tmp_path / "drift.json").read_text())
    held, words = Replan.after(d, 1, rows)
    assert held and words.startswith("held: the next 3 observations' median 9.0 ms"), words
    d.pop("accept_lo_s"), d.pop("accept_hi_s")  # a drift.json of before: the predicted band
    assert Replan.after(d, 1, rows)[0] is False


@pytest.fixture
def run_dir(tmp_path, tiny_raw):
    tiny_raw["workload"]["epochs"] = 20
    tiny_raw["objective"] = "time"
    tiny_raw["cluster"] = {"workers_per_node": 2}
    tiny_raw["launch"] = {
        "executor": "local",
        "poll_s": 0.5,
        "monitor_every_steps": 2,
        "replan": "move",
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(tiny_raw))
    write_json(tmp_path / "selection.json", {"selected": {"workers": 2, "global_batch": B}})
    _pred().to_csv(tmp_path / "predictions.csv", index=False)
    return tmp_path


@pytest.mark.training
@pytest.mark.alone  # the monitor judges measured steps: no neighbour's load in them
def test_a_job_whose_sync_slows_moves_and_trains_every_sample_once(run_dir, venv_path, monkeypatch):
    monkeypatch.setenv(faults.ENV, "slowsync:step=30,ms=150,workers=2")
    final = train_from_files(
        run_dir / "config.yaml",
        run_dir / "selection.json",
        run_dir / "train",
        predictions=run_dir / "predictions.csv",
    )
    rec = json.loads((run_dir / "train" / "attempts.json").read_text())
    a1, a2 = rec["attempts"]
    assert (a1["workers"], a1["outcome"], a2["workers"], a2["outcome"]) == (
        2,
        "moved",
        1,
        "completed",
    )
    assert "moved from N=2 B=64 to N=1 B=64" in a1["reason"]
    moved = [d for d in a1["drift"] if d["action"] == "moved"]
    assert len(moved) == 1 and moved[0]["step"] > 30 and moved[0]["direction"] == "slower"
    # from the checkpoint taken on the request
    assert a2["start_step"] == a1["checkpoint_step"] >= moved[0]["step"]
    m = pd.read_csv(run_dir / "train" / "metrics.csv")
    # every sample once per epoch
    assert list(m["epoch"]) == list(range(1, 21)) and (m["samples"] == D).all()
    assert set(m["workers"]) == {1, 2} and m["workers"].iloc[-1] == 1
    assert final["workers"] == 1 and final["steps"] == a2["end_step"]


@pytest.mark.training
@pytest.mark.alone  # a neighbour's load would be a drift of its own
def test_move_without_a_drift_never_moves(run_dir, venv_path):
    """The same run, nothing slowed: one attempt at the selected (N, B), whatever it observed."""
    raw = yaml.safe_load((run_dir / "config.yaml").read_text())
    raw["workload"]["epochs"] = 4
    (run_dir / "config.yaml").write_text(yaml.safe_dump(raw))
    final = train_from_files(
        run_dir / "config.yaml",
        run_dir / "selection.json",
        run_dir / "train",
        predictions=run_dir / "predictions.csv",
    )
    att = json.loads((run_dir / "train" / "attempts.json").read_text())["attempts"]
    assert [(a["workers"], a["outcome"]) for a in att] == [(2, "completed")]
    assert final["workers"] == 2 and final["monitored_steps"] > 10
    assert all(d["action"] != "moved" for d in att[0]["drift"])


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
    d = refit.onto(model_inputs.planning(cfg), _pred(), 2, B, allowed=[1])
    assert (d.move, d.workers, d.global_batch) == (True, 1, B)
    assert "N=2 B=64 cannot run on the nodes left (N <= 1 can)" in d.reason
    assert "constraints.min_workers=2 cannot hold on them: dropped" in d.reason
    # where both can run, the objective's own choice (N = 2 is faster) and nothing dropped
    d = refit.onto(model_inputs.planning(cfg), _pred(), 2, B, allowed=[1, 2])
    assert d.workers == 2 and "dropped" not in d.reason


def test_a_lost_node_or_peer_is_resubmitted_at_most_max_requeues_times_in_a_row():
    """The launcher's rule after a failed attempt on SLURM: a worker's error that says a peer
    vanished is resubmitted at the same shape (the controller marks a dead node down only
    after SlurmdTimeout); any other failure ends the run; never more than
    launch.max_requeues times in a row."""
    from types import SimpleNamespace

    from tula.production.nodes import LOST_PEER, NodeWatch

    cfg = config.from_dict({"launch": {"max_requeues": 2}})
    watch = NodeWatch(cfg, None, None)
    gloo = "RuntimeError: [pair.cc:545] Read error [10.77.0.2]:42711: Connection reset by peer."
    assert LOST_PEER.search(gloo) and not LOST_PEER.search("ValueError: bad input shape")
    watch.start(4, 128, "local")  # a local job has no nodes to lose: the outcome stands
    assert watch.outcome(("failed", gloo), SimpleNamespace(job_id="1")) == ("failed", gloo)

    def ended(*outcomes):
        return [SimpleNamespace(outcome=o) for o in outcomes]

    assert watch.resubmits(ended("completed", "peer_lost"))
    assert watch.resubmits(ended("node_lost", "peer_lost"))
    assert not watch.resubmits(ended("peer_lost", "node_lost", "peer_lost"))
    assert not watch.resubmits(ended("failed")) and not watch.resubmits(ended("oom"))
