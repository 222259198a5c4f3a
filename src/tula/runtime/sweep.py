"""The probe's compute sweep: compute-only steps (the training step under ``DDP.no_sync()``)
at the grid's other local batches, after the probe's own measurement, on every rank: the
compute curve the step-time model is fitted on (:mod:`tula.model.perf`)."""

from __future__ import annotations

from typing import Any

import torch.distributed as torch_dist

from tula import config as config_mod
from tula.model.grid import Point, sweep_local_batches
from tula.runtime.agreement import StepOOM
from tula.runtime.measure import step_peak_bytes, timing_stats
from tula.runtime.replica import Replica

# a swept batch must fit this many times into an epoch (start, short last batch aside)
SWEEP_MIN_STEPS = 4


def run_sweep(
    replica: Replica,
    cfg: config_mod.Config,
    point: Point,
    max_local_batch: int | None,
    out: dict,
    world: int,
) -> None:
    """The compute sweep on every rank (rank 0's epoch-start extra given to all), its rows
    gathered into rank 0's record."""
    start_extra: list[Any] = [out.get("epoch_start_extra_s", 0.0)]
    torch_dist.broadcast_object_list(start_extra, src=0)
    rows = _sweep(replica, cfg, point, max_local_batch, float(start_extra[0]))
    swept: list[Any] = [None] * world
    torch_dist.all_gather_object(swept, rows)
    if replica.rank == 0:
        out["sweep"] = _sweep_rows(swept)


def _sweep(
    replica, cfg: config_mod.Config, point: Point, max_local_batch: int | None, start_extra_s: float
) -> list[dict]:
    """Compute-only steps (the training step under ``DDP.no_sync()``) at the other local
    batches that fit, in this process after the probe's own measurement: the compute curve.

    Each local batch gets one untimed step, then ``probe.sweep_steps`` timed ones; an epoch's
    first step and its short last batch are left out of the mean, and the first step's extra
    (measured at the probe's own batch) is added at that batch's rate, as for the probe's own
    compute time. Only batches of which an epoch holds at least SWEEP_MIN_STEPS are swept.
    Peak memory is measured on a plain step. Smallest first; the first OOM (agreed by every
    rank) ends the sweep."""
    rows: list[dict] = []
    for lb in sweep_local_batches(
        cfg,
        point.workers,
        point.local_batch,
        max_local_batch,
        replica.data.train_size // SWEEP_MIN_STEPS,
    ):
        replica.set_global_batch(lb * point.workers)
        row: dict[str, Any] = {"local_batch": lb}
        try:
            with replica.ddp.no_sync():
                replica.next_timed_step()  # warm-up: the allocator and caches meet the new shape
                times, timed = [], 0
                while timed < cfg.probe.sweep_steps:  # blocks, one synchronisation each
                    t, kind, n = replica.next_timed_block(
                        min(cfg.probe.block_steps, cfg.probe.sweep_steps - timed)
                    )
                    times.append((t, kind))
                    timed += n
                peak = step_peak_bytes(replica, refresh=False)["plain"]
        except StepOOM as exc:
            row.update(status="oom", error=f"out of memory on rank(s) {exc.ranks}")
            rows.append(row)
            break
        plain = [t for t, kind in times if kind == "plain"] or [t for t, _ in times]
        row.update(
            status="ok", times=plain, peak=peak, extra=start_extra_s / replica.steps_per_epoch
        )
        rows.append(row)
    return rows


def _sweep_rows(per_rank: list[list[dict]]) -> list[dict]:
    """One row per swept local batch: the slowest rank per step, mean (+ amortised epoch-start
    extra), median, CV; peak memory the largest of the ranks'."""
    rows = []
    for i, first in enumerate(per_rank[0]):
        row = {"local_batch": first["local_batch"], "status": first["status"]}
        if first["status"] == "ok":
            steps = [max(rk[i]["times"][j] for rk in per_rank) for j in range(len(first["times"]))]
            st = timing_stats(steps)
            peaks = [rk[i]["peak"] for rk in per_rank if rk[i].get("peak") is not None]
            row.update(
                compute_time_s=st["mean"] + first["extra"],
                compute_time_median_s=st["median"],
                compute_time_cv=st["cv"],
                compute_times_s=steps,
                peak_mem_bytes=int(max(peaks)) if peaks else None,
            )
        else:
            row["error"] = first.get("error")
        rows.append(row)
    return rows
