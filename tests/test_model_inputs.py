"""tula.model_inputs: each record the equations take carries the config's own values, key by
key (a field built from the wrong key would change a prediction without any error)."""

import dataclasses

import pytest

from tula import config, model_inputs
from tula.model.inputs import Bounds

RAW = {
    "workload": {"epochs": 7},
    "grid": {"workers": [1, 2, 4], "batch_min": 32, "batch_max": 256},
    "cluster": {"workers_per_node": 2},
    "search": "full",
    "objective": "cost",
    "knee_on": "cost",
    "knee_rule": "kneedle",
    "knee_gain": 0.2,
    "constraints": {"min_workers": 2, "max_workers": 4, "min_batch": 64, "max_batch": 128},
    "pricing": {
        "model": "node_hour",
        "per_worker_hour": 1.5,
        "per_node_hour": 9.0,
        "per_gb_hour": 0.25,
        "currency": "EUR",
    },
    "hardware": {"gpu": "h100", "device_memory_gb": 40, "memory_margin": 0.1},
    "probe": {"warmup_steps": 4, "timed_steps": 30, "timeout_s": 120, "precision": 0.05},
    "train": {"base_batch": 64, "compile": "on", "lr": 0.2, "method": "lrs"},
    "launch": {"checkpoint_every_steps": 50, "checkpoint_every_epochs": 3},
}


def test_every_record_carries_its_keys():
    cfg = config.from_dict(RAW)
    p = model_inputs.planning(cfg)
    g = p.grid
    assert (g.workers, g.batch_min, g.batch_max, g.workers_per_node, g.search) == (
        (1, 2, 4),
        32,
        256,
        2,
        "full",
    )
    pr = p.price
    assert (pr.model, pr.per_worker_hour, pr.per_node_hour, pr.per_gb_hour, pr.currency) == (
        "node_hour",
        1.5,
        9.0,
        0.25,
        "EUR",
    )
    assert pr.workers_per_node == 2
    goal = p.goal
    assert (goal.objective, goal.knee_on, goal.knee_rule, goal.knee_gain) == (
        "cost",
        "cost",
        "kneedle",
        0.2,
    )
    assert goal.bounds == Bounds(min_workers=2, max_workers=4, min_batch=64, max_batch=128)
    assert (goal.epochs, goal.base_batch) == (7, 64)
    e = p.extras
    assert (e.checkpoint_every_steps, e.checkpoint_every_epochs, e.compiled) == (50, 3, True)
    dev = model_inputs.device(cfg)
    assert dev.gpu == "h100" and dev.memory_budget_bytes == cfg.hardware.memory_budget_bytes
    assert dev.precision == cfg.train.precision
    s = model_inputs.probe_steps(cfg)
    assert (s.warmup_steps, s.timed_steps, s.timeout_s, s.precision) == (4, 30, 120, 0.05)
    lr = model_inputs.lr_plan(cfg.train)
    assert (lr.lr, lr.linear_scaling, lr.base_batch) == (0.2, True, 64)
    assert lr.peak(256) == 0.2 * 256 / 64


def test_the_records_are_frozen_so_no_equation_changes_what_the_config_said():
    p = model_inputs.planning(config.from_dict({}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.goal.objective = "time"  # type: ignore[misc]
