"""The probe's compute sweep: compute-only steps (the training step under ``DDP.no_sync()``)
at the grid's other local batches, after the probe's own measurement, on every rank: the
compute curve the step-time model is fitted on (:mod:`tula.model.perf`)."""

from __future__ import annotations

import math
import time
from typing import Any, Iterable

import torch.distributed as torch_dist

from tula import config as config_mod
from tula import model_inputs
from tula.model.grid import Point, micro_steps, steps_per_epoch, sweep_local_batches
from tula.runtime.group.agreement import StepOOM, max_over_ranks
from tula.runtime.probe.measure import NoTimeline, step_peak_bytes, timing_stats
from tula.runtime.probe.probe_timing import compute_only, step_timer, synced_lead_in
from tula.runtime.step.replica import Replica
from tula.runtime.timer.precision import Series
from tula.runtime.timer.timing import StepTimer, Target

# a swept batch must fit this many times into an epoch (start, short last batch aside)
SWEEP_MIN_STEPS = 4
ROUND_STEPS = 4  # timed steps at each local batch per round


def run_sweep(
    replica: Replica,
    cfg: config_mod.Config,
    point: Point,
    max_local_batch: int | None,
    start_extra_s: float,
    probed: Iterable[int] = (),
) -> list[dict] | None:
    """The compute sweep on every rank (rank 0's epoch-start extra ``start_extra_s`` given to
    all), its rows gathered: rank 0's record's ``sweep`` (None on the other ranks).
    ``probed``: the local batches the job probes anyway, not swept
    (:func:`tula.model.grid.sweep_local_batches`)."""
    replica.inject("sweep")  # a fault drill's crash after the measurement stood
    start_extra: list[Any] = [start_extra_s]
    torch_dist.broadcast_object_list(start_extra, src=0)
    rows = _sweep(replica, cfg, point, max_local_batch, float(start_extra[0]), probed)
    swept: list[Any] = [None] * replica.world
    torch_dist.all_gather_object(swept, rows)
    if replica.rank != 0:
        return None
    out = _sweep_rows(swept)
    for row in out:  # a fixed train.accumulate splits the sweep's steps too
        k = micro_steps(row["local_batch"], replica.accumulate, replica.max_micro_batch)
        row.update({"accumulate": k} if k > 1 else {})
    return out


def _sweep(
    replica,
    cfg: config_mod.Config,
    point: Point,
    max_local_batch: int | None,
    start_extra_s: float,
    probed: Iterable[int],
) -> list[dict]:
    """Compute-only steps (the training step under ``DDP.no_sync()``) at the other local
    batches that fit, in this process after the probe's own measurement: the compute curve.

    In rounds over the local batches, so that a drift of the machine falls on every batch
    alike: the first round gives each batch one untimed step (the allocator and caches meet
    the shape) and its peak memory (a plain step); every round then times ROUND_STEPS steps
    at each batch not yet done, each step alone on a device without a queue (the probe's
    timer, :mod:`tula.runtime.timer.timing`). A batch is done when its mean is within
    ``probe.precision`` after ``probe.sweep_steps`` steps; the rounds end when every batch is
    done or ``probe.time_budget_s`` is spent. An epoch's first step and its short last batch
    are left out of the mean, and the first step's extra (measured at the probe's own batch) is
    added at that batch's rate, as for the probe's own compute time. Only batches of which an
    epoch holds at least SWEEP_MIN_STEPS are swept. Smallest first; the first OOM (agreed by
    every rank) ends the sweep for it and every larger batch."""
    batches = sweep_local_batches(
        model_inputs.grid_spec(cfg),
        point.workers,
        point.local_batch,
        max_local_batch,
        replica.data.train_size // SWEEP_MIN_STEPS,
        probed,
    )
    own = replica.global_batch
    target = Target(cfg.probe.precision, cfg.probe.sweep_steps, cfg.probe.time_budget_s)
    timer = step_timer(replica, target, cfg.probe.block_steps)
    rows = {lb: {"local_batch": lb} for lb in batches}
    live, warm = _first_round(replica, batches, rows, point.workers)
    batches = [lb for lb in batches if lb in live or "status" in rows[lb]]
    series = _rounds(
        replica, timer, live, point.workers, timer.size_block(min(warm)) if warm else 1
    )
    replica.set_global_batch(own, back=True)
    for lb in live:
        s = series[lb]
        hw = s.half_width()
        rows[lb].update(
            status="ok",
            times=s.times,
            extra=start_extra_s
            / steps_per_epoch(replica.data.train_size, lb * point.workers, point.workers),
            timed_steps=s.n_steps,
            halfwidth=hw if math.isfinite(hw) else None,
            reached=bool(hw <= target.precision),
        )
    return [rows[lb] for lb in batches]


def _first_round(
    replica: Replica, batches: list[int], rows: dict[int, dict], workers: int
) -> tuple[list[int], list[float]]:
    """Each local batch's untimed first step (the allocator and caches meet the shape) and its
    peak memory (a plain step), smallest first; the first OOM ends the sweep there. Returns the
    batches to time and the first steps' seconds."""
    live: list[int] = []
    warm: list[float] = []
    for lb in batches:
        replica.set_global_batch(lb * workers, park=True)
        try:
            with replica.no_sync():
                warm.append(replica.walk.next_timed_step()[0])
                rows[lb]["peak"] = step_peak_bytes(replica, refresh=False)["plain"]
        except NoTimeline:  # every rank: this batch's compute is timed without its peak
            rows[lb]["peak"] = None
        except StepOOM as exc:
            rows[lb].update(status="oom", error=f"out of memory on rank(s) {exc.ranks}")
            break
        live.append(lb)
    return live, warm


def _rounds(
    replica: Replica, timer: StepTimer, batches: list[int], workers: int, block: int
) -> dict[int, Series]:
    """Rounds of ROUND_STEPS compute-only steps at every batch not yet done, each sample the
    slowest rank's (one all-reduce per round): a batch is done within the precision after its
    minimum of steps, or, once the budget is spent, after its minimum of steps of any kind.

    Each timed compute-only block follows untimed synced steps at the same batch
    (:func:`tula.runtime.probe.probe_timing.synced_lead_in`), as in the probe's timer and in
    training, where every step's compute follows a step that synced. Back to back they read
    faster than either pays: on 2 cores, two workers' compute-only steps at 32 samples each
    took 5.3-5.8 ms in a row and 7.1-8.2 ms after a synced step, so a sweep timed in a row read
    N = 2's compute 10-20 % below its probes' and the fit put that in no term."""
    target = timer.target
    assert target is not None
    series = {lb: Series() for lb in batches}

    compute = compute_only(replica)
    lead_in = synced_lead_in(replica.walk, until_plain=3)

    def done(s: Series, spent: bool) -> bool:
        if s.judged_steps() >= target.min_steps and s.half_width() <= target.precision:
            return True
        return spent and s.n_steps + sum(map(len, s.other.values())) >= target.min_steps

    t0, live = time.perf_counter(), list(batches)
    while live:
        pending = []
        for lb in live:
            replica.set_global_batch(lb * workers, park=True)
            for _ in range(ROUND_STEPS):  # queued on a device clock, read once the round ends
                lead_in(block)
                mark = timer.clock.begin()
                n, kind = compute(block)
                pending.append((lb, timer.clock.end(mark), n, kind))
        own = [timer.clock.read(h) / max(n, 1) for _, h, n, _ in pending]
        agreed = max_over_ranks(own + [time.perf_counter() - t0])
        for (lb, _, n, kind), t in zip(pending, agreed):
            series[lb].add(t, n, kind)
        live = [lb for lb in live if not done(series[lb], agreed[-1] >= target.budget_s)]
    return series


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
                compute_timed_steps=first["timed_steps"],
                compute_time_halfwidth_rel=first["halfwidth"],
                precision_reached=first["reached"],
                peak_mem_bytes=int(max(peaks)) if peaks else None,
            )
        else:
            row["error"] = first.get("error")
        rows.append(row)
    return rows
