"""The figures (tula.stages.plot): each draws what the results files say -- a line per N of
the predictions, the probes where they were measured, the choice starred, the compute and
memory models through their measurements, the training curve with its relaunches marked."""

import numpy as np
import pandas as pd
import pytest

from selections import selection
from tula.stages import plot
from tula.stages.plot.training import attempt_marks, sync_over_run, training_curve

PNG = b"\x89PNG\r\n\x1a\n"


def _pred():
    rows = []
    for n in (1, 2):
        for b in (32, 64, 128):
            t = 10.0 / n + b / 64
            rows.append(
                {
                    "workers": n,
                    "global_batch": b,
                    "local_batch": b // n,
                    "train_time_s": t,
                    "train_time_lo_s": 0.9 * t,
                    "train_time_hi_s": 1.1 * t,
                    "cost_worker_hour": t / 3600 * n * 2.48,
                    "cost_memory": t,
                    "feasible": b != 128 or n == 2,
                    "probe_status": "ok" if b != 64 else "",
                    "measured_train_time_s": 1.05 * t if b != 64 else np.nan,
                    "mem_bytes": 1e6 * b / n,
                }
            )
    return pd.DataFrame(rows)


SELECTION = selection(2, 64, objective="knee", train_time_s=6.0, cost=0.01)


def _lines(ax):
    return {
        line.get_label(): (list(line.get_xdata()), [float(v) for v in line.get_ydata()])
        for line in ax.lines
    }


def test_time_vs_batch_draws_each_n_its_probes_the_infeasible_points_and_the_choice(tmp_path):
    fig = plot.time_vs_batch(_pred(), SELECTION, tmp_path / "t.png")
    lines = _lines(fig.axes[0])
    assert set(lines) == {
        "N=1 predicted",
        "N=1 infeasible",
        "N=1 probed",
        "N=2 predicted",
        "N=2 probed",
        "selected (knee): N=2, B=64",
    }
    assert lines["N=1 predicted"] == ([32, 64, 128], [10.5, 11.0, 12.0])
    assert lines["N=1 infeasible"] == ([128], [12.0])  # N=1 cannot hold B=128 in this table
    assert lines["N=2 probed"] == (
        [32, 128],
        pytest.approx([1.05 * 5.5, 1.05 * 7.0]),
    )  # B=64 was not probed
    assert lines["selected (knee): N=2, B=64"] == ([64], [6.0])
    assert fig.axes[0].get_title() == "Training time vs batch — selected N=2, B=64: 6 s"
    assert (tmp_path / "t.png").read_bytes()[:8] == PNG


def test_cost_vs_batch_says_its_unit_and_scales_the_probes_by_the_price(tmp_path):
    fig = plot.cost_vs_batch(_pred(), SELECTION, tmp_path / "c.png")
    ax = fig.axes[0]
    assert ax.get_ylabel() == "cost C (USD, per worker-hour pricing)"
    assert _lines(ax)["N=2 probed"][1] == pytest.approx(
        [1.05 * 5.5 / 3600 * 2 * 2.48, 1.05 * 7.0 / 3600 * 2 * 2.48]
    )


def test_compute_and_memory_figures_put_the_model_through_the_measurements(tmp_path):
    from conftest import synthetic
    from tula.model import memory, perf

    meas = synthetic("ring", np.random.default_rng(0))
    model = perf.fit(meas, "ring")
    fig = plot.compute_vs_batch(meas, model.to_dict(), tmp_path / "k.png")
    lines = _lines(fig.axes[0])
    assert lines["N=8 probe"][0] == [4, 8, 16, 32]  # B = 32..256 over 8 workers
    xs, ys = lines[f"N=8 model ({model.compute.form.name})"]
    # exact data: the model is the truth
    assert ys == pytest.approx(1e3 * (0.004 + 0.0002 * np.asarray(xs)), rel=1e-6)
    mem = memory.fit(meas, 8e6).to_dict()
    fig = plot.memory_vs_batch(_pred(), meas, mem, tmp_path / "m.png")
    ax = fig.axes[0]
    assert ax.get_title() == f"Memory vs local batch — largest feasible b: {mem['max_local_batch']}"
    budget = [line for line in ax.lines if line.get_label() == "memory budget"]
    assert len(budget) == 1 and budget[0].get_ydata()[0] == pytest.approx(8e6 / 2**20)


def test_attempt_marks_place_every_relaunch_and_resume_on_the_epoch_axis():
    metrics = pd.DataFrame({"epoch": [1, 2, 3], "step": [23, 46, 92]})
    attempts = {
        "attempts": [
            {
                "global_batch": 64,
                "start_step": 0,
                "outcome": "oom",
                "segments": [{"start_step": 0}, {"start_step": 20}],
            },
            {
                "global_batch": 32,
                "start_step": 46,
                "outcome": "completed",
                "segments": [{"start_step": 46}, {"start_step": 69}],
            },
        ]
    }
    assert attempt_marks(metrics, attempts) == [
        (20 / 23, "resumed", False),
        (2.0, "B=32 (OOM at B=64)", True),
        (2.5, "resumed", False),
    ]
    assert attempt_marks(metrics, None) == []


def test_the_training_curve_has_a_noise_scale_panel_when_the_epochs_measured_one(tmp_path):
    metrics = pd.DataFrame(
        {
            "epoch": [1, 2],
            "step": [23, 46],
            "train_loss": [1.0, 0.5],
            "test_loss": [1.1, 0.6],
            "train_acc": [0.6, 0.8],
            "test_acc": [0.55, 0.75],
            "grad_noise_scale": [100.0, 150.0],
        }
    )
    final = {"workers": 2, "global_batch": 64, "final_test_acc": 0.75}
    fig = training_curve(metrics, final, tmp_path / "tr.png")
    assert (
        len(fig.axes) == 3
        and fig._suptitle.get_text() == "Training at N=2, B=64: final test accuracy 75.00%"
    )
    assert _lines(fig.axes[2])["B_noise (per epoch, AGS refresh)"] == ([1, 2], [100.0, 150.0])
    assert (
        len(
            training_curve(
                metrics.drop(columns="grad_noise_scale"), final, tmp_path / "t2.png"
            ).axes
        )
        == 2
    )


def test_the_monitored_steps_figure_draws_sync_against_its_band_and_marks_each_drift(tmp_path):
    steps = pd.DataFrame(
        {
            "step": [10, 20, 30],
            "workers": 4,
            "global_batch": 128,
            "step_time_s": [0.05, 0.06, 0.09],
            "compute_time_s": [0.04, 0.04, 0.04],
            "sync_time_s": [0.01, 0.02, 0.05],
            "predicted_sync_s": 0.01,
            "sync_lo_s": 0.0,
            "sync_hi_s": 0.02,
        }
    )
    drifts = [{"step": 30, "direction": "slower", "action": "recorded"}]
    fig = sync_over_run(steps, drifts, tmp_path / "s.png")
    lines = _lines(fig.axes[0])
    assert lines["sync = step - compute"] == ([10, 20, 30], [10.0, 20.0, 50.0])  # ms
    assert lines["predicted sync"][1] == [10.0] * 3
    assert [t.get_text() for t in fig.axes[0].texts] == ["drift (slower): recorded"]
    assert (tmp_path / "s.png").stat().st_size > 0
    empty = sync_over_run(steps.iloc[:0], [], tmp_path / "e.png")
    assert (
        "no monitored steps" in empty.axes[0].texts[0].get_text() and (tmp_path / "e.png").exists()
    )
