"""The predictions at every grid point (tula.model.predictions): Eq. 4's T and C, feasibility
from measured out-of-memory points, time to accuracy from the gradient noise scale, the wall
time's start-up, evaluation and checkpoints, a probe's one-off first-step extras by hand, and
a batch past b_max as micro-batches. (The predict stage's own reading of D is in
tests/stages/test_predict.py.)"""

import numpy as np
import pandas as pd
import pytest

from conftest import synced_probes
from tula import config, model_inputs
from tula.model import memory
from tula.model import perf as perfmodel
from tula.model.linfit import fit_linear
from tula.model.predictions import checkpoints_written, one_off_extras, predict


def test_the_first_steps_extras_by_hand():
    ok = pd.DataFrame(
        {
            "global_batch": [64, 64, 1024],
            "step_time_s": [0.1, 0.1, 0.3],
            # the first step and the short batch's first step together; the whole epoch at 1,024
            "first_steps_time_s": [1.0, 0.6, 1.5],
            "first_short_step_s": [0.25, np.nan, np.nan],
            "partial_extra_s": [0.05, np.nan, np.nan],
        }
    )
    first, short = one_off_extras(ok, train_samples=1000)
    # 1.0 - 0.25 - 0.1; with no short batch of its own 0.6 - 0.1; B >= D: two steps of one shape
    assert first.tolist() == pytest.approx([0.65, 0.5, 1.5 - 2 * 0.3], rel=1e-12)
    # the short batch's first step over its own step (the step and its partial extra)
    assert short.iloc[0] == pytest.approx(0.25 - 0.15, rel=1e-12)
    assert short.iloc[1:].isna().all()
    # a record from before the partial extra was measured: none taken off
    older = one_off_extras(ok.drop(columns="partial_extra_s"), train_samples=1000)[1]
    assert older.iloc[0] == pytest.approx(0.25 - 0.1)


def test_an_extra_is_never_below_zero():
    ok = pd.DataFrame(
        {
            "global_batch": [64],
            "step_time_s": [0.5],
            "first_steps_time_s": [0.4],
            "first_short_step_s": [0.1],
        }
    )
    first, short = one_off_extras(ok, train_samples=None)
    assert first.tolist() == [0.0] and short.tolist() == [0.0]


def _flat_perf(step_s: float) -> perfmodel.PerfModel:
    """A perf model whose every step takes ``step_s`` (fitted on exact flat data)."""
    df = pd.DataFrame(
        dict(
            workers=[1, 1, 1],
            global_batch=[1, 2, 4],
            local_batch=[1, 2, 4],
            status="ok",
            compute_time_s=step_s,
            step_time_s=step_s,
            sync_time_s=0.0,
            peak_mem_bytes=1.0,
            source="probe",
        )
    )
    return perfmodel.fit(df, "ring")


def test_predict_eq4_arithmetic():
    cfg = config.from_dict(
        {
            "grid": {"workers": [2], "batch_min": 64, "batch_max": 64},
            "workload": {"epochs": 3},
            "pricing": {"per_worker_hour": 3.6},
        }
    )
    mem = memory.MemoryModel(fit_linear([1, 2], [1e9, 1e9]), None)
    row = predict(model_inputs.planning(cfg), _flat_perf(0.1), mem, train_samples=1000).iloc[0]
    assert row["steps_per_epoch"] == 16  # ceil(1000 / 64)
    assert row["train_time_s"] == pytest.approx(3 * 16 * 0.1, rel=1e-6)
    # the interval's ends are T's too: each end of the step's interval over the same steps
    for end in ("lo", "hi"):
        assert row[f"train_time_{end}_s"] == pytest.approx(3 * 16 * row[f"step_time_{end}_s"])
    assert row["cost_worker_hour"] == pytest.approx(4.8 / 3600 * 2 * 3.6, rel=1e-6)
    assert row["cost_memory"] == pytest.approx(4.8 / 3600 * 2 * 1.0 * 0.15, rel=1e-6)


def test_measured_oom_marks_point_infeasible_and_sweep_rows_are_not_probes():
    cfg = config.from_dict({"grid": {"workers": [1], "batch_min": 32, "batch_max": 64}})
    mem = memory.MemoryModel(fit_linear([1, 2], [1.0, 1.0]), None)
    measured = pd.DataFrame(
        [
            dict(
                workers=1,
                global_batch=64,
                local_batch=64,
                status="oom",
                step_time_s=np.nan,
                source="probe",
            ),
            dict(
                workers=1,
                global_batch=64,
                local_batch=32,
                status="ok",
                step_time_s=np.nan,
                compute_time_s=0.1,
                source="sweep",
            ),
        ]
    )
    pred = predict(model_inputs.planning(cfg), _flat_perf(0.1), mem, 100, measured)
    assert list(pred["feasible"]) == [True, False] and list(pred["probe_status"]) == ["", "oom"]


def test_time_to_accuracy_scales_the_epochs_with_the_gradient_noise_scale():
    """B_noise = 100 pooled from two probes; workload.epochs = 3 reach the target at base_batch 128,
    so B needs 3 (1 + B/100)/(1 + 128/100) epochs (McCandlish et al.)."""
    cfg = config.from_dict(
        {
            "grid": {"workers": [2], "batch_min": 64, "batch_max": 256},
            "workload": {"epochs": 3},
            "train": {"base_batch": 128},
        }
    )
    mem = memory.MemoryModel(fit_linear([1, 2], [1e9, 1e9]), None)
    measured = pd.DataFrame(
        [
            dict(
                workers=2,
                global_batch=b,
                local_batch=b // 2,
                status="ok",
                step_time_s=0.1,
                source="probe",
                grad_sq=1.0,
                grad_sq_se=0.1,
                grad_trace=100.0,
                grad_trace_se=5.0,
            )
            for b in (64, 256)
        ]
    )
    pred = predict(model_inputs.planning(cfg), _flat_perf(0.1), mem, 1000, measured)
    assert pred["b_noise"].tolist() == pytest.approx([100.0] * 3)
    epochs = [3 * (1 + b / 100) / 2.28 for b in (64, 128, 256)]
    assert pred["epochs_to_accuracy"].tolist() == pytest.approx(epochs)
    # at base_batch: the configured epochs
    assert pred.loc[1, "epochs_to_accuracy"] == pytest.approx(3.0)
    assert pred["time_to_accuracy_s"].tolist() == pytest.approx(
        [e * s * 0.1 for e, s in zip(epochs, (16, 8, 4))]
    )
    assert pred["cost_to_accuracy"].tolist() == pytest.approx(
        (pred["time_to_accuracy_s"] / 3600 * 2 * cfg.pricing.per_worker_hour).tolist()
    )
    no_noise = predict(
        model_inputs.planning(cfg),
        _flat_perf(0.1),
        mem,
        1000,
        measured.drop(columns=["grad_sq", "grad_trace"]),
    )
    assert no_noise["time_to_accuracy_s"].isna().all()


def test_checkpoints_written_counts_the_trainers_writes():
    # every 2nd epoch but the last of 5 (2, 4) + the final one; steps every 10 of 5 x 7 = 35 (10,
    # 20, 30)
    assert checkpoints_written(5, 7, None, 2) == 3
    assert checkpoints_written(5, 7, 10, 2) == 6
    assert checkpoints_written(1, 7, None, 1) == 1


def test_wall_time_adds_start_up_evaluation_and_checkpoints_as_the_probes_measured_them():
    cfg = config.from_dict(
        {
            "grid": {"workers": [1, 2, 4], "batch_min": 64, "batch_max": 64},
            "workload": {"epochs": 3},
            "launch": {"checkpoint_every_epochs": 1},
        }
    )
    mem = memory.MemoryModel(fit_linear([1, 2], [1.0, 1.0]), None)
    probe = dict(global_batch=64, status="ok", step_time_s=0.1, compute_time_s=0.1, source="probe")
    measured = pd.DataFrame(
        [
            dict(
                probe,
                workers=1,
                local_batch=64,
                startup_time_s=4.0,
                eval_first_time_s=1.2,
                eval_time_s=0.8,
                checkpoint_time_s=0.2,
            ),
            dict(
                probe,
                workers=2,
                local_batch=32,
                startup_time_s=5.0,
                eval_first_time_s=0.9,
                eval_time_s=0.5,
                checkpoint_time_s=0.3,
            ),
            dict(
                probe,
                workers=2,
                local_batch=32,
                startup_time_s=7.0,
                eval_first_time_s=0.7,
                eval_time_s=0.3,
                checkpoint_time_s=0.1,
            ),
        ]
    )
    pred = predict(model_inputs.planning(cfg), _flat_perf(0.1), mem, 1000, measured).set_index(
        "workers"
    )
    # N=2: the median of its two probes; N=4 was not probed: N=2's, evaluation halved (sharded)
    cols = ["startup_time_s", "eval_first_time_s", "eval_time_s", "checkpoint_time_s"]
    assert pred.loc[2, cols].tolist() == pytest.approx([6.0, 0.8, 0.4, 0.2])
    assert pred.loc[4, cols].tolist() == pytest.approx([6.0, 0.4, 0.2, 0.2])
    assert (pred["checkpoints"] == 3).all()  # end of epochs 1 and 2, and the final one
    T = 3 * 16 * 0.1
    # the first evaluation pass (cold) once, a later pass for each further epoch
    assert pred.loc[1, "wall_time_s"] == pytest.approx(4.0 + T + 1.2 + 2 * 0.8 + 3 * 0.2)
    assert pred.loc[4, "wall_time_s"] == pytest.approx(6.0 + T + 0.4 + 2 * 0.2 + 3 * 0.2)
    assert pred.loc[4, "wall_time_hi_s"] - pred.loc[4, "train_time_hi_s"] == pytest.approx(
        6.0 + 0.8 + 0.6
    )
    # without it (the choice's resamples: no objective reads it), the rest is the same
    brief = predict(model_inputs.planning(cfg), _flat_perf(0.1), mem, 1000, measured, wall=False)
    assert "wall_time_s" not in brief and "checkpoints" not in brief
    pd.testing.assert_frame_equal(brief.set_index("workers"), pred[brief.columns[1:]])
    # probes from before these were measured: no wall time, said as NaN rather than guessed
    old = measured.drop(columns=["eval_first_time_s"])
    assert (
        predict(model_inputs.planning(cfg), _flat_perf(0.1), mem, 1000, old)["wall_time_s"]
        .isna()
        .all()
    )


def test_first_steps_are_the_points_own_steps_plus_the_probes_one_off_extras_at_its_batch():
    """A point pays its first step at each batch shape (the full batch's, and the short last
    batch's where its epoch ends in one) as its own predicted step, plus once what the probes
    at its N paid beyond their first step and, for the short batch, beyond that batch's own
    step; each read at the point's B between the probes' (linear in log B). Never below zero;
    records without the short batch's split fall back to the median at that N."""
    from tula.model.predictions import first_steps

    probes = pd.DataFrame(
        dict(
            workers=[2, 2, 4],
            global_batch=[32, 128, 128],
            status="ok",
            train_samples=480,
            step_time_s=[0.10, 0.40, 0.50],
            first_steps_time_s=[0.30, 1.30, 0.80],  # full + short
            first_short_step_s=[0.0, 0.50, 0.60],  # 480 % 32 == 0: no short batch at B=32
            partial_extra_s=[0.0, -0.10, None],  # the short batch's step less a full one
        )
    )
    points = pd.DataFrame(
        dict(
            workers=[2, 2, 2, 4],
            global_batch=[32, 64, 128, 256],
            step_time_s=[0.11, 0.2, 0.38, 0.9],
        )
    )
    got, shapes = first_steps(points, probes, n0=[2, 2, 2, 4])
    # first step's extra: B=32 0.30 - 0.10 = 0.20; B=128 1.30 - 0.50 - 0.40 = 0.40; N=4 below
    # zero, so 0. The short batch's: B=128 0.50 - (0.40 - 0.10) = 0.20; N=4 0.60 - 0.50 = 0.10.
    # B=64 lies halfway between 32 and 128 in log B: 0.30; only B=128 measured a short batch
    assert shapes == [1, 2, 2, 2]
    assert got == pytest.approx(
        [0.11 + 0.20, 2 * 0.2 + 0.30 + 0.20, 2 * 0.38 + 0.40 + 0.20, 2 * 0.9 + 0.0 + 0.10]
    )
    # No probe had a short batch of its own (B=32 has none, B >= D is one batch): on a CPU in
    # eager mode a new shape builds nothing, so the point pays its first step's extra once, not
    # once per shape; where each shape builds its own kernels it pays it at each
    big = dict(
        global_batch=512, step_time_s=0.476, first_steps_time_s=1.119, first_short_step_s=0.43
    )
    no_short = pd.DataFrame([dict(probes.iloc[0]), dict(probes.iloc[0]) | big])
    at_128 = pd.DataFrame(dict(workers=[2], global_batch=[128], step_time_s=[0.38]))
    # the first step's extra at 128: between 0.20 (B=32) and 1.119 - 2 x 0.476 (B=512, whose
    # two steps are one shape's), halfway in log B
    mid = (0.20 + (1.119 - 2 * 0.476)) / 2
    assert first_steps(at_128, no_short, n0=[2])[0] == pytest.approx([2 * 0.38 + mid])
    built = first_steps(at_128, no_short, n0=[2], builds_per_shape=True)[0]
    assert built == pytest.approx([2 * 0.38 + 2 * mid])
    # B >= D: the epoch is one batch, one shape, one step apart
    one, k = first_steps(
        pd.DataFrame(dict(workers=[2], global_batch=[512], step_time_s=[0.5])), no_short, n0=[2]
    )
    assert k == [1] and one == pytest.approx([0.5 + (1.119 - 2 * 0.476)])
    old = probes.drop(columns=["first_short_step_s"])
    assert first_steps(points, old, n0=[2, 2, 2, 4])[0] == pytest.approx([0.8, 0.8, 0.8, 0.8])
    # nothing measured: nothing predicted, and no step taken out of T
    none = probes.drop(columns=["first_steps_time_s", "first_short_step_s"])
    assert first_steps(points, none, n0=[2, 2, 2, 4]) == ([0.0] * 4, [0] * 4)


def test_a_probe_that_found_its_process_warm_gives_no_first_step_extra():
    """One probe job measures its N's batches in one process: only its first point's first
    steps were the process's own (``fresh_process``), as a production job pays them. A later
    point's first step found the process warm, so its extra says nothing of a job's start: the
    first step's extra comes from the fresh ones alone, while a new shape's (the short batch's)
    comes from every probe. A record from before the column (NaN) counts as fresh."""
    from tula.model.predictions import one_off_extras

    probes = pd.DataFrame(
        dict(
            workers=[2, 2, 2],
            global_batch=[32, 128, 256],
            status="ok",
            step_time_s=[0.10, 0.40, 0.80],
            first_steps_time_s=[0.30, 1.00, 1.50],
            first_short_step_s=[0.0, 0.50, 0.90],
            partial_extra_s=[0.0, -0.10, -0.20],
            fresh_process=[True, False, None],
        )
    )
    first, short = one_off_extras(probes, 480)
    # fresh: 0.30 - 0.10 = 0.20; warm: NaN (not 1.00 - 0.50 - 0.40); no column value: 1.50 - 0.90
    # - 0.80 < 0, so 0
    assert first.tolist()[0] == pytest.approx(0.20) and pd.isna(first.tolist()[1])
    assert first.tolist()[2] == 0.0
    # the short batch's extra from the warm probe too: 0.50 - (0.40 - 0.10)
    assert short.tolist()[1] == pytest.approx(0.20)
    # as measurements.csv gives the column back
    as_read = probes.assign(fresh_process=["True", "False", float("nan")])
    assert pd.isna(one_off_extras(as_read, 480)[0].tolist()[1])


def test_a_batch_past_b_max_is_feasible_as_micro_batches_with_its_memory_and_price():
    """train.accumulate: auto with b_max = 64 (a memory budget): B = 256 on N = 1 runs as 4
    micro-batches of 64, feasible, its memory a micro-batch's, its step 4 micro-steps of a
    flat step (a flat compute: the sync is 0); with accumulate 1 it is infeasible as before."""
    raw = {"grid": {"workers": [1], "batch_min": 64, "batch_max": 256}}
    mem = memory.MemoryModel(fit_linear([1, 2], [1e6, 2e6]), 64.5e6)  # 1 MB a sample
    cases = (("auto", [1, 2, 4], [True] * 3), (1, [1, 1, 1], [True, False, False]))
    # a fixed k that does not divide b: its largest micro-batch, ceil(b / k) (64 in 3: 22)
    cases += ((3, [3, 3, 3], [True, True, False]),)  # 86 > b_max
    for accumulate, k, feasible in cases:
        cfg = config.from_dict({**raw, "train": {"accumulate": accumulate}})
        pred = predict(model_inputs.planning(cfg), _flat_perf(0.1), mem, 1024)
        micro = [-(-b // kk) for b, kk in zip((64, 128, 256), k)]
        assert pred["accumulate"].tolist() == k and pred["feasible"].tolist() == feasible
        assert pred["micro_batch"].tolist() == micro
        assert pred["step_time_s"].tolist() == pytest.approx([0.1 * kk for kk in k], rel=1e-6)
        assert pred["mem_bytes"].tolist() == pytest.approx([1e6 * m for m in micro], rel=1e-6)


def test_a_point_probed_ok_carries_its_measured_step_and_t_and_a_failed_one_none():
    """predictions.csv beside each prediction: the probe's own step there and the T it makes
    (epochs x steps per epoch x that step), where the probe ran; none where it failed."""
    cfg = config.from_dict({"grid": {"workers": [1], "batch_min": 32, "batch_max": 64}})
    mem = memory.MemoryModel(fit_linear([1, 2], [1.0, 1.0]), None)
    probe = dict(workers=1, local_batch=32, source="probe", compute_time_s=0.1)
    measured = pd.DataFrame(
        [
            probe | dict(global_batch=32, status="ok", step_time_s=0.125),
            probe | dict(global_batch=64, local_batch=64, status="error", step_time_s=np.nan),
        ]
    )
    pred = predict(model_inputs.planning(cfg), _flat_perf(0.1), mem, 100, measured)
    ok, failed = pred.iloc[0], pred.iloc[1]
    assert ok["measured_step_time_s"] == 0.125 and failed["probe_status"] == "error"
    assert ok["measured_train_time_s"] == ok["epochs"] * ok["steps_per_epoch"] * 0.125
    assert np.isnan(failed["measured_step_time_s"]) and np.isnan(failed["measured_train_time_s"])


def test_a_model_without_an_input_floor_predicts_no_input_time():
    """No input time measured (the perf model has no floor): predictions.csv leaves the
    column empty, not 0 s, which would read as an input that costs nothing."""
    cfg = config.from_dict({"grid": {"workers": [1], "batch_min": 32, "batch_max": 64}})
    mem = memory.MemoryModel(fit_linear([1, 2], [1.0, 1.0]), None)
    perf = _flat_perf(0.1)
    assert perf.input is None
    pred = predict(model_inputs.planning(cfg), perf, mem, 100)
    assert pred["input_time_s"].isna().all()


def test_a_point_of_several_workers_without_a_measured_sync_is_not_a_candidate():
    """No multi-worker probe (no step model): N = 2's sync is unknown, never free; N = 1 is."""
    cfg = config.from_dict({"grid": {"workers": [1, 2], "batch_min": 64, "batch_max": 64}})
    mem = memory.MemoryModel(fit_linear([1, 2], [1e6, 1e6]), None)
    perf = _flat_perf(0.1)
    assert perf.step is None
    pred = predict(model_inputs.planning(cfg), perf, mem, 1024)
    assert dict(zip(pred["workers"], pred["feasible"])) == {1: True, 2: False}


def _as_read(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` as measurements.csv gives it back: written and parsed, its words new strings."""
    import io

    return pd.read_csv(io.StringIO(df.to_csv(index=False)))


def test_only_a_probe_that_ran_ok_gives_its_step_and_an_oom_one_rules_its_point_out():
    """A failed probe (error), one out of memory (oom) and one past its time limit may have
    timed a step before they stopped: none is the point's measured step. The oom one's point
    is no candidate; the others' are. Read as measurements.csv gives them back (parsed words,
    not literals)."""
    cfg = config.from_dict({"grid": {"workers": [1], "batch_min": 32, "batch_max": 256}})
    mem = memory.MemoryModel(fit_linear([1, 2], [1.0, 1.0]), None)
    probe = dict(workers=1, source="probe", compute_time_s=0.1)
    measured = _as_read(
        pd.DataFrame(
            [
                probe | dict(global_batch=32, local_batch=32, status="ok", step_time_s=0.125),
                probe | dict(global_batch=64, local_batch=64, status="error", step_time_s=0.2),
                probe | dict(global_batch=128, local_batch=128, status="oom", step_time_s=0.3),
                probe | dict(global_batch=256, local_batch=256, status="timeout", step_time_s=4),
            ]
        )
    )
    pred = predict(model_inputs.planning(cfg), _flat_perf(0.1), mem, 100, measured)
    assert pred["measured_step_time_s"].iloc[0] == 0.125
    assert pred["measured_step_time_s"].iloc[1:].isna().all()
    # a probe past its time limit says nothing of memory: its point stays a candidate
    assert pred["feasible"].tolist() == [True, True, False, True]
    assert pred["probe_status"].tolist() == ["ok", "error", "oom", "timeout"]
    assert pred["local_batch"].dtype.kind == "i"  # predictions.csv writes 32, not 32.0


def test_checkpoints_written_without_a_per_epoch_or_per_step_cadence():
    # steps every 10 of 5 x 7 = 35 (10, 20, 30) and the final one; none at epochs' ends
    assert checkpoints_written(5, 7, 10, None) == 4
    # every 3rd epoch but the last of 5 (3) and the final one: a whole count, not 1 + 4 / 3
    assert checkpoints_written(5, 7, None, 3) == 2


def test_a_wall_time_counts_only_the_ok_probes_overheads_and_the_first_steps_beyond_t():
    """One ok probe at N = 1 (D = 100 samples, B = 25: four full steps a epoch, no short one)
    measured its overheads and a first step 1.0 s long against a 0.1 s step; a failed and an
    oom probe beside it measured overheads of their own, which do not count. Two epochs, a
    checkpoint at each end: wall = start-up + T + (1.0 - 0.1) + first pass + later pass + 2
    writes, and the same besides on the interval's ends."""
    cfg = config.from_dict(
        {
            "grid": {"workers": [1], "batch_min": 25, "batch_max": 25},
            "workload": {"epochs": 2},
            "launch": {"checkpoint_every_epochs": 1},
        }
    )
    mem = memory.MemoryModel(fit_linear([1, 2], [1.0, 1.0]), None)
    over = dict(startup_time_s=4.0, eval_first_time_s=1.2, eval_time_s=0.8, checkpoint_time_s=0.2)
    bad = dict(startup_time_s=90.0, eval_first_time_s=9.0, eval_time_s=9.0, checkpoint_time_s=9.0)
    probe = dict(workers=1, global_batch=25, local_batch=25, source="probe", train_samples=100)
    measured = _as_read(
        pd.DataFrame(
            [
                probe | over | dict(status="ok", step_time_s=0.1, first_steps_time_s=1.0),
                probe | bad | dict(status="error", step_time_s=0.1, first_steps_time_s=9.0),
                probe | bad | dict(status="oom", step_time_s=0.1, first_steps_time_s=9.0),
            ]
        )
    )
    p = predict(model_inputs.planning(cfg), _flat_perf(0.1), mem, 100, measured).iloc[0]
    besides = 4.0 + (1.0 - 0.1) + 1.2 + 0.8 + 2 * 0.2
    assert p["first_steps"] == 1 and p["first_steps_time_s"] == pytest.approx(1.0)
    assert p["wall_time_s"] == pytest.approx(p["train_time_s"] + besides)
    assert p["wall_time_lo_s"] == pytest.approx(p["train_time_lo_s"] + besides)
    assert p["wall_time_hi_s"] == pytest.approx(p["train_time_hi_s"] + besides)


def test_a_first_step_no_slower_than_the_rest_costs_a_new_shape_nothing():
    """A probe whose first step took no longer than its later ones (an extra of exactly 0)
    on a device where each shape builds its own kernels: the point's short batch pays its
    own step and no extra either; where an N's probes predate the first-steps split (NaN),
    nothing is added for it."""
    from tula.model.predictions import first_steps

    probes = pd.DataFrame(
        dict(
            workers=[2],
            global_batch=[32],
            status="ok",
            train_samples=480,
            step_time_s=[0.1],
            first_steps_time_s=[0.1],
            first_short_step_s=[0.0],
        )
    )
    at_64 = pd.DataFrame(dict(workers=[2], global_batch=[64], step_time_s=[0.2]))
    got, k = first_steps(
        pd.DataFrame(dict(workers=[2], global_batch=[100], step_time_s=[0.3])),
        probes,
        n0=[2],
        builds_per_shape=True,
    )
    assert k == [2] and got == pytest.approx([2 * 0.3])
    # 480 % 64 = 32: a short batch, two shapes, each at its own step and nothing more
    assert first_steps(at_64, probes, n0=[2], builds_per_shape=True)[0] == pytest.approx([0.4])
    older = probes.drop(columns="first_short_step_s").assign(first_steps_time_s=[float("nan")])
    assert first_steps(at_64, older, n0=[2])[0] == [0.0]


def test_a_gpu_probe_pays_a_new_shapes_kernels_and_a_cpu_probe_does_not():
    """D = 110 at B = 25: four full batches and a short one of 10, two shapes. The probe's
    first step paid 0.9 s beyond its step and measured no short batch of its own: on a CPU in
    eager mode the short shape builds nothing (0.9 s once); on a GPU (cuDNN's autotuning) it
    pays its own (0.9 s twice). predictions.csv's micro-batch is a whole number of samples."""
    cfg = config.from_dict({"grid": {"workers": [1], "batch_min": 25, "batch_max": 25}})
    mem = memory.MemoryModel(fit_linear([1, 2], [1.0, 1.0]), None)
    over = dict(startup_time_s=4.0, eval_first_time_s=1.2, eval_time_s=0.8, checkpoint_time_s=0.2)
    probe = dict(workers=1, global_batch=25, local_batch=25, source="probe", train_samples=110)
    row = probe | over | dict(status="ok", step_time_s=0.1, first_steps_time_s=1.0)
    row["first_short_step_s"] = 0.0  # its short batch's first step not timed apart
    plan = model_inputs.planning(cfg)
    paid = {}
    for device in ("cpu", "cuda:0"):
        measured = _as_read(pd.DataFrame([row | dict(device=device)]))
        p = predict(plan, _flat_perf(0.1), mem, 110, measured).iloc[0]
        assert p["first_steps"] == 2 and p["micro_batch"] == 25
        paid[device] = p["first_steps_time_s"] - 2 * p["step_time_s"]
        assert predict(plan, _flat_perf(0.1), mem, 110, measured)["micro_batch"].dtype.kind == "i"
    assert paid["cpu"] == pytest.approx(0.9) and paid["cuda:0"] == pytest.approx(1.8)


def test_without_the_probes_data_size_each_point_pays_one_first_step():
    """Probes that did not record D (train_samples): no short batch can be placed, so each
    point pays one first step, its own step plus the probes' extra (0.30 - 0.10 = 0.20)."""
    from tula.model.predictions import first_steps

    probes = pd.DataFrame(
        dict(
            workers=[2],
            global_batch=[32],
            status="ok",
            step_time_s=[0.1],
            first_steps_time_s=[0.3],
            first_short_step_s=[0.0],
        )
    )
    points = pd.DataFrame(dict(workers=[2, 2], global_batch=[32, 100], step_time_s=[0.1, 0.3]))
    got, k = first_steps(points, probes, n0=[2, 2])
    assert k == [1, 1] and got == pytest.approx([0.1 + 0.2, 0.3 + 0.2])


def test_each_n_splits_its_batch_and_accumulates_past_b_max_with_a_measured_sync():
    """B = 256 on N = 1, 2, 4 with b_max = 64 (accumulate auto): local batches 256, 128, 64 run
    as 4, 2 and 1 micro-batches of 64. With a sync model fitted (multi-worker probes), every N
    is a candidate, N = 1 included, and sync_measured is a yes or no."""
    perf = perfmodel.fit(synced_probes((16, 32, 64)), "ring")
    assert perf.step is not None
    mem = memory.MemoryModel(fit_linear([1, 2], [1e6, 2e6]), 64.5e6)  # b_max = 64
    raw = {"grid": {"workers": [1, 2, 4], "batch_min": 256, "batch_max": 256}}
    cfg = config.from_dict({**raw, "train": {"accumulate": "auto"}})
    pred = predict(model_inputs.planning(cfg), perf, mem, 4096)
    assert pred["local_batch"].tolist() == [256, 128, 64]
    assert pred["accumulate"].tolist() == [4, 2, 1] and pred["micro_batch"].tolist() == [64] * 3
    assert pred["feasible"].tolist() == [True] * 3
    assert pred["sync_measured"].dtype == bool and pred["sync_measured"].all()
    # each N's step is the model's at its own local batch and micro-batches
    own = perf.accumulated(np.array([1.0, 2, 4]), np.array([256.0, 128, 64]), np.array([4, 2, 1]))
    assert pred["step_time_s"].tolist() == list(own["step_time_s"])


def test_a_batch_of_exactly_the_data_is_one_shape_whose_two_steps_are_taken_off():
    """B = D: the epoch is one full batch, no short one; the two first steps the probe timed
    are both of that shape, so its first step's extra is first_steps - 2 steps."""
    ok = pd.DataFrame(
        {
            "global_batch": [1000],
            "step_time_s": [0.3],
            "first_steps_time_s": [1.5],
            "first_short_step_s": [0.0],
        }
    )
    first, short = one_off_extras(ok, train_samples=1000)
    assert first.tolist() == pytest.approx([1.5 - 2 * 0.3]) and short.isna().all()
