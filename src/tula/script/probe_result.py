"""What a probe of a user's script writes once its steps are measured
(:mod:`tula.script.probe`): rank 0's :class:`tula.model.probe_measured.Measurement`, built by
the same function as Tula's own probe's from every rank's samples, and what the job pays
besides its steps (start-up, the script's time between epochs, one checkpoint write), each the
slowest rank's; every rank's :class:`tula.model.probe_record.RankResult`."""

from __future__ import annotations

import os
import platform
import resource
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from tula.model.grid import steps_per_epoch
from tula.model.probe_measured import Overheads
from tula.model.probe_record import RankResult
from tula.runtime.group import dist
from tula.runtime.group.agreement import max_over_ranks
from tula.runtime.probe.measure import process_started
from tula.runtime.probe.probe_measurement import Stepped, measurement
from tula.script import snapshot
from tula.script.base import Loop, param_bytes
from tula.script.parts import Parts
from tula.script.walk import Walk
from tula.workers.script_run import LAUNCHER


def checkpoint_time(where: Path, parts: Parts, walk: Walk, batches: tuple[int, int]) -> float:
    """Seconds to write one checkpoint of the kept parts as the job writes them
    (:func:`tula.script.snapshot.write`), in ``where``'s ``checkpoint/``, then removed."""
    t0 = time.perf_counter()
    folder = where / "checkpoint"
    try:
        snapshot.write(folder, parts, walk, batches, 1, {"probe": True})
    finally:
        if not torch_dist.is_initialized() or torch_dist.get_rank() == 0:
            shutil.rmtree(folder, ignore_errors=True)
    return time.perf_counter() - t0


def overheads(first_step_at: float, gaps: list[float], checkpoint_s: float) -> Overheads:
    """Start-up (the process's start to its first step), the script's time between epochs
    (its evaluation, its logging: the first such stretch and a later one) and a checkpoint's
    write, each the slowest rank's."""
    gaps = gaps or [0.0]
    own = [
        first_step_at - process_started(),
        gaps[0],
        statistics.fmean(gaps[1:]) if len(gaps) > 1 else gaps[0],
        checkpoint_s,
    ]
    return Overheads(*max_over_ranks(own))


def rank_result(run: Loop, result: dict[str, Any], first_s: float, paid: Overheads) -> RankResult:
    """This rank's result: rank 0's holds the measurement from every rank's samples
    (``result``: the timing, the extras, the peak, the lead-in steps) and ``paid``."""
    mine = {
        "host": dist.hostname(),
        "first_steps": first_s,
        "first_short_step": 0.0,
        "peak": result["peak_bytes"],
        "peaks": {"plain": result["peak_bytes"]},
        "peak_error": result.get("peak_error"),
        "input": None,
        "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    gathered: list[Any] = [None] * run.world
    torch_dist.all_gather_object(gathered, mine)
    if run.rank != 0:
        return RankResult(run.rank)
    terms = param_bytes(run)
    m = measurement(
        stepped(run.walk, run.global_batch, run.world),
        gathered,
        result["timing"],
        {**result["extras"], "lead_in": {"plain": result["lead_in"]}},
        grad_bytes_per_step=terms["grad_bytes"],
        memory={**terms, "act_bytes": None, "batch_bytes": None},
        env=env(run, [g["host"] for g in gathered]),
        fresh_process=True,
    )
    done = RankResult(0).measured_as(m).with_overheads(paid)
    return done.timed(time.time() - process_started())


def stepped(walk: Walk, global_batch: int, world: int) -> Stepped:
    """What the measurement needs of the script's loop: its epoch's steps, the set's size."""
    spe = walk.length or (
        int(steps_per_epoch(walk.train_samples, global_batch, world)) if walk.train_samples else 1
    )
    return Stepped(spe, 0.0, walk.train_samples, walk.steps_done)


def env(run: Loop, hosts: list[str]) -> dict[str, Any]:
    """What the probe's workers ran with, for its record."""
    device = run.parts.device()
    return {
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        "backend": torch_dist.get_backend(),
        "comm_env": dist.comm_env(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "world_size": run.world,
        "launcher": os.environ.get(LAUNCHER) or dist.worker_env().launcher,
        "hostnames": hosts,
        "threads_per_worker": torch.get_num_threads(),
        "workload": "script",
    }
