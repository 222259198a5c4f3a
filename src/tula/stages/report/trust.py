"""The report's trust sections: how precisely each probe was timed, and how firmly the probes'
noise holds the choice."""

from __future__ import annotations

import html

import pandas as pd

from tula.progress import fmt_duration
from tula.stages.report.sections import _cell


def precision_section(measurements: pd.DataFrame) -> str:
    """How precisely each probe (and each swept batch) was timed, and what would reach the
    target where it was missed."""
    if "precision_reached" not in measurements.columns:
        return ""
    rows = measurements[
        (measurements["status"] == "ok") & measurements["source"].isin(["probe", "sweep"])
    ]
    rows = rows[rows["precision_reached"].notna()]
    if rows.empty:
        return ""
    target = float(pd.to_numeric(rows["precision_target"], errors="coerce").max())
    out = [
        "<table><tr><th>measured</th><th>N</th><th>B</th><th>b</th><th>steps timed</th>"
        "<th>&plusmn; step (95 %)</th><th>&plusmn; compute (95 %)</th><th>reached</th></tr>"
    ]
    missed = []
    for _, r in rows.iterrows():
        cells, miss = _precision_row(r, target)
        if miss:
            missed.append(miss)
        out.append(
            f"<tr{' class=bad' if miss else ''}>"
            + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells)
            + f"<td>{'no' if miss else 'yes'}</td></tr>"
        )
    head = (
        f"<h2>How precise the probes are</h2><p>Each probe timed its steps until the 95 % "
        f"confidence half-width of its mean was within &plusmn;{100 * target:g} % "
        "(probe.precision), or its time budget (probe.time_budget_s) was spent. The fits weight "
        "each point by its precision.</p>"
    )
    if not missed:
        return head + "<p>Every point reached it.</p>" + "\n".join(out) + "</table>"
    return (
        head
        + f"<p class=bad>{len(missed)} of {len(rows)} points missed it; their predictions rest "
        "on noisier figures. To reach it: a longer probe.time_budget_s (the time each would need "
        "is below), or quieter machines (probe.exclusive: true on SLURM, nothing else running "
        "beside a local probe).</p><ul>"
        + "".join(f"<li>{m}</li>" for m in missed)
        + "</ul>"
        + "\n".join(out)
        + "</table>"
    )


def _precision_row(r: pd.Series, target: float) -> tuple[list, str]:
    """One row's cells, and where it missed the target, what would reach it."""
    probe = r["source"] == "probe"
    hws = [r.get("step_time_halfwidth_rel") if probe else None, r["compute_time_halfwidth_rel"]]
    hws = [float(h) if h is not None and h == h else None for h in hws]
    steps = r["step_timed_steps"] if probe else r["compute_timed_steps"]
    name = f"N={int(r['workers'])} B={int(r['global_batch'])}" + (
        "" if probe else f" (sweep b={int(r['local_batch'])})"
    )
    cells = ["probe" if probe else "sweep", int(r["workers"]), int(r["global_batch"])]
    cells += [int(r["local_batch"]), _cell("n", steps)]
    cells += ["" if h is None else f"{100 * h:.1f} %" for h in hws]
    if bool(r["precision_reached"]):
        return cells, ""
    worst = max((h for h in hws if h is not None), default=float("nan"))
    per_step = (r["step_time_s"] + r["compute_time_s"]) if probe else r["compute_time_s"]
    need = float(steps) * (worst / target) ** 2
    return cells, (
        f"{name}: &plusmn;{100 * worst:.1f} %, about {need:.0f} steps "
        f"(~{fmt_duration(need * float(per_step))} of timing)"
    )


def robustness_line(r: dict | None) -> str:
    """How firmly the probes' noise holds the choice, in one paragraph."""
    if not r:
        return ""
    c, ru = r["chosen"], r.get("runner_up")
    other = (
        f"; the runner-up, N={ru['workers']} B={ru['global_batch']}, in {100 * ru['share']:.0f} %"
        if ru
        else ""
    )
    ratio = r.get("scatter_ratio", 1.0)
    wider = (
        f" (each mean redrawn within its measured precision times {ratio:.1f}, how far the fit's "
        "residuals exceed that precision)"
        if ratio > 1.0
        else " (each mean redrawn within its measured precision)"
    )
    line = (
        f"Chosen in <b>{100 * c['share']:.0f} %</b> of {r['resamples']} resamples of the probes' "
        f"timings{wider}{other}."
    )
    if r["settled"]:
        return f"<p>{line}</p>"
    return (
        f"<p class=bad><b>The choice is not settled at this noise</b>: {line} Rule: "
        f"{html.escape(r['rule'])}. To settle it: {html.escape(r.get('to_settle', ''))}.</p>"
    )
