"""Eq. 4b: worker-hour, node-hour and memory pricing, and each through predict and select."""

import pandas as pd
import pytest

import bounds
from conftest import synced_probes
from tula import config, model_inputs
from tula.model import memory
from tula.model import perf as perfmodel
from tula.model.choice import select
from tula.model.linfit import fit_linear
from tula.model.pricing import memory_cost, node_cost, nodes_of, worker_cost
from tula.stages import predict as predict_mod


def test_pricing_arithmetic():
    # 2 hours on 4 workers at 2.5 per worker-hour = 20; memory: 2 h * 4 * 8 GB * 0.15 = 9.6
    assert worker_cost(7200, 4, 2.5) == pytest.approx(20.0)
    assert memory_cost(7200, 4, 8e9, 0.15) == pytest.approx(9.6)
    # whole 8-GPU nodes at 16 per node-hour: 4 workers take one node (2 h = 32), 16 take two, 24
    # three
    assert nodes_of([1, 4, 8, 9, 16, 24], 8).tolist() == [1, 1, 1, 2, 2, 3]
    assert node_cost(7200, [4, 16, 24], 8, 16.0).tolist() == pytest.approx([32.0, 64.0, 96.0])


def test_node_hour_pricing_bills_whole_nodes_through_predict_and_select():
    """4 workers per node, a node-hour at 4x a worker-hour: N = 1, 2 and 4 all pay one node,
    so the cheapest under node_hour is the fastest of them (N = 4), while worker_hour pays
    each worker and prefers N = 1 (sync makes more workers cost more in total)."""
    b = [32, 64, 128, 256]
    perf = perfmodel.fit(synced_probes(b), "ring")
    mem = memory.MemoryModel(fit_linear([1, 2], [1e6, 2e6]), None)
    picks = {}
    for model in ("worker_hour", "node_hour"):
        cfg = config.from_dict(
            {
                "grid": {"workers": [1, 2, 4], "batch_min": 128, "batch_max": 128},
                "cluster": {"workers_per_node": 4},
                "workload": {"epochs": 1},
                "objective": "cost",
                "pricing": {
                    "model": model,
                    "per_worker_hour": 1.0,
                    **({"per_node_hour": 4.0} if model == "node_hour" else {}),
                },
            }
        )
        pred = predict_mod.predict(model_inputs.planning(cfg), perf, mem, train_samples=4096)
        assert pred["nodes"].tolist() == [1, 1, 1]
        T = pred["train_time_s"]
        assert pred["cost_worker_hour"].tolist() == pytest.approx(
            (T / 3600 * pred["workers"]).tolist()
        )
        if model == "node_hour":
            assert pred["cost_node_hour"].tolist() == pytest.approx((T / 3600 * 4.0).tolist())
        assert pred["cost"].tolist() == pred[f"cost_{model}"].tolist()
        sel = select(pred, model_inputs.planning(cfg))
        picks[model] = sel.selected.workers
        assert (
            sel.pricing["unit"] == {"worker_hour": "worker-hour", "node_hour": "node-hour"}[model]
        )
    assert picks == {"worker_hour": 1, "node_hour": 4}


def _linear_perf() -> perfmodel.PerfModel:
    """One worker; a step takes 10 ms + 1 ms per sample (fitted on exact data)."""
    b = [16, 32, 64, 128, 256]
    df = pd.DataFrame(
        dict(
            workers=1,
            global_batch=b,
            local_batch=b,
            status="ok",
            step_time_s=[0.01 + 0.001 * x for x in b],
            compute_time_s=[0.01 + 0.001 * x for x in b],
            sync_time_s=0.0,
            peak_mem_bytes=1.0,
            source="probe",
        )
    )
    return perfmodel.fit(df, "ring")


@pytest.mark.parametrize("model, expect_batch", [("worker_hour", 256), ("memory", 64)])
def test_memory_pricing_flows_through_predict_and_select(model, expect_batch):
    """T falls with B (fewer 10 ms overheads) while memory grows 100 MB per sample: node pricing
    buys the largest batch, memory pricing the one where GB x hours is least."""
    cfg = config.from_dict(
        {
            "grid": {"workers": [1], "batch_min": 64, "batch_max": 256},
            "workload": {"epochs": 1},
            "objective": "cost",
            "pricing": {"model": model, "per_worker_hour": 2.0, "per_gb_hour": 0.5},
        }
    )
    mem = memory.MemoryModel(fit_linear([1, 2], [1e8, 2e8]), None)  # 100 MB per sample
    pred = predict_mod.predict(model_inputs.planning(cfg), _linear_perf(), mem, train_samples=1024)
    T = 1024 / pred["global_batch"] * (0.01 + 0.001 * pred["global_batch"])
    assert pred["train_time_s"].tolist() == pytest.approx(T.tolist(), rel=bounds.SOLVER)
    assert pred["mem_bytes"].tolist() == pytest.approx([6.4e9, 12.8e9, 25.6e9])
    assert pred["cost_memory"].tolist() == pytest.approx(
        (T / 3600 * pred["mem_bytes"] / 1e9 * 0.5).tolist(), rel=bounds.SOLVER
    )
    assert pred["cost"].tolist() == pred[f"cost_{model}"].tolist()
    sel = select(pred, model_inputs.planning(cfg))
    assert sel.selected.global_batch == expect_batch
    chosen = pred[pred["global_batch"] == expect_batch].iloc[0]
    assert sel.selected.cost == pytest.approx(chosen[f"cost_{model}"])


def test_cost_bills_the_model_the_config_names_exactly():
    """cost() dispatches on the pricing model's name as a parsed config gives it (a string
    read from YAML, not the literal in this file), and each model's arithmetic is exact: one
    hour on 2 workers of 1 GB at 1.5 per GB-hour is 3.0, not 3.000000003."""
    import json

    from tula.model.inputs import Price
    from tula.model.pricing import cost

    named = json.loads('["memory", "node_hour", "worker_hour"]')
    mem, node, worker = (
        Price(model=m, per_worker_hour=2.0, per_node_hour=5.0, per_gb_hour=1.5, workers_per_node=4)
        for m in named
    )
    assert float(cost(3600.0, 2, 1e9, mem)) == 3.0
    assert float(cost(3600.0, 2, 1e9, node)) == 5.0  # two workers share one 4-worker node
    assert float(cost(3600.0, 2, 1e9, worker)) == 4.0
    assert float(memory_cost(3600.0, 1, 1e9, 1.0)) == 1.0
    # a name that is none of them (sorting before or between them) is an error, not a guess
    for wrong in ("gpu_hour", "mem", "node", "zone_hour"):
        with pytest.raises(ValueError, match=f"pricing.model: '{wrong}'"):
            cost(3600.0, 2, 1e9, Price(model=wrong))
