"""The production job: checkpoints, requeue, OOM relaunch at a smaller batch — nothing lost.

Real runs: `tula launch` with submitit's local executor (2 processes, gloo), real signals,
a real torch.OutOfMemoryError raised inside the model's forward (fault injection), real
checkpoint files. The SLURM `scontrol requeue` test is in test_slurm.py."""

import copy
import json
import math

import pandas as pd
import pytest
import yaml

from bounds import check_accuracy
from conftest import TINY, bitwise_equal, load_params, train_from_files, venv_env
from selections import selection, selection_json
from tula import config, faults
from tula.io import write_json
from tula.production import confirm, relaunch

D = 1437  # digits training samples


def _run_dir(d, raw):
    raw["launch"] = {"checkpoint_every_steps": 5, "poll_s": 0.5, "executor": "local"}
    (d / "config.yaml").write_text(yaml.safe_dump(raw))
    write_json(d / "selection.json", selection_json(2, 64))
    return d


@pytest.fixture
def run_dir(tmp_path, tiny_raw):
    return _run_dir(tmp_path, tiny_raw)


def _launch(d, out="train", **kw):
    return train_from_files(d / "config.yaml", d / "selection.json", d / out, **kw)


def _attempts(d, out="train"):
    return json.loads((d / out / "attempts.json").read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run of run_dir's configuration, made once for the tests that compare
    with it (they only read it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", venv_env()["PATH"])
        d = _run_dir(tmp_path_factory.mktemp("reference"), copy.deepcopy(TINY))
        final = _launch(d, "ref")
    return d / "ref", final


STEPS1 = math.ceil(D / 64)  # steps of epoch 1 at B=64 (23); epoch 2 starts with step 23


def _relaunched_after(run_dir, where, step, checkpoint_step, rank=1):
    """The attempt at B=64 ended as oom at `where` (the failing rank's record says so), the next
    resumed at B=32 from `checkpoint_step` and completed the run."""
    rec = _attempts(run_dir)
    a1, a2 = rec["attempts"]
    assert (a1["global_batch"], a1["outcome"], a1["checkpoint_step"]) == (
        64,
        "oom",
        checkpoint_step,
    )
    marker = json.loads((run_dir / "train" / "oom" / f"attempt1-rank{rank}.json").read_text())
    assert (marker["where"], marker["step"], marker["global_batch"]) == (where, step, 64)
    assert (a2["global_batch"], a2["outcome"], a2["start_step"]) == (
        32,
        "completed",
        checkpoint_step,
    )
    # the resumed epoch finishes at B=32 from the checkpoint's sample (none left at the epoch's
    # end), then epoch 2
    assert a2["end_step"] == checkpoint_step + math.ceil(
        (D - min(checkpoint_step * 64, D)) / 32
    ) + math.ceil(D / 32)
    assert rec["outcome"] == "completed" and list(
        pd.read_csv(run_dir / "train" / "metrics.csv")["epoch"]
    ) == [1, 2]
    return a1


@pytest.mark.training
def test_sigterm_then_resume_is_bitwise_equal_to_an_uninterrupted_run(
    run_dir, reference, monkeypatch
):
    ref_dir, ref_final = reference
    monkeypatch.setenv(faults.ENV, "signal:step=12,sig=TERM")
    with pytest.raises(RuntimeError, match="was stopped .*SIGTERM.*run the same command again"):
        _launch(run_dir)
    first = _attempts(run_dir)
    assert first["outcome"] == "stopped" and first["attempts"][0]["segments"][0]["end_step"] == 13
    assert not (run_dir / "train" / "final.json").exists()
    for output in ("attempts.json", "metrics.csv"):  # what Snakemake deletes when the rule fails
        (run_dir / "train" / output).unlink(missing_ok=True)
    monkeypatch.delenv(faults.ENV)
    final = _launch(run_dir)  # the same command again: resumes from the stop checkpoint
    att = _attempts(run_dir)["attempts"]
    assert [a["outcome"] for a in att] == ["stopped", "completed"]
    assert att[1]["start_step"] == 13 and att[1]["global_batch"] == 64
    assert final["steps"] == ref_final["steps"] == 2 * math.ceil(D / 64)
    assert bitwise_equal(
        load_params(run_dir / "train" / "model.pt"), load_params(ref_dir / "model.pt")
    )
    cols = ["epoch", "step", "lr", "train_loss", "train_acc", "test_loss", "test_acc"]
    m, r = pd.read_csv(run_dir / "train" / "metrics.csv"), pd.read_csv(ref_dir / "metrics.csv")
    assert m[cols].equals(r[cols])  # the partial epoch's sums were checkpointed per rank too


@pytest.mark.training
def test_usr2_checkpoints_and_submitit_requeues_within_one_launch(run_dir, reference, monkeypatch):
    ref_dir, _ = reference
    monkeypatch.setenv(faults.ENV, "signal:step=30,sig=USR2")
    _launch(run_dir)
    (att,) = _attempts(run_dir)["attempts"]
    assert att["outcome"] == "completed"
    assert [(s["start_step"], s["end_step"], s["outcome"]) for s in att["segments"]] == [
        (0, 31, "requeued"),
        (31, 46, "completed"),
    ]
    assert bitwise_equal(
        load_params(run_dir / "train" / "model.pt"), load_params(ref_dir / "model.pt")
    )


@pytest.mark.training
def test_oom_on_one_rank_relaunches_smaller_from_the_last_checkpoint(
    run_dir, venv_path, monkeypatch
):
    monkeypatch.setenv(faults.ENV, "oom:step=7,rank=1,batch=64")
    final = _launch(run_dir)
    rec = _attempts(run_dir)
    a1, a2 = rec["attempts"]
    assert (a1["global_batch"], a1["outcome"], a1["end_step"], a1["checkpoint_step"]) == (
        64,
        "oom",
        7,
        5,
    )
    assert "rank(s) [1]" in a1["reason"] and "out of memory" in a1["reason"]
    assert (a2["global_batch"], a2["outcome"], a2["start_step"]) == (32, "completed", 5)
    # Steps 0-4 at B=64 are kept, steps 5-6 (after the checkpoint) are redone at B=32 from sample
    # 320
    # of epoch 1: no step before the checkpoint is repeated or lost.
    expected = 5 + math.ceil((D - 5 * 64) / 32) + math.ceil(D / 32)
    assert final["steps"] == a2["end_step"] == expected and final["global_batch"] == 32
    m = pd.read_csv(run_dir / "train" / "metrics.csv")
    assert list(m["epoch"]) == [1, 2] and list(m["step"]) == [
        expected - math.ceil(D / 32),
        expected,
    ]
    assert (
        rec["outcome"] == "completed"
        and (run_dir / "train" / "oom" / "attempt1-rank1.json").exists()
    )


@pytest.mark.training
def test_truncated_newest_checkpoint_falls_back_to_the_previous_one(
    run_dir, venv_path, monkeypatch, capsys
):
    monkeypatch.setenv(faults.ENV, "truncate:step=10;oom:step=12,rank=0,batch=64")
    _launch(run_dir)
    a1, a2 = _attempts(run_dir)["attempts"]
    assert a1["outcome"] == "oom" and a2["start_step"] == 5  # not the torn step-10 checkpoint
    assert "checkpoint of step 10 skipped" in capsys.readouterr().out


@pytest.mark.training
def test_no_smaller_batch_left_is_a_clear_error(run_dir, venv_path, monkeypatch):
    monkeypatch.setenv(faults.ENV, "oom:step=3,rank=1")  # at every batch
    with pytest.raises(
        RuntimeError,
        match=r"out of memory at every global batch tried for N=2 \(64, 32\).*batch_min=32",
    ):
        _launch(run_dir)
    rec = _attempts(run_dir)
    assert rec["outcome"] == "failed" and [a["global_batch"] for a in rec["attempts"]] == [64, 32]
    assert not (run_dir / "train" / "final.json").exists()


@pytest.mark.training
def test_oom_in_backward_is_recorded_by_the_failing_rank_and_relaunched(
    run_dir, venv_path, monkeypatch
):
    # Rank 1 fails inside backward while rank 0 waits in DDP's all-reduce: no agreement is
    # possible; rank 0 dies of the broken connection, rank 1's record makes the attempt an oom.
    monkeypatch.setenv(faults.ENV, "oom:step=7,rank=1,batch=64,where=backward")
    _launch(run_dir)
    a1 = _relaunched_after(run_dir, "backward", 7, 5)
    assert a1["reason"].startswith("out of memory in the backward pass of step 7 (rank1): injected")


@pytest.mark.training
def test_oom_in_the_ags_refresh_is_agreed_and_relaunched(run_dir, venv_path, monkeypatch):
    # Step 23 is epoch 2's first step, where AGS refreshes its factors (method ags, the default).
    monkeypatch.setenv(faults.ENV, f"oom:step={STEPS1},rank=1,batch=64,where=refresh")
    _launch(run_dir)
    a1 = _relaunched_after(run_dir, "refresh", STEPS1, STEPS1)  # the end-of-epoch checkpoint
    assert a1["reason"].startswith(
        f"out of memory in AGS's factor refresh of step {STEPS1} on rank(s) [1]"
    )
    assert a1["segments"][0]["end_step"] == STEPS1


@pytest.mark.training
@pytest.mark.parametrize("rank", [0, 1])
def test_oom_while_checkpointing_leaves_no_partial_checkpoint_and_relaunches(
    run_dir, venv_path, monkeypatch, rank
):
    monkeypatch.setenv(faults.ENV, f"oom:step=10,rank={rank},batch=64,where=checkpoint")
    _launch(run_dir)
    a1 = _relaunched_after(run_dir, "checkpoint", 10, 5, rank=rank)
    assert a1["reason"].startswith(
        f"out of memory while writing the checkpoint of step 10 on rank(s) [{rank}]"
    )


@pytest.mark.training
def test_oom_in_evaluation_halves_the_eval_batch_without_a_relaunch(
    run_dir, reference, monkeypatch, capsys
):
    ref_dir, ref_final = reference
    # the evaluation after epoch 1
    monkeypatch.setenv(faults.ENV, f"oom:step={STEPS1},rank=1,where=eval")
    final = _launch(run_dir)
    (att,) = _attempts(run_dir)["attempts"]
    assert att["outcome"] == "completed" and not (run_dir / "train" / "oom").exists()
    assert ref_final["eval_batch_size"] == 256 and ref_final["eval_oom_retries"] == []
    (retry,) = final["eval_oom_retries"]
    assert (retry["step"], retry["eval_batch"], retry["retry_batch"], retry["ranks"]) == (
        STEPS1,
        256,
        128,
        [1],
    )
    assert final["eval_batch_size"] == 128  # kept for the rest of the run
    assert (
        "out of memory in evaluation on rank(s) [1] at 256 samples per worker: evaluating again at "
        "128" in (capsys.readouterr().out)
    )
    m, r = pd.read_csv(run_dir / "train" / "metrics.csv"), pd.read_csv(ref_dir / "metrics.csv")
    # the same evaluation, in smaller pieces
    assert m["test_acc"].tolist() == r["test_acc"].tolist()
    assert m["test_loss"].tolist() == pytest.approx(r["test_loss"].tolist(), rel=1e-6)
    assert bitwise_equal(
        load_params(run_dir / "train" / "model.pt"), load_params(ref_dir / "model.pt")
    )


@pytest.mark.training
def test_oom_in_evaluation_at_one_sample_per_worker_ends_the_attempt(
    tmp_path, tiny_raw, venv_path, monkeypatch
):
    tiny_raw["data"] = {"eval_batch_size": 1}
    tiny_raw["workload"]["epochs"] = 1
    tiny_raw["launch"] = {"checkpoint_every_steps": 5, "poll_s": 0.5, "executor": "local"}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(tiny_raw))
    write_json(tmp_path / "selection.json", selection_json(2, 64))
    monkeypatch.setenv(faults.ENV, f"oom:step={STEPS1},rank=0,batch=64,where=eval")
    _launch(tmp_path)
    a1, a2 = _attempts(tmp_path)["attempts"]
    assert a1["outcome"] == "oom" and a1["reason"].startswith(
        f"out of memory in evaluation after step {STEPS1} on rank(s) [0]"
    )
    assert (a2["global_batch"], a2["start_step"], a2["outcome"]) == (32, 20, "completed")


@pytest.mark.training
@pytest.mark.parametrize("method", ["lars", "polo"])
def test_every_baseline_trains_on_two_processes_and_resumes_bitwise(
    run_dir, monkeypatch, venv_path, method
):
    """Real 2-process training with the baselines that keep a state of their own, stopped by
    SIGTERM in epoch 2 and resumed: the same model, bit for bit, as an uninterrupted run. lars
    stands for lrs too (the same warm-up, the schedule's state; lrs adds no state, and
    tests/runtime/test_recipe.py checks both LRs step by step); static scales by a constant.
    Post-local SGD's stop falls in its local phase (polo_sync_epochs: 1), where the two replicas
    differ: both are checkpointed."""
    raw = yaml.safe_load((run_dir / "config.yaml").read_text())
    raw["train"].update(
        method=method, warmup_epochs=1, base_batch=32, polo_sync_epochs=1, polo_averages_per_epoch=4
    )
    (run_dir / "config.yaml").write_text(yaml.safe_dump(raw))
    ref = _launch(run_dir, "ref")
    assert ref["method"] == method and ref["steps"] == 2 * STEPS1
    # epoch 2, between two polo averages
    monkeypatch.setenv(faults.ENV, f"signal:step={STEPS1 + 7},sig=TERM")
    with pytest.raises(RuntimeError, match="was stopped"):
        _launch(run_dir)
    monkeypatch.delenv(faults.ENV)
    for output in ("attempts.json", "metrics.csv"):
        (run_dir / "train" / output).unlink(missing_ok=True)
    final = _launch(run_dir)
    assert [a["outcome"] for a in _attempts(run_dir)["attempts"]] == ["stopped", "completed"]
    assert bitwise_equal(
        load_params(run_dir / "train" / "model.pt"), load_params(run_dir / "ref" / "model.pt")
    )
    m = pd.read_csv(run_dir / "ref" / "metrics.csv")
    base_lr = config.load(run_dir / "config.yaml").train.lr  # small_cnn: 0.05
    # LR at the end of each epoch: lars warms up to k = B / base_batch = 2 over 1 epoch; polo
    # warms up to 1
    expected = {"lars": 2.0, "polo": 1.0}[method]
    assert m["lr"].tolist() == pytest.approx([base_lr * expected] * 2, rel=1e-6)
    assert final["final_test_acc"] == ref["final_test_acc"]
    check_accuracy(f"launcher baseline {method}", final["final_test_acc"])  # chance 0.1
    assert m["grad_noise_scale"].isna().all()  # no AGS refresh, no per-epoch noise scale


@pytest.mark.training
def test_ags_refresh_every_steps_refreshes_the_factors_on_that_period(run_dir, venv_path):
    raw = yaml.safe_load((run_dir / "config.yaml").read_text())
    raw["train"]["ags_refresh_every_steps"] = 5
    (run_dir / "config.yaml").write_text(yaml.safe_dump(raw))
    final = _launch(run_dir)
    assert final["method"] == "ags" and final["steps"] == 2 * STEPS1
    # steps 0, 5, ..., 45: every 5th, not per epoch
    assert final["ags"]["refreshes"] == math.ceil(2 * STEPS1 / 5)


def test_smaller_batches_follow_the_memory_model_else_halve(tmp_path):
    pred = tmp_path / "predictions.csv"
    pd.DataFrame(
        {
            "workers": [2, 2, 2, 2, 4],
            "global_batch": [32, 64, 128, 256, 128],
            "feasible": [True, True, False, True, True],
            "mem_bytes": [1.0, 2.0, 3.0, 4.0, 9.0],
        }
    ).to_csv(pred)
    assert relaunch.fallback_batches(2, 256, pred, floor=32) == [
        64,
        32,
    ]  # 128 infeasible, N=4 rows ignored
    assert relaunch.fallback_batches(2, 256, None, floor=32) == [128, 64, 32]
    assert relaunch.fallback_batches(4, 16, None, floor=1) == [
        8,
        4,
    ]  # at least one sample per worker


def test_record_prediction_puts_each_part_of_the_wall_time_beside_what_the_job_paid(
    tmp_path, capsys
):
    pred = tmp_path / "predictions.csv"
    pd.DataFrame(
        [
            {
                "workers": 2,
                "global_batch": 64,
                "step_time_s": 0.1,
                "step_time_lo_s": 0.09,
                "step_time_hi_s": 0.11,
                "train_time_s": 10.0,
                "train_time_lo_s": 9.0,
                "train_time_hi_s": 11.0,
                "epochs": 4,
                "startup_time_s": 3.0,
                "first_steps_time_s": 0.7,
                "eval_first_time_s": 0.8,
                "eval_time_s": 0.4,
                "checkpoint_time_s": 0.25,
                "checkpoints": 4,
                "wall_time_s": 16.7,
                "wall_time_lo_s": 15.7,
                "wall_time_hi_s": 17.7,
            }
        ]
    ).to_csv(pred, index=False)
    final_path = tmp_path / "final.json"
    write_json(
        final_path,
        {
            "workers": 2,
            "global_batch": 64,
            "mean_step_time_s": 0.11,
            "train_time_s": 11.0,
            "startup_time_s": 3.3,
            "first_steps_time_s": 0.6,
            "eval_time_s": 2.0,
            "checkpoint_time_s": 1.5,
            "wall_time_s": 18.9,
        },
    )
    final = confirm.record_prediction(final_path, pred)
    assert json.loads(final_path.read_text()) == final
    parts = {p["part"]: p for p in final["wall_check"]}
    assert list(parts) == [
        "steps",
        "start-up",
        "first steps",
        "evaluation",
        "checkpoints",
        "rest",
        "wall time",
    ]
    assert parts["first steps"]["predicted_s"] == 0.7 and parts["first steps"]["measured_s"] == 0.6
    # the first pass 0.8, then 3 x 0.4
    assert parts["evaluation"]["predicted_s"] == pytest.approx(2.0)
    assert parts["checkpoints"]["predicted_s"] == 1.0  # 4 x 0.25
    assert parts["checkpoints"]["ratio"] == pytest.approx(1.5)
    assert parts["rest"] == {
        "part": "rest",
        "predicted_s": None,
        "measured_s": pytest.approx(0.5),
        "ratio": None,
    }
    assert final["wall_time_ratio"] == pytest.approx(18.9 / 16.7) and final[
        "predicted_wall_time_interval_s"
    ] == [15.7, 17.7]
    assert "checkpoints  predicted 1.0 s, paid 1.5 s (x1.500)" in capsys.readouterr().out


def test_the_steps_timed_apart_are_taken_out_of_t_where_the_prediction_counts_them(tmp_path):
    """T counts every step at the step's rate, while the job times its first step at each
    shape apart (first_steps_time_s) and the rest as training: the steps part predicted is T
    less those steps, so that the parts add up to the wall time predicted."""
    pred = tmp_path / "predictions.csv"
    row = dict(workers=2, global_batch=256, step_time_s=0.2, step_time_lo_s=0.1, step_time_hi_s=0.3)
    row |= dict(train_time_s=1.2, train_time_lo_s=0.6, train_time_hi_s=1.8, epochs=3)
    row |= dict(startup_time_s=4.0, first_steps=2, first_steps_time_s=0.6, eval_first_time_s=0.1)
    row |= dict(eval_time_s=0.05, checkpoint_time_s=0.01, checkpoints=3)
    # start-up + T + the first steps beyond T's rate + evaluation + checkpoints
    row |= dict(wall_time_s=4.0 + 1.2 + (0.6 - 2 * 0.2) + 0.2 + 0.03)
    row |= dict(wall_time_lo_s=4.83, wall_time_hi_s=6.03)
    pd.DataFrame([row]).to_csv(pred, index=False)
    final_path = tmp_path / "final.json"
    paid = dict(workers=2, global_batch=256, mean_step_time_s=0.2, train_time_s=0.8)
    paid |= dict(startup_time_s=4.0, first_steps_time_s=0.6, eval_time_s=0.2)
    write_json(final_path, paid | dict(checkpoint_time_s=0.03, wall_time_s=5.63))
    final = confirm.record_prediction(final_path, pred)
    parts = {p["part"]: p for p in final["wall_check"]}
    # 6 steps at 0.2 s: 2 timed apart, 4 as training
    assert parts["steps"]["predicted_s"] == pytest.approx(0.8)
    assert final["train_time_ratio"] == pytest.approx(1.0)
    predicted = sum(parts[k]["predicted_s"] for k in ("steps", "start-up", "first steps"))
    predicted += parts["evaluation"]["predicted_s"] + parts["checkpoints"]["predicted_s"]
    assert predicted == pytest.approx(parts["wall time"]["predicted_s"])
    assert final["wall_time_ratio"] == pytest.approx(1.0)


@pytest.mark.training
@pytest.mark.slow
def test_compiled_training_relaunches_after_an_oom_and_resumes_from_the_checkpoint(
    run_dir, venv_path, monkeypatch
):
    """train.compile on: torch.compile of the model in the production job; an out-of-memory
    error still relaunches at a smaller batch, from the checkpoint; each new shape's first step
    (compilation) is counted apart from the steady step."""
    raw = yaml.safe_load((run_dir / "config.yaml").read_text())
    raw["train"]["compile"] = "on"
    (run_dir / "config.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.setenv(faults.ENV, "oom:step=7,rank=1,batch=64")
    final = _launch(run_dir)
    a1, a2 = _attempts(run_dir)["attempts"]
    assert (a1["outcome"], a1["checkpoint_step"], a2["outcome"], a2["start_step"]) == (
        "oom",
        5,
        "completed",
        5,
    )
    assert final["compile"] == "on" and final["global_batch"] == 32
    assert final["steps"] == 5 + math.ceil((D - 5 * 64) / 32) + math.ceil(D / 32)
    # each shape's first step, compiled and timed apart: attempt 1's full batch at B=64, then
    # attempt 2's full and short batches at B=32 (the run's times carry over its attempts)
    assert final["first_steps"] == 3 and final["first_steps_time_s"] > 0
    check_accuracy("launcher compiled, relaunched after an OOM", final["final_test_acc"])


def test_a_job_whose_every_step_is_timed_apart_has_no_training_ratio(tmp_path):
    """One epoch of one step: the step is the job's first at its shape, timed apart, so no
    training step is left to compare; the ratio is None, and the summary says the rest."""
    from tula import config
    from tula.stages.summary import _paid

    pred = tmp_path / "predictions.csv"
    row = dict(workers=1, global_batch=512, step_time_s=0.2, step_time_lo_s=0.1, step_time_hi_s=0.3)
    row |= dict(train_time_s=0.2, train_time_lo_s=0.1, train_time_hi_s=0.3, first_steps=1)
    pd.DataFrame([row]).to_csv(pred, index=False)
    final_path = tmp_path / "final.json"
    write_json(
        final_path, dict(workers=1, global_batch=512, mean_step_time_s=0.0, train_time_s=0.0)
    )
    final = confirm.record_prediction(final_path, pred)
    assert final["train_time_ratio"] is None and final["predicted_train_time_s"] == 0.2
    said = _paid(final, selection(1, 512, cost=0.1), config.from_dict({}))
    assert said[0].startswith("training steps predicted") and "(x" not in said[0]
