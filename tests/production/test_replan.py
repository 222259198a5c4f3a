"""launch.replan: move — a real run that moves (the decision itself, re-fit, re-predict,
re-select, pay for the relaunch, is tula.model.refit's: tests/model/test_refit.py). The drift
is a real delay in every synced step (fault ``slowsync``: what a slower network does to the
all-reduce; the network lab's real link is in test_netlab.py); the processes, checkpoints,
monitor and relaunch are the production job's own."""

import json

import pandas as pd
import pytest
import yaml

from conftest import REPLAN_B as B
from conftest import REPLAN_D as D
from conftest import replan_table, train_from_files
from selections import selection_json
from tula import config, faults
from tula.io import write_json


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

    replan_table().to_csv(tmp_path / "p.csv", index=False)
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
    write_json(tmp_path / "selection.json", selection_json(2, B))
    replan_table().to_csv(tmp_path / "predictions.csv", index=False)
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
