"""The answer where the user looks: what `snakemake` prints at its end (the workflow's
``onsuccess`` and ``onerror``, rules/hooks.smk), so that the recommendation, what the
production job paid against it, how far to trust it and where the report is are on the
terminal, not only in files; after a failure, the failing rule's log and its last error line.
Reads the results files only."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from tula import model_inputs
from tula.config import Config, metric_name
from tula.io import read_json
from tula.model import pricing
from tula.model.measurements import at_chance, judged_halfwidths, judged_steps, short_of_steps
from tula.model.selection import Selection
from tula.progress import fmt_span


def _first_sentence(text: str) -> str:
    cut = re.split(r"(?<=[.;)])\s+(?=[A-Z(])", text.strip(), maxsplit=1)[0]
    return cut if len(cut) < 240 else cut[:237] + "..."


def _paid(final: dict, sel: Selection, cfg: Config) -> list[str]:
    """Training time, wall time and cost: predicted, paid, and their ratio."""
    s, cur = sel.selected, cfg.pricing.currency
    out = []
    if final.get("predicted_train_time_s"):
        # T less the steps the job timed apart (its first at each shape), as train_time_s
        timed = next((p for p in final.get("wall_check") or [] if p["part"] == "steps"), None)
        predicted = timed["predicted_s"] if timed else final["predicted_train_time_s"]
        out.append(
            f"training steps predicted {fmt_span(predicted)}, paid "
            f"{fmt_span(final['train_time_s'])}"
            + (f" (x{r:.2f})" if (r := final.get("train_time_ratio")) is not None else "")
        )
    if final.get("predicted_wall_time_s"):
        out.append(
            f"wall time predicted {fmt_span(final['predicted_wall_time_s'])}, paid "
            f"{fmt_span(final['wall_time_s'])} (x{final['wall_time_ratio']:.2f})"
        )
    paid = float(
        pricing.cost(
            final["train_time_s"],
            final["workers"],
            s.mem_bytes,
            model_inputs.price(cfg),
        )
    )
    out.append(f"cost predicted {s.cost:.4g} {cur}, paid {paid:.4g} {cur}")
    return out


def _trust(results: Path, sel: Selection, final: dict | None) -> list[str]:
    """What not to trust: an unsettled choice, probes that missed their precision, a step
    outside its interval."""
    out = []
    r = sel.robustness
    if r and not r.settled:
        out.append(
            f"the choice is not settled at this noise (chosen in {100 * r.chosen.share:.0f} % "
            f"of {r.resamples} resamples); to settle it: {r.to_settle or ''}"
        )
    meas = results / "measurements.csv"
    if meas.exists():
        m = pd.read_csv(meas)
        if {"source", "precision_reached", "step_time_halfwidth_rel"} <= set(m.columns):
            p = m[(m["source"] == "probe") & (m["status"] == "ok")]
            missed = p[p["precision_reached"].astype(str).str.lower() == "false"]
            if len(missed):
                names = ", ".join(_missed(r) for _, r in missed.iterrows())
                out.append(
                    f"{len(missed)} of {len(p)} probes missed their precision: {names} (the report "
                    "says what would reach it)"
                )
    est = _estimate_contradicted(results / "memory_probe.json")
    if est:
        out.append(est)
    lo_hi = (final or {}).get("predicted_step_time_interval_s")
    if final and lo_hi and not lo_hi[0] <= final["mean_step_time_s"] <= lo_hi[1]:
        out.append(
            f"the production step ({1e3 * final['mean_step_time_s']:.1f} ms) fell outside its "
            f"95 % interval ({1e3 * lo_hi[0]:.1f}-{1e3 * lo_hi[1]:.1f} ms)"
        )
    return out or ["every probe reached its precision and the choice held in the resamples"]


def _missed(r: pd.Series) -> str:
    """A probe that missed its precision: its wider arm's half-width as the precision rule judged
    it (as the report shows it), and the steps it lacked where it was short of them."""
    worst = max((h for h in judged_halfwidths(r)[0] if h is not None), default=None)
    said = [] if worst is None else [f"±{100 * worst:.1f} %"]
    if (least := short_of_steps(r)) is not None:
        said.append(f"on {int(judged_steps(r))} steps of the {least} probe.timed_steps asks")
    return f"N{int(r.workers)}_B{int(r.global_batch)}" + (f" ({' '.join(said)})" if said else "")


def _estimate_contradicted(memory_probe: Path) -> str:
    """A sentence where the memory probe contradicted the estimate from the model alone."""
    if not memory_probe.exists():
        return ""
    check = ((read_json(memory_probe).get("estimate") or {}).get("against_probe")) or {}
    if not check.get("disagrees"):
        return ""
    return (
        f"the memory estimate from the model alone was {check['error_at_largest']:+.0%} off the "
        "memory probe at its largest batch: the probe's figures were used; do not plan this "
        "model's memory on the estimate (tula check) alone"
    )


def success_lines(results: str | Path, cfg: Config) -> list[str]:
    """The end-of-run summary; [] where the run made no selection (another target)."""
    results = Path(results)
    if not (results / "selection.json").exists():
        return []
    sel = Selection.read(results / "selection.json")
    final_path = results / "train" / "final.json"
    final = read_json(final_path) if final_path.exists() else None
    s = sel.selected
    lines = [
        f"tula: use N={s.workers} workers, global batch B={s.global_batch} "
        f"({s.local_batch} per worker"
        + (f", {s.accumulate} micro-batches a step" if s.micro_batches > 1 else "")
        + ")"
        + (f" on partition {sel.partition}" if sel.partition else "")
        + f", objective {sel.objective}: "
        + _first_sentence(sel.reason)
    ]
    if final:
        if (final["workers"], final["global_batch"]) != s.key:
            lines.append(
                f"  trained at N={final['workers']} B={final['global_batch']} instead (see the "
                "report's attempts: an out-of-memory relaunch, a move or a lost node)"
            )
        lines.append("  " + "; ".join(_paid(final, sel, cfg)))
        lines.append(f"  {_metric_line(final)}, {final['epochs']} epochs")
        workload = results / "workload.json"
        chance = (
            at_chance(final, read_json(workload).get("num_classes")) if workload.exists() else None
        )
        if chance:
            lines.append(f"  WARNING: {chance}")
    plan = results / "plan" / "plan.json"
    if not final and plan.exists():
        lines.append(
            f"  no training ran (snakemake plan): the plan is {plan}, a batch script for your own "
            f"training script {plan.with_name('train.sbatch')}"
        )
    lines.append(f"  memory budget: {cfg.hardware.describe_memory()}")
    lines += [f"  trust: {t}" for t in _trust(results, sel, final)]
    report = results / "report.html" if final else results / "plan" / "report.html"
    if report.exists():
        lines.append(f"  report: {report.resolve()}")
    return lines


def _metric_line(final: dict) -> str:
    """The test metric at the end and at its best, under its own name (percent for accuracy)."""
    metric = final.get("metric", "accuracy")
    end, best = final["final_test_acc"], final["best_test_acc"]
    if metric == "accuracy":
        return f"accuracy: {100 * end:.2f} % at the end, best {100 * best:.2f} %"
    return f"{metric_name(metric)}: {end:.4g} at the end, best {best:.4g}"


def error_lines(snakemake_log) -> list[str]:
    """After a failed run: the failing rule(s), each one's log and the last error line in it.
    ``snakemake_log``: what Snakemake's onerror gives as ``log`` (its log file, or a list)."""
    logs = [snakemake_log] if isinstance(snakemake_log, (str, Path)) else snakemake_log or []
    text = ""
    for one in logs:
        try:
            text += Path(one).read_text(errors="replace")
        except OSError:
            pass
    out = []
    for rule, block in re.findall(r"Error in rule (\w+):\n(.*?)(?=\n\S|\Z)", text, re.S):
        logs = re.findall(r"^\s+log: (\S+)", block, re.M)
        out.append(f"tula: rule {rule} failed" + (f"; its log: {logs[0]}" if logs else ""))
        last = last_error(Path(logs[0])) if logs else ""
        if last:
            out.append(f"  last error: {last}")
    if not out and logs:
        out.append(f"tula: the run failed; Snakemake's log: {', '.join(map(str, logs))}")
    return out


def last_error(log: Path) -> str:
    """The last line of ``log`` that reads as an error, else its last line."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    errors = [ln for ln in lines if re.search(r"\b\w*(Error|error|Exception)\b", ln)]
    return (errors or lines or [""])[-1][:400]
