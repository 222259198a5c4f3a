"""Cost of a training run (Eq. 4b). A price is data from the config, not code.

- worker_hour:  C = T[h] * N * per_worker_hour                       (each worker / GPU billed)
- node_hour:    C = T[h] * ceil(N / workers_per_node) * per_node_hour (whole nodes billed)
- memory:       C = T[h] * N * mem_GB * per_gb_hour   (§IV-C.2, GB of device memory used)
"""

from __future__ import annotations

import numpy as np

from tula.model.grid import nodes_of
from tula.model.inputs import Price

UNITS = {"worker_hour": "worker-hour", "node_hour": "node-hour", "memory": "GB-hour"}


def worker_cost(train_time_s, workers, per_worker_hour: float):
    return np.asarray(train_time_s, dtype=float) / 3600.0 * np.asarray(workers) * per_worker_hour


def node_cost(train_time_s, workers, workers_per_node: int, per_node_hour: float):
    return (
        np.asarray(train_time_s, dtype=float)
        / 3600.0
        * nodes_of(workers, workers_per_node)
        * per_node_hour
    )


def memory_cost(train_time_s, workers, mem_bytes, per_gb_hour: float):
    gb = np.asarray(mem_bytes, dtype=float) / 1e9
    return np.asarray(train_time_s, dtype=float) / 3600.0 * np.asarray(workers) * gb * per_gb_hour


def cost(train_time_s, workers, mem_bytes, p: Price):
    """Cost under the configured pricing model (``pricing.model``)."""
    if p.model == "memory":
        return memory_cost(train_time_s, workers, mem_bytes, p.per_gb_hour)
    if p.model == "node_hour":
        return node_cost(train_time_s, workers, p.workers_per_node, p.per_node_hour)
    if p.model == "worker_hour":
        return worker_cost(train_time_s, workers, p.per_worker_hour)
    raise ValueError(f"pricing.model: {p.model!r} is not one of {', '.join(sorted(UNITS))}")
