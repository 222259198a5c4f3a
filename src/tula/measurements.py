"""``results/measurements.csv``: the input of ``tula fit``; one row per measurement.

This file is a public contract: measurements taken anywhere (a real GPU cluster, another
tool) can be written in this form and fed to ``tula fit`` / ``tula predict``.
Required columns (units in the names):

=================  ============================================================
nodes              N, data-parallel workers (GPUs) of the job that measured the row
global_batch       B, samples per optimizer step over all workers, of that job
local_batch        b, samples per worker per step (B / N for probe rows)
step_time_s        mean wall time of one synchronous training step (s)
compute_time_s     mean time of the same step without gradient sync (s)
sync_time_s        step_time_s - compute_time_s: exposed communication (s)
peak_mem_bytes     peak memory of one worker (bytes)
status             ok | oom | error | timeout; only ok rows are fitted
=================  ============================================================

Optional ``source`` says what a row is (absent: every row is a probe):

- ``probe``: a timed DDP probe at (N, B); every column above is filled.
- ``sweep``: compute-only steps at another local batch, timed inside the probe job of
  (N, B) after its own measurement (the compute curve). local_batch is the swept one,
  global_batch the job's; step_time_s and sync_time_s are empty; compute_time_s and
  peak_mem_bytes are filled.
- ``memory``: the memory probe (one worker, before any timing probe): local_batch and
  peak_mem_bytes; the times are empty.

Other optional columns written by ``tula aggregate``: step_time_iqr_s, compute_time_iqr_s,
step_time_cv, compute_time_cv, epoch_start_extra_s, rss_peak_bytes, grad_bytes_per_step,
param_bytes, grad_bytes, opt_bytes, act_bytes, batch_bytes, train_samples, wall_s, device,
backend, error, probe_file; and on multi-worker probe rows the gradient noise scale
(tula.noise): grad_noise_scale = B_noise = grad_trace / grad_sq, grad_sq = |G|^2 and
grad_trace = tr(Sigma), the per-sample gradient covariance's trace, with grad_sq_se and
grad_trace_se their standard errors over the noise steps (empty for N = 1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from tula.io import read_json, write_csv

REQUIRED = [
    "nodes", "global_batch", "local_batch", "step_time_s", "compute_time_s", "sync_time_s", "peak_mem_bytes", "status",
]  # fmt: skip
OPTIONAL = [
    "source", "step_time_iqr_s", "compute_time_iqr_s", "step_time_cv", "compute_time_cv", "epoch_start_extra_s",
    "rss_peak_bytes", "grad_bytes_per_step", "param_bytes", "grad_bytes", "opt_bytes", "act_bytes", "batch_bytes",
    "train_samples", "wall_s", "device", "backend", "error", "probe_file", "grad_noise_scale", "grad_sq", "grad_trace",
    "grad_sq_se", "grad_trace_se",
]  # fmt: skip
NUMERIC = [c for c in REQUIRED if c != "status"]
SOURCES = ("probe", "sweep", "memory")
# The numbers an ok row of each source must carry.
FILLED = {
    "probe": NUMERIC,
    "sweep": ["nodes", "global_batch", "local_batch", "compute_time_s"],
    "memory": ["nodes", "global_batch", "local_batch", "peak_mem_bytes"],
}


def rows_from_probe(record: dict, probe_file: str) -> list[dict]:
    """The rows of one probe record: the probe itself, its sweep rows, and the records of
    any smaller batches it fell back to after an OOM."""
    row = {c: record.get(c) for c in REQUIRED + OPTIONAL}
    mem = record.get("memory") or {}
    for k in ("param_bytes", "grad_bytes", "opt_bytes", "act_bytes", "batch_bytes"):
        row[k] = mem.get(k)
    env = record.get("env") or {}
    row["device"], row["backend"] = env.get("device"), env.get("backend")
    row["source"], row["probe_file"] = "probe", probe_file
    rows = [row]
    for sw in record.get("sweep") or []:
        rows.append({"nodes": record["nodes"], "global_batch": record["global_batch"], "local_batch": sw["local_batch"],
                     "compute_time_s": sw.get("compute_time_s"), "compute_time_cv": sw.get("compute_time_cv"),
                     "peak_mem_bytes": sw.get("peak_mem_bytes"), "status": sw["status"], "error": sw.get("error"),
                     "source": "sweep", "probe_file": probe_file, "device": row["device"],
                     "backend": row["backend"], "train_samples": record.get("train_samples")})  # fmt: skip
    for fb in record.get("fallbacks") or []:
        rows += rows_from_probe(fb, probe_file)
    return rows


def rows_from_memory_probe(record: dict, path: str) -> list[dict]:
    env = record.get("env") or {}
    return [{"nodes": 1, "global_batch": p["local_batch"], "local_batch": p["local_batch"],
             "peak_mem_bytes": p.get("peak_mem_bytes"), "status": p["status"], "error": p.get("error"),
             "source": "memory", "probe_file": path, "device": env.get("device"), "backend": env.get("backend"),
             **{k: (p.get("memory") or {}).get(k) for k in ("param_bytes", "grad_bytes", "opt_bytes", "act_bytes",
                                                             "batch_bytes")}}
            for p in record.get("points", [])]  # fmt: skip


def aggregate(probe_files: Iterable[str | Path], out: str | Path, memory_probe: str | Path | None = None) -> pd.DataFrame:
    """Collect probe JSON files (and the memory probe's points) into one table; failed
    probes are included, with their status."""
    rows = []
    for f in sorted(map(str, probe_files)):
        rec = read_json(f)
        missing = [k for k in ("nodes", "global_batch", "status") if k not in rec]
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
    df = df.assign(_o=df["source"].map(order)).sort_values(["_o", "nodes", "global_batch", "local_batch"], kind="stable")
    df = df.drop(columns="_o")
    write_csv(out, df)
    return df


def load(path: str | Path) -> pd.DataFrame:
    """Read and check a measurements table; errors name the file, the row and the column.
    A table without ``source`` is all probe rows."""
    p = Path(path)
    try:
        df = pd.read_csv(p)
    except FileNotFoundError:
        raise FileNotFoundError(f"{p}: measurements file not found") from None
    except pd.errors.EmptyDataError:
        raise ValueError(f"{p}: empty file; expected columns {', '.join(REQUIRED)}") from None
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ValueError(f"{p}: missing column(s) {', '.join(missing)}; required: {', '.join(REQUIRED)}")
    if "source" not in df.columns:
        df["source"] = "probe"
    df["source"] = df["source"].fillna("probe").astype(str)
    unknown = sorted(set(df["source"]) - set(SOURCES))
    if unknown:
        i = int((~df["source"].isin(SOURCES)).idxmax())
        raise ValueError(f"{p}: row {i + 2}, column source: {unknown[0]!r} is not one of {', '.join(SOURCES)}")
    ok = df["status"] == "ok"
    for c in NUMERIC:
        vals = pd.to_numeric(df[c], errors="coerce")
        needed = np.zeros(len(df), dtype=bool)
        for src, cols in FILLED.items():
            if c in cols:
                needed |= (df["source"] == src).to_numpy()
        bad = ok & ((vals.isna() & needed) | (vals < 0))
        if bad.any():
            i = int(bad.idxmax())
            raise ValueError(f"{p}: row {i + 2}, column {c}: {df.at[i, c]!r} is not a non-negative number")
        df[c] = vals
    bad_div = ok & (df["source"] == "probe") & (df["local_batch"] * df["nodes"] != df["global_batch"])
    if bad_div.any():
        i = int(bad_div.idxmax())
        raise ValueError(f"{p}: row {i + 2}: local_batch x nodes != global_batch")
    return df


def probes(df: pd.DataFrame) -> pd.DataFrame:
    """The timed DDP probe rows (not the sweep or memory rows)."""
    return df[df["source"] == "probe"] if "source" in df.columns else df
