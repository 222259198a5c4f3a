"""The report's trust sections: how precisely each probe was timed, and how firmly the probes'
noise holds the choice."""

from __future__ import annotations

import html

import pandas as pd

from tula.model.grid import paid_mix
from tula.model.measurements import judged_halfwidths, judged_steps, short_of_steps
from tula.model.selection import Robustness
from tula.progress import fmt_duration, fmt_span
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
        "(probe.precision), or its time budget (probe.time_budget_s) was spent: the mean step "
        "training pays, every kind of step (an epoch's first, its short last batch) at its "
        "share of an epoch; the steps counted here are the plain ones. The fits weight each "
        "point by its precision.</p>"
    ) + campaign_line(measurements)
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


def campaign_line(measurements: pd.DataFrame) -> str:
    """What the probe jobs cost against the timing they bought (measurements' timed_s and
    wall_s): the overhead Tula adds on top of the job it plans."""
    if "timed_s" not in measurements.columns:
        return ""
    probes = measurements[measurements["source"] == "probe"]
    wall = pd.to_numeric(probes["wall_s"], errors="coerce").sum()
    timed = pd.to_numeric(probes["timed_s"], errors="coerce").sum()
    if not wall > 0:
        return ""
    return (
        f"<p>The probe campaign: {len(probes)} probe(s) in {probes['workers'].nunique()} "
        f"job(s), one per N, ran {fmt_span(wall)} (their workers' wall, summed; "
        f"{fmt_span(wall / len(probes))} a probe) for {fmt_span(timed)} of timed steps: "
        f"<b>{100 * timed / wall:.0f} %</b> of what the probes cost bought a measurement; the "
        "rest was start-up, evaluation, a checkpoint and the compute sweep's untimed steps "
        "(once per job), and each batch's first steps, memory steps and input read. A probe "
        "that reaches probe.precision sooner buys fewer timed seconds and so lowers this "
        "share; the seconds a probe is what the campaign costs "
        "(measurements.csv: timed_s, probe_efficiency per probe).</p>"
    )


def _precision_row(r: pd.Series, target: float) -> tuple[list, str]:
    """One row's cells, and where it missed the target, what would reach it."""
    probe = r["source"] == "probe"
    hws, judged = judged_halfwidths(r)
    steps = r["step_timed_steps"] if probe else r["compute_timed_steps"]
    name = f"N={int(r['workers'])} B={int(r['global_batch'])}" + (
        "" if probe else f" (sweep b={int(r['local_batch'])})"
    )
    cells = ["probe" if probe else "sweep", int(r["workers"]), int(r["global_batch"])]
    cells += [int(r["local_batch"]), _cell("n", steps)]
    spiked = f" (robust spread: {int(r['step_spikes'])} step(s) spiked)" if judged else ""
    cells += ["" if h is None else f"{100 * h:.1f} %{spiked}" for h in hws]
    if bool(r["precision_reached"]):
        return cells, ""
    worst = max((h for h in hws if h is not None), default=float("nan"))
    per_step = (r["step_time_s"] + r["compute_time_s"]) if probe else r["compute_time_s"]
    least = short_of_steps(r) if probe else None
    # a probe's precision weighs every kind of step at its share of an epoch: the plain steps
    # counted are that share of the steps it timed, and all of them scale alike; the minimum
    # counts every kind the half-width weighs
    need = max(float(steps) * (worst / target) ** 2 / _plain_share(r), least or 0)
    return cells, (
        f"{name}: &plusmn;{100 * worst:.1f} %"
        + (
            f" on {int(judged_steps(r))} steps, under the {least} probe.timed_steps asks"
            if least
            else ""
        )
        + f", about {need:.0f} steps (~{fmt_duration(need * float(per_step))} of timing)"
    )


def _plain_share(r: pd.Series) -> float:
    """The share of an epoch's steps that are plain at a probe's batch (1 for a sweep row,
    or where the training set's size is not known)."""
    samples = pd.to_numeric(r.get("train_samples"), errors="coerce")
    if r["source"] != "probe" or not samples == samples:
        return 1.0
    mix = paid_mix(int(samples), int(r["global_batch"]), int(r["workers"]), 0.0)
    return 1.0 - sum(mix.values()) if mix else 1.0


def robustness_line(r: Robustness | None) -> str:
    """How firmly the probes' noise holds the choice, in one paragraph."""
    if not r:
        return ""
    ru = r.runner_up
    other = (
        f"; the runner-up, N={ru.workers} B={ru.global_batch}, in {100 * ru.share:.0f} %"
        if ru
        else ""
    )
    wider = (
        f" (each mean redrawn within its measured precision times {r.scatter_ratio:.1f}, how far "
        "the fit's residuals exceed that precision)"
        if r.scatter_ratio > 1.0
        else " (each mean redrawn within its measured precision)"
    )
    line = (
        f"Chosen in <b>{100 * r.chosen.share:.0f} %</b> of {r.resamples} resamples of the "
        f"probes' timings{wider}{other}."
    )
    if r.settled:
        return f"<p>{line}</p>"
    return (
        f"<p class=bad><b>The choice is not settled at this noise</b>: {line} Rule: "
        f"{html.escape(r.rule)}. To settle it: {html.escape(r.to_settle or '')}.</p>"
    )


def estimate_section(memory_probe: dict | None) -> str:
    """How far the estimate from the model alone (tula check) held against the memory probe,
    and the batches it ruled out unmeasured."""
    est = (memory_probe or {}).get("estimate")
    if not est:
        return ""
    check = est["against_probe"]
    mib = 2**20
    head = (
        "<h2>Memory from the model alone</h2><p>Before any job ran, <code>tula check</code> ran "
        "the training step under FakeTensorMode and estimated "
        f"{est['fixed_bytes'] / mib:.1f} MiB + {est['per_sample_bytes'] / mib:.3f} MiB per "
        f"sample of the local batch (for {html.escape(str(est['device']))}); "
        f"{est['flops_per_sample'] / 1e9:.3g} GFLOP per sample. The memory probe measured the "
        "real step; its figures decide what fits.</p>"
    )
    out = [
        "<table><tr><th>local batch</th><th>measured peak (MiB)</th><th>estimate (MiB)</th>"
        "<th>error</th></tr>"
    ]
    for r in check["points"]:
        out.append(
            f"<tr><td>{r['local_batch']}</td><td>{r['measured_bytes'] / mib:.1f}</td>"
            f"<td>{r['estimate_bytes'] / mib:.1f}</td><td>{r['error']:+.1%}</td></tr>"
        )
    out.append("</table>")
    largest = check["error_at_largest"]
    if largest is None:
        verdict = "<p>No batch was measured: the estimate is unchecked.</p>"
    elif check["disagrees"]:
        verdict = (
            f"<p class=bad>The estimate and the probe disagree: {largest:+.1%} at the largest "
            f"batch measured, beyond the {check['bound']:.0%} bound. The probe's figures are "
            "used; for this model, do not plan on the estimate alone.</p>"
        )
    else:
        verdict = (
            f"<p>The estimate held: {largest:+.1%} at the largest batch measured (bound "
            f"&plusmn;{check['bound']:.0%}); per sample {_pct(check['per_sample_error'])}, "
            f"fixed part {_pct(check['fixed_error'])}.</p>"
        )
    skipped = est.get("ruled_out") or []
    if skipped:
        verdict += (
            "<p>Not measured, ruled out by the estimate (over the budget by a clear margin): "
            + ", ".join(
                f"local batch {r['local_batch']} ({r['estimate_bytes'] / 1e9:.1f} GB)"
                for r in skipped
            )
            + ".</p>"
        )
    return head + verdict + "".join(out)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"
