"""The probe's worker (``python -m tula.runtime.probe_worker``, started N times by
``tula probe``): a short DDP run at one (N, B) that times the production step and measures
its memory, then the compute curve at the grid's other local batches and the gradient noise
scale. Each rank writes ``<result-dir>/rank<r>.json``, also when it fails; rank 0's holds
the measurement (:mod:`tula.stages.probe` says what is timed and how).
"""

from __future__ import annotations

import functools
import resource
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as torch_dist

from tula import config as config_mod
from tula import faults as tula_faults
from tula import workers
from tula.io import write_json
from tula.model.grid import Point
from tula.model.measurements import HOST_BOUND, INPUT_BOUND
from tula.model.memory import max_local_batch
from tula.runtime import dist, gradnoise, probe_timing, sweep
from tula.runtime.agreement import StepOOM
from tula.runtime.measure import (
    input_time_s,
    measure_step,
    process_started,
    step_peak_bytes,
    timing_stats,
)
from tula.runtime.methods import midepoch_refreshes_per_step
from tula.runtime.optim import TulaOptimizer
from tula.runtime.replica import Replica
from tula.runtime.snapshot import write_checkpoint
from tula.runtime.timing import Timing


def run_worker(
    cfg: config_mod.Config,
    point: Point,
    result_dir: Path,
    max_local_batch: int | None = None,
    attempt: int = 1,
) -> None:
    """Body of one worker process (rank r of N): the probe's own measurement, then the
    gradient noise scale and the compute sweep. Writes result_dir/rank{r}.json; a failure
    is recorded there (once the measurement stands, a later failure is only noted beside it)."""
    rank = dist.worker_env().rank
    workers.dump_stacks_before_deadline()
    reach = functools.partial(_reach, result_dir, rank, point.name, tula_faults.from_env())
    reach("started")
    out: dict[str, Any] = {"rank": rank, "status": "ok"}
    result = workers.result_path(result_dir, rank)
    after = [""]  # what runs after the measurement, named if it fails; "" while measuring
    try:
        _probe(cfg, point, result_dir, max_local_batch, attempt, out, after, reach)
    except StepOOM as exc:  # every rank agreed in the step (forward-pass OOM on some rank)
        out = {
            "rank": rank,
            "status": "oom",
            "error": f"out of memory on rank(s) {exc.ranks}: {(exc.message or '').splitlines()[0]}",
        }
        write_json(result, out)
        dist.shutdown(ok=True)
        sys.exit(1)
    except Exception as exc:  # noqa: BLE001 - recorded, never silently dropped
        out = _failure(out, exc, rank, after[0])
    write_json(result, out)
    reach("leaving")
    dist.shutdown(
        ok=out["status"] == "ok"
        and not any(f"{k}_error" in out for k in ("overheads", "noise", "sweep"))
    )
    if out["status"] != "ok":
        sys.exit(1)


def _reach(result_dir: Path, rank: int, point: str, faults: list, phase: str) -> None:
    """This rank has reached ``phase`` (:data:`tula.workers.PROBE_PHASES`): said beside its
    result, for the record of a probe stopped by ``probe.timeout_s``; a ``hang`` fault due
    there waits."""
    workers.mark(result_dir, rank, phase)
    tula_faults.hang_if_due(faults, rank, point, phase)


def _start(
    cfg: config_mod.Config, point: Point, rank: int, reach: Callable[[str], None]
) -> tuple[dist.WorkerEnv, torch.device, str, Replica, float]:
    """The process group, then this rank's replica (model, optimizer, data); with this
    process's start-up, to its first step, as the production job counts it."""
    reach("process group")
    wenv, device, backend = dist.init(
        cfg.hardware, timeout_s=cfg.probe.timeout_s, cluster=cfg.cluster
    )
    if wenv.world_size != point.workers:
        raise RuntimeError(f"launched {wenv.world_size} workers for a probe of N={point.workers}")
    reach("model and data")
    replica = Replica(cfg, device, point.global_batch, rank, wenv.world_size)
    return wenv, device, backend, replica, time.time() - process_started()


def _measure_point(
    cfg: config_mod.Config,
    point: Point,
    attempt: int,
    out: dict[str, Any],
    result: Path,
    reach: Callable[[str], None],
) -> tuple[Replica, float]:
    """The probe's own measurement at its (N, B): memory of one step, then the timed steps of
    every rank, combined on rank 0 and written to ``result`` at once. Returns the replica and
    this process's start-up (to its first step, as the production job counts it)."""
    rank = out["rank"]
    wenv, device, backend, replica, startup_s = _start(cfg, point, rank, reach)
    reach("first steps")
    # the process's first training steps, before anything else has run a forward pass: what the
    # production job pays at its start and at its first short batch
    first_steps = probe_timing.first_steps(replica)
    if replica.epoch_over():  # the short last batch closed the epoch: the next one starts
        replica.restart_epoch()
    reach("memory step")
    mem = measure_step(
        replica.ddp,
        replica.opt,
        functools.partial(replica.forward_loss, eager=True),
        *replica.to_device(*next(replica.epoch_batches())),
    )
    # the memory step took a batch but no position: the epoch's iterator starts over
    replica.stream.forget()
    injector = tula_faults.Injector(tula_faults.from_env(), rank, point=point.name, attempt=attempt)
    if injector:  # after the memory step: an OOM meets the step's agreement
        replica.inject_faults(injector)
        replica.inject("start")
    reach("timed steps")
    timing, extras = probe_timing.time_steps(replica, cfg, point.name)
    retried: dict[str, int] = {}
    reach("peaks and input")
    mine = _this_rank(replica, cfg, first_steps, retried)
    reach("gathering")
    gathered: list[Any] = [None] * wenv.world_size
    torch_dist.all_gather_object(gathered, mine)
    if rank == 0:
        out.update(
            _measurement(replica, gathered, timing, extras),
            grad_bytes_per_step=mem.grad_bytes,
            memory=mem.to_dict(),
            profiler_retries=retried,  # extra steps: CPU profiler failures
            env=dist.env_info(
                device,
                backend,
                wenv,
                [g["host"] for g in gathered],
                cfg,
                replica.stream.loader.num_workers,
            ),
            sweep=[],
        )
        write_json(result, out)  # the probe's own measurement stands even if what follows fails
    return replica, startup_s


def _probe(
    cfg: config_mod.Config,
    point: Point,
    result_dir: Path,
    max_local_batch: int | None,
    attempt: int,
    out: dict[str, Any],
    after: list[str],
    reach: Callable[[str], None],
) -> None:
    """The probe's phases on this rank: its own measurement (written as soon as it stands),
    then what the job pays besides steps, the gradient noise scale and the compute sweep
    (``after[0]`` names the phase running, for the record if it fails)."""
    rank = out["rank"]
    result = workers.result_path(result_dir, rank)
    replica, startup_s = _measure_point(cfg, point, attempt, out, result, reach)
    after[0] = "overheads"
    reach("overheads")
    paid = _overheads(replica, result_dir, startup_s)
    if rank == 0:
        out.update(paid)
        write_json(result, out)
    after[0] = "noise"
    if cfg.probe.noise_steps > 0:
        reach("noise")
        # before the sweep changes the batch
        noise_record = gradnoise.measure(replica, cfg.probe.noise_steps)
        if rank == 0:
            out.update(noise_record)
            write_json(result, out)
    after[0] = "sweep"
    if cfg.probe.sweep_steps > 0:
        reach("sweep")
        sweep.run_sweep(replica, cfg, point, max_local_batch, out, replica.world)


def _this_rank(
    replica: Replica,
    cfg: config_mod.Config,
    first_steps: tuple[float, float],
    retried: dict[str, int],
) -> dict[str, Any]:
    """What this rank measured, for rank 0 to gather: its first steps, its memory peaks (a
    plain step and an AGS refresh step, each measured alone) and its input pipeline alone."""
    peaks = step_peak_bytes(replica, retries=retried)
    reads = (
        max(cfg.probe.input_batches, 3 * replica.stream.loader.num_workers)
        if cfg.probe.input_batches
        else 0
    )
    return {
        "host": dist.hostname(),
        "first_steps": sum(first_steps),
        "first_short_step": first_steps[1],
        "peak": max(peaks.values()),
        "peaks": peaks,
        "input": input_time_s(replica, reads)
        if reads
        else None,  # all ranks at once: they share the node
        "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def _failure(out: dict[str, Any], exc: Exception, rank: int, after: str) -> dict[str, Any]:
    """The record of a failed worker; after the measurement (``after``: noise or sweep) the
    measurement is kept and the failure noted beside it."""
    first = (str(exc).splitlines() or [""])[0]
    if after:
        return {**out, f"{after}_error": f"rank {rank}: {type(exc).__name__}: {first}"}
    if isinstance(exc, torch.OutOfMemoryError):
        return {"rank": rank, "status": "oom", "error": f"out of memory on rank {rank}: {first}"}
    return {
        "rank": rank,
        "status": "error",
        "error": f"rank {rank}: {type(exc).__name__}: {exc}",
        "traceback": traceback.format_exc(),
        "failed_at": time.time(),
    }


def _overheads(replica: Replica, result_dir: Path, startup_s: float) -> dict[str, Any]:
    """What the production job pays besides its steps, measured as it pays it: start-up
    (process start to the first step), two evaluation passes (:meth:`Replica.evaluate`: the
    job's first pass pays what a first pass does -- the test loader, first forwards at the
    evaluation batch -- and its later ones do not; one pass timed alone predicted the job's
    evaluation 0.63-0.85x over 6 runs) and one checkpoint write
    (:func:`tula.runtime.snapshot.write_checkpoint`, beside the probe's result, then removed);
    each the slowest rank's. An epoch's start is in the step time already
    (``epoch_start_extra_s``). Out of memory here is noted, not the probe's outcome."""
    try:
        t0 = time.perf_counter()
        replica.evaluate()
        t1 = time.perf_counter()
        replica.evaluate()
        t2 = time.perf_counter()
        write_checkpoint(replica, result_dir / "checkpoint", keep=1, extra={"probe": True})
        mine = (startup_s, t1 - t0, t2 - t1, time.perf_counter() - t2)
    except StepOOM as exc:
        return {"overheads_error": f"out of memory {exc.where} on rank(s) {exc.ranks}"}
    finally:
        if replica.rank == 0:
            shutil.rmtree(result_dir / "checkpoint", ignore_errors=True)
    gathered: list[Any] = [None] * replica.world
    torch_dist.all_gather_object(gathered, mine)
    startup, first, ev, ck = (max(g[i] for g in gathered) for i in range(4))
    return {
        "startup_time_s": startup,
        "eval_first_time_s": first,
        "eval_time_s": ev,
        "checkpoint_time_s": ck,
    }


def _measurement(
    replica: Replica, gathered: list[dict], timing: Timing, extras: dict[str, list[float]]
) -> dict[str, Any]:
    """Rank 0: the probe's step, compute and sync times (per step, the slowest rank's), with an
    epoch start's and a mid-epoch refresh's extra cost, and the short last batch's saving,
    added at training's rate; the timing's precision; its peak memory, the largest rank's."""
    step, comp = timing.arms["step"], timing.arms["compute"]
    for arm in (step, comp):  # every step an epoch's first (B >= D): those, then
        arm.fall_back_to_starts()
    s, c = timing_stats(step.times), timing_stats(comp.times)
    s["mean"], c["mean"] = step.mean(), comp.mean()
    start_extra = (
        max(statistics.fmean(extras["start"]) - s["mean"], 0.0) if extras["start"] else 0.0
    )
    refresh_extra = (
        max(statistics.fmean(extras["refresh"]) - s["mean"], 0.0) if extras["refresh"] else 0.0
    )
    # the epoch's short last batch, cheaper than a full one (negative), once an epoch
    partial_extra = statistics.fmean(extras["partial"]) - s["mean"] if extras["partial"] else 0.0
    extra = (
        start_extra + partial_extra
    ) / replica.steps_per_epoch + refresh_extra * midepoch_refreshes_per_step(replica.t)
    return {
        "step_time_s": s["mean"] + extra,
        "compute_time_s": c["mean"] + extra,
        "sync_time_s": max(s["mean"] - c["mean"], 0.0),
        "epoch_start_extra_s": start_extra,
        "refresh_extra_s": refresh_extra,
        "partial_extra_s": partial_extra,
        "partial_step_times_s": extras["partial"],
        "steps_per_epoch": replica.steps_per_epoch,
        "epoch_start_step_times_s": extras["start"],
        "refresh_step_times_s": extras["refresh"],
        "lead_in_steps": extras.get("lead_in", {}),  # untimed, by kind (StepTimer.run)
        "step_time_median_s": s["median"],
        "compute_time_median_s": c["median"],
        "step_time_iqr_s": s["iqr"],
        "compute_time_iqr_s": c["iqr"],
        "step_time_cv": s["cv"],
        "compute_time_cv": c["cv"],
        "step_times_s": step.times,
        "compute_times_s": comp.times,
        **timing.record(),
        **_peaks(gathered),
        "train_samples": replica.data.train_size,
        "first_steps_time_s": max(g.get("first_steps", 0.0) for g in gathered),
        "first_short_step_s": max(g.get("first_short_step", 0.0) for g in gathered),
        "compile": replica.t.compile,
        "on_device": replica.stream.feed.resident,
        **_decode(replica.stream.decode),
        **_input(gathered, s["mean"] + extra),
        "host_bound": _host_bound(timing),
        "steps_run": replica.pos.step,
        "optimizer_counters": dict(replica.opt.counters)
        if isinstance(replica.opt, TulaOptimizer)
        else None,
    }


def _decode(choice: dict | None) -> dict[str, Any]:
    """data.decode auto, where it was measured (tula.runtime.decoding): which decoder the probe
    read with, by how much it was faster, and both timings."""
    if choice is None:
        return {"decode": None, "decode_faster_by": None, "decode_choice": None}
    return {
        "decode": choice["chosen"],
        "decode_faster_by": choice["faster_by"],
        "decode_choice": choice,
    }


def _host_bound(timing: Timing) -> bool | None:
    """On a queued device: did the host's time to queue the synced step set its pace (None
    where the clock has no queue to tell it by)."""
    share = timing.arms["step"].host_share()
    return None if share is None else bool(share >= HOST_BOUND)


def _peaks(gathered: list[dict]) -> dict[str, int | None]:
    """The probe's memory peaks, each the largest rank's."""
    refresh = [g["peaks"]["refresh"] for g in gathered if "refresh" in g["peaks"]]
    return {
        "peak_mem_bytes": int(max(g["peak"] for g in gathered)),
        "plain_peak_bytes": int(max(g["peaks"]["plain"] for g in gathered)),
        "refresh_peak_bytes": int(max(refresh)) if refresh else None,
        "rss_peak_bytes": int(max(g["rss"] for g in gathered)),
    }


def _input(gathered: list[dict], step_s: float) -> dict[str, Any]:
    """The input pipeline's time per batch (the slowest rank's) and whether it sets the pace."""
    times = [g["input"] for g in gathered if g.get("input")]
    if not times:
        return {"input_time_s": None, "input_bound": None}
    return {"input_time_s": max(times), "input_bound": bool(max(times) >= INPUT_BOUND * step_s)}


def _worker_main(argv: list[str] | None = None) -> None:
    a = workers.parse_worker_args("tula.runtime.probe_worker", argv)
    bmax = max_local_batch(a.memory_probe) if a.memory_probe else None
    run_worker(
        config_mod.load(a.config),
        Point(a.workers, a.global_batch),
        Path(a.result_dir),
        bmax,
        a.attempt,
    )


if __name__ == "__main__":
    _worker_main()
