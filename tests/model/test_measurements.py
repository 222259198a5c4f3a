"""The measurements table (tula.model.measurements), the public contract of tula fit and tula
predict: a table written elsewhere loads, and a bad one names its file, row and column."""

import pandas as pd
import pytest

from tula.model import measurements


def test_external_measurements_contract(tmp_path):
    p = tmp_path / "ext.csv"
    pd.DataFrame(
        [
            dict(
                workers=4,
                global_batch=256,
                local_batch=64,
                step_time_s=0.3,
                compute_time_s=0.2,
                sync_time_s=0.1,
                peak_mem_bytes=5e9,
                status="ok",
            )
        ]
    ).to_csv(p, index=False)
    assert len(measurements.load(p)) == 1


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.drop(columns=["sync_time_s"]), "missing column.*sync_time_s"),
        (lambda d: d.assign(step_time_s=["fast"]), "column step_time_s"),
        (lambda d: d.assign(local_batch=[32]), "local_batch x workers"),
    ],
)
def test_bad_measurements_name_file_and_column(tmp_path, change, message):
    p = tmp_path / "bad.csv"
    base = pd.DataFrame(
        [
            dict(
                workers=4,
                global_batch=256,
                local_batch=64,
                step_time_s=0.3,
                compute_time_s=0.2,
                sync_time_s=0.1,
                peak_mem_bytes=5e9,
                status="ok",
            )
        ]
    )
    change(base).to_csv(p, index=False)
    with pytest.raises(ValueError, match=message):
        measurements.load(p)


def test_source_rows_are_checked_for_what_they_must_carry(tmp_path):
    row = dict(
        workers=2,
        global_batch=64,
        local_batch=16,
        step_time_s=None,
        compute_time_s=None,
        sync_time_s=None,
        peak_mem_bytes=600,
        status="ok",
        source="sweep",
    )
    p = tmp_path / "m.csv"
    pd.DataFrame([row]).to_csv(p, index=False)
    # a sweep row is a compute time
    with pytest.raises(ValueError, match="row 2, column compute_time_s"):
        measurements.load(p)
    pd.DataFrame([row | {"source": "memory"}]).to_csv(p, index=False)
    assert measurements.load(p).loc[0, "peak_mem_bytes"] == 600  # a memory row needs no time
    # a probe row's peak may be missing only where peak_error says why (its timing stands)
    times = {"step_time_s": 0.3, "compute_time_s": 0.2, "sync_time_s": 0.1, "local_batch": 32}
    timed = row | {"source": "probe", **times}
    pd.DataFrame([timed | {"peak_mem_bytes": None}]).to_csv(p, index=False)
    with pytest.raises(ValueError, match="row 2, column peak_mem_bytes"):
        measurements.load(p)
    why = "torch's profiler could not build a step's memory timeline in 6 tries"
    pd.DataFrame([timed | {"peak_mem_bytes": None, "peak_error": why}]).to_csv(p, index=False)
    assert measurements.load(p).loc[0, "step_time_s"] == 0.3
    pd.DataFrame([row | {"source": "guess"}]).to_csv(p, index=False)
    with pytest.raises(
        ValueError, match="column source: 'guess' is not one of probe, sweep, memory"
    ):
        measurements.load(p)


def test_a_rows_judged_half_widths_and_steps():
    """The half-widths the precision rule judged: the robust ones where the steps spiked (mad),
    else the plain ones; a sweep row has no step. Steps judged: every kind, else the plain ones
    of an older row; a row judged over fewer than probe.timed_steps is short of them."""
    probe = pd.Series(
        {
            "source": "probe",
            "step_spread": "mad",
            "step_time_halfwidth_rel": 0.3,
            "step_time_halfwidth_judged_rel": 0.02,
            "compute_time_halfwidth_rel": 0.05,
            "compute_time_halfwidth_judged_rel": 0.01,
            "step_judged_steps": 12,
            "step_timed_steps": 10,
            "precision_min_steps": 20,
        }
    )
    assert measurements.judged_halfwidths(probe) == ([0.02, 0.01], True)
    plain = probe.copy()
    plain["step_spread"] = "sd"
    assert measurements.judged_halfwidths(plain) == ([0.3, 0.05], False)
    for older in (probe.drop("step_spread"), probe.replace({"mad": float("nan")})):
        assert measurements.judged_halfwidths(older) == ([0.3, 0.05], False)  # before the spread
    sweep = pd.Series({"source": "sweep", "compute_time_halfwidth_rel": float("nan")})
    assert measurements.judged_halfwidths(sweep) == ([None, None], False)
    # a sweep row's step half-width is never read, whatever the row carries
    stray = pd.Series({"source": "sweep", "step_time_halfwidth_rel": 0.1})
    assert measurements.judged_halfwidths(stray) == ([None, None], False)
    assert measurements.judged_steps(probe) == 12
    older = probe.drop("step_judged_steps")
    assert measurements.judged_steps(older) == 10
    assert measurements.short_of_steps(probe) == 20
    assert measurements.short_of_steps(probe.drop("precision_min_steps")) is None
    enough = probe.copy()
    enough["step_judged_steps"] = 20
    assert measurements.short_of_steps(enough) is None
    enough["step_judged_steps"] = 25  # more than the least: not short either
    assert measurements.short_of_steps(enough) is None


def test_a_run_at_chance_is_said_so_and_only_for_accuracy():
    final = {"final_test_acc": 0.11, "best_test_acc": 0.14, "final_train_loss": 2.3}
    said = measurements.at_chance(final, 10)
    assert said.startswith("The final test accuracy, 11.00 %, is at chance for 10 classes (10 %")
    assert "best 14.00 %" in said and "training loss at 2.3" in said
    assert "at chance for 6 classes (17 %" in measurements.at_chance({"final_test_acc": 0.2}, 6)
    # at most AT_CHANCE / classes: 15 % of 10 classes is at chance, 16 % is not
    assert measurements.at_chance({"final_test_acc": 0.15}, 10) is not None
    assert measurements.at_chance({"final_test_acc": 0.16}, 10) is None
    assert measurements.at_chance({**final, "metric": "user:f1"}, 10) is None
    assert measurements.at_chance(final, 1) is None and measurements.at_chance(final, None) is None
    assert measurements.at_chance({}, 10) is None
    assert measurements.at_chance({**final, "metric": "abc.metrics:F1"}, 10) is None
    # two classes: at chance up to 75 %; three: the chance level said to the percent
    assert "at chance for 2 classes (50 %" in measurements.at_chance({"final_test_acc": 0.6}, 2)
    assert "at chance for 3 classes (33 %" in measurements.at_chance({"final_test_acc": 0.4}, 3)


def test_a_missing_or_empty_measurements_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="m.csv: measurements file not found"):
        measurements.load(tmp_path / "m.csv")
    (tmp_path / "e.csv").write_text("")
    with pytest.raises(ValueError, match="e.csv: empty file; expected columns workers"):
        measurements.load(tmp_path / "e.csv")


def test_an_unknown_source_is_named_at_its_own_row(tmp_path):
    """The first row whose source is not one Tula writes, by its line in the file (the header
    is line 1)."""
    p = tmp_path / "m.csv"
    row = dict(workers=1, global_batch=32, local_batch=32, step_time_s=0.3, status="ok")
    row |= dict(compute_time_s=0.2, sync_time_s=0.1, peak_mem_bytes=5e9)
    pd.DataFrame([row | {"source": s} for s in ("probe", "probe", "guess")]).to_csv(p, index=False)
    with pytest.raises(ValueError, match="row 4, column source: 'guess' is not one of"):
        measurements.load(p)
    # two unknown words: the first row's own, not the first in the alphabet
    pd.DataFrame([row | {"source": s} for s in ("probe", "wild", "guess")]).to_csv(p, index=False)
    with pytest.raises(ValueError, match="row 3, column source: 'wild' is not one of"):
        measurements.load(p)


def test_steps_of_one_batch_are_fitted_as_they_were_measured():
    """No row accumulates micro-batches: the table is the one-batch steps the model fits,
    every column and type as it was."""
    df = pd.DataFrame(
        dict(workers=[1, 2], local_batch=[32, 16], compute_time_s=[0.2, 0.1], step_time_s=0.3)
    )
    pd.testing.assert_frame_equal(measurements.as_micro_batches(df), df)


def test_a_negative_time_is_named_and_a_zero_one_is_a_number(tmp_path):
    p = tmp_path / "m.csv"
    row = dict(workers=1, global_batch=32, local_batch=32, step_time_s=0.3, status="ok")
    row |= dict(compute_time_s=0.2, sync_time_s=0.0, peak_mem_bytes=5e9)
    pd.DataFrame([row]).to_csv(p, index=False)
    assert measurements.load(p)["sync_time_s"].tolist() == [0.0]
    pd.DataFrame([row | {"sync_time_s": -0.1}]).to_csv(p, index=False)
    with pytest.raises(ValueError, match="row 2, column sync_time_s: -0.1 is not a non-negative"):
        measurements.load(p)


def test_a_probe_whose_batches_do_not_multiply_is_named_at_its_row(tmp_path):
    p = tmp_path / "m.csv"
    row = dict(workers=4, global_batch=256, local_batch=32, step_time_s=0.3, status="ok")
    row |= dict(compute_time_s=0.2, sync_time_s=0.1, peak_mem_bytes=5e9)
    pd.DataFrame([row]).to_csv(p, index=False)
    with pytest.raises(ValueError, match="row 2: local_batch x workers != global_batch"):
        measurements.load(p)
    pd.DataFrame([row | {"local_batch": 128}]).to_csv(p, index=False)  # 512 > 256: too many
    with pytest.raises(ValueError, match="row 2: local_batch x workers != global_batch"):
        measurements.load(p)


def test_an_accumulated_rows_memory_was_measured_at_its_largest_micro_batch():
    """k micro-batches of b samples: the largest is ceil(b / k) (10 in 4: 3, 3, 2, 2)."""
    df = pd.DataFrame(dict(local_batch=[10, 8, 7], accumulate=[4, 4, 1]))
    assert measurements.memory_batch(df).tolist() == [3, 2, 7]


def test_a_sweep_row_keeps_its_probes_n_and_b_at_another_local_batch(tmp_path):
    """A sweep row times compute at another local batch inside a probe job: it carries that
    probe's N and B (tula.stages.aggregate), so its batches do not multiply, and it loads."""
    p = tmp_path / "m.csv"
    probe = dict(workers=4, global_batch=256, local_batch=64, step_time_s=0.3, status="ok")
    probe |= dict(compute_time_s=0.2, sync_time_s=0.1, peak_mem_bytes=5e9, source="probe")
    sweep = dict(workers=4, global_batch=256, local_batch=16, compute_time_s=0.06, status="ok")
    pd.DataFrame([probe, sweep | {"source": "sweep"}]).to_csv(p, index=False)
    assert measurements.load(p)["local_batch"].tolist() == [64, 16]


def test_a_step_that_pays_nothing_once_is_not_paid_back_a_negative_time():
    """Probes whose one-batch compute came out below their micro-batches' part (noise, a fast
    step): what a step pays once is 0 at that N, not a negative time."""
    rows = pd.DataFrame(
        dict(
            source="probe",
            workers=[1, 1, 2],
            accumulate=1,
            compute_time_s=[0.010, 0.010, 0.012],
            micro_time_s=[0.011, 0.011, 0.010],
        )
    )
    assert measurements.once_per_step(rows) == ((1.0, 0.0), (2.0, pytest.approx(0.002)))


def _probe_row(**change):
    row = dict(workers=1, global_batch=32, local_batch=32, step_time_s=0.3, status="ok")
    return row | dict(compute_time_s=0.2, sync_time_s=0.1, peak_mem_bytes=5e9) | change


def test_a_row_that_did_not_run_is_not_checked_for_numbers_it_never_measured(tmp_path):
    """A probe that failed or timed out wrote what it had: a time it never measured (empty) or
    one it could not finish (negative) is no error in the table, as it would be on an ok row."""
    p = tmp_path / "m.csv"
    rows = [_probe_row(), _probe_row(status="error", step_time_s=None, compute_time_s=-1.0)]
    pd.DataFrame(rows).to_csv(p, index=False)
    assert measurements.load(p)["status"].tolist() == ["ok", "error"]


def test_a_probe_without_its_memory_peak_must_still_carry_its_times(tmp_path):
    """peak_error says why an ok probe has no memory peak (the profiler failed): it excuses
    that column only; the probe's step time is still required."""
    p = tmp_path / "m.csv"
    pd.DataFrame([_probe_row(peak_mem_bytes=None, peak_error="profiler")]).to_csv(p, index=False)
    assert len(measurements.load(p)) == 1
    for col in ("step_time_s", "compute_time_s"):  # after the peak's name and before it
        gone = _probe_row(peak_mem_bytes=None, peak_error="profiler", **{col: None})
        pd.DataFrame([gone]).to_csv(p, index=False)
        with pytest.raises(ValueError, match=f"row 2, column {col}: nan is not a non-negative"):
            measurements.load(p)


def test_the_probes_are_the_timed_rows_not_the_sweeps_or_the_memory_probes():
    df = pd.DataFrame(dict(source=["probe", "sweep", "memory"], workers=[1, 1, 1]))
    assert measurements.probes(df)["source"].tolist() == ["probe"]
    memory_row = pd.Series({"source": "memory", "step_time_halfwidth_rel": 0.1})
    assert measurements.judged_halfwidths(memory_row) == ([None, None], False)


def test_a_final_record_read_from_json_is_judged_for_chance_as_one_built_here():
    """summary.json's final figures, parsed from text: its metric word is the same word."""
    import json

    final = json.loads('{"final_test_acc": 0.11, "metric": "accuracy"}')
    assert measurements.at_chance(final, 10) is not None


def test_a_step_is_host_bound_where_queuing_it_took_at_least_nine_tenths_of_it():
    shares = pd.Series([0.95, 0.9, 0.5])
    assert measurements.host_bound(shares).tolist() == [True, True, False]


def test_a_step_of_micro_batches_reads_its_input_one_micro_batch_at_a_time():
    """k = 4 micro-batches of 8 samples, 20 ms of input for the 32: the one-batch step at 8
    samples that the model fits reads 5 ms of it."""
    row = dict(workers=1, local_batch=32, accumulate=4, compute_time_s=0.2, step_time_s=0.2)
    out = measurements.as_micro_batches(pd.DataFrame([row | {"input_time_s": 0.02}]))
    assert out["local_batch"].tolist() == [8.0] and out["input_time_s"].tolist() == [0.005]


def test_a_row_parsed_from_text_is_judged_as_one_built_here():
    """The words of a row read from a CSV are other string objects than the code's literals:
    a probe row whose steps spiked still reads its robust half-widths."""
    import io

    text = "source,step_spread,step_time_halfwidth_rel,step_time_halfwidth_judged_rel\n"
    row = pd.read_csv(io.StringIO(text + "probe,mad,0.3,0.02\n")).iloc[0]
    assert measurements.judged_halfwidths(row) == ([0.02, None], True)


def test_a_workers_communication_variables_are_one_cell():
    env = {"comm_env": {"NCCL_IB_DISABLE": "1", "GLOO_SOCKET_IFNAME": "eth0"}}
    assert measurements.comm_env_text(env) == "GLOO_SOCKET_IFNAME=eth0;NCCL_IB_DISABLE=1"
    assert measurements.comm_env_text({}) == "" == measurements.comm_env_text({"comm_env": None})
