"""The report's sections, each an HTML fragment from the results files: the attempts, the
prediction against what the job paid, drift, the step model, the gradient noise scale, the
communication environment, where the jobs ran (what sets the pace, input or host:
:mod:`tula.stages.report.pace`)."""

from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

from tula.model import noise
from tula.model.measurements import comm_env_text
from tula.progress import fmt_span


def _img(path: Path) -> str:
    if not path.exists():
        return f"<p class=bad>missing figure {html.escape(str(path))}</p>"
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def _cell(column: str, v) -> str:
    """Readable cell: blanks for missing values, MiB for byte counts."""
    if v is None or (isinstance(v, float) and v != v):
        return ""
    if column.endswith("_bytes"):
        return f"{float(v) / 2**20:.2f}"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _table(df: pd.DataFrame, highlight: tuple[int, int] | None = None) -> str:
    cols = list(df.columns)
    heads = [c.replace("_bytes", " (MiB)") for c in cols]
    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in heads) + "</tr>"]
    for _, row in df.iterrows():
        sel = highlight and (int(row["workers"]), int(row["global_batch"])) == highlight
        cells = [f"<td>{html.escape(_cell(c, row[c]))}</td>" for c in cols]
        out.append(f"<tr{' class=sel' if sel else ''}>" + "".join(cells) + "</tr>")
    return "\n".join(out) + "</table>"


def attempts_table(attempts: dict | None) -> str:
    """One row per attempt of the training job: batch, steps, how it ended and why."""
    if not attempts or not attempts.get("attempts"):
        return "<p class=sub>No attempts.json: the training job's attempts are not known.</p>"
    out = [
        "<table><tr><th>attempt</th><th>job</th><th>N</th><th>global batch</th><th>per "
        "worker</th><th>steps</th><th>resumed</th><th>outcome</th><th style='text-align:left'>why "
        "it ended</th></tr>"
    ]
    for a in attempts["attempts"]:
        resumed = max(len(a.get("segments", [])) - 1, 0)
        cls = " class=bad" if a["outcome"] not in ("completed", "running", "moved") else ""
        steps = f"{a['start_step']} → {a['end_step'] if a['end_step'] is not None else '?'}"
        out.append(
            f"<tr><td>{a['attempt']}</td><td>{html.escape(str(a['job_id']))}</td>"
            f"<td>{a.get('workers') or attempts.get('workers', '')}</td>"
            f"<td>{a['global_batch']}</td>"
            f"<td>{a['local_batch']}</td><td>{steps}</td><td>{resumed}×</td><td{cls}>{html.escape(a['outcome'])}</td>"
            f"<td style='text-align:left'>{html.escape(a['reason'])}</td></tr>"
        )
    moves = [a for a in attempts["attempts"] if a["outcome"] == "moved"]
    after_oom = [
        (a, b)
        for a, b in zip(attempts["attempts"], attempts["attempts"][1:])
        if a["outcome"] == "oom"
    ]
    note = "".join(
        f"<p>Out of memory at B={a['global_batch']}: the job was relaunched from its last "
        f"checkpoint at B={b['global_batch']}.</p>"
        for a, b in after_oom
    ) + "".join(f"<p>Network drift: {html.escape(a['reason'])}.</p>" for a in moves)
    note += "".join(
        f"<p>Node lost (attempt {a['attempt']}): {html.escape(a['reason'])}.</p>"
        for a in attempts["attempts"]
        if a["outcome"] in ("replanned", "node_lost", "peer_lost")
    )
    return (
        note
        + "\n".join(out)
        + "</table><p class=sub>resumed: requeues (preemption, time limit) inside the "
        "attempt, each from the checkpoint written when the signal came.</p>"
    )


TRAINING_PLOTS = ("training.png", "steps.png")


def drift_card(final: dict) -> str:
    """What the job's own sync measurements said against the prediction (launch.replan)."""
    n = final.get("monitored_steps", 0)
    if not n:
        off, due = final.get("monitor_off"), final.get("monitor_first_due_step")
        if off:
            why = off
        elif due is not None:
            why = (
                f"launch.monitor_every_steps: {final.get('monitor_every_steps')} put the first "
                f"pair at step {due}, and the job trained {final.get('steps')} steps"
            )
        else:  # a final.json from before the monitor said why
            why = (
                "one worker, post-local SGD, launch.replan: off, or a run shorter than its first "
                "pair"
            )
        return (
            "<p class=sub>No monitored steps: the job did not time its sync while it trained "
            f"({html.escape(why)}).</p>"
        )
    drifts = final.get("drift", [])
    if not drifts:
        return (
            f"<p><b>Network drift</b>: none — the sync time of {n} monitored steps stayed, as a "
            "median of 5, inside the predicted band (results/train/steps.csv).</p>"
        )
    items = "".join(
        f"<li>step {d['step']}: {html.escape(d['reason'])} — {html.escape(d['action'])}</li>"
        for d in drifts
    )
    return (
        f"<p class=bad><b>Network drift</b> found {len(drifts)} time(s) in {n} monitored steps "
        f"(results/train/drift.json):</p><ul>{items}</ul><p class=sub>launch.replan: record writes "
        "a drift down and trains on at the same (N, B); the time it costs is in the measured step "
        "above.</p>"
    )


def prediction_card(final: dict) -> str:
    """'predicted vs measured' for the point the job trained (from final.json)."""
    if final.get("predicted_step_time_s") is None:
        return (
            "<p class=sub>No prediction for the trained point (predictions.csv has no row for "
            "it).</p>"
        )
    lo, hi = final["predicted_step_time_interval_s"]
    tlo, thi = final["predicted_train_time_interval_s"]
    ratio = final["step_time_ratio"]
    inside = lo <= final["mean_step_time_s"] <= hi
    verdict = (
        "inside the prediction's 95 % interval"
        if inside
        else "<span class=bad>outside the prediction's 95 % interval</span>"
    )
    return (
        f"<p><b>Predicted vs measured</b> at N={final['workers']}, B={final['global_batch']}: step "
        f"predicted {1e3 * final['predicted_step_time_s']:.2f} ms ({1e3 * lo:.2f}–{1e3 * hi:.2f}), "
        f"measured {1e3 * final['mean_step_time_s']:.2f} ms (×{ratio:.3f}, {verdict}); training "
        f"time predicted {fmt_span(final['predicted_train_time_s'])} "
        f"({fmt_span(tlo)}–{fmt_span(thi)}) for every step, measured "
        f"{fmt_span(final['train_time_s'])} in training steps (the first step at each batch "
        f"shape is timed apart: the table's steps and first steps).</p>" + wall_table(final)
    )


def wall_table(final: dict) -> str:
    """The job's wall time part by part, predicted against paid (final.json's wall_check)."""
    parts = final.get("wall_check")
    if not parts:
        return (
            "<p class=sub>The wall time was not predicted (the probes did not measure start-up, "
            f"evaluation and checkpoints): evaluation {fmt_span(final['eval_time_s'])}, "
            f"checkpoints {fmt_span(final['checkpoint_time_s'])}, start-up "
            f"{fmt_span(final['startup_time_s'])}.</p>"
        )
    rows = []
    for p in parts:
        pred = "—" if p["predicted_s"] is None else fmt_span(p["predicted_s"])
        ratio = "not modelled" if p["ratio"] is None else f"×{p['ratio']:.2f}"
        off = p["ratio"] is not None and p["part"] == "wall time" and abs(p["ratio"] - 1) > 0.05
        rows.append(
            f"<tr{' class=bad' if off else ''}><td>{html.escape(p['part'])}</td><td>{pred}</td>"
            f"<td>{fmt_span(p['measured_s'])}</td><td>{ratio}</td></tr>"
        )
    return (
        "<table><tr><th>wall time</th><th>predicted</th><th>paid</th><th>paid / predicted</th></tr>"
        + "".join(rows)
        + "</table><p class=sub>Start-up, a first and a later evaluation pass and one checkpoint "
        "write were measured by the probes; the rest (end-of-epoch bookkeeping, monitoring) is not "
        "modelled.</p>"
    )


def model_section(perf: dict | None) -> str:
    """How the step-time model was chosen and how close it passes to each probe."""
    if not perf:
        return ""
    parts = ["<h2>Step-time model</h2>"]
    for key, label in (("compute", "Compute"), ("step", "Step (sync)"), ("input", "Input floor")):
        f = perf.get(key)
        if not f:
            continue
        ps = ", ".join(
            f"{k} = {v:.4g} [{lo:.3g}, {hi:.3g}]"
            for (k, v), (lo, hi) in zip(f["params"].items(), f["params_ci95"].values())
        )
        parts.append(
            f"<p><b>{label}</b>: <code>{html.escape(f['form'])}</code>: "
            f"{html.escape(f['equation'])}; {html.escape(ps)} (95 % intervals). Why: "
            f"{html.escape(f.get('why', ''))}.</p>"
        )
    multi = perf.get("multi_worker_probes")
    if multi is not None:
        ok = [f"N={p['workers']} B={p['global_batch']}" for p in multi if p["status"] == "ok"]
        bad = [
            f"N={p['workers']} B={p['global_batch']} ({p['status']})"
            for p in multi
            if p["status"] != "ok"
        ]
        parts.append(
            "<p>"
            + (
                f"Sync measured at {', '.join(ok)}."
                if ok
                else "<span class=bad>No multi-worker probe "
                "succeeded: communication was not measured, and only N = 1 is predicted "
                "(probe.no_sync_fallback).</span>"
            )
            + (
                f" <span class=bad>No sync measured at {', '.join(bad)}.</span>"
                if bad and ok
                else ""
            )
            + "</p>"
        )
    res = pd.DataFrame(perf.get("residuals") or [])
    if len(res):
        inside = int(res["within_noise"].fillna(False).astype(bool).sum())
        parts.append(
            f"<p>The model passes within each probe's measured precision (noise_pct: the 95 % "
            f"half-width of its mean step) at {inside} of {len(res)} probes:</p>" + _table(res)
        )
    return "\n".join(parts)


def noise_section(predictions: pd.DataFrame, chosen_batch: int) -> str:
    """The gradient noise scale pooled from the probes, the critical batch, and where the
    chosen B sits: the statistical efficiency it keeps and the epochs it needs."""
    if "b_noise" not in predictions.columns or predictions["b_noise"].isna().all():
        return (
            "<h2>Gradient noise scale</h2><p>Not measured: it needs multi-worker probes (a "
            "grid.workers value &ge; 2) with probe.noise_steps &gt; 0.</p>"
        )
    bn, se = float(predictions["b_noise"].iloc[0]), float(predictions["b_noise_se"].iloc[0])
    row = predictions[predictions["global_batch"] == chosen_batch].iloc[0]
    eff = noise.statistical_efficiency(chosen_batch, bn)
    return (
        f"<h2>Gradient noise scale</h2><p>B_noise = <b>{bn:.0f}</b> &plusmn; {se:.0f} samples, "
        "pooled from the multi-worker probes (McCandlish et al. 2018): the critical batch, beyond "
        f"which a larger batch needs proportionally more epochs. The chosen B = {chosen_batch} is "
        f"{chosen_batch / bn:.2f}&times; B_noise: each sample is worth {100 * eff:.0f} % of what "
        "it is worth at a small batch, and reaching the accuracy that workload.epochs reach at "
        f"train.base_batch takes an estimated {row['epochs_to_accuracy']:.3g} epochs. Measured "
        "early in training; B_noise usually grows later, so this errs toward smaller batches.</p>"
    )


def comm_env_section(measurements: pd.DataFrame, final: dict) -> str:
    """The NCCL_*/GLOO_* variables the probes and the production job ran with (hardware.comm_env
    or the jobs' environment); a difference is flagged: the probes timed another setting."""
    probes = (
        measurements[measurements["source"] == "probe"]
        if "source" in measurements.columns
        else measurements
    )
    seen = (
        sorted({v if isinstance(v, str) else "" for v in probes["comm_env"]})
        if "comm_env" in probes.columns
        else []
    )
    prod = comm_env_text(final)
    show = lambda t: html.escape(t.replace(";", ", ")) if t else "none"  # noqa: E731
    same = seen == [prod]
    return (
        "<p><b>Communication environment</b> (hardware.comm_env and the jobs' NCCL_*/GLOO_* "
        f"variables): probes: {'; '.join(show(t) for t in seen) or 'not recorded'}; production: "
        f"{show(prod)}"
        + (
            ""
            if same or "comm_env" not in final
            else " <span class=bad>— not the same: the probes timed "
            "another communication setting than production ran</span>"
        )
        + ".</p>"
    )


def device_line(workload: dict | None) -> str:
    """Where the probes and training ran and why (tula.devices' decision, as `tula check`
    wrote it to results/workload.json)."""
    d = (workload or {}).get("device")
    if not d:
        return ""
    budget = (
        f" Memory budget: {html.escape(d['memory_budget'])}; the memory probe and the search "
        "set were bounded by it."
        if d.get("memory_budget")
        else ""
    )
    t = (workload or {}).get("training") or {}
    method = (
        f" Trained with <b>{html.escape(t['method'])}</b>: {html.escape(t['method_reason'])}."
        if t.get("method_reason")
        else ""
    )
    return (
        f"<p class=sub>Ran on <b>{html.escape(d['device'].upper())}</b> with "
        f"{html.escape(d['backend'])}: {html.escape(d['why'])}.{budget}{method}</p>"
    )
