"""``results/report.html``: the page a user opens first. One self-contained file (plots
embedded), rendered from the results files only: the page is ``page.html`` (jinja2, every
value escaped unless it is one of the sections' own HTML), its sections
:mod:`tula.stages.report.sections`."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import jinja2
import pandas as pd

from tula.config import metric_name
from tula.io import atomic_write, read_json
from tula.model.measurements import at_chance
from tula.model.selection import Selection
from tula.progress import fmt_span
from tula.stages.report.cluster import nodes_section
from tula.stages.report.pace import decode_line, host_section, input_section
from tula.stages.report.partitions import partitions_section
from tula.stages.report.sections import (
    TRAINING_PLOTS,
    _img,
    _table,
    attempts_table,
    comm_env_section,
    device_line,
    drift_card,
    model_section,
    noise_section,
    prediction_card,
)
from tula.stages.report.trust import estimate_section, precision_section, robustness_line

PAGE = jinja2.Environment(
    loader=jinja2.PackageLoader("tula.stages.report", "."),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
).get_template("page.html")

PREDICTION_COLUMNS = (
    "workers", "nodes", "global_batch", "local_batch", "accumulate", "step_time_s",
    "input_time_s", "input_bound", "train_time_s", "cost", "mem_bytes", "feasible",
    "probe_status", "measured_step_time_s",
)  # fmt: skip
MEASUREMENT_COLUMNS = (
    "source", "workers", "nodes", "global_batch", "local_batch", "accumulate", "status",
    "step_time_s", "compute_time_s", "sync_time_s", "input_time_s", "step_time_cv",
    "peak_mem_bytes", "error",
)  # fmt: skip


def render(
    selection: Selection,
    predictions: pd.DataFrame,
    measurements: pd.DataFrame,
    final: dict | None,
    plots: list[Path],
    out: str | Path,
    title: str = "Tula report",
    attempts: dict | None = None,
    perf: dict | None = None,
    workload: dict | None = None,
    memory_probe: dict | None = None,
    plan: dict | None = None,
) -> None:
    """The page; ``final`` None: no training ran (``snakemake plan``), and the page says so
    where the training job's sections would be, naming the plan's files."""
    s = selection.selected
    chosen = s.key
    failed = measurements[measurements["status"] != "ok"]
    pred_cols = [c for c in PREDICTION_COLUMNS if c in predictions.columns]
    meas_cols = [c for c in MEASUREMENT_COLUMNS if c in measurements.columns]
    page = PAGE.render(
        title=title,
        generated=f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}",
        objective=selection.objective,
        device=device_line(workload),
        warnings=(workload or {}).get("warnings", []),
        s=s,
        train_time=fmt_span(s.train_time_s),
        reason=selection.reason,
        robustness=robustness_line(selection.robustness),
        partitions=partitions_section(selection),
        plan=plan,
        **(_training(final, measurements, workload, attempts, plots) if final else {"final": None}),
        selection_plots=[_img(p) for p in plots if p.name not in TRAINING_PLOTS],
        input=input_section(predictions, measurements, chosen)
        + decode_line(measurements)
        + host_section(measurements),
        model=model_section(perf),
        precision=precision_section(measurements),
        estimate=estimate_section(memory_probe),
        noise=noise_section(predictions, s.global_batch),
        failed=_table(failed[meas_cols]) if len(failed) else "",
        failed_count=len(failed),
        predictions=_table(predictions[pred_cols], chosen),
        measurements=_table(measurements[meas_cols]),
    )
    with atomic_write(out) as fh:
        fh.write(page)


def _training(final, measurements, workload, attempts, plots) -> dict:
    """The training job's part of the page, from final.json."""
    metric = final.get("metric", "accuracy")
    return dict(
        final=final,
        metric=metric_name(metric),
        as_percent=metric == "accuracy",
        trained_time=fmt_span(final["train_time_s"]),
        chance=at_chance(final, (workload or {}).get("num_classes")),
        prediction=prediction_card(final),
        comm_env=comm_env_section(measurements, final),
        nodes=nodes_section(measurements, final),
        training_plot="".join(_img(p) for p in plots if p.name == "training.png"),
        attempts=attempts_table(attempts),
        # nothing monitored: the drift card's one sentence says so, not an empty figure
        steps_plot="".join(_img(p) for p in plots if p.name == "steps.png")
        if final.get("monitored_steps")
        else "",
        drift=drift_card(final),
    )


def run(
    selection,
    predictions,
    measurements,
    final,
    plots,
    out,
    attempts=None,
    perf=None,
    workload=None,
    memory_probe=None,
    plan=None,
) -> None:
    """``tula report``: render ``out`` from the results files (plots: the PNG paths; workload:
    results/workload.json, whose warnings head the page; memory_probe: its check of the
    estimate from the model alone)."""
    render(
        Selection.read(selection),
        pd.read_csv(predictions),
        pd.read_csv(measurements),
        read_json(final) if final else None,
        [Path(p) for p in plots],
        out,
        attempts=read_json(attempts) if attempts else None,
        perf=read_json(perf) if perf else None,
        workload=read_json(workload) if workload else None,
        memory_probe=read_json(memory_probe) if memory_probe else None,
        plan=read_json(plan) if plan else None,
    )
    print(f"[report] -> {out}")
