"""The probe's worker (tula.runtime.probe.probe_worker): how rank 0 turns every rank's timed steps
into the probe's step, compute and sync times, and what a failure leaves in the record. (The
worker runs end to end under torchrun in tests/stages/test_probe.py.)"""

import pytest
import torch
from test_replica import _replica, one_process_group  # noqa: F401 - the fixture, and a real replica in it

from tula import config, faults
from tula.model.probe_measured import Measurement, Noise, Overheads
from tula.model.probe_record import Probed, ProbeRecord, RankResult
from tula.runtime.probe import probe_measurement, probe_timing, probe_worker
from tula.runtime.probe.measure import PROFILER_TRIES
from tula.runtime.probe.probe_state import JobState
from tula.runtime.step.replica import Replica
from tula.runtime.timer.precision import Series
from tula.runtime.timer.timing import Target, Timing


def test_an_epoch_starts_extra_and_the_short_batchs_saving_at_trainings_rate(one_process_group):  # noqa: F811
    """The timer's series are already the slowest rank's (tests/runtime/test_timing.py); rank 0
    adds an epoch start's extra and the short last batch's saving once per epoch, and takes the
    largest rank's memory."""
    replica = _replica("fp32")  # digits at B=64: 23 steps an epoch
    gathered = [
        {"peak": 100, "peaks": {"plain": 90, "refresh": 100}, "rss": 5, "host": "a"},
        {"peak": 120, "peaks": {"plain": 120, "refresh": 110}, "rss": 7, "host": "b"},
    ]
    step, compute = Series([0.11, 0.12], [1, 1]), Series([0.08, 0.10], [1, 1])
    timing = Timing(
        {"step": step, "compute": compute}, Target(0.02, 2, 1.0), False, "budget", 1.0, 1, "steps"
    )
    extras = {"start": [0.32], "refresh": [], "partial": [0.05]}
    stepped = probe_measurement.Stepped.of(replica)
    m = probe_measurement.measurement(stepped, gathered, timing, extras).to_json()
    plain = (0.11 + 0.12) / 2
    start_extra, partial_extra = 0.32 - plain, 0.05 - plain
    assert m["step_times_s"] == [0.11, 0.12] and m["compute_times_s"] == [0.08, 0.10]
    assert m["epoch_start_step_times_s"] == [0.32] and m["epoch_start_extra_s"] == pytest.approx(
        start_extra
    )
    assert m["partial_extra_s"] == pytest.approx(partial_extra)
    extra = (start_extra + partial_extra) / 23
    assert m["step_time_s"] == pytest.approx(plain + extra)
    assert m["compute_time_s"] == pytest.approx(0.09 + extra)
    assert m["sync_time_s"] == pytest.approx(plain - 0.09) and m["steps_per_epoch"] == 23
    assert m["precision_reached"] is False and m["timing_stopped_by"] == "budget"
    assert m["step_timed_steps"] == 2 and m["step_time_halfwidth_rel"] > m["precision_target"]
    assert (
        m["peak_mem_bytes"],
        m["plain_peak_bytes"],
        m["refresh_peak_bytes"],
        m["rss_peak_bytes"],
    ) == (120, 120, 110, 7)


def test_a_failure_before_the_measurement_is_the_record_and_after_it_a_note_beside_it():
    def record(rank, exc, after, measured=None):
        result = RankResult(rank).measured_as(measured)
        return probe_worker._failure(result, exc, after=after)

    oom = record(1, torch.OutOfMemoryError("CUDA out of memory\nmore"), "").to_json()
    assert oom == {
        "rank": 1,
        "status": "oom",
        "error": "out of memory on rank 1: CUDA out of memory",
    }
    err = record(0, RuntimeError("boom"), "", Measurement(step_time_s=0.1)).to_json()
    assert (err["status"], err["error"]) == (
        "error",
        "rank 0: RuntimeError: boom",
    ) and "traceback" in err
    assert "step_time_s" not in err  # a measurement not stood is no part of a failed record
    kept = record(0, RuntimeError("lost peer"), "sweep", Measurement(step_time_s=0.1))
    assert kept.failed_after_measurement and not kept.failed
    assert {k: v for k, v in kept.to_json().items() if v is not None} == {
        "rank": 0,
        "status": "ok",
        "step_time_s": 0.1,
        "sweep": [],
        "sweep_error": "rank 0: RuntimeError: lost peer",
    }
    with pytest.raises(ValueError, match="warmup"):
        RankResult(0).noted("warmup", "x")  # only a phase after the measurement is a note


def test_the_record_is_built_from_its_parts_and_read_back_as_it_was_written():
    """Each measuring function returns its part; the rank's result is those parts, the sweep's
    rows replacing the measurement's empty list, the point's own seconds last; the point's
    record (what was probed, how it ended, rank 0's result) reads back to the same record."""
    rows = [{"local_batch": 16, "status": "ok"}]
    parts = (
        RankResult(0)
        .measured_as(Measurement(step_time_s=0.1))
        .with_overheads(Overheads(startup_time_s=4.0))
        .with_noise(Noise({"b_noise": 12.0}, grad_noise_scale=12.0))
        .swept(rows, "N1_B32")
        .timed(3.5)
    )
    j = parts.to_json()
    assert (j["rank"], j["status"], j["step_time_s"], j["sweep"]) == (0, "ok", 0.1, rows)
    assert (j["startup_time_s"], j["grad_noise_scale"], j["sweep_in"]) == (4.0, 12.0, "N1_B32")
    assert list(j)[-1] == "point_wall_s" and j["point_wall_s"] == 3.5
    assert RankResult.from_json(j) == parts
    assert RankResult(1).to_json() == {"rank": 1, "status": "ok"}
    with pytest.raises(AttributeError):
        parts.sweep = []  # frozen: a part changes only through the record's own methods
    assert not parts.failed and not parts.failed_after_measurement
    # a later point of the same job: no sweep of its own, the record names the point that has it
    later = RankResult(0).measured_as(Measurement(step_time_s=0.2)).swept(None, "N1_B32")
    assert (later.to_json()["sweep"], later.to_json()["sweep_in"]) == ([], "N1_B32")
    record = ProbeRecord(Probed(1, 64, 64, nodes=1), "ok", result=parts, wall_s=9.0)
    assert ProbeRecord.from_json(record.to_json()) == record
    lost = record.with_lost([1])
    assert (
        lost.lost_ranks == [1] and "1 sweep rows" in lost.after_error and record.lost_ranks is None
    )
    with pytest.raises(ValueError, match="step_tme_s"):
        ProbeRecord.from_json({**record.to_json(), "step_tme_s": 1.0})  # not a key it has
    with pytest.raises(ValueError, match="missing workers"):
        ProbeRecord.from_json({"global_batch": 64, "status": "ok"})


def test_an_epoch_of_two_steps_is_timed_at_its_start_on_both_arms(one_process_group):  # noqa: F811
    """Digits' 1437 samples at B = 1024: an epoch is its first step and a short last batch of
    413. Synced and compute-only steps alternate one by one (each round led by an untimed
    synced step), so the arms meet only epoch starts and short batches, in a pattern of the
    round's length, and neither a plain step: both arms are then timed at the epoch's start,
    each its own, and the probe's record stands (it raised on an empty series)."""
    cfg = config.from_dict({"probe": {"warmup_steps": 1, "timed_steps": 4, "time_budget_s": 0.3}})
    replica = Replica(cfg, torch.device("cpu"), 1024, 0, 1)
    assert replica.steps_per_epoch == 2
    timing, extras = probe_timing.time_steps(replica, cfg, "N1_B1024")
    step, compute = timing.arms["step"], timing.arms["compute"]
    # what alternation met: short batches and epoch starts only, never a plain step
    met = {k for arm in (step, compute) for k, v in arm.other.items() if v}
    assert "partial" in met and met <= {"partial", "start"}
    for arm in (step, compute):
        assert not arm.times and len(arm.other["start"]) >= probe_timing.EXTRA_STEPS
    m = probe_measurement.measurement(
        probe_measurement.Stepped.of(replica),
        [{"peak": 1, "peaks": {"plain": 1}, "rss": 1, "host": "a"}],
        timing,
        extras,
    ).to_json()
    assert m["step_timed_steps"] == len(step.other["start"])
    assert m["compute_timed_steps"] == len(compute.other["start"])
    assert m["step_time_s"] > 0 and m["compute_time_s"] > 0 and m["sync_time_s"] >= 0
    assert m["epoch_start_step_times_s"] == step.other["start"]


def test_a_probe_jobs_points_load_the_sets_once_and_share_the_resident_copy(
    one_process_group,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """Each point of a probe job gets a fresh replica at its batch, but the workload's sets are
    loaded once for the job (a large npz set took 1.6-2.8 s a load here) and a set kept on the
    device is copied there once: the job's later points read the same tensors."""
    from tula.model.grid import Point
    from tula.runtime.group import dist
    from tula.runtime.input import data as data_mod

    loads = []
    real = data_mod.load_config
    monkeypatch.setattr(data_mod, "load_config", lambda cfg: loads.append(1) or real(cfg))
    cfg = config.from_dict({"data": {"on_device": True}})  # resident, also on CPU
    job = JobState([64, 128])
    job.joined((dist.worker_env({}), torch.device("cpu"), "gloo"))
    replicas = []
    for b in (32, 128):
        phases = probe_worker.Phases(tmp_path, 0, f"N1_B{b}", [], None)
        replicas.append(probe_worker._start(cfg, Point(1, b), 0, phases, job)[3])
    first, second = replicas
    assert len(loads) == 1 and second.data is first.data and job.data is first.data
    assert (second.global_batch, second.steps_per_epoch) == (128, 12)  # its own batch
    feeds = [r.stream.feed for r in replicas]
    assert all(f.resident for f in feeds)
    assert feeds[1].x is feeds[0].x and feeds[1].y is feeds[0].y
    x, _ = next(iter(second.walk.epoch_batches()))
    assert x.shape[0] == 128


@pytest.mark.parametrize("fails", [PROFILER_TRIES - 1, PROFILER_TRIES])
def test_a_point_whose_memory_timeline_fails_every_try_keeps_its_timing_without_the_peak(
    one_process_group,  # noqa: F811
    fails,
):
    """torch's CPU profiler once failed all six tries of a CI probe's rank ("duplicate outputs:
    aten::abs/where"), and the point's timing was lost with its peak. Five failures still end
    in a peak; six leave the point's timing standing, with no peak and the reason beside it."""
    cfg = config.from_dict({"probe": {"input_batches": 0}, "train": {"method": "static"}})
    replica = Replica(cfg, torch.device("cpu"), 64, 0, 1)
    injected = faults.parse(f"profiler:point=P,tries={fails}")
    replica.inject_faults(faults.Injector(injected, 0, point="P"))
    retried: dict[str, int] = {}
    mine = probe_worker._this_rank(replica, cfg, (0.5, 0.1), retried)
    if fails < PROFILER_TRIES:
        assert mine["peak"] > 0 and mine["peak_error"] is None and retried == {"plain": fails}
        return
    assert mine["peak"] is None and mine["peaks"] == {}
    assert f"in {PROFILER_TRIES} tries" in mine["peak_error"]
    timing = Timing(
        {"step": Series([0.1], [1]), "compute": Series([0.08], [1])},
        Target(0.02, 1, 1.0),
        False,
        "budget",
        1.0,
        1,
        "steps",
    )
    extras = {"start": [], "refresh": [], "partial": []}
    m = probe_measurement.measurement(
        probe_measurement.Stepped.of(replica), [{**mine, "rss": 1}], timing, extras
    ).to_json()
    assert m["step_time_s"] == pytest.approx(0.1) and m["peak_error"] == mine["peak_error"]
    assert m["peak_mem_bytes"] is None and m["plain_peak_bytes"] is None and m["rss_peak_bytes"]
