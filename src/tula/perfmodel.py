"""Step-time model (Eq. 2) and training time (Eq. 4a) for every grid point.

    t_step(N, b) = t_compute(b) + t_sync(N)
    t_compute(b) = c0 + c1 * b                 (linear in the local batch b)
    t_sync(N)    = s0 + s1 * x(N)              x = (N-1)/N ring | N param. server | log2 N tree
    T            = E * ceil(D / B) * t_step    (Eq. 4a with whole steps per epoch)

Each sub-model is fitted on its own measurement (compute_time_s, sync_time_s), so a
partial search's four corner probes give both fits the points they need. Predictions
are clipped at zero: a line fitted to noisy points must not predict negative time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pandas as pd

from tula import pricing as pricing_mod
from tula.config import Config
from tula.grid import grid
from tula.linfit import LinearFit, fit_linear
from tula.memory import MemoryModel

COLLECTIVE_TERMS: dict[str, tuple[str, Callable[[np.ndarray], np.ndarray]]] = {
    "ring": ("(N-1)/N", lambda n: (n - 1.0) / n),
    "ps": ("N", lambda n: n.astype(float)),
    "tree": ("log2(N)", lambda n: np.log2(n)),
}


def sync_feature(collective: str, nodes) -> np.ndarray:
    if collective not in COLLECTIVE_TERMS:
        raise ValueError(f"config key 'hardware.collective': unknown collective {collective!r}")
    return COLLECTIVE_TERMS[collective][1](np.asarray(nodes, dtype=float))


@dataclass(frozen=True)
class PerfModel:
    collective: str
    compute: LinearFit  # compute_time_s vs local_batch
    sync: LinearFit  # sync_time_s vs x(N)

    def compute_time_s(self, local_batch) -> np.ndarray:
        return np.maximum(self.compute.predict(local_batch), 0.0)

    def sync_time_s(self, nodes) -> np.ndarray:
        n = np.asarray(nodes, dtype=float)
        t = np.maximum(self.sync.predict(sync_feature(self.collective, n)), 0.0)
        return np.where(n <= 1, 0.0, t)  # one worker has nothing to synchronise

    def step_time_s(self, nodes, local_batch) -> np.ndarray:
        return self.compute_time_s(local_batch) + self.sync_time_s(nodes)

    def step_time_interval_s(self, nodes, local_batch, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
        """95 % prediction interval of a step: the compute and sync intervals added (conservative)."""
        n = np.asarray(nodes, dtype=float)
        c_lo, c_hi = self.compute.predict_interval(local_batch, alpha)
        s_lo, s_hi = self.sync.predict_interval(sync_feature(self.collective, n), alpha)
        s_lo, s_hi = np.where(n <= 1, 0.0, s_lo), np.where(n <= 1, 0.0, s_hi)
        return np.maximum(c_lo, 0) + np.maximum(s_lo, 0), np.maximum(c_hi, 0) + np.maximum(s_hi, 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "equation": "step_time_s = (c0 + c1*local_batch) + (s0 + s1*x(N)), clipped at 0  (Eq. 2)",
            "collective": self.collective,
            "sync_term": COLLECTIVE_TERMS[self.collective][0],
            "compute": self.compute.to_dict(),
            "sync": self.sync.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PerfModel":
        return cls(d["collective"], LinearFit.from_dict(d["compute"]), LinearFit.from_dict(d["sync"]))


def fit(measurements: pd.DataFrame, collective: str) -> PerfModel:
    """Fit compute vs local batch and sync vs the collective's N-term, on ok probes."""
    ok = measurements[measurements["status"] == "ok"]
    multi = ok[ok["nodes"] > 1]
    compute = fit_linear(ok["local_batch"], ok["compute_time_s"], what="step-time model (compute_time_s vs local_batch)")
    if len(multi):
        sync = fit_linear(sync_feature(collective, multi["nodes"]), multi["sync_time_s"], what="sync model")
    else:  # only N=1 probes: no communication was observed, none is predicted
        sync = LinearFit(0.0, 0.0, (0.0, 0.0), (0.0, 0.0), float("nan"), 0, 0)
    return PerfModel(collective, compute, sync)


def steps_per_epoch(train_samples: int, global_batch) -> np.ndarray:
    return np.ceil(train_samples / np.asarray(global_batch, dtype=float))


def predict(cfg: Config, perf: PerfModel, mem: MemoryModel, train_samples: int, measured: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per grid point: predicted step time, T, C, memory, feasibility."""
    pts = grid(cfg)
    df = pd.DataFrame({"nodes": [p.nodes for p in pts], "global_batch": [p.global_batch for p in pts]})
    df["local_batch"] = df["global_batch"] // df["nodes"]
    df["compute_time_s"] = perf.compute_time_s(df["local_batch"])
    df["sync_time_s"] = perf.sync_time_s(df["nodes"])
    df["step_time_s"] = df["compute_time_s"] + df["sync_time_s"]
    df["step_time_lo_s"], df["step_time_hi_s"] = perf.step_time_interval_s(df["nodes"], df["local_batch"])
    df["steps_per_epoch"] = steps_per_epoch(train_samples, df["global_batch"]).astype(int)
    df["epochs"] = cfg.workload.epochs
    steps = df["epochs"] * df["steps_per_epoch"]
    df["train_time_s"] = steps * df["step_time_s"]
    df["train_time_lo_s"], df["train_time_hi_s"] = steps * df["step_time_lo_s"], steps * df["step_time_hi_s"]
    df["mem_bytes"] = mem.predict_bytes(df["local_batch"])
    df["cost_node"] = pricing_mod.node_cost(df["train_time_s"], df["nodes"], cfg.pricing.per_node_hour)
    df["cost_memory"] = pricing_mod.memory_cost(df["train_time_s"], df["nodes"], df["mem_bytes"], cfg.pricing.per_gb_hour)
    df["cost"] = df["cost_memory"] if cfg.pricing.model == "memory" else df["cost_node"]
    df["feasible"] = mem.feasible(df["local_batch"])
    df["probe_status"] = ""
    df["measured_step_time_s"] = math.nan
    df["measured_train_time_s"] = math.nan
    if measured is not None and len(measured):
        m = measured.set_index(["nodes", "global_batch"])
        for i, row in df.iterrows():
            key = (row["nodes"], row["global_batch"])
            if key in m.index:
                rec = m.loc[key]
                rec = rec.iloc[0] if isinstance(rec, pd.DataFrame) else rec
                df.at[i, "probe_status"] = rec["status"]
                if rec["status"] == "ok":
                    df.at[i, "measured_step_time_s"] = rec["step_time_s"]
                    df.at[i, "measured_train_time_s"] = row["epochs"] * row["steps_per_epoch"] * rec["step_time_s"]
                elif rec["status"] == "oom":
                    df.at[i, "feasible"] = False  # a probe ran out of memory here: not a candidate
    df["feasible"] = df["feasible"].astype(bool)
    return df

