"""The grid as the model alone sees it: what the estimate of the step
(:mod:`tula.runtime.probe.estimate`, a dict here) and the named GPU (:mod:`tula.gpus`) say about
the grid before any job runs, and how far the memory probe found the estimate off.

- The memory model's two terms (Eq. 3) from the estimate give each local batch's memory; a
  local batch whose estimate exceeds the budget by more than :data:`CLEAR_MARGIN` is ruled out
  without a probe (none is bought to watch it run out of memory). One nearer the budget is left
  to the memory probe.
- A roofline bounds each point's compute time from below: no step is faster than its FLOPs at
  the GPU's peak, nor than its memory traffic at full bandwidth (every byte of its peak written
  once at least).
- The memory probe stays the truth: its measured peaks against the estimate give the estimate's
  error, and where the two differ by more than :data:`DISAGREE` the report says the probe won.
"""

from __future__ import annotations

from typing import Any

from tula.gpus import from_config
from tula.model.inputs import Device, Price, ProbeSteps
from tula.model.pricing import cost

# an estimate this far above the budget rules a local batch out without a probe
CLEAR_MARGIN = 0.25
# the estimate off the memory probe by more than this (relative) at a batch both measured: said
DISAGREE = 0.15


def predict_bytes(est: dict[str, Any], local_batch: float) -> float:
    return est["fixed_bytes"] + est["per_sample_bytes"] * local_batch


def max_local_batch(est: dict[str, Any], budget_bytes: float | None) -> int | None:
    """The largest local batch whose estimated memory fits the budget (None: unbounded; 0:
    not even one sample)."""
    if budget_bytes is None:
        return None
    if est["per_sample_bytes"] <= 0:
        return None if est["fixed_bytes"] <= budget_bytes else 0
    return max(int((budget_bytes - est["fixed_bytes"]) // est["per_sample_bytes"]), 0)


def clear_bound(est: dict[str, Any] | None, budget_bytes: float | None) -> int | None:
    """The largest local batch the estimate does not rule out (None: no bound): probes stay
    at or below it until the memory probe has measured."""
    if not est or budget_bytes is None:
        return None
    return max_local_batch(est, budget_bytes * (1 + CLEAR_MARGIN))


def clearly_out(est: dict[str, Any] | None, budget_bytes: float | None, local_batch: int) -> bool:
    """True when the estimate puts ``local_batch`` beyond the budget by more than CLEAR_MARGIN."""
    if not est or budget_bytes is None:
        return False
    return predict_bytes(est, local_batch) > budget_bytes * (1 + CLEAR_MARGIN)


def roofline_s(est: dict[str, Any], local_batch: int, gpu, precision: str) -> float:
    """Least compute time of one step at ``local_batch`` on ``gpu`` (seconds): FLOPs at peak or
    the step's bytes at full bandwidth, whichever is longer."""
    flops = est["flops_per_sample"] * local_batch / gpu.peak_flops(precision)
    traffic = predict_bytes(est, local_batch) / (gpu.bandwidth_gbs * 1e9)
    return max(flops, traffic)


def grid_estimate(dev: Device, est: dict[str, Any], points) -> list[dict[str, Any]]:
    """Per grid point (``points``: (workers, global_batch) pairs): its local batch, estimated
    memory, whether it fits the budget, whether it is ruled out, and (with hardware.gpu) its
    roofline compute time per step."""
    budget = dev.memory_budget_bytes
    gpu = from_config(dev.gpu) if dev.gpu else None
    rows = []
    for n, b in points:
        local = b // n
        mem = predict_bytes(est, local)
        rows.append(
            {
                "workers": n,
                "global_batch": b,
                "local_batch": local,
                "estimate_bytes": mem,
                "fits": budget is None or mem <= budget,
                "ruled_out": clearly_out(est, budget, local),
                "roofline_s": roofline_s(est, local, gpu, dev.precision) if gpu else None,
            }
        )
    return rows


def against_probe(est: dict[str, Any], points: list[dict], fit: dict[str, float]) -> dict:
    """The estimate against the memory probe: each measured point's relative error
    ((estimate - measured) / measured), the two terms' errors against the probe's fitted
    memory model (``fit``: intercept, slope), the worst error, and whether the error at the
    largest batch measured (the nearest to b_max, where the estimate decides what fits)
    exceeds DISAGREE: the probe wins. At small batches a few MiB the estimate leaves out (the
    loader's buffers, the allocator) can be a large share and decide nothing."""
    rows = [
        {
            "local_batch": p["local_batch"],
            "measured_bytes": p["peak_mem_bytes"],
            "estimate_bytes": predict_bytes(est, p["local_batch"]),
        }
        for p in points
        if p.get("status") == "ok" and p.get("peak_mem_bytes")
    ]
    for r in rows:
        r["error"] = r["estimate_bytes"] / r["measured_bytes"] - 1
    largest = max(rows, key=lambda r: r["local_batch"])["error"] if rows else None
    return {
        "points": rows,
        "per_sample_error": _rel(est["per_sample_bytes"], fit.get("slope")),
        "fixed_error": _rel(est["fixed_bytes"], fit.get("intercept")),
        "worst_error": max((abs(r["error"]) for r in rows), default=None),
        "error_at_largest": largest,
        "bound": DISAGREE,
        "disagrees": largest is not None and abs(largest) > DISAGREE,
    }


def _rel(estimate: float, measured: float | None) -> float | None:
    return None if not measured else estimate / measured - 1


def campaign_price(
    dev: Device, probe: ProbeSteps, price: Price, est: dict[str, Any], jobs: list[dict]
) -> dict[str, float] | None:
    """The probe campaign's price as a range (``jobs``: the campaign's probes, each with its
    ``workers`` and ``local_batch``; one job per N measures its probes in turn): at least
    every probe's warm-up and timed steps at the roofline (start-up, loading and the sweep
    cost nothing: a floor no campaign goes under), at most every probe at its time limit
    (probe.timeout_s) and each job's five minutes to start. None without hardware.gpu (no
    roofline)."""
    if not dev.gpu:
        return None
    gpu = from_config(dev.gpu)
    steps = probe.warmup_steps + probe.timed_steps
    low = high = 0.0
    started: set[int] = set()
    for j in jobs:
        mem = predict_bytes(est, j["local_batch"])
        least_s = steps * roofline_s(est, j["local_batch"], gpu, dev.precision)
        low += float(cost(least_s, j["workers"], mem, price))
        start_s = 0 if j["workers"] in started else 300
        started.add(j["workers"])
        high += float(cost(probe.timeout_s + start_s, j["workers"], mem, price))
    return {"low": low, "high": high, "currency": price.currency}
