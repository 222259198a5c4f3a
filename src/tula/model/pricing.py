"""Cost of a training run (Eq. 4b). A price is data from the config, not code.

- node pricing:   C = T[h] * N * per_node_hour
- memory pricing: C = T[h] * N * mem_GB * per_gb_hour   (§IV-C.2, GB of device memory used)
"""

from __future__ import annotations

import numpy as np

from tula.config import Pricing


def node_cost(train_time_s, nodes, per_node_hour: float):
    return np.asarray(train_time_s, dtype=float) / 3600.0 * np.asarray(nodes) * per_node_hour


def memory_cost(train_time_s, nodes, mem_bytes, per_gb_hour: float):
    gb = np.asarray(mem_bytes, dtype=float) / 1e9
    return np.asarray(train_time_s, dtype=float) / 3600.0 * np.asarray(nodes) * gb * per_gb_hour


def cost(train_time_s, nodes, mem_bytes, pricing: Pricing):
    """Cost under the configured pricing model (``pricing.model``)."""
    if pricing.model == "memory":
        return memory_cost(train_time_s, nodes, mem_bytes, pricing.per_gb_hour)
    return node_cost(train_time_s, nodes, pricing.per_node_hour)
