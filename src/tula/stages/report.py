"""``results/report.html``: the page a user opens first. One self-contained file
(plots embedded), rendered from the results files only."""

from __future__ import annotations

import base64
import html
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from tula.io import atomic_write, read_json
from tula.model import noise
from tula.model.floor import INPUT_BOUND
from tula.model.measurements import comm_env_text
from tula.progress import fmt_duration

CSS = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{margin-bottom:.2em} .sub{color:#666;margin-top:0}
.card{background:#f6f8fa;border:1px solid #d0d7de;border-radius:8px;padding:1em 1.4em;margin:1em 0}
.big{font-size:1.6em;font-weight:600} table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{border:1px solid #d0d7de;padding:3px 8px;text-align:right} th{background:#eef}
tr.sel td{background:#ffe9e9;font-weight:600} .bad{color:#b00} img{max-width:100%}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:1em}
"""


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
    out = ["<table><tr><th>attempt</th><th>job</th><th>N</th><th>global batch</th><th>per worker</th><th>steps</th>"
           "<th>resumed</th><th>outcome</th><th style='text-align:left'>why it ended</th></tr>"]  # fmt: skip
    for a in attempts["attempts"]:
        resumed = max(len(a.get("segments", [])) - 1, 0)
        cls = " class=bad" if a["outcome"] not in ("completed", "running", "moved") else ""
        steps = f"{a['start_step']} → {a['end_step'] if a['end_step'] is not None else '?'}"
        out.append(f"<tr><td>{a['attempt']}</td><td>{html.escape(str(a['job_id']))}</td>"
                   f"<td>{a.get('workers') or attempts.get('workers', '')}</td><td>{a['global_batch']}</td>"
                   f"<td>{a['local_batch']}</td><td>{steps}</td><td>{resumed}×</td><td{cls}>{html.escape(a['outcome'])}</td>"
                   f"<td style='text-align:left'>{html.escape(a['reason'])}</td></tr>")  # fmt: skip
    moves = [a for a in attempts["attempts"] if a["outcome"] == "moved"]
    after_oom = [(a, b) for a, b in zip(attempts["attempts"], attempts["attempts"][1:]) if a["outcome"] == "oom"]
    note = "".join(f"<p>Out of memory at B={a['global_batch']}: the job was relaunched from its last checkpoint at "
                   f"B={b['global_batch']}.</p>" for a, b in after_oom) + "".join(
        f"<p>Network drift: {html.escape(a['reason'])}.</p>" for a in moves)  # fmt: skip
    return note + "\n".join(out) + "</table><p class=sub>resumed: requeues (preemption, time limit) inside the " \
        "attempt, each from the checkpoint written when the signal came.</p>"


TRAINING_PLOTS = ("training.png", "steps.png")


def drift_card(final: dict) -> str:
    """What the job's own sync measurements said against the prediction (launch.replan)."""
    n = final.get("monitored_steps", 0)
    if not n:
        return ("<p class=sub>No monitored steps: the job did not time its sync while it trained (one worker, "
                "post-local SGD, or launch.replan: off).</p>")  # fmt: skip
    drifts = final.get("drift", [])
    if not drifts:
        return (f"<p><b>Network drift</b>: none — the sync time of {n} monitored steps stayed, as a median of 5, "
                "inside the predicted band (results/train/steps.csv).</p>")  # fmt: skip
    items = "".join(f"<li>step {d['step']}: {html.escape(d['reason'])} — {html.escape(d['action'])}</li>" for d in drifts)
    return (f"<p class=bad><b>Network drift</b> found {len(drifts)} time(s) in {n} monitored steps "
            f"(results/train/drift.json):</p><ul>{items}</ul><p class=sub>launch.replan: record writes a drift down "
            "and trains on at the same (N, B); the time it costs is in the measured step above.</p>")  # fmt: skip


def prediction_card(final: dict) -> str:
    """'predicted vs measured' for the point the job trained (from final.json)."""
    if final.get("predicted_step_time_s") is None:
        return "<p class=sub>No prediction for the trained point (predictions.csv has no row for it).</p>"
    lo, hi = final["predicted_step_time_interval_s"]
    tlo, thi = final["predicted_train_time_interval_s"]
    ratio = final["step_time_ratio"]
    inside = lo <= final["mean_step_time_s"] <= hi
    verdict = ("inside the prediction's 95 % interval" if inside else
               "<span class=bad>outside the prediction's 95 % interval</span>")  # fmt: skip
    return (f"<p><b>Predicted vs measured</b> at N={final['workers']}, B={final['global_batch']}: step "
            f"predicted {1e3 * final['predicted_step_time_s']:.2f} ms ({1e3 * lo:.2f}–{1e3 * hi:.2f}), measured "
            f"{1e3 * final['mean_step_time_s']:.2f} ms (×{ratio:.3f}, {verdict}); training time predicted "
            f"{fmt_duration(final['predicted_train_time_s'])} ({fmt_duration(tlo)}–{fmt_duration(thi)}), measured "
            f"{fmt_duration(final['train_time_s'])} in training steps.</p>" + wall_table(final))


def wall_table(final: dict) -> str:
    """The job's wall time part by part, predicted against paid (final.json's wall_check)."""
    parts = final.get("wall_check")
    if not parts:
        return ("<p class=sub>The wall time was not predicted (the probes did not measure start-up, evaluation "
                f"and checkpoints): evaluation {fmt_duration(final['eval_time_s'])}, checkpoints "
                f"{fmt_duration(final['checkpoint_time_s'])}, start-up {fmt_duration(final['startup_time_s'])}.</p>")
    rows = []
    for p in parts:
        pred = "—" if p["predicted_s"] is None else fmt_duration(p["predicted_s"])
        ratio = "not modelled" if p["ratio"] is None else f"×{p['ratio']:.2f}"
        off = p["ratio"] is not None and p["part"] == "wall time" and abs(p["ratio"] - 1) > 0.05
        rows.append(f"<tr{' class=bad' if off else ''}><td>{html.escape(p['part'])}</td><td>{pred}</td>"
                    f"<td>{fmt_duration(p['measured_s'])}</td><td>{ratio}</td></tr>")
    return ("<table><tr><th>wall time</th><th>predicted</th><th>paid</th><th>paid / predicted</th></tr>"
            + "".join(rows) + "</table><p class=sub>Start-up, a first and a later evaluation pass and one checkpoint "
            "write were measured by the probes; the rest (end-of-epoch bookkeeping, monitoring) is not modelled.</p>")


def model_section(perf: dict | None) -> str:
    """How the step-time model was chosen and how close it passes to each probe."""
    if not perf:
        return ""
    parts = ["<h2>Step-time model</h2>"]
    for key, label in (("compute", "Compute"), ("step", "Step (sync)"), ("input", "Input floor")):
        f = perf.get(key)
        if not f:
            continue
        ps = ", ".join(f"{k} = {v:.4g} [{lo:.3g}, {hi:.3g}]" for (k, v), (lo, hi)
                       in zip(f["params"].items(), f["params_ci95"].values()))  # fmt: skip
        parts.append(f"<p><b>{label}</b>: <code>{html.escape(f['form'])}</code>: {html.escape(f['equation'])}; "
                     f"{html.escape(ps)} (95 % intervals). Why: {html.escape(f.get('why', ''))}.</p>")  # fmt: skip
    multi = perf.get("multi_worker_probes")
    if multi is not None:
        ok = [f"N={p['workers']} B={p['global_batch']}" for p in multi if p["status"] == "ok"]
        bad = [f"N={p['workers']} B={p['global_batch']} ({p['status']})" for p in multi if p["status"] != "ok"]
        parts.append("<p>" + (f"Sync measured at {', '.join(ok)}." if ok else
                              "<span class=bad>No multi-worker probe succeeded: communication was not measured, "
                              "and only N = 1 is predicted (probe.no_sync_fallback).</span>")
                     + (f" <span class=bad>No sync measured at {', '.join(bad)}.</span>" if bad and ok else "")
                     + "</p>")  # fmt: skip
    res = pd.DataFrame(perf.get("residuals") or [])
    if len(res):
        inside = int(res["within_noise"].fillna(False).astype(bool).sum())
        parts.append(f"<p>The model passes within each probe's measured step-to-step noise at {inside} of {len(res)} "
                     "probes:</p>" + _table(res))  # fmt: skip
    return "\n".join(parts)


def noise_section(predictions: pd.DataFrame, chosen_batch: int) -> str:
    """The gradient noise scale pooled from the probes, the critical batch, and where the
    chosen B sits: the statistical efficiency it keeps and the epochs it needs."""
    if "b_noise" not in predictions.columns or predictions["b_noise"].isna().all():
        return ("<h2>Gradient noise scale</h2><p>Not measured: it needs multi-worker probes (a grid.workers value "
                "&ge; 2) with probe.noise_steps &gt; 0.</p>")  # fmt: skip
    bn, se = float(predictions["b_noise"].iloc[0]), float(predictions["b_noise_se"].iloc[0])
    row = predictions[predictions["global_batch"] == chosen_batch].iloc[0]
    eff = noise.statistical_efficiency(chosen_batch, bn)
    return (f"<h2>Gradient noise scale</h2><p>B_noise = <b>{bn:.0f}</b> &plusmn; {se:.0f} samples, pooled from the "
            f"multi-worker probes (McCandlish et al. 2018): the critical batch, beyond which a larger batch needs "
            f"proportionally more epochs. The chosen B = {chosen_batch} is {chosen_batch / bn:.2f}&times; B_noise: "
            f"each sample is worth {100 * eff:.0f} % of what it is worth at a small batch, and reaching the accuracy "
            f"that workload.epochs reach at train.base_batch takes an estimated "
            f"{row['epochs_to_accuracy']:.3g} epochs. Measured early in training; B_noise usually grows later, so "
            "this errs toward smaller batches.</p>")  # fmt: skip


def comm_env_section(measurements: pd.DataFrame, final: dict) -> str:
    """The NCCL_*/GLOO_* variables the probes and the production job ran with (hardware.comm_env
    or the jobs' environment); a difference is flagged: the probes timed another setting."""
    probes = measurements[measurements["source"] == "probe"] if "source" in measurements.columns else measurements
    seen = sorted({v if isinstance(v, str) else "" for v in probes["comm_env"]}) if "comm_env" in probes.columns else []
    prod = comm_env_text(final)
    show = lambda t: html.escape(t.replace(";", ", ")) if t else "none"  # noqa: E731
    same = seen == [prod]
    return (f"<p><b>Communication environment</b> (hardware.comm_env and the jobs' NCCL_*/GLOO_* variables): "
            f"probes: {'; '.join(show(t) for t in seen) or 'not recorded'}; production: {show(prod)}"
            + ("" if same or "comm_env" not in final else " <span class=bad>— not the same: the probes timed "
               "another communication setting than production ran</span>") + ".</p>")  # fmt: skip


def input_section(predictions: pd.DataFrame, measurements: pd.DataFrame, chosen: tuple[int, int]) -> str:
    """Where the input pipeline, not the model or the network, sets the pace, and what would
    lift it; one line where it was timed and nowhere close."""
    if "input_time_s" not in predictions.columns or predictions["input_time_s"].isna().all():
        return ""
    share = predictions["input_time_s"] / predictions["step_time_s"]
    bound = predictions[predictions["input_bound"].astype(bool)]
    if bound.empty:
        return (f"<p><b>Input</b>: the input pipeline read alone takes at most {100 * share.max():.2g} % of a "
                "predicted step at any grid point: it does not set the pace.</p>")  # fmt: skip
    points = ", ".join(f"N={int(r.workers)} B={int(r.global_batch)}" for r in bound.itertuples())
    workers = sorted({int(w) for w in pd.to_numeric(measurements.get("data_workers", pd.Series(dtype=float)),
                                                    errors="coerce").dropna()})  # fmt: skip
    here = any((int(r.workers), int(r.global_batch)) == chosen for r in bound.itertuples())
    return ("<div class='card bad'><b>The input sets the pace</b> at " + html.escape(points) + " (the input "
            f"pipeline alone takes at least {100 * INPUT_BOUND:.0f} % of the step there" + ("; the selected point is one of them" if here else "")
            + "). A faster model, a faster network or more workers per batch would not make those steps faster. "
            "What would: more loader processes per worker (data.num_workers"
            + (f", the probes read with {', '.join(map(str, workers))}" if workers else "") + "), more CPU cores per "
            "worker (SLURM's --cpus-per-task, or fewer workers per node: each node's loaders share its cores), "
            "or lighter decoding (smaller stored images, data.image_size).</div>")  # fmt: skip


def device_line(workload: dict | None) -> str:
    """Where the probes and training ran and why (tula.devices' decision, as `tula check`
    wrote it to results/workload.json)."""
    d = (workload or {}).get("device")
    if not d:
        return ""
    return (f"<p class=sub>Ran on <b>{html.escape(d['device'].upper())}</b> with {html.escape(d['backend'])}: "
            f"{html.escape(d['why'])}.</p>")


def render(selection: dict, predictions: pd.DataFrame, measurements: pd.DataFrame, final: dict,
           plots: list[Path], out: str | Path, title: str = "Tula report", attempts: dict | None = None,
           perf: dict | None = None, workload: dict | None = None) -> None:  # fmt: skip
    s = selection["selected"]
    cur = s["currency"]
    failed = measurements[measurements["status"] != "ok"]
    pred_cols = [c for c in ["workers", "nodes", "global_batch", "local_batch", "step_time_s", "input_time_s", "input_bound",
                             "train_time_s", "cost", "mem_bytes", "feasible", "probe_status", "measured_step_time_s"]
                 if c in predictions.columns]  # fmt: skip
    meas_cols = [c for c in ["source", "workers", "nodes", "global_batch", "local_batch", "status", "step_time_s",
                             "compute_time_s", "sync_time_s", "input_time_s", "step_time_cv", "peak_mem_bytes", "error"]
                 if c in measurements.columns]  # fmt: skip
    parts = [
        f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1><p class=sub>generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC} "
        f"from results/ — objective <b>{html.escape(selection['objective'])}</b></p>"
        + device_line(workload),
        "".join(f"<div class='card bad'>{html.escape(w)}</div>" for w in (workload or {}).get("warnings", [])),
        "<div class=card><div class=big>Use N = {n} workers, global batch B = {b} ({lb} per worker)</div>"
        "<p>Predicted training time {t} ({ts:.4g} s), cost {c:.4g} {cur}, memory {m:.1f} MiB per worker.</p>"
        "<p>{reason}</p></div>".format(n=s["workers"], b=s["global_batch"], lb=s["local_batch"],
                                      t=fmt_duration(s["train_time_s"]), ts=s["train_time_s"], c=s["cost"], cur=cur,
                                      m=s["mem_bytes"] / 2**20, reason=html.escape(selection["reason"])),  # fmt: skip
        "<div class=card><b>Training at the selected point</b>: {e} epochs, {st} steps, final test accuracy "
        "<b>{a:.2f} %</b> (best {ba:.2f} %), training time {w}.{relaunch}</div>".format(
            e=final["epochs"], st=final["steps"], a=100 * final["final_test_acc"], ba=100 * final["best_test_acc"],
            w=fmt_duration(final["train_time_s"]),
            relaunch="" if final["global_batch"] == s["global_batch"] else
            f" <span class=bad>Finished at B={final['global_batch']}: B={s['global_batch']} ran out of memory "
            "(see Attempts below).</span>") + prediction_card(final) + comm_env_section(measurements, final),  # fmt: skip
        "<div class=grid>" + "".join(f"<div>{_img(p)}</div>" for p in plots if p.name not in TRAINING_PLOTS) + "</div>",
        "<h2>Training job</h2>" + "".join(_img(p) for p in plots if p.name == "training.png")
        + f"<p><b>Attempts</b> (results/train/attempts.json)</p>{attempts_table(attempts)}"
        + "".join(_img(p) for p in plots if p.name == "steps.png") + drift_card(final),
    ]
    parts.append(input_section(predictions, measurements, (s["workers"], s["global_batch"])))
    parts.append(model_section(perf))
    parts.append(noise_section(predictions, s["global_batch"]))
    if len(failed):
        parts.append(f"<h2 class=bad>{len(failed)} measurement(s) did not succeed</h2>" + _table(failed[meas_cols]))
    parts += [
        "<h2>Predictions for every grid point</h2>",
        _table(predictions[pred_cols], (s["workers"], s["global_batch"])),
        "<h2>Probe measurements</h2>",
        _table(measurements[meas_cols]),
        "<p class=sub>Files: results/measurements.csv, results/model/{memory,perf}.json, results/predictions.csv, "
        "results/selection.json, results/train/metrics.csv, results/train/final.json, results/train/attempts.json, results/train/model.pt — see results/README.md.</p>",
        "</body></html>",
    ]
    with atomic_write(out) as fh:
        fh.write("\n".join(parts))


def run(selection, predictions, measurements, final, plots, out, attempts=None, perf=None, workload=None) -> None:
    """``tula report``: render ``out`` from the results files (plots: the PNG paths; workload:
    results/workload.json, whose warnings head the page)."""
    render(read_json(selection), pd.read_csv(predictions), pd.read_csv(measurements), read_json(final),
           [Path(p) for p in plots], out, attempts=read_json(attempts) if attempts else None,
           perf=read_json(perf) if perf else None, workload=read_json(workload) if workload else None)  # fmt: skip
    print(f"[report] -> {out}")
