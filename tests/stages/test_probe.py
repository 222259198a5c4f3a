"""The probe (tula.stages.probe, tula.runtime.probe.probe_worker), for real: torchrun, 2 gloo
workers, a real DDP model; failures (out of memory, errors, timeouts) are recorded, never raised."""

import json

import numpy as np
import pytest

import bounds
from tula.faults import ENV as FAULT_ENV
from tula.runtime.probe.measure import PROFILER_TRIES
from tula.stages import probe
from user_workload import SLOW_SAMPLE_S


@pytest.mark.probe
def test_two_process_gloo_probe(tiny_config_file, tmp_path, venv_path):
    out = tmp_path / "probes" / "N2_B64.json"
    rec = probe.run(tiny_config_file, 2, 64, out)
    assert json.loads(out.read_text()) == json.loads(json.dumps(rec))
    assert rec["status"] == "ok", rec.get("error")
    assert (
        rec["local_batch"] == 32
        and rec["env"]["world_size"] == 2
        and rec["env"]["backend"] == "gloo"
    )
    assert len(rec["env"]["hostnames"]) == 2
    assert 0 < rec["compute_time_s"] and 0 < rec["step_time_s"] and rec["sync_time_s"] >= 0
    # of the compute-only step, the micro-batch's move, forward and backward (not its fetch,
    # the flags' all-reduce nor the optimizer's step: what an accumulated step pays once)
    assert 0 < rec["micro_time_s"] < rec["compute_time_s"]
    # on CPU (no queue) every timed step is timed alone, synced and compute-only alternating, at
    # least probe.timed_steps = 3 of each, until both means are within probe.precision or the
    # budget (0.5 s here) is spent; the record says which
    assert rec["timing_mode"] == "steps" and rec["block_steps"] == 1
    assert rec["step_timed_steps"] >= 3 and rec["compute_timed_steps"] >= 3
    assert len(rec["step_times_s"]) == rec["step_timed_steps"] and rec["step_time_iqr_s"] >= 0
    # the step and the compute are what their timed steps took, each with the same extras
    # (an epoch's start, its short last batch, a refresh): they differ by the synced steps'
    # mean less the compute-only ones', and that is the sync
    mean = {a: sum(rec[f"{a}_times_s"]) / len(rec[f"{a}_times_s"]) for a in ("step", "compute")}
    apart = mean["step"] - mean["compute"]
    assert rec["step_time_s"] - rec["compute_time_s"] == pytest.approx(apart, rel=1e-6, abs=1e-12)
    assert rec["sync_time_s"] == pytest.approx(max(apart, 0.0), rel=1e-6, abs=1e-12)
    target = rec["precision_target"]
    reached = max(rec["step_time_halfwidth_rel"], rec["compute_time_halfwidth_rel"]) <= target
    assert rec["precision_target"] == 0.02 and rec["precision_reached"] is reached
    assert rec["timing_stopped_by"] == ("precision" if reached else "budget")
    assert rec["timing_budget_s"] == 0.5 and (reached or rec["timing_s"] >= rec["timing_budget_s"])
    # The probe ran the production step: AGS (the default method) refreshed at the first step of
    # every epoch. Steps of the epoch's iterator: the first pair (a synced and a compute-only step,
    # what a new shape costs once), the first short last batch, 1 warm-up pair, the timed steps of
    # both kinds (epoch starts and short batches met among them included), each round's untimed
    # synced lead-in step, epoch starts started
    # until 3 are timed, and the two memory steps (a plain step and a forced AGS refresh, each
    # measured alone); the optimizer also stepped once more for the Eq. 3 breakdown, which takes
    # no position. Torch's CPU profiler now and then cannot build a step's memory timeline: that
    # memory step is measured again, one step more.
    c, extra = rec["optimizer_counters"], rec["profiler_retries"]
    assert set(extra) == {"plain", "refresh"} and all(
        0 <= v < PROFILER_TRIES for v in extra.values()
    )
    timed = sum(
        rec[f"{a}_timed_steps"] + sum(rec[f"{a}_other_steps"].values()) for a in ("step", "compute")
    )
    starts = rec["epoch_start_step_times_s"]
    assert len(starts) >= 3
    started = len(starts) - rec["step_other_steps"].get("start", 0)
    # each round of the timer is led by an untimed synced step: one per sample of the synced arm
    lead = rec["step_timed_steps"] + sum(rec["step_other_steps"].values())
    assert sum(rec["lead_in_steps"].values()) == lead
    assert rec["steps_run"] == 2 + 1 + 2 + lead + timed + started + 2 + sum(extra.values())
    assert c["steps"] == rec["steps_run"] + 1
    # refreshes: every epoch's first step (the timed ones of both kinds and the lead-ins among
    # them), the forced
    # one, and the first memory step where it started an epoch
    met = (
        rec["step_other_steps"].get("start", 0)
        + rec["compute_other_steps"].get("start", 0)
        + rec["lead_in_steps"].get("start", 0)
    )
    least = 1 + met + started + 1
    assert least <= c["refreshes"] <= least + 1 + extra["refresh"]
    assert rec["peak_mem_bytes"] == max(rec["plain_peak_bytes"], rec["refresh_peak_bytes"])
    # step time = mean plain step + the epoch start's extra time at training's rate: once per epoch
    # of ceil(1437 / 64) = 23 steps
    assert (
        rec["steps_per_epoch"] == 23
        and rec["epoch_start_extra_s"] >= 0
        and rec["refresh_extra_s"] == 0
    )
    # ... and the short last batch's saving (its steps timed apart, like the starts)
    plain = sum(rec["step_times_s"]) / len(rec["step_times_s"])
    extras = rec["epoch_start_extra_s"] + rec["partial_extra_s"]
    assert rec["step_time_s"] == pytest.approx(plain + extras / 23)
    mem = rec["memory"]
    assert (
        mem["act_bytes"] > 0
        and mem["grad_bytes"] == mem["param_bytes"] == rec["grad_bytes_per_step"]
    )
    # SGD's momentum and AGS's per-parameter scale: two buffers per parameter (the memory step comes
    # after the first steps, as in training, so AGS's factors exist)
    assert mem["opt_bytes"] == 2 * mem["param_bytes"]
    assert mem["batch_bytes"] == 32 * 64 * 4 + 32 * 8  # float32 8x8 images + int64 labels
    # The peak is measured, and nearly without noise: the same allocations in the same order give
    # the same bytes at N = 1 and N = 2 alike (DDP's buckets are not in the CPU timeline), to a
    # few small tensors that come and go (24 and 488 B apart in the runs measured, of 4 MB). So
    # its relations to Eq. 3 hold to ``slack``, 8 of the CPU allocator's 512 B blocks, 2 % of one
    # gradient's bytes:
    # - every term of Eq. 3 is live at the step's peak;
    # - the compute-only steps' peaks (the sweep's b = 16, 64, 128) lie on one line in b, as
    #   Eq. 3 says memory grows (its slope is above Eq. 3's per-sample bytes: backward's
    #   gradients of activations, which Eq. 3 leaves out and the memory fit takes from these
    #   peaks);
    # - the plain step holds one gradient more than a compute-only step at its batch (the
    #   optimizer step's gradient-sized buffer), and AGS's refresh at most one more again (the
    #   small-batch gradient beside the large one, Algorithm 1).
    slack = 8 * 512
    assert mem["model_total_bytes"] <= rec["plain_peak_bytes"]
    sweep_peak = {s["local_batch"]: s["peak_mem_bytes"] for s in rec["sweep"]}
    slope, intercept = np.polyfit(list(sweep_peak), list(sweep_peak.values()), 1)
    assert all(abs(p - (intercept + slope * b)) <= slack for b, p in sweep_peak.items())
    assert slope > (mem["act_bytes"] + mem["batch_bytes"]) / 32
    plain_over_compute = rec["plain_peak_bytes"] - (intercept + slope * 32)
    assert plain_over_compute == pytest.approx(mem["grad_bytes"], abs=slack)
    assert (
        -slack <= rec["refresh_peak_bytes"] - rec["plain_peak_bytes"] <= mem["grad_bytes"] + slack
    )
    assert not (out.parent / ".N2_B64.ranks").exists()
    # what the production job pays besides its steps, measured once as it pays it: start-up to the
    # first step, a first and a later evaluation pass, one checkpoint write (removed after; no step
    # taken, see steps_run)
    assert all(
        rec[k] > 0
        for k in ("startup_time_s", "eval_first_time_s", "eval_time_s", "checkpoint_time_s")
    )
    assert "overheads_error" not in rec
    # the compute curve: the grid's other local batches (16 = 32/2, 64, 128), compute-only steps in
    # this same job, each row with its own mean, noise and peak memory, growing with the batch
    sweep = rec["sweep"]
    assert [s["local_batch"] for s in sweep] == [16, 64, 128] and all(
        s["status"] == "ok" for s in sweep
    )
    # in rounds of 4 steps at each batch, each step timed alone: at least probe.sweep_steps = 6 of
    # each (an epoch's first step set apart), until within the precision or the budget is spent
    for s in sweep:
        assert s["compute_timed_steps"] == len(s["compute_times_s"]) >= 6
        assert s["compute_time_cv"] >= 0 and s["precision_reached"] is (
            s["compute_time_halfwidth_rel"] <= target
        )
    peaks = [s["peak_mem_bytes"] for s in sweep]
    assert peaks[0] < rec["plain_peak_bytes"] < peaks[1] < peaks[2]
    # the gradient noise scale: probe.noise_steps (16) untimed steps at the weights the timed steps
    # reached, b = 32 per worker against the all-reduced B = 64; no optimizer step, no position
    # taken
    gn = rec["gradient_noise"]
    assert (gn["steps"], gn["small_batch"], gn["big_batch"]) == (16, 32, 64) and gn["time_s"] > 0
    # |G|^2 is estimated from 16 steps at weights that a varying number of timed steps reached
    # (the timer stops at its precision): it was 1.7 standard errors above zero in one run, so
    # only its sign decides whether there is a noise scale
    assert rec["grad_trace"] == gn["trace"] > 0 and rec["grad_sq"] == gn["grad_sq"]
    assert gn["grad_sq_se"] > 0 and gn["trace_se"] > 0
    if rec["grad_sq"] > 0:
        assert rec["grad_noise_scale"] == pytest.approx(rec["grad_trace"] / rec["grad_sq"])
    else:
        assert rec["grad_noise_scale"] is None


@pytest.mark.probe
def test_activation_memory_grows_linearly_with_batch(tiny_config_file, tmp_path, venv_path):
    one = probe.run(tiny_config_file, 1, 32, tmp_path / "a.json")
    a = one["memory"]["act_bytes"]
    b = probe.run(tiny_config_file, 1, 64, tmp_path / "b.json")["memory"]["act_bytes"]
    assert 0 <= 2 * a - b <= bounds.FIXED_ACTIVATION_BYTES, (a, b)
    # one worker has no second batch size: no noise scale, and the record says why
    assert one["gradient_noise"] == {
        "b_noise": None,
        "why": "one worker: no second batch size to compare with",
    }
    assert "grad_noise_scale" not in one


@pytest.mark.probe
def test_oom_on_one_rank_is_agreed_on_by_the_step_and_recorded(
    tiny_config_file, tmp_path, venv_path, monkeypatch
):
    # raised in rank 1's forward, inside the step
    monkeypatch.setenv(FAULT_ENV, "oom:point=N2_B64,rank=1")
    rec = probe.run(tiny_config_file, 2, 64, tmp_path / "N2_B64.json")
    # rank 0 did not run out of memory, yet reports it: the step's agreement all-reduce told it
    assert rec["status"] == "oom" and "rank(s) [1]" in rec["error"] and "injected" in rec["error"]
    assert "step_time_s" not in rec and rec["wall_s"] < 60  # nobody waited for a collective timeout


@pytest.mark.probe
def test_a_probe_past_probe_timeout_s_is_killed_and_says_where_each_rank_was(
    tiny_raw, tmp_path, venv_path, monkeypatch, capfd
):
    """Workers that do not finish in probe.timeout_s are killed with their whole process group;
    the probe records status timeout (the DAG goes on without the point) instead of hanging,
    names the phase each rank had reached, and the log holds the hung rank's Python stack."""
    import subprocess
    import time

    import yaml

    # rank 1 stops as it starts; rank 0 then waits for it in the rendezvous. The limit is the
    # shortest that still lets rank 0 reach it: its start-up (torch and DDP's imports, about
    # 4-8 s on 2 loaded cores) with room to spare.
    monkeypatch.setenv("TULA_INJECT_FAULT", "hang:point=N2_B64,rank=1,where=started")
    tiny_raw["probe"].update(timeout_s=15)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(tiny_raw))
    t0 = time.monotonic()
    rec = probe.run(cfg, 2, 64, tmp_path / "N2_B64.json")
    assert time.monotonic() - t0 < 80  # killed at the limit, not run to the end
    assert rec["status"] == "timeout"
    assert [(r["rank"], r["phase"]) for r in rec["ranks_reached"]] == [
        (0, "process group"),
        (1, "started"),
    ]
    assert rec["error"].startswith(
        "probe exceeded probe.timeout_s=15s: rank 0 in 'process group' for "
    ), rec["error"]
    assert "rank 1 in 'started' for " in rec["error"]
    assert json.loads((tmp_path / "N2_B64.json").read_text())["ranks_reached"][1]["for_s"] > 0
    left = subprocess.run(["pgrep", "-f", str(cfg)], capture_output=True, text=True).stdout.split()
    assert left == [], f"workers of the killed probe still run: {left}"
    # each worker printed its stacks before it was killed: the hung one names where it waits
    err = capfd.readouterr().err
    assert "Timeout (0:00:" in err and "hang_if_due" in err, err[-3000:]


def test_phases_reached_names_a_rank_that_never_said_as_not_started(tmp_path):
    from tula.workers import phases

    phases.mark(tmp_path, 0, "sweep")
    (tmp_path / "rank2.phase.json").write_text("{not json")  # cut as it was written: unknown
    reached = phases.phases_reached(tmp_path, 3)
    assert [r["phase"] for r in reached] == ["sweep", "not started", "not started"]
    assert 0 <= reached[0]["for_s"] < 60 and reached[1]["for_s"] is None
    assert phases.describe_phases(reached).startswith("rank 0 in 'sweep' for ")


@pytest.mark.probe
def test_worker_error_is_recorded(tiny_raw, tmp_path, venv_path):
    import torch
    import yaml

    if torch.cuda.is_available():
        pytest.skip("this failure needs a machine without CUDA")
    tiny_raw["hardware"] = {"device": "cuda", "backend": "gloo"}
    cfg = tmp_path / "cuda.yaml"
    cfg.write_text(yaml.safe_dump(tiny_raw))
    rec = probe.run(cfg, 1, 32, tmp_path / "N1_B32.json")
    assert rec["status"] == "error"
    assert "config key 'hardware.device' is cuda" in rec["error"] and "has no GPU" in rec["error"]
    assert json.loads((tmp_path / "N1_B32.json").read_text())["status"] == "error"


@pytest.mark.probe
def test_probe_of_a_user_model_and_dataset_imported_on_every_worker(
    tmp_path, venv_path, user_pythonpath
):
    import yaml

    cfg = tmp_path / "user.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "workload": {
                    "model": "user_workload:make_model",
                    "dataset": "user_workload:make_datasets",
                },
                "probe": {"warmup_steps": 1, "timed_steps": 2, "time_budget_s": 0.5},
            }
        )
    )
    # both torchrun workers import tests/user_workload.py
    rec = probe.run(cfg, 2, 32, tmp_path / "N2_B32.json")
    assert rec["status"] == "ok", rec.get("error")
    assert rec["model"] == "user_workload:make_model" and rec["train_samples"] == 300
    assert rec["memory"]["param_bytes"] == 4 * (16 * 32 + 32 + 32 * 3 + 3)


@pytest.mark.probe
def test_a_uint8_npz_set_is_probed_with_its_batches_standardised_on_the_device(tmp_path, venv_path):
    """A uint8 image set kept on the device (data.on_device: true gathers there on CPU too):
    the probe's steps, its memory step and evaluation all take standardised float input (a
    uint8 batch into the network would fail its first convolution), and the probe records the
    resident set."""
    import numpy as np
    import yaml

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(256, 1, 8, 8), dtype=np.uint8)
    np.savez(
        tmp_path / "u8.npz",
        x_train=x,
        y_train=np.arange(256) % 10,
        x_test=x[:64],
        y_test=np.arange(64) % 10,
    )
    cfg = tmp_path / "u8.yaml"
    raw = {
        "workload": {"dataset": f"npz:{tmp_path / 'u8.npz'}"},
        "data": {"on_device": True},
        "grid": {"workers": [1], "batch_min": 32, "batch_max": 64},
        "probe": {"warmup_steps": 1, "timed_steps": 2, "time_budget_s": 0.3, "sweep_steps": 0},
    }
    cfg.write_text(yaml.safe_dump(raw))
    rec = probe.run(cfg, 1, 32, tmp_path / "N1_B32.json")
    assert rec["status"] == "ok", rec.get("error")
    assert rec["on_device"] is True and rec["step_time_s"] > 0 and rec["eval_time_s"] > 0
    assert rec["memory"]["batch_bytes"] == 32 * 64 * 4 + 32 * 8  # the step's float input


@pytest.mark.probe
def test_a_slow_input_makes_the_probe_input_bound_and_the_prediction_follow_it(
    tmp_path, venv_path, user_pythonpath
):
    """A training set that sleeps 10 ms per sample (user_workload.SlowBlobs) under a model that
    steps in well under a millisecond: the probe reads the input alone, finds it sets the pace,
    and the step model's floor predicts the measured steps within the probes' noise."""
    import yaml

    from tula.model import measurements, perf
    from tula.stages import aggregate

    cfg = tmp_path / "slow.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "workload": {
                    "model": "user_workload:make_model",
                    "dataset": "user_workload:make_slow_datasets",
                    "epochs": 1,
                },
                "grid": {"workers": [1], "batch_min": 8, "batch_max": 16},
                "data": {"num_workers": 0},
                "probe": {
                    "warmup_steps": 1,
                    "timed_steps": 10,
                    "input_batches": 4,
                    "time_budget_s": 0.5,
                },
            }
        )
    )
    files = []
    for b in (8, 16):
        files.append(tmp_path / f"N1_B{b}.json")
        rec = probe.run(cfg, 1, b, files[-1])
        assert rec["status"] == "ok", rec.get("error")
        assert rec["env"]["data_workers"] == 0
        # at least the sleeps; and one batch's worth, not two: the step that reads the same
        # batches under the same load is the yardstick (a wall-clock ceiling failed in CI on a
        # loaded host, where each 4 ms sleep took 6 ms; user_workload.SLOW_SAMPLE_S says why 10 ms)
        assert rec["input_time_s"] >= b * SLOW_SAMPLE_S
        assert rec["input_bound"]
        assert bounds.log_error(rec["input_time_s"], rec["step_time_s"]) <= bounds.TWO_READS_BOUND
    aggregate.run(files, tmp_path / "measurements.csv")
    df = measurements.load(tmp_path / "measurements.csv")
    model = perf.fit(df, "ring")
    assert model.input is not None and model.input.form.name in ("per_sample", "linear")
    probes = measurements.probes(df)
    for r in probes.itertuples():
        predicted = float(model.step_time_s(1, r.local_batch))
        assert bool(model.input_bound(1, r.local_batch)) and predicted >= float(
            model.input_time_s(1, r.local_batch)
        )
        # within the two reads' scatter: the steps' (their timed blocks' CV, three times), or
        # 20 % for the floor's own, read from probe.input_batches (4) batches alone with no CV
        # of its own (a clean clone's loaded host read 47.7 ms a batch alone against steps of
        # 42.0 ms at a CV of 4.3 %); two probes leave the floor's form to the simplest, per sample
        assert bounds.log_error(r.step_time_s, predicted) <= bounds.TWO_READS_BOUND
    # where no input was read, there is no floor, and nothing is called input-bound
    plain = perf.fit(df.drop(columns=["input_time_s"]), "ring")
    assert plain.input is None and not plain.input_bound(1, 16)


@pytest.mark.probe
def test_a_probe_decodes_jpegs_on_the_device_path(tmp_path, venv_path):
    """data.decode: gpu's plumbing through a whole probe of two workers on CPU tensors: the memory
    step, the timed steps, the input read alone, the gradient noise steps and the sweep all take
    their batches decoded by the feed, and evaluation its CPU views."""
    import yaml

    from conftest import make_jpeg_folder

    root = make_jpeg_folder(tmp_path / "jpegs", n=24)
    cfg = tmp_path / "jpeg.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "workload": {"dataset": f"imagefolder:{root}", "epochs": 1},
                "grid": {"workers": [2], "batch_min": 8, "batch_max": 16},
                "data": {"image_size": 16, "decode": "gpu", "num_workers": 1},
                "probe": {
                    "warmup_steps": 1,
                    "timed_steps": 3,
                    "noise_steps": 4,
                    "time_budget_s": 0.5,
                },
            }
        )
    )
    rec = probe.run(cfg, 2, 16, tmp_path / "N2_B16.json")
    assert rec["status"] == "ok", rec.get("error")
    assert rec["input_time_s"] > 0 and rec["env"]["data_workers"] == 1
    # decoded float images + labels
    assert rec["memory"]["batch_bytes"] == 8 * 3 * 16 * 16 * 4 + 8 * 8
    # the gradient-noise steps read through the same feed (decoded there); on 48 images after the
    # timed steps their |G|^2 estimate may come out at or below zero, and B_noise is then None
    gn = rec["gradient_noise"]
    assert "noise_error" not in rec and gn["steps"] == 4 and gn["trace"] > 0
    assert all(s["status"] == "ok" for s in rec["sweep"]) and rec["eval_time_s"] > 0


@pytest.mark.probe
def test_a_memory_timeline_failing_on_one_rank_is_measured_again_on_every_rank(
    tiny_config_file, tmp_path, venv_path, monkeypatch
):
    """torch's profiler sometimes cannot build a step's memory timeline (AssertionError "version
    mismatch"); the ranks agree to measure one more step, so the collectives stay in step."""
    monkeypatch.setenv(FAULT_ENV, "profiler:point=N2_B64,rank=1")
    rec = probe.run(tiny_config_file, 2, 64, tmp_path / "N2_B64.json")
    assert rec["status"] == "ok", rec.get("error")
    # one step more than without the failure (the count of test_two_process_gloo_probe), and one
    # more for each failure of torch's own (about one step in ten)
    retried = rec["profiler_retries"]
    timed = sum(
        rec[f"{a}_timed_steps"] + sum(rec[f"{a}_other_steps"].values()) for a in ("step", "compute")
    )
    started = len(rec["epoch_start_step_times_s"]) - rec["step_other_steps"].get("start", 0)
    assert retried["plain"] >= 1 and rec["peak_mem_bytes"] > 0
    lead = sum(rec["lead_in_steps"].values())  # each timed round's untimed synced step
    assert rec["steps_run"] == 5 + lead + timed + started + 2 + sum(retried.values())


def test_a_vanished_peer_is_the_machines_failure_and_any_other_error_the_points():
    """The lab's node drill once left a two-node probe whose surviving ranks wrote gloo's
    "Connection reset by peer" before the dead node's ranks were counted lost: that point is
    launched once more, as a lost rank's is; an error of the point's own is not."""
    from tula.model.probe_record import ProbeRecord
    from tula.stages.probe.job import lost_a_worker

    def lost(**record):
        return lost_a_worker(ProbeRecord.from_json({"workers": 2, "global_batch": 64, **record}))

    gloo = (
        "rank 2: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
        "pair.cc:545] Read error [10.77.0.2]:22918: Connection reset by peer."
    )
    assert lost(status="error", error=gloo)
    assert lost(status="ok", lost_ranks=[1], after_error="x")
    assert not lost(status="error", error="rank 0: ValueError: bad shape")
    assert not lost(status="oom", error="CUDA out of memory")


@pytest.mark.probe
def test_a_rank_lost_after_the_measurement_is_probed_once_more_and_said_when_lost_twice(
    tiny_config_file, tmp_path, venv_path, monkeypatch
):
    """Rank 1 segfaults as the compute sweep starts (seen once in a benchmark run: the record
    read ok, its sweep rows silently missing). Once: the probe is launched again and the second
    record, sweep rows included, is kept. Twice: rank 0's measurement is kept, and the record
    and the log say which rank died and what is missing; inside a SLURM job it is not failed."""
    monkeypatch.setenv(FAULT_ENV, "crash:point=N2_B64,rank=1,where=sweep")
    rec = probe.run(tiny_config_file, 2, 64, tmp_path / "once.json")
    assert rec["status"] == "ok" and rec["sweep"] and "after_error" not in rec
    assert "after the measurement stood" in rec["retried_after"]["error"]
    assert 1 in rec["retried_after"]["lost_ranks"]
    monkeypatch.setenv(FAULT_ENV, "crash:point=N2_B64,rank=1,where=sweep,attempts=2")
    monkeypatch.setenv("SLURM_JOB_ID", "424242")
    rec = probe.run(tiny_config_file, 2, 64, tmp_path / "twice.json")
    assert rec["status"] == "ok" and rec["step_time_s"] > 0 and rec["sweep"] == []
    assert 1 in rec["lost_ranks"] and rec["after_error"].startswith(
        f"rank(s) {rec['lost_ranks']} died without writing a result"
    )
    assert "(0 sweep rows)" in rec["after_error"]
    assert json.loads((tmp_path / "twice.json").read_text())["after_error"] == rec["after_error"]


@pytest.mark.probe
def test_a_rank_lost_twice_is_an_error_that_names_it(
    tiny_config_file, tmp_path, venv_path, monkeypatch
):
    """Rank 1 segfaults before its result (as torch's profiler did once in CI), in both
    launches: the first launch's loss is kept under retried_after, the second's is the error.
    (Lost once, the second launch's record is kept: the test above, where the loss falls
    after the measurement.)"""
    monkeypatch.setenv(FAULT_ENV, "crash:point=N2_B64,rank=1,attempts=2")
    rec = probe.run(tiny_config_file, 2, 64, tmp_path / "N2_B64.json")
    assert (
        f"rank(s) {rec['retried_after']['lost_ranks']} died without writing a result"
        in rec["retried_after"]["error"]
    )
    assert (
        rec["status"] == "error"
        and 1 in rec["lost_ranks"]
        and 1 in rec["retried_after"]["lost_ranks"]
    )
    assert rec["error"].startswith(
        f"rank(s) {rec['lost_ranks']} died without writing a result (killed by a signal"
    )


@pytest.mark.probe
def test_a_rank_lost_twice_inside_a_slurm_job_fails_it_so_that_it_runs_again(
    tiny_config_file, tmp_path, venv_path, monkeypatch
):
    """Inside a SLURM job a rank lost in both launches is the machine's (a node died under the
    probe): nothing is recorded and the probe fails, so that SLURM's requeue or Snakemake's
    retries run it again instead of the campaign going on without the point. (A job id SLURM
    does not know has no tasks to srun onto: the workers start with torchrun.)"""
    monkeypatch.setenv(FAULT_ENV, "crash:point=N2_B64,rank=1,attempts=2")
    monkeypatch.setenv("SLURM_JOB_ID", "424242")
    with pytest.raises(RuntimeError, match=r"probe N2_B64: rank\(s\) \[.*1.*\] were lost in both"):
        probe.run(tiny_config_file, 2, 64, tmp_path / "N2_B64.json")
    assert not (tmp_path / "N2_B64.json").exists()


def test_the_rank_that_failed_first_is_the_error_reported():
    from tula.model.grid import Point

    cfg = __import__("tula.config", fromlist=["from_dict"]).from_dict({})
    ranks = [
        {
            "rank": 0,
            "status": "error",
            "error": "rank 0: Connection closed by peer",
            "failed_at": 2.0,
        },
        {
            "rank": 1,
            "status": "error",
            "error": "rank 1: AssertionError: version mismatch",
            "failed_at": 1.0,
        },
    ]
    assert (
        probe.combine(Point(2, 64), ranks, None, cfg).error
        == "rank 1: AssertionError: version mismatch"
    )


@pytest.mark.probe
@pytest.mark.slow
def test_a_compiled_probe_counts_compilation_as_a_first_step_cost(
    tiny_config_file, tmp_path, venv_path
):
    """train.compile on: the probe times the compiled step; compilation (each shape's first
    step) is measured once as first_steps_time_s, the start-up's, not the step's."""
    import yaml

    raw = yaml.safe_load(tiny_config_file.read_text())
    raw["train"]["compile"] = "on"
    cfg = tmp_path / "compiled.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    rec = probe.run(cfg, 1, 64, tmp_path / "probes" / "N1_B64.json")
    assert rec["status"] == "ok", rec.get("error")
    assert rec["compile"] == "on" and rec["block_steps"] == 1
    assert rec["first_steps_time_s"] > 5 * rec["step_time_median_s"] > 0


@pytest.mark.probe
def test_a_probe_job_gives_each_point_its_own_limit_and_launches_the_rest_again(
    tiny_raw, tmp_path, venv_path, monkeypatch
):
    """One probe job, three batches at N = 1 in one process: the second hangs in its timed
    steps and is stopped probe.timeout_s after it began (not after the launch: the first point
    had spent part of the job's time already), recorded as a timeout that says where the rank
    was; the first stays measured, and the third, never begun, is launched again in a fresh
    process and measured. The points' walls sum to the launches'."""
    import time

    import yaml

    monkeypatch.setenv(FAULT_ENV, "hang:point=N1_B64,rank=0,where=timed steps")
    tiny_raw["probe"].update(timeout_s=20, sweep_steps=0, noise_steps=0)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(tiny_raw))
    outs = {b: tmp_path / f"B{b}.json" for b in (32, 64, 128)}
    t0 = time.monotonic()
    recs = probe.run_batches(cfg, 1, [32, 64, 128], outs)
    took = time.monotonic() - t0
    assert [recs[b]["status"] for b in (32, 64, 128)] == ["ok", "timeout", "ok"], recs
    assert [(r["rank"], r["phase"]) for r in recs[64]["ranks_reached"]] == [(0, "timed steps")]
    assert recs[64]["error"].startswith("probe exceeded probe.timeout_s=20s: rank 0 in 'timed")
    # the hung point had its own 20 s from when it began (a deadline counted from the launch would
    # have stopped it sooner: the first point had spent some); the job far less than three limits
    began = recs[64]["ranks_reached"][0]["point_for_s"]
    assert 20 <= began < 20 + 5 and took < 60, (recs[64], took)
    # the first and the third each ran first in their process: their first steps a fresh job's
    assert recs[32]["fresh_process"] and recs[128]["fresh_process"]
    assert recs[32]["job_wall_s"] != recs[128]["job_wall_s"]  # two launches
    first_launch = recs[32]["wall_s"] + recs[64]["wall_s"]
    assert first_launch == pytest.approx(recs[32]["job_wall_s"])
    assert recs[128]["wall_s"] == pytest.approx(recs[128]["job_wall_s"])
    assert {b: json.loads(outs[b].read_text())["status"] for b in outs} == {
        32: "ok",
        64: "timeout",
        128: "ok",
    }


def test_a_probe_job_keeps_the_records_bought_with_the_same_settings(tiny_config_file, tmp_path):
    """The probe job at N = 1 (the tiny grid's partial search: B = 32 and 128) finds both
    records measured with today's settings beside its job.json: it keeps them, launches
    nothing, and lists them. A record measured otherwise, or failed, would be bought again."""
    from tula import config
    from tula.io import write_json
    from tula.pipeline import stage_settings

    settings = stage_settings(config.load(tiny_config_file), "probe")
    job = tmp_path / "N1" / "job.json"
    for b in (32, 128):
        write_json(
            job.parent / f"B{b}.json",
            {"workers": 1, "global_batch": b, "status": "ok", "settings": settings},
        )
    recs = probe.run_at(tiny_config_file, 1, job, None)
    assert sorted(recs) == [32, 128]
    assert json.loads(job.read_text()) == {
        "schema": "tula.probe-job/1",
        "workers": 1,
        "batches": [32, 128],
        "records": ["B32.json", "B128.json"],
        "status": {"32": "ok", "128": "ok"},
        "probed": [],
        "kept": [32, 128],
    }
    other = json.loads(settings) | {"probe.timed_steps": 99}
    write_json(job.parent / "B32.json", {"status": "ok", "settings": json.dumps(other)})
    write_json(job.parent / "B128.json", {"status": "error", "settings": settings})
    assert probe._bought(job.parent / "B32.json", settings) is None
    assert probe._bought(job.parent / "B128.json", settings) is None
    assert probe._bought(job.parent / "B64.json", settings) is None  # none there


def test_the_log_says_where_the_jobs_compute_curve_is_or_that_it_needed_none():
    """A job that probes every local batch it would sweep sweeps none, and its log says so at
    each point, not "swept at 0 other local batches" and "swept once, at N1_B32"."""
    from tula.model.grid import Point
    from tula.model.probe_record import ProbeRecord
    from tula.stages.probe.job import _sweep_note as note

    def _sweep_note(point, rec, launch):
        def typed(r):
            return ProbeRecord.from_json({"workers": 1, "global_batch": 32, "status": "ok", **r})

        return note(point, typed(rec), {k: typed(v) for k, v in launch.items()})

    row = {"local_batch": 16, "status": "ok"}
    first, later = Point(1, 32), Point(1, 64)
    swept = {"N1_B32": {"sweep_in": "N1_B32", "sweep": [row]}}
    assert _sweep_note(first, swept["N1_B32"], swept) == "compute swept at 1 other local batches"
    assert _sweep_note(later, {"sweep_in": "N1_B32", "sweep": []}, swept) == (
        "compute curve swept once for the job, at N1_B32"
    )
    none = {"N1_B32": {"sweep_in": "N1_B32", "sweep": []}}
    for point, rec in ((first, none["N1_B32"]), (later, {"sweep_in": "N1_B32", "sweep": []})):
        assert _sweep_note(point, rec, none) == (
            "no compute sweep: the job probes every local batch of the grid it would sweep"
        )
    # a later launch's point, whose sweep was in an earlier launch: where it is
    assert _sweep_note(later, {"sweep_in": "N1_B32", "sweep": []}, {}) == (
        "compute curve swept once for the job, at N1_B32"
    )
