from dataclasses import replace

import pandas as pd
import pytest

from selections import selection
from tula.stages.report.sections import _cell, _table


def test_cells_are_readable():
    assert _cell("error", float("nan")) == ""
    assert _cell("peak_mem_bytes", 3 * 2**20) == "3.00"
    assert _cell("step_time_s", 0.0123456) == "0.01235"


def test_table_marks_selection_and_converts_headers():
    df = pd.DataFrame({"workers": [1, 2], "global_batch": [64, 64], "mem_bytes": [2**20, 2**21]})
    html = _table(df, highlight=(2, 64))
    assert "<th>mem (MiB)</th>" in html and html.count("class=sel") == 1 and "nan" not in html


ATTEMPTS = {
    "selected_batch": 128,
    "attempts": [
        {
            "attempt": 1,
            "job_id": "41",
            "global_batch": 128,
            "local_batch": 64,
            "start_step": 0,
            "end_step": 40,
            "outcome": "oom",
            "reason": "out of memory at step 40 on rank(s) [1]",
            "segments": [{"start_step": 0}],
        },
        {
            "attempt": 2,
            "job_id": "42",
            "global_batch": 64,
            "local_batch": 32,
            "start_step": 36,
            "end_step": 312,
            "outcome": "completed",
            "reason": "trained every epoch",
            "segments": [{"start_step": 36}, {"start_step": 48}],
        },
    ],
}


def test_attempts_table_shows_batch_and_why_each_attempt_ended():
    from tula.stages.report.sections import attempts_table

    html = attempts_table(ATTEMPTS)
    assert html.count("<tr>") == 3 and "relaunched from its last checkpoint at B=64" in html
    assert (
        "<td class=bad>oom</td>" in html
        and "out of memory at step 40" in html
        and "<td>1×</td>" in html
    )
    assert "not known" in attempts_table(None)


def test_training_curve_marks_relaunches_and_requeues():
    from tula.stages.plot.training import attempt_marks

    metrics = pd.DataFrame({"epoch": [1, 2, 3, 4], "step": [12, 24, 36, 60]})
    marks = attempt_marks(metrics, ATTEMPTS)
    assert marks == [(3.0, "B=64 (OOM at B=128)", True), (pytest.approx(3.5), "resumed", False)]
    assert attempt_marks(metrics, None) == []


def test_summary_card_shows_predicted_vs_measured():
    from tula.stages.report.sections import prediction_card

    final = {
        "workers": 2,
        "global_batch": 128,
        "predicted_step_time_s": 0.0267,
        "mean_step_time_s": 0.0250,
        "predicted_step_time_interval_s": [0.020, 0.033],
        "predicted_train_time_s": 4.8,
        "predicted_train_time_interval_s": [3.6, 5.9],
        "step_time_ratio": 0.025 / 0.0267,
        "train_time_s": 4.5,
        "eval_time_s": 0.3,
        "checkpoint_time_s": 0.2,
        "startup_time_s": 4.9,
    }
    html = prediction_card(final)
    assert "step predicted 26.70 ms (20.00–33.00), measured 25.00 ms (×0.936, inside" in html
    assert (
        "training time predicted 4.8 s (3.6 s–5.9 s) for every step, measured 4.5 s in training "
        "steps" in html
    )
    final["mean_step_time_s"] = 0.040
    assert "outside the prediction" in prediction_card(final)
    assert "No prediction" in prediction_card({"workers": 1})
    # probes from before the wall-time parts
    assert "wall time was not predicted" in prediction_card(final)
    final["wall_check"] = [
        {"part": "steps", "predicted_s": 4.8, "measured_s": 4.5, "ratio": 4.5 / 4.8},
        {"part": "rest", "predicted_s": None, "measured_s": 0.1, "ratio": None},
        {"part": "wall time", "predicted_s": 9.0, "measured_s": 10.0, "ratio": 10.0 / 9.0},
    ]
    html = prediction_card(final)
    # tenths of a second below a minute: a part of 0.2 s reads so, not "0s" beside a ratio
    assert "<td>steps</td><td>4.8 s</td><td>4.5 s</td><td>×0.94</td>" in html
    assert "<td>rest</td><td>—</td><td>0.1 s</td><td>not modelled</td>" in html
    # 11 % over: more than the 5 % the prediction aims at
    assert "<tr class=bad><td>wall time</td>" in html


def test_model_section_says_which_form_won_why_and_how_close_each_probe_is():
    from tula.stages.report.sections import model_section

    perf = {
        "compute": {
            "form": "saturating",
            "equation": "c0 + c1*max(b - b0, 0)",
            "params": {"c0": 0.02, "c1": 3e-4, "b0": 60.0},
            "params_ci95": {"c0": [0.019, 0.021], "c1": [2.9e-4, 3.1e-4], "b0": [55.0, 65.0]},
            "why": "leave-one-out error 1.2 % RMS over 40 points; linear: 30 %",
        },
        "step": None,
        "residuals": [
            {
                "workers": 1,
                "global_batch": 32,
                "error_pct": 1.0,
                "noise_pct": 3.0,
                "within_noise": True,
            },
            {
                "workers": 1,
                "global_batch": 512,
                "error_pct": -7.0,
                "noise_pct": 3.0,
                "within_noise": False,
            },
        ],
    }
    html = model_section(perf)
    assert (
        "<code>saturating</code>" in html and "b0 = 60 [55, 65]" in html and "linear: 30 %" in html
    )
    assert "the 95 % half-width of its mean step) at 1 of 2 probes" in html
    assert "Step (sync)" not in html and model_section(None) == ""


def test_noise_section_says_where_the_chosen_batch_sits_against_the_critical_batch():
    import pandas as pd

    from tula.stages.report.sections import noise_section

    pred = pd.DataFrame(
        {
            "global_batch": [64, 256],
            "b_noise": [128.0, 128.0],
            "b_noise_se": [12.0, 12.0],
            "epochs_to_accuracy": [4.2, 7.5],
        }
    )
    html = noise_section(pred, 256)
    assert "B_noise = <b>128</b> &plusmn; 12" in html and "B = 256 is 2.00&times; B_noise" in html
    assert "worth 33 %" in html and "7.5 epochs" in html
    assert "Not measured" in noise_section(pred.assign(b_noise=float("nan")), 64)


def test_the_drift_card_says_what_the_monitored_steps_found():
    from tula.stages.report.sections import drift_card

    assert "No monitored steps" in drift_card({"monitored_steps": 0})
    # why none: the reason the monitor gave, or a run shorter than its first pair
    off = drift_card({"monitored_steps": 0, "monitor_off": "one worker has no sync to time"})
    assert "(one worker has no sync to time)" in off
    short = {"monitored_steps": 0, "monitor_off": None, "monitor_every_steps": "auto"}
    card = drift_card({**short, "monitor_first_due_step": 100, "steps": 45})
    assert "launch.monitor_every_steps: auto put the first pair at step 100" in card
    assert "the job trained 45 steps" in card and "one worker" not in card
    assert "none" in drift_card(
        {"monitored_steps": 7, "drift": []}
    ) and "7 monitored steps" in drift_card({"monitored_steps": 7, "drift": []})
    d = {
        "step": 40,
        "reason": "sync 41.0 ms vs predicted 12.0 ms (8.9-15.6) for 40 steps",
        "action": "recorded",
    }
    card = drift_card({"monitored_steps": 9, "drift": [d]})
    assert (
        "found 1 time(s) in 9 monitored steps" in card
        and "step 40: sync 41.0 ms vs predicted 12.0 ms" in card
    )


def test_a_move_is_said_with_its_reason_and_each_attempt_shows_its_n():
    from tula.stages.plot.training import attempt_marks
    from tula.stages.report.sections import attempts_table

    why = (
        "sync 41.0 ms vs predicted 12.0 ms; moved from N=4 B=128 to N=2 B=128, predicted to save "
        "31 % of the remaining time"
    )
    rec = {
        "selected_batch": 128,
        "workers": 4,
        "attempts": [
            {
                "attempt": 1,
                "job_id": "7",
                "workers": 4,
                "global_batch": 128,
                "local_batch": 32,
                "start_step": 0,
                "end_step": 90,
                "outcome": "moved",
                "reason": why,
                "segments": [{"start_step": 0}],
            },
            {
                "attempt": 2,
                "job_id": "8",
                "workers": 2,
                "global_batch": 128,
                "local_batch": 64,
                "start_step": 90,
                "end_step": 300,
                "outcome": "completed",
                "reason": "trained every epoch",
                "segments": [{"start_step": 90}],
            },
        ],
    }
    html = attempts_table(rec)
    assert f"<p>Network drift: {why}.</p>" in html and "<td>4</td><td>128</td><td>32</td>" in html
    assert "<td>moved</td>" in html and "relaunched" not in html  # a move is not an error
    metrics = pd.DataFrame({"epoch": [1, 2, 3], "step": [100, 200, 300]})
    assert attempt_marks(metrics, rec) == [(0.9, "N=2 B=128 (moved at N=4 B=128)", True)]


def test_input_section_marks_where_the_input_sets_the_pace_and_what_would_lift_it():
    from tula.stages.report.pace import input_section

    pred = pd.DataFrame(
        {
            "workers": [1, 2, 4],
            "global_batch": [64, 64, 64],
            "step_time_s": [0.10, 0.06, 0.05],
            "input_time_s": [0.095, 0.05, 0.01],
            "input_bound": [True, True, False],
        }
    )
    meas = pd.DataFrame({"data_workers": [3, 3, 1]})
    card = input_section(pred, meas, (2, 64))
    assert "The input sets the pace</b> at N=1 B=64, N=2 B=64 " in card and "N=4" not in card
    assert "the selected point is one of them" in card and "the probes read with 1, 3" in card
    assert "data.num_workers" in card and "--cpus-per-task" in card
    calm = input_section(pred.assign(input_bound=False), meas, (4, 64))
    assert "at most 95 % of a predicted step" in calm and "does not set the pace" in calm
    tiny = input_section(
        pred.assign(input_bound=False, input_time_s=[4e-5, 4e-5, 4e-5]), meas, (4, 64)
    )
    assert "at most 0.08 % of a predicted step" in tiny  # small shares keep their digits, not "0 %"
    # not measured: not said
    assert input_section(pred.assign(input_time_s=float("nan")), meas, (1, 64)) == ""


def test_the_precision_table_names_the_points_that_missed_and_what_would_reach_them():
    from tula.stages.report.trust import precision_section

    m = pd.DataFrame(
        [
            dict(source="probe", status="ok", workers=1, global_batch=32, local_batch=32,
                 step_time_s=0.01, compute_time_s=0.01, step_time_halfwidth_rel=0.01,
                 compute_time_halfwidth_rel=0.015, step_timed_steps=40, compute_timed_steps=40,
                 precision_target=0.02, precision_reached=True),
            dict(source="probe", status="ok", workers=2, global_batch=512, local_batch=256,
                 step_time_s=0.05, compute_time_s=0.04, step_time_halfwidth_rel=0.08,
                 compute_time_halfwidth_rel=0.04, step_timed_steps=10, compute_timed_steps=10,
                 precision_target=0.02, precision_reached=False),
        ]
    )  # fmt: skip
    html = precision_section(m)
    assert "1 of 2 points missed it" in html and html.count("class=bad>") == 2
    # +-8 % from 10 steps: (8 / 2)^2 x 10 = 160 steps of 90 ms (step + compute) = 14 s
    assert "N=2 B=512: &plusmn;8.0 %, about 160 steps (~14s of timing)" in html
    assert precision_section(m.drop(columns="precision_reached")) == ""
    # digits' 1437 samples at B = 512: an epoch of 3 steps, one plain; the precision weighs all
    # three kinds, so the 10 plain steps came with 20 others, and all of them scale alike
    html = precision_section(m.assign(train_samples=1437))
    assert "N=2 B=512: &plusmn;8.0 %, about 480 steps (~43s of timing)" in html
    # a probe whose few spiking steps were judged by their robust spread shows that half-width
    spiky = m.assign(
        step_spread=["mad", "sd"],
        step_spikes=[2, 0],
        step_time_halfwidth_rel=[0.09, 0.08],
        step_time_halfwidth_judged_rel=[0.012, 0.08],
        compute_time_halfwidth_judged_rel=[0.015, 0.04],
    )
    html = precision_section(spiky)
    assert "<td>1.2 % (robust spread: 2 step(s) spiked)</td>" in html and "9.0 %" not in html
    assert "1 of 2 points missed it" in html


def test_a_probe_short_of_its_steps_is_told_so_in_the_report_and_the_summary(tmp_path):
    """A probe whose half-widths are within the target but whose budget ran out before the
    plain steps probe.timed_steps asks (an epoch of a few steps at a large B) missed its
    precision for want of steps: the report and the end-of-run summary say so, and what would
    reach it is those steps, not fewer than it timed."""
    from tula.model.measurements import short_of_steps
    from tula.stages.report.trust import precision_section
    from tula.stages.summary import _trust

    row = dict(
        source="probe",
        status="ok",
        workers=1,
        global_batch=256,
        local_batch=256,
        step_time_s=0.05,
        compute_time_s=0.04,
        step_time_halfwidth_rel=0.014,
        compute_time_halfwidth_rel=0.012,
        step_timed_steps=7,
        compute_timed_steps=6,
        precision_target=0.02,
        precision_min_steps=20,
        precision_reached=False,
    )
    m = pd.DataFrame([row])
    html = precision_section(m)
    # (1.4 / 2)^2 x 7 would be 3 steps: the 20 plain steps are what it lacks, 20 x 90 ms = 1.8 s
    assert (
        "N=1 B=256: &plusmn;1.4 % on 7 steps, under the 20 probe.timed_steps asks, "
        "about 20 steps (~2s of timing)"
    ) in html
    # half-widths beyond the target on enough steps: the rule of the half-width alone
    wide = precision_section(
        pd.DataFrame([{**row, "step_time_halfwidth_rel": 0.08, "step_timed_steps": 30}])
    )
    assert "N=1 B=256: &plusmn;8.0 %, about 480 steps" in wide and "probe.timed_steps" not in wide
    m.to_csv(tmp_path / "measurements.csv", index=False)
    (line,) = _trust(tmp_path, selection(1, 64), None)
    assert "1 of 1 probes missed their precision: N1_B256 (±1.4 % on 7 steps of the 20" in line
    # the minimum counts the steps the half-width is over, epoch starts too where it weighs them
    assert short_of_steps(pd.Series({**row, "step_judged_steps": 20})) is None
    assert short_of_steps(pd.Series({**row, "step_judged_steps": 9})) == 20
    lacking = precision_section(pd.DataFrame([{**row, "step_judged_steps": 9}]))
    assert "on 9 steps, under the 20 probe.timed_steps asks" in lacking
    m.assign(precision_min_steps=float("nan")).to_csv(tmp_path / "measurements.csv", index=False)
    (line,) = _trust(
        tmp_path, selection(1, 64), None
    )  # a table from before the column: the half-width alone
    assert "N1_B256 (±1.4 %)" in line
    # the summary shows the figure the report shows: the wider arm, as the rule judged it
    spiky = m.assign(
        precision_min_steps=20,
        step_timed_steps=30,
        step_spread="mad",
        step_spikes=2,
        step_time_halfwidth_rel=0.09,
        step_time_halfwidth_judged_rel=0.012,
        compute_time_halfwidth_rel=0.031,
        compute_time_halfwidth_judged_rel=0.031,
    )
    spiky.to_csv(tmp_path / "measurements.csv", index=False)
    (line,) = _trust(tmp_path, selection(1, 64), None)
    assert "N1_B256 (±3.1 %)" in line and "<li>N=1 B=256: &plusmn;3.1 %," in precision_section(
        spiky
    )


def test_the_host_section_says_below_which_batch_the_gpu_waits_for_python():
    from tula.stages.report.pace import host_section

    m = pd.DataFrame(
        {
            "source": ["probe"] * 4 + ["sweep"],
            "status": ["ok"] * 5,
            "workers": [1, 1, 1, 1, 1],
            "global_batch": [32, 64, 256, 1024, 128],
            "step_host_share": [0.98, 0.93, 0.41, 0.12, None],
            "host_bound": [True, True, False, False, None],
        }
    )
    card = host_section(m)
    assert "The host sets the pace below B = 256: the GPU waits for Python." in card
    assert "N=1 B=32 (98 %), N=1 B=64 (93 %)" in card and "B=1024" not in card
    assert "train.compile: true" in card and "a larger batch per worker" in card
    everywhere = host_section(m.assign(step_host_share=[0.98, 0.97, 0.95, 0.92, None]))
    assert "at every batch probed up to B = 1024" in everywhere
    busy = host_section(m.assign(step_host_share=[0.3, 0.2, 0.1, 0.05, None]))
    assert "at most 30 % of its time" in busy and "card bad" not in busy
    # a CPU has no queue: its probes cannot tell, and the report says nothing
    assert host_section(m.assign(step_host_share=None)) == ""
    assert host_section(m.drop(columns=["step_host_share", "host_bound"])) == ""


def test_an_unsettled_choice_says_so_with_its_rule_and_what_would_settle_it():
    from tula.model.selection import Robustness
    from tula.stages.report.trust import robustness_line

    r = {
        "resamples": 100,
        "chosen": {"workers": 2, "global_batch": 256, "share": 0.55},
        "runner_up": {"workers": 2, "global_batch": 512, "share": 0.45},
        "settled": False,
        "scatter_ratio": 2.5,
        "rule": "the point chosen in most resamples",
        "to_settle": "time N=2 B=256 and N=2 B=512 more precisely",
    }
    shares = [r["chosen"], r["runner_up"]]
    r |= dict(method="", shares=shares, point_estimate=r["chosen"], threshold=0.6)
    held = Robustness.from_json(r)
    html = robustness_line(held)
    assert "not settled at this noise" in html and "<b>55 %</b>" in html and "2.5" in html
    assert "N=2 B=512, in 45 %" in html and "time N=2 B=256 and N=2 B=512" in html
    settled = replace(held, settled=True)
    assert "not settled" not in robustness_line(settled) and robustness_line(None) == ""


def test_nodes_and_links_name_the_hosts_and_each_levels_bus_bandwidth():
    """Where the probes and the production job ran, and per network level the probes' sync and
    the ring bus bandwidth it implies: 2(N-1)/N x the gradient bytes / the sync time."""
    from tula.stages.report.cluster import nodes_section

    mb = 2**20
    m = pd.DataFrame(
        {
            "source": ["probe", "probe", "probe", "sweep"],
            "status": ["ok"] * 4,
            "workers": [1, 2, 4, 4],
            "nodes": [1, 1, 2, 2],
            "sync_time_s": [0.0, 0.002, 0.080, None],
            "grad_bytes_per_step": [mb, mb, mb, None],
            "hosts": ["tula-n0", "tula-n0 tula-n0", "tula-n0 tula-n0 tula-n1 tula-n1", None],
        }
    )
    final = {"hostnames": ["tula-n0", "tula-n0", "tula-n1", "tula-n1"]}
    html = nodes_section(m, final)
    assert "4 worker(s) on 2 node(s): tula-n0 (2 workers), tula-n1 (2 workers)" in html
    assert "The probes ran on tula-n0, tula-n1." in html
    # within a node: 2 x 1/2 x 1 MiB / 2 ms; between nodes: 2 x 3/4 x 1 MiB / 80 ms
    assert (
        f"sync median 2.0 ms for 1.00 MiB of gradients a step: {mb / 0.002 / 1e6:.1f} MB/s" in html
    )
    assert (
        f"sync median 80.0 ms for 1.00 MiB of gradients a step: {1.5 * mb / 0.08 / 1e6:.1f}" in html
    )
    assert "<b>within a node</b> (N = 2, 1 probe(s))" in html
    assert "<b>between nodes</b> (N = 4, 1 probe(s))" in html
    assert "not a link's between nodes" not in html
    one = nodes_section(m.iloc[:1].drop(columns=["hosts"]), {})
    assert "no link was measured" in one
    # a local run: N = 4 planned on 2 nodes, its workers all on one machine
    m["hosts"] = ["vm", "vm vm", "vm vm vm vm", None]
    local = nodes_section(m, {"hostnames": ["vm"] * 4})
    assert (
        "MB/s ring bus bandwidth; the plan's nodes were one machine here (vm), so this is that "
        "machine's rate, not a link's between nodes</li>" in local
    )


def test_a_lost_node_is_said_in_the_attempts_table():
    from tula.stages.report.sections import attempts_table

    lost = {
        "attempts": [
            {**ATTEMPTS["attempts"][0], "outcome": "replanned", "reason": "partition 'lab' lost"},
            ATTEMPTS["attempts"][1],
        ]
    }
    html = attempts_table(lost)
    assert "Node lost (attempt 1): partition &#x27;lab&#x27; lost." in html
    assert "<td class=bad>replanned</td>" in html


def _memory_probe(measured_at_64: float) -> dict:
    from tula.model import estimated

    mib = 2**20
    est = {"fixed_bytes": 10 * mib, "per_sample_bytes": mib, "flops_per_sample": 2e9}
    pts = [
        {"local_batch": 16, "status": "ok", "peak_mem_bytes": 26 * mib},
        {"local_batch": 64, "status": "ok", "peak_mem_bytes": measured_at_64},
    ]
    fit = {"intercept": 10 * mib, "slope": mib}
    return {
        "points": pts,
        "estimate": {
            **est,
            "device": "cuda",
            "ruled_out": [
                {"local_batch": 4096, "estimate_bytes": estimated.predict_bytes(est, 4096)}
            ],
            "against_probe": estimated.against_probe(est, pts, fit),
        },
    }


def test_the_estimate_section_says_how_far_the_model_alone_held(tmp_path):
    """Where it held: its error at each batch and the bound; where the probe contradicted it:
    by how much, and that the probe's figures were used; the batches it ruled out unmeasured.
    The end-of-run summary names a contradicted estimate among what not to trust."""
    from tula.io import write_json
    from tula.stages.report.trust import estimate_section
    from tula.stages.summary import _estimate_contradicted

    mib = 2**20
    held = estimate_section(_memory_probe(74 * mib))
    assert "The estimate held: +0.0% at the largest batch measured" in held
    assert "local batch 4096 (4.3 GB)" in held and "class=bad" not in held
    off = estimate_section(_memory_probe(100 * mib))  # the estimate 26 % low at b=64
    assert "disagree: -26.0% at the largest batch measured" in off and "class=bad" in off
    assert "<td>64</td><td>100.0</td><td>74.0</td><td>-26.0%</td>" in off
    assert estimate_section({"points": []}) == ""  # no estimate (a model that reads its values)
    write_json(tmp_path / "memory_probe.json", _memory_probe(100 * mib))
    assert "-26% off the memory probe" in _estimate_contradicted(tmp_path / "memory_probe.json")
    write_json(tmp_path / "memory_probe.json", _memory_probe(74 * mib))
    assert _estimate_contradicted(tmp_path / "memory_probe.json") == ""


def test_the_decode_line_says_which_decoder_the_probes_measured_faster():
    from tula.stages.report.pace import decode_line

    m = pd.DataFrame(
        {
            "source": ["probe", "probe", "sweep"],
            "decode": ["cpu", "cpu", None],
            "decode_faster_by": [2.44, 2.1, None],
        }
    )
    line = decode_line(m)
    assert "read on the CPU (loader workers), 2.10-2.44x faster than the other" in line
    assert "data.decode to cpu or gpu" in line and "close" not in line
    split = decode_line(m.assign(decode=["cpu", "gpu", None], decode_faster_by=[1.05, 1.02, None]))
    assert "1 probe(s) on the CPU (loader workers), 1 probe(s) on the GPU (nvJPEG)" in split
    assert "the two were close" in split
    # nothing measured (not auto, no JPEG folder, or no CUDA): nothing said
    assert decode_line(m.assign(decode=None)) == "" and decode_line(m.drop(columns="decode")) == ""


def test_a_production_job_at_chance_is_said_in_the_report_and_the_summary(tmp_path):
    """The H200 campaign's own results (bench/gpu-runs/h200-2026-11-28): its production job
    ended at 9.18 % on 10 classes, which the report and the summary gave as a number only.
    Both now say it is chance and where to look; the same results at 90 % say nothing of it."""
    import json
    import shutil
    from pathlib import Path

    from tula import config
    from tula.model.measurements import at_chance
    from tula.stages import report
    from tula.stages.summary import success_lines

    run = Path(__file__).resolve().parents[2] / "bench" / "gpu-runs" / "h200-2026-11-28"
    results = tmp_path / "results"
    shutil.copytree(run / "results", results)
    cfg = config.load(run / "snapshot.json")
    said = "is at chance for 10 classes (10 %; best 11.33 %)"
    for acc, warned in ((None, True), (0.9, False)):
        if acc is not None:
            final = json.loads((results / "train" / "final.json").read_text())
            final.update(final_test_acc=acc, best_test_acc=acc)
            (results / "train" / "final.json").write_text(json.dumps(final))
        out = tmp_path / f"report_{warned}.html"
        report.run(
            results / "selection.json",
            results / "predictions.csv",
            results / "measurements.csv",
            results / "train" / "final.json",
            [],
            out,
            attempts=results / "train" / "attempts.json",
            workload=results / "workload.json",
            memory_probe=results / "memory_probe.json",
        )
        page = out.read_text()
        lines = success_lines(results, cfg)
        assert (said in page) is warned and ("the model did not learn" in page) is warned
        assert (
            any(line.startswith("  WARNING: The final test accuracy, 9.18 %") for line in lines)
            is warned
        )
    # the rule: at most 1.5 x chance; a set of one class, or no class count, says nothing
    assert at_chance({"final_test_acc": 0.15}, 10) and not at_chance({"final_test_acc": 0.16}, 10)
    assert at_chance({"final_test_acc": 0.0}, 1) is None
    assert at_chance({"final_test_acc": 0.0}, None) is None
