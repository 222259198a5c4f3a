"""``results/measurements.csv``: one row per probe, the input of ``tula fit``.

This file is a public contract: measurements taken anywhere (a real GPU cluster, another
tool) can be written in this form and fed to ``tula fit`` / ``tula predict``.
Required columns (units in the names):

=================  ============================================================
nodes              N, data-parallel workers (GPUs)
global_batch       B, samples per optimizer step over all workers
local_batch        b = B / N, samples per worker per step
step_time_s        median wall time of one synchronous training step (s)
compute_time_s     median time of the same step without gradient sync (s)
sync_time_s        step_time_s - compute_time_s: exposed communication (s)
peak_mem_bytes     peak memory of one worker (bytes)
status             ok | oom | error | timeout; only ok rows are fitted
=================  ============================================================

Optional columns written by ``tula aggregate``: step_time_iqr_s, compute_time_iqr_s,
step_time_cv, rss_peak_bytes, grad_bytes_per_step, param_bytes, grad_bytes, opt_bytes,
act_bytes, batch_bytes, train_samples, wall_s, device, backend, error, source.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import pandas as pd

from tula.io import read_json, write_csv

REQUIRED = [
    "nodes", "global_batch", "local_batch", "step_time_s", "compute_time_s", "sync_time_s", "peak_mem_bytes", "status",
]  # fmt: skip
OPTIONAL = [
    "step_time_iqr_s", "compute_time_iqr_s", "step_time_cv", "rss_peak_bytes", "grad_bytes_per_step",
    "param_bytes", "grad_bytes", "opt_bytes", "act_bytes", "batch_bytes", "train_samples", "wall_s",
    "device", "backend", "error", "source",
]  # fmt: skip
NUMERIC = [c for c in REQUIRED if c != "status"]


def row_from_probe(record: dict, source: str) -> dict:
    row = {c: record.get(c) for c in REQUIRED + OPTIONAL}
    mem = record.get("memory") or {}
    for k in ("param_bytes", "grad_bytes", "opt_bytes", "act_bytes", "batch_bytes"):
        row[k] = mem.get(k)
    env = record.get("env") or {}
    row["device"], row["backend"] = env.get("device"), env.get("backend")
    row["source"] = source
    return row


def aggregate(probe_files: Iterable[str | Path], out: str | Path) -> pd.DataFrame:
    """Collect probe JSON files into one table (failed probes included, with status)."""
    rows = []
    for f in sorted(map(str, probe_files)):
        rec = read_json(f)
        missing = [k for k in ("nodes", "global_batch", "status") if k not in rec]
        if missing:
            raise ValueError(f"{f}: not a probe record (missing {', '.join(missing)})")
        rows.append(row_from_probe(rec, f))
    if not rows:
        raise ValueError("aggregate: no probe files given")
    df = pd.DataFrame(rows, columns=REQUIRED + OPTIONAL).sort_values(["nodes", "global_batch"], kind="stable")
    write_csv(out, df)
    return df


def load(path: str | Path) -> pd.DataFrame:
    """Read and check a measurements table; errors name the file and the column."""
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
    ok = df["status"] == "ok"
    for c in NUMERIC:
        vals = pd.to_numeric(df[c], errors="coerce")
        bad = ok & (vals.isna() | (vals < 0))
        if bad.any():
            i = int(bad.idxmax())
            raise ValueError(f"{p}: row {i + 2}, column {c}: {df.at[i, c]!r} is not a non-negative number")
        df[c] = vals
    bad_div = ok & (df["local_batch"] * df["nodes"] != df["global_batch"])
    if bad_div.any():
        i = int(bad_div.idxmax())
        raise ValueError(f"{p}: row {i + 2}: local_batch x nodes != global_batch")
    return df
