"""How a probe's timing is kept in its record (tula.model.probe_measured): flat keys per arm,
read back whole; a record with no timing reads back none; an older record's arm without
some keys reads them as None."""

from tula.model.probe_measured import Arm, Measurement, TimingFigures

STEP = Arm(
    timed_steps=12,
    judged_steps=14,
    other_steps={"start": 2},
    halfwidth_mix={"start": 0.1},
    time_halfwidth_rel=0.03,
    time_halfwidth_judged_rel=0.02,
    spread="sd",
    spikes=0,
    host_share=None,
)


def test_timing_figures_read_back_whole_from_their_flat_keys():
    t = TimingFigures(step=STEP, precision_target=0.02, precision_reached=True, timing_s=1.5)
    flat = t.to_json()
    assert flat["step_timed_steps"] == 12 and flat["step_other_steps"] == {"start": 2}
    assert "compute_timed_steps" not in flat and flat["precision_target"] == 0.02
    assert TimingFigures.from_json(flat) == t


def test_only_an_arm_or_only_the_rest_still_reads_back():
    arm_only = {
        k: v for k, v in TimingFigures(step=STEP).to_json().items() if k.startswith("step_")
    }
    assert TimingFigures.from_json(arm_only) == TimingFigures(step=STEP)
    assert TimingFigures.from_json({"timing_s": 2.0}) == TimingFigures(timing_s=2.0)
    assert TimingFigures.from_json({"an_unrelated_key": 1}) is None


def test_an_older_records_arm_reads_its_missing_keys_as_none():
    old = {"compute_timed_steps": 6, "compute_spread": "sd"}
    got = TimingFigures.from_json(old).compute
    assert (got.timed_steps, got.spread, got.spikes, got.host_share) == (6, "sd", None, None)


def test_a_rank_result_without_its_rank_reads_as_rank_minus_one():
    """A record written by the launcher (a timeout, a silent exit) names no rank: -1, never a
    real rank 0, ok or failed."""
    from tula.model.probe_record import RankResult

    assert RankResult.from_json({"status": "ok", "step_time_s": 0.1}).rank == -1
    failed = RankResult.from_json({"status": "timeout", "error": "no word in 60 s"})
    assert failed.rank == -1 and failed.failure.status == "timeout" and failed.failed
    assert RankResult.from_json({"rank": 0, "status": "ok"}).rank == 0


def test_a_measurement_reads_back_every_key_it_wrote():
    """Whatever a key's place in the alphabet beside "timing" (step_time_s before it,
    train_samples after it), a measurement written is read back whole."""
    m = Measurement(
        step_time_s=0.1,
        train_samples=1024,
        steps_run=50,
        timing=TimingFigures(step=STEP, timing_s=1.5),
    )
    assert Measurement.from_json(m.to_json()) == m


def test_a_noise_scale_not_estimated_is_written_as_its_reason_alone():
    """One worker: no estimate, only why; its other keys are not written as nulls."""
    from tula.model.probe_measured import Noise

    why = {"why": "one worker: the noise scale needs two batch sizes"}
    assert Noise(gradient_noise=why).to_json() == {"gradient_noise": why}
    full = Noise(gradient_noise={"b_noise": 300.0}, grad_noise_scale=300.0).to_json()
    assert full["grad_noise_scale"] == 300.0 and full["grad_sq"] is None
