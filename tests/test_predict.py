"""The predict stage: Eq. 4 arithmetic, and feasibility from measured out-of-memory points."""

import numpy as np
import pandas as pd
import pytest

from tula import config, memory, perfmodel
from tula import predict as predict_mod
from tula.linfit import fit_linear


def _flat_perf(step_s: float) -> perfmodel.PerfModel:
    """A perf model whose every step takes ``step_s`` (fitted on exact flat data)."""
    df = pd.DataFrame(dict(nodes=[1, 1, 1], global_batch=[1, 2, 4], local_batch=[1, 2, 4], status="ok",
                           compute_time_s=step_s, step_time_s=step_s, sync_time_s=0.0, peak_mem_bytes=1.0,
                           source="probe"))  # fmt: skip
    return perfmodel.fit(df, "ring")



def test_predict_eq4_arithmetic():
    cfg = config.from_dict({"grid": {"nodes": [2], "batch_min": 64, "batch_max": 64}, "workload": {"epochs": 3},
                            "pricing": {"per_node_hour": 3.6}})  # fmt: skip
    mem = memory.MemoryModel(fit_linear([1, 2], [1e9, 1e9]), None)
    row = predict_mod.predict(cfg, _flat_perf(0.1), mem, train_samples=1000).iloc[0]
    assert row["steps_per_epoch"] == 16  # ceil(1000 / 64)
    assert row["train_time_s"] == pytest.approx(3 * 16 * 0.1, rel=1e-6)
    assert row["cost_node"] == pytest.approx(4.8 / 3600 * 2 * 3.6, rel=1e-6)
    assert row["cost_memory"] == pytest.approx(4.8 / 3600 * 2 * 1.0 * 0.15, rel=1e-6)


def test_measured_oom_marks_point_infeasible_and_sweep_rows_are_not_probes():
    cfg = config.from_dict({"grid": {"nodes": [1], "batch_min": 32, "batch_max": 64}})
    mem = memory.MemoryModel(fit_linear([1, 2], [1.0, 1.0]), None)
    measured = pd.DataFrame([dict(nodes=1, global_batch=64, local_batch=64, status="oom", step_time_s=np.nan,
                                  source="probe"),
                             dict(nodes=1, global_batch=64, local_batch=32, status="ok", step_time_s=np.nan,
                                  compute_time_s=0.1, source="sweep")])  # fmt: skip
    pred = predict_mod.predict(cfg, _flat_perf(0.1), mem, 100, measured)
    assert list(pred["feasible"]) == [True, False] and list(pred["probe_status"]) == ["", "oom"]
