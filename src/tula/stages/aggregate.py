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


def rows_from_probe(record: dict, probe_file: str) -> list[dict]:
    """The rows of one probe record: the probe itself, its sweep rows, and the records of
    any smaller batches it fell back to after an OOM."""
    row = {c: record.get(c) for c in REQUIRED + OPTIONAL}
    mem = record.get("memory") or {}
    for k in ("param_bytes", "grad_bytes", "opt_bytes", "act_bytes", "batch_bytes"):
        row[k] = mem.get(k)
    env = record.get("env") or {}
    row["device"], row["backend"], row["comm_env"] = (
        env.get("device"),
        env.get("backend"),
        comm_env_text(env),
    )
    row["data_workers"] = env.get("data_workers")
    row["hosts"] = " ".join(env.get("hostnames") or []) or None  # every rank's, in rank order
    row["source"], row["probe_file"] = "probe", probe_file
    row["precision_min_steps"] = record.get("timed_steps")  # probe.timed_steps, as it ran
    row["timed_s"] = timed_seconds(record)
    if row["timed_s"] is not None and record.get("wall_s"):
        row["probe_efficiency"] = row["timed_s"] / record["wall_s"]
    rows = [row]
    for sw in record.get("sweep") or []:
        rows.append(
            {
                "workers": record["workers"],
                "nodes": record.get("nodes"),
                "global_batch": record["global_batch"],
                "local_batch": sw["local_batch"],
                "compute_time_s": sw.get("compute_time_s"),
                "compute_time_cv": sw.get("compute_time_cv"),
                "compute_time_halfwidth_rel": sw.get("compute_time_halfwidth_rel"),
                "compute_timed_steps": sw.get("compute_timed_steps"),
                "precision_target": record.get("precision_target"),
                "precision_reached": sw.get("precision_reached"),
                "peak_mem_bytes": sw.get("peak_mem_bytes"),
                "status": sw["status"],
                "error": sw.get("error"),
                "source": "sweep",
                "probe_file": probe_file,
                "device": row["device"],
                "backend": row["backend"],
                "train_samples": record.get("train_samples"),
            }
        )
    for fb in record.get("fallbacks") or []:
        rows += rows_from_probe(fb, probe_file)
    return rows


def timed_seconds(record: dict) -> float | None:
    """Seconds of timed steps a probe job bought: its synced and compute-only steps at (N, B),
    the plain ones and those of the other kinds each arm weighed into its mean (epoch starts,
    short last batches, AGS refreshes: the kinds of ``*_halfwidth_mix``), and its sweep's
    compute-only steps (each a mean x the steps it is over). Steps timed and set aside (an
    arm judged at epoch starts alone) bought nothing. None where the probe measured nothing."""
    if record.get("status") != "ok":
        return None
    total = 0.0
    for kind in ("step", "compute"):
        t, k = record.get(f"{kind}_time_s"), record.get(f"{kind}_timed_steps") or 0
        other = record.get(f"{kind}_other_steps") or {}
        k += sum(other.get(m, 0) for m in record.get(f"{kind}_halfwidth_mix") or {})
        total += (t or 0.0) * k
    for sw in record.get("sweep") or []:
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
    (``results/probes/N{n}/job.json``) every record it lists, beside it."""
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
        rec = read_json(f)
        missing = [k for k in ("workers", "global_batch", "status") if k not in rec]
        if missing:
            raise ValueError(f"{f}: not a probe record (missing {', '.join(missing)})")
        rows += rows_from_probe(rec, f)
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
