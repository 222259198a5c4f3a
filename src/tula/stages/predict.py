"""The predict stage: step time, T (Eq. 4a), C (Eq. 4b), memory and feasibility at every
grid point, probed or not (``tula predict`` -> results/predictions.csv)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tula import config as config_mod
from tula import model_inputs
from tula.io import read_json, write_csv
from tula.model import measurements as measurements_mod
from tula.model.memory import MemoryModel
from tula.model.perf import PerfModel
from tula.model.predictions import OVERHEADS, checkpoints_written, predict

__all__ = ["OVERHEADS", "checkpoints_written", "predict", "run", "train_samples_of"]


def train_samples_of(
    df: pd.DataFrame, given: int | None = None, workload: str | Path | None = None
) -> int:
    """D: given, else recorded by the probes, else by `tula check` in results/workload.json."""
    if given:
        return given
    if "train_samples" in df.columns and df["train_samples"].notna().any():
        return int(df["train_samples"].dropna().iloc[0])
    if workload and Path(workload).exists() and read_json(workload).get("train_samples"):
        return int(read_json(workload)["train_samples"])
    raise ValueError(
        "predict: the number of training samples D is unknown: no probe recorded it; pass "
        "--train-samples or --workload results/workload.json (written by `tula check`)"
    )


def run(
    config: str | Path,
    measurements: str | Path,
    memory: str | Path,
    perf: str | Path,
    out: str | Path,
    train_samples: int | None = None,
    workload: str | Path | None = None,
) -> pd.DataFrame:
    """``tula predict``: read the config, measurements and fitted models; write ``out``."""
    cfg = config_mod.load(config)
    df = measurements_mod.load(measurements)
    perf_m = PerfModel.from_dict(read_json(perf))
    mem_m = MemoryModel.from_dict(read_json(memory))
    D = train_samples_of(df, train_samples, workload)
    pred = predict(model_inputs.planning(cfg), perf_m, mem_m, D, df)
    write_csv(out, pred)
    print(
        f"[predict] {len(pred)} grid points ({int(pred['feasible'].sum())} feasible), D={D} "
        f"samples, E={cfg.workload.epochs} epochs -> {out}"
    )
    return pred
