"""A production job's folder, attempts and submission (tula.production.jobdir, .attempts,
.submission): submitit's executor and what it writes for SLURM, a job left running by a dead
launcher, which checkpoints a run may resume, and how a finished job's outcome is read."""

import functools
import pickle
import subprocess
import sys

import pytest
import yaml

from conftest import checkpoint_state
from job_bodies import finish_with
from tula import checkpoint, config
from tula.production import attempts, jobdir, submission
from tula.production.job import ProductionJob


@pytest.mark.parametrize(
    "cfg_part, cfg_acct, expect",
    [
        (None, None, ("profile_part", "profile_acct")),  # the profile's (passed by the launch rule)
        ("config_part", "config_acct", ("config_part", "config_acct")),  # the config's win
        ("config_part", None, ("config_part", "profile_acct")),  # each key on its own
    ],
)
def test_config_partition_and_account_take_precedence_over_the_profile(
    tiny_raw, tmp_path, cfg_part, cfg_acct, expect
):
    import shutil

    if not shutil.which("sbatch"):
        pytest.skip("the SLURM executor needs sbatch on PATH")
    tiny_raw["launch"] = {
        "executor": "slurm",
        "slurm_partition": cfg_part,
        "slurm_account": cfg_acct,
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(tiny_raw))
    cfg = config.load(tmp_path / "c.yaml")
    ex = submission.make_executor(
        cfg, "slurm", tmp_path / "submitit", 2, 30, partition="profile_part", account="profile_acct"
    )
    params = ex._executor.parameters  # what submitit writes as #SBATCH lines
    assert (params["partition"], params["account"]) == expect
    assert params["time"] == 30 and params["ntasks_per_node"] * params["nodes"] == 2


def test_a_local_job_left_running_by_a_dead_launcher_is_not_started_twice(tmp_path):
    import os
    import subprocess

    prior = {"executor": "local", "attempts": [{"outcome": "running", "job_id": str(os.getpid())}]}
    with pytest.raises(RuntimeError, match=rf"still running; .*kill {os.getpid()}"):
        submission.still_running(prior, tmp_path, 2)
    gone = subprocess.Popen(["true"])
    gone.wait()
    prior["attempts"][0]["job_id"] = str(gone.pid)
    assert submission.still_running(prior, tmp_path, 2) is None
    prior["attempts"][0]["outcome"] = "completed"
    assert submission.still_running(prior, tmp_path, 2) is None


def test_only_an_unfinished_newest_checkpoint_of_this_run_is_resumed(tmp_path):
    checkpoint.save(tmp_path, {**checkpoint_state(1), "complete": False}, 5)
    assert jobdir.resumable(tmp_path, "f") and not jobdir.resumable(tmp_path, "other settings")
    checkpoint.save(tmp_path, {**checkpoint_state(2), "complete": True}, 10)  # the run finished
    assert not jobdir.resumable(tmp_path, "f")  # its older step-5 checkpoint must not be resumed


def test_the_history_round_trips_through_both_copies_of_attempts_json(tmp_path):
    h = attempts.History(tmp_path, "fp", 2, 64, "local")
    h.attempts.append(
        attempts.Attempt(
            1, 64, 32, "123", 0, end_step=23, checkpoint_step=20, outcome="oom", reason="x"
        )
    )
    h.write("running")
    copies = [tmp_path / "attempts.json", tmp_path / "checkpoints" / "attempts.json"]
    assert copies[0].read_text() == copies[1].read_text()
    prior = attempts.History.read(tmp_path)
    assert {
        k: prior[k] for k in ("fingerprint", "workers", "selected_batch", "executor", "outcome")
    } == {
        "fingerprint": "fp",
        "workers": 2,
        "selected_batch": 64,
        "executor": "local",
        "outcome": "running",
    }
    assert attempts.History.attempts_of(prior) == h.attempts
    copies[
        0
        # Snakemake deletes the rule's output when the rule fails: the copy by the checkpoints stays
    ].unlink()
    assert attempts.History.read(tmp_path)["attempts"][0]["outcome"] == "oom"


def test_a_resumed_history_closes_an_attempt_whose_job_is_gone_and_knows_its_oom_batches(
    tmp_path,
):
    """What a new `tula launch` of the same run makes of the record it finds: the last attempt,
    still `running` with no job left, ended as interrupted (not when its job is still alive);
    the batches that ran out of memory, never tried again; what the terminal is told."""
    h = attempts.History(tmp_path, "fp", 2, 128, "local")
    h.add(attempts.Attempt(1, 128, 64, "1", 0, outcome="oom", reason="out of memory"))
    h.add(attempts.Attempt(2, 64, 32, "2", 10))
    h.close_interrupted(job_alive=True)
    assert h.attempts[-1].outcome == "running"
    h.close_interrupted(job_alive=False)
    assert h.attempts[-1].outcome == "interrupted" and "newest checkpoint" in h.attempts[-1].reason
    assert h.oom_batches() == {128}
    done = attempts.Attempt(3, 64, 32, "3", 10, outcome="completed", reason="fine")
    done.account(
        [{"start_step": 10, "end_step": 20}, {"start_step": 20, "end_step": 30}],
        30,
        [{"step": 15, "reason": "sync 2x", "action": "recorded"}],
    )
    assert done.report_lines() == [
        "attempt 3: network drift at step 15: sync 2x — recorded",
        "attempt 3 ended: completed after 1 preemption/requeue(s), each resumed from its "
        "checkpoint",
    ]
    assert h.attempts[0].report_lines() == ["attempt 1 ended: oom — out of memory"]


def test_starting_over_clears_what_another_run_left_and_keeps_the_rest(tmp_path):
    for stale in ("checkpoints/step_10/model.pt", "oom/attempt1-rank0.json"):
        (tmp_path / stale).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / stale).write_text("x")
    for f in ("segments.json", "started.json", "attempts.json", "metrics.csv"):
        (tmp_path / f).write_text("{}")
    jobdir.start_over(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attempts.json", "metrics.csv"]


@pytest.mark.slow
def test_a_finished_jobs_outcome_is_read_from_its_result_its_oom_record_or_its_segments(
    tmp_path, tiny_raw, user_pythonpath
):
    cfg = config.from_dict({**tiny_raw, "launch": {"executor": "local"}})
    ex = submission.make_executor(cfg, "local", tmp_path / "submitit", 1, 5)
    cases = [
        ({"outcome": "completed", "step": 46}, ("completed", "trained every epoch")),
        (
            {
                "outcome": "oom",
                "step": 7,
                "ranks": [1],
                "message": "CUDA out of memory",
                "place": "in the forward pass of step 7",
            },
            (
                "oom",
                "out of memory in the forward pass of step 7 on rank(s) [1]: CUDA out of memory",
            ),
        ),
        (RuntimeError("boom"), ("failed", "RuntimeError: boom")),
    ]
    for attempt, (result, expected) in enumerate(cases, 1):
        job = submission.submit(ex, functools.partial(finish_with, result), "local")
        submission.wait(job, 0.2)
        assert submission.outcome(job, tmp_path, attempt) == expected
    # a rank that ran out of memory in backward left its record before the job failed
    jobdir.oom_record_path(tmp_path, 4, 1).parent.mkdir(parents=True, exist_ok=True)
    jobdir.oom_record_path(tmp_path, 4, 1).write_text(
        '{"place": "in the backward pass of step 9", "message": "OOM"}'
    )
    job = submission.submit(ex, functools.partial(finish_with, RuntimeError("peer lost")), "local")
    submission.wait(job, 0.2)
    assert submission.outcome(job, tmp_path, 4) == (
        "oom",
        "out of memory in the backward pass of step 9 (rank1): OOM",
    )
    # a job stopped by TERM: its last segment says so
    jobdir.add_segment(
        tmp_path,
        {
            "attempt": 5,
            "start_step": 0,
            "end_step": 13,
            "outcome": "stopped",
            "reason": "SIGTERM (preemption, time limit or cancel): checkpointed; exiting",
        },
    )
    job = submission.submit(ex, functools.partial(finish_with, SystemExit(143)), "local")
    submission.wait(job, 0.2)
    asked = []  # submitit writes no result after SystemExit, and waits 15 s for one if asked
    job.results = lambda: asked.append("results") or job.__class__.results(job)
    assert submission.outcome(job, tmp_path, 5) == (
        "stopped",
        "SIGTERM (preemption, time limit or cancel): checkpointed; exiting",
    )
    assert asked == []
    assert jobdir.segments(tmp_path, 5)[0]["end_step"] == 13 and jobdir.segments(tmp_path, 4) == []


def test_the_production_job_unpickles_without_the_launcher(tmp_path):
    """submitit unpickles the job in every task before it runs; its module is imported then.
    The launcher's module (pandas' frames, the selection) would cost each task start-up the
    probe's workers do not pay, so the job is a module of its own."""
    ck = checkpoint.Checkpointing(
        directory=tmp_path, fingerprint="f", every_steps=None, every_epochs=1, keep=2
    )
    blob = tmp_path / "job.pkl"
    blob.write_bytes(pickle.dumps(ProductionJob(config.from_dict({}), 2, 64, str(tmp_path), ck)))
    code = (
        f"import pickle, sys; job = pickle.loads(open({str(blob)!r}, 'rb').read()); "
        "print(type(job).__module__, sorted(m for m in sys.modules if "
        "m.startswith(('tula.stages', 'tula.production.launcher')) or m == 'torch'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split(maxsplit=1)
    assert out == [
        "tula.production.job",
        "[]\n",
    ]  # no stage, no launcher, and no torch until the job runs


def test_a_start_that_left_no_record_is_a_lost_stretch_when_the_job_resumes(tmp_path):
    """Rank 0's processes killed with their node write no segment; the requeued job, resuming
    from the checkpoint of step 24, records the stretch the first start trained (from its step
    in started.json) as lost. A start whose segment is there, and a new attempt's first start,
    add nothing."""
    from tula.io import write_json

    assert jobdir.unrecorded_stretch(tmp_path, 1, 24) is None  # nothing started yet
    write_json(jobdir.started_path(tmp_path), {"attempt": 1, "step": 0, "first_step_time": 1.0})
    lost = jobdir.unrecorded_stretch(tmp_path, 1, 24)
    assert lost is not None
    assert (lost["start_step"], lost["end_step"], lost["outcome"]) == (0, 24, "lost")
    assert "from the checkpoint of step 24" in lost["reason"]
    assert jobdir.unrecorded_stretch(tmp_path, 2, 24) is None  # attempt 2's first start
    assert jobdir.unrecorded_stretch(tmp_path / "x", 1, 0) is None
    write_json(jobdir.started_path(tmp_path / "x"), {"attempt": 1, "step": 40})
    assert jobdir.unrecorded_stretch(tmp_path / "x", 1, 0) is None  # not this run's start
    # the launcher, once attempt 1's job has ended (its next attempt resumes): the same stretch
    assert jobdir.attempt_segments(tmp_path, 1, 24) == [lost]
    assert jobdir.attempt_segments(tmp_path, 1, 24) == [lost]  # written once
    (tmp_path / "segments.json").unlink()
    jobdir.add_segment(
        tmp_path, {"attempt": 1, "start_step": 0, "end_step": 28, "outcome": "requeued"}
    )
    assert jobdir.unrecorded_stretch(tmp_path, 1, 28) is None  # that start said how it ended
