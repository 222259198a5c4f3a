"""Eq. 4b: node pricing and memory pricing, and memory pricing through predict and select."""

import pandas as pd
import pytest

from tula import config
from tula.model import memory
from tula.model import perf as perfmodel
from tula.model.linfit import fit_linear
from tula.model.pricing import memory_cost, node_cost
from tula.stages import predict as predict_mod
from tula.stages.select import select


def test_pricing_arithmetic():
    # 2 hours on 4 nodes at 2.5 per node-hour = 20; memory: 2 h * 4 * 8 GB * 0.15 = 9.6
    assert node_cost(7200, 4, 2.5) == pytest.approx(20.0)
    assert memory_cost(7200, 4, 8e9, 0.15) == pytest.approx(9.6)


def _linear_perf() -> perfmodel.PerfModel:
    """One worker; a step takes 10 ms + 1 ms per sample (fitted on exact data)."""
    b = [16, 32, 64, 128, 256]
    df = pd.DataFrame(dict(nodes=1, global_batch=b, local_batch=b, status="ok", step_time_s=[0.01 + 0.001 * x for x in b],
                           compute_time_s=[0.01 + 0.001 * x for x in b], sync_time_s=0.0, peak_mem_bytes=1.0,
                           source="probe"))  # fmt: skip
    return perfmodel.fit(df, "ring")


@pytest.mark.parametrize("model, expect_batch", [("node", 256), ("memory", 64)])
def test_memory_pricing_flows_through_predict_and_select(model, expect_batch):
    """T falls with B (fewer 10 ms overheads) while memory grows 100 MB per sample: node pricing
    buys the largest batch, memory pricing the one where GB x hours is least."""
    cfg = config.from_dict({"grid": {"nodes": [1], "batch_min": 64, "batch_max": 256}, "workload": {"epochs": 1},
                            "objective": "cost", "pricing": {"model": model, "per_node_hour": 2.0,
                                                             "per_gb_hour": 0.5}})  # fmt: skip
    mem = memory.MemoryModel(fit_linear([1, 2], [1e8, 2e8]), None)  # 100 MB per sample
    pred = predict_mod.predict(cfg, _linear_perf(), mem, train_samples=1024)
    T = 1024 / pred["global_batch"] * (0.01 + 0.001 * pred["global_batch"])
    assert pred["train_time_s"].tolist() == pytest.approx(T.tolist(), rel=1e-3)
    assert pred["mem_bytes"].tolist() == pytest.approx([6.4e9, 12.8e9, 25.6e9])
    assert pred["cost_memory"].tolist() == pytest.approx((T / 3600 * pred["mem_bytes"] / 1e9 * 0.5).tolist(), rel=1e-3)
    assert pred["cost"].tolist() == pred[f"cost_{model}"].tolist()
    sel = select(pred, cfg)
    assert sel["selected"]["global_batch"] == expect_batch
    chosen = pred[pred["global_batch"] == expect_batch].iloc[0]
    assert sel["selected"]["cost"] == pytest.approx(chosen[f"cost_{model}"])
