"""``tula aggregate``: every probe record (and the memory probe's points) into one table,
``results/measurements.csv`` (its columns: :mod:`tula.model.measurements`). Failed probes
are rows too, with their status: a failure is never dropped."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import pandas as pd

from tula.io import read_json, write_csv
from tula.model.measurements import (
    OPTIONAL,
    PROBE_JOB_SCHEMA,
    REQUIRED,
    SOURCES,
    comm_env_text,
)
from tula.model.probe_record import ProbeRecord


def rows_from_probe(record: dict, probe_file: str) -> list[dict]:
    """The rows of one probe record (its JSON, read through
    :class:`tula.model.probe_record.ProbeRecord`): the probe itself, its sweep rows, and the
    records of any smaller batches it fell back to after an OOM."""
    return _rows(ProbeRecord.from_json(record), probe_file)


def _rows(rec: ProbeRecord, probe_file: str) -> list[dict]:
    flat, m = rec.to_json(), rec.measured
    row = {c: flat.get(c) for c in REQUIRED + OPTIONAL}
    mem, env = m.memory or {}, m.env or {}
    for k in ("param_bytes", "grad_bytes", "opt_bytes", "act_bytes", "batch_bytes"):
        row[k] = mem.get(k)
    row["device"], row["backend"], row["comm_env"] = (
        env.get("device"),
        env.get("backend"),
        comm_env_text(env),
    )
    row["data_workers"] = env.get("data_workers")
    row["hosts"] = " ".join(env.get("hostnames") or []) or None  # every rank's, in rank order
    row["source"], row["probe_file"] = "probe", probe_file
    row["precision_min_steps"] = rec.probed.timed_steps  # probe.timed_steps, as it ran
    row["timed_s"] = timed_seconds(rec)
    if row["timed_s"] is not None and rec.wall_s:
        row["probe_efficiency"] = row["timed_s"] / rec.wall_s
    rows = [row]
    target = m.timing.precision_target if m.timing else None
    for sw in rec.sweep:
        rows.append(
            {
                "workers": rec.probed.workers,
                "nodes": rec.probed.nodes,
                "global_batch": rec.probed.global_batch,
                "local_batch": sw["local_batch"],
                "accumulate": sw.get("accumulate"),  # a fixed train.accumulate's k
                "compute_time_s": sw.get("compute_time_s"),
                "compute_time_cv": sw.get("compute_time_cv"),
                "compute_time_halfwidth_rel": sw.get("compute_time_halfwidth_rel"),
                "compute_timed_steps": sw.get("compute_timed_steps"),
                "precision_target": target,
                "precision_reached": sw.get("precision_reached"),
                "peak_mem_bytes": sw.get("peak_mem_bytes"),
                "status": sw["status"],
                "error": sw.get("error"),
                "source": "sweep",
                "probe_file": probe_file,
                "device": row["device"],
                "backend": row["backend"],
                "train_samples": m.train_samples,
            }
        )
    for fb in rec.fallbacks or []:
        rows += _rows(fb, probe_file)
    return rows


def timed_seconds(rec: ProbeRecord) -> float | None:
    """Seconds of timed steps a probe job bought: its synced and compute-only steps at (N, B),
    the plain ones and those of the other kinds each arm weighed into its mean (epoch starts,
    short last batches, AGS refreshes: the kinds of ``*_halfwidth_mix``), and its sweep's
    compute-only steps (each a mean x the steps it is over). Steps timed and set aside (an
    arm judged at epoch starts alone) bought nothing. None where the probe measured nothing."""
    if not rec.ok:
        return None
    m, total = rec.measured, 0.0
    for t, arm in ((m.step_time_s, "step"), (m.compute_time_s, "compute")):
        a = getattr(m.timing, arm) if m.timing else None
        k = (a.timed_steps or 0) if a else 0
        k += sum((a.other_steps or {}).get(kind, 0) for kind in (a.halfwidth_mix or {})) if a else 0
        total += (t or 0.0) * k
    for sw in rec.sweep:
        if sw.get("status") == "ok":
            total += (sw.get("compute_time_s") or 0.0) * (sw.get("compute_timed_steps") or 0)
    return total


def rows_from_memory_probe(record: dict, path: str) -> list[dict]:
    env = record.get("env") or {}
    checked = {
        r["local_batch"]: r
        for r in ((record.get("estimate") or {}).get("against_probe") or {}).get("points", [])
    }
    return [
        {
            "workers": 1,
            "nodes": 1,
            "global_batch": p["local_batch"],
            "local_batch": p["local_batch"],
            "peak_mem_bytes": p.get("peak_mem_bytes"),
            "status": p["status"],
            "error": p.get("error"),
            "source": "memory",
            "probe_file": path,
            "device": env.get("device"),
            "backend": env.get("backend"),
            **{
                k: (p.get("memory") or {}).get(k)
                for k in ("param_bytes", "grad_bytes", "opt_bytes", "act_bytes", "batch_bytes")
            },
            "estimate_mem_bytes": checked.get(p["local_batch"], {}).get("estimate_bytes"),
            "estimate_mem_error": checked.get(p["local_batch"], {}).get("error"),
        }
        for p in record.get("points", [])
    ]


def records_in(paths: Iterable[str | Path]) -> list[str]:
    """The probe records named: a record itself, or a probe job's ``job.json``
    (``results/partitions/<name>/probes/N{n}/job.json``) every record it lists, beside it."""
    out: list[str] = []
    for p in map(Path, paths):
        rec = read_json(p)
        if rec.get("schema") == PROBE_JOB_SCHEMA:
            out += [str(p.parent / name) for name in rec["records"]]
        else:
            out.append(str(p))
    return out


def run(
    probe_files: Iterable[str | Path], out: str | Path, memory_probe: str | Path | None = None
) -> pd.DataFrame:
    """Collect probe records (each, or a probe job's ``job.json``; and the memory probe's
    points) into one table; failed probes are included, with their status."""
    rows = []
    for f in sorted(records_in(probe_files)):
        try:
            rec = ProbeRecord.from_json(read_json(f))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{f}: {exc}") from exc
        rows += _rows(rec, f)
    if not rows:
        raise ValueError("aggregate: no probe files given")
    if memory_probe:
        rec = read_json(memory_probe)
        if "points" not in rec:
            raise ValueError(f"{memory_probe}: not a memory probe record (no points)")
        rows += rows_from_memory_probe(rec, str(memory_probe))
    order = {s: i for i, s in enumerate(SOURCES)}
    df = pd.DataFrame(rows, columns=REQUIRED + OPTIONAL)
    df = df.assign(_o=df["source"].map(order)).sort_values(
        ["_o", "workers", "global_batch", "local_batch"], kind="stable"
    )
    df = df.drop(columns="_o")
    write_csv(out, df)
    probes = df[df["source"] == "probe"]
    ok = int((probes["status"] == "ok").sum())
    print(
        f"[aggregate] {len(probes)} probes ({ok} ok, {len(probes) - ok} failed), "
        f"{int((df['source'] == 'sweep').sum())} sweep rows, "
        f"{int((df['source'] == 'memory').sum())} memory rows -> {out}"
    )
    return df
