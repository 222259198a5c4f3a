"""The probe's worker (``python -m tula.runtime.probe.probe_worker``, started N times by
``tula probe``): a short DDP run at one (N, B) that times the production step and measures
its memory, then the compute curve at the grid's other local batches and the gradient noise
scale. Each rank writes ``<result-dir>/rank<r>.json``, also when it fails; rank 0's holds
the measurement (:mod:`tula.stages.probe` says what is timed and how).
"""

from __future__ import annotations

import functools
import gc
import resource
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from tula import config as config_mod
from tula import faults as tula_faults
from tula.model.grid import Point, micro_steps
from tula.model.memory import max_local_batch
from tula.model.probe_measured import Overheads
from tula.model.probe_record import AFTER_MEASUREMENT, Failure, RankResult
from tula.runtime.group import dist
from tula.runtime.group.agreement import StepOOM
from tula.runtime.probe import gradnoise, probe_measurement, probe_timing, sweep
from tula.runtime.probe.measure import (
    NoTimeline,
    input_time_s,
    measure_step,
    process_started,
    step_peak_bytes,
)
from tula.runtime.probe.probe_state import JobState, Standing
from tula.runtime.step.replica import Replica
from tula.runtime.step.snapshot import write_checkpoint
from tula.workers.args import parse_worker_args
from tula.workers.phases import mark, point_dir
from tula.workers.processes import result_path
from tula.workers.stacks import dump_stacks_before_deadline


def run_worker(
    cfg: config_mod.Config,
    points: list[Point],
    result_dir: Path,
    max_local_batch: int | None = None,
    attempt: int = 1,
) -> None:
    """Body of one worker process (rank r of N): every point of ``points`` (one N, its
    batches in order) probed in turn in this one process, which starts, imports and joins
    the process group once. Each point gets a fresh replica (the production job's model,
    optimizer and loader at that B), its own measurement and gradient noise, and writes
    ``result_dir/<point>/rank{r}.json``; start-up, evaluation and the checkpoint, which do
    not depend on B, are measured at the first point and given to the others, and so is the
    compute sweep (the grid's other local batches, less those the job probes: the same at
    every B of one N). A
    failure is recorded at its point and ends the process: ``tula probe`` launches the
    points not yet probed again (once the measurement stands, a later failure is only
    noted beside it)."""
    rank = dist.worker_env().rank
    dump_stacks_before_deadline()
    faults = tula_faults.from_env()
    job = JobState([p.local_batch for p in points])
    ended = "ok"
    for i, point in enumerate(points):
        began = None if i == 0 else time.time()
        if began is not None:  # the first point's limit is the launcher's deadline itself
            dump_stacks_before_deadline(left_s=cfg.probe.timeout_s)
        phases = Phases(result_dir, rank, point.name, faults, began)
        if i == 0:
            phases.enter("started")
        ended = _probe_point(cfg, point, result_dir, max_local_batch, attempt, phases, job)
        gc.collect()  # the point's replica (its loader workers, its device memory) goes
        if ended != "ok":
            break
    dist.shutdown(ok=ended != "failed")
    if ended != "ok":
        sys.exit(1)


class Phases:
    """Where this rank is at one point of the job, the one tracker of it: each phase
    (:data:`tula.faults.PROBE_PHASES`) said beside the rank's result as it is entered, for the
    record of a probe stopped by ``probe.timeout_s`` (a ``hang`` fault due there waits), and
    the phase a failure happened in."""

    def __init__(self, result_dir: Path, rank: int, point: str, faults: list, began: float | None):
        self.dir = point_dir(result_dir, point)
        self.rank, self.point, self.faults, self.began = rank, point, faults, began
        self.now = ""

    def enter(self, phase: str) -> None:
        if phase not in tula_faults.PROBE_PHASES:  # the list a hang's ``where`` is checked against
            raise ValueError(f"{phase!r} is not one of tula.faults.PROBE_PHASES")
        self.now = phase
        mark(self.dir, self.rank, phase, self.began)
        tula_faults.hang_if_due(self.faults, self.rank, self.point, phase)

    @property
    def after_measurement(self) -> str:
        """The phase running if it follows the measurement ("" while measuring)."""
        return self.now if self.now in AFTER_MEASUREMENT else ""


def _probe_point(
    cfg: config_mod.Config,
    point: Point,
    result_dir: Path,
    max_local_batch: int | None,
    attempt: int,
    phases: Phases,
    job: JobState,
) -> str:
    """One point on this rank, its result written: "ok"; "stopped" where every rank agreed
    to stop (an out-of-memory step) or what followed the measurement failed; "failed"."""
    rank = dist.worker_env().rank
    t0 = time.perf_counter()
    now = Standing(result_path(phases.dir, rank), RankResult(rank))
    try:
        _probe(cfg, point, result_dir, max_local_batch, attempt, now, phases, job)
    except StepOOM as exc:  # every rank agreed in the step (forward-pass OOM on some rank)
        first = (exc.message or "").splitlines()[0]
        oom = Failure("oom", f"out of memory on rank(s) {exc.ranks}: {first}")
        now.stands(RankResult(rank, failure=oom), every_rank=True)
        return "stopped"
    except Exception as exc:  # noqa: BLE001 - recorded, never silently dropped
        now.stands(_failure(now.result, exc, phases.after_measurement), save=False)
    if not now.result.failed and rank == 0:
        now.stands(now.result.timed(time.perf_counter() - t0), save=False)
    now.stands(now.result, every_rank=True)
    phases.enter("leaving")
    if now.result.failed:
        return "failed"
    return "stopped" if now.result.failed_after_measurement else "ok"


def _start(
    cfg: config_mod.Config,
    point: Point,
    rank: int,
    phases: Phases,
    job: JobState,
    bmax: int | None = None,
) -> tuple[dist.WorkerEnv, torch.device, str, Replica, float]:
    """The process group (joined at the first point), then this point's replica (model,
    optimizer, data; its steps as micro-batches of at most ``bmax`` under train.accumulate);
    with this process's start-up, to the first point's first step, as the production job
    counts it."""
    if job.group is None:
        phases.enter("process group")
        wenv, device, backend = dist.init(
            cfg.hardware, timeout_s=cfg.probe.timeout_s, cluster=cfg.cluster
        )
        if wenv.world_size != point.workers:
            raise RuntimeError(
                f"launched {wenv.world_size} workers for a probe of N={point.workers}"
            )
        job.joined((wenv, device, backend))
    wenv, device, backend = job.group
    phases.enter("model and data")
    # the sets are loaded (and a resident set copied to the device) once for the job's points
    replica = Replica(
        cfg, device, point.global_batch, rank, wenv.world_size, data=job.data, max_micro_batch=bmax
    )
    job.started(replica.data, time.time() - process_started())
    return wenv, device, backend, replica, job.startup_s


def _measure_point(
    cfg: config_mod.Config,
    point: Point,
    attempt: int,
    rank: int,
    phases: Phases,
    job: JobState,
    bmax: int | None = None,
) -> tuple[Replica, float, dict[str, Any] | None]:
    """The probe's own measurement at its (N, B): memory of one step, then the timed steps of
    every rank, combined on rank 0. Returns the replica, this process's start-up (to its first
    step, as the production job counts it) and rank 0's measurement (None on the others)."""
    wenv, device, backend, replica, startup_s = _start(cfg, point, rank, phases, job, bmax)
    phases.enter("first steps")
    # the replica's first training steps, before anything else has run a forward pass on it:
    # what the production job pays at its start and at its first short batch
    first_steps = probe_timing.first_steps(replica)
    if replica.walk.epoch_over():  # the short last batch closed the epoch: the next one starts
        replica.walk.restart_epoch()
    phases.enter("memory step")
    mem = _memory_step(replica)
    injector = tula_faults.Injector(tula_faults.from_env(), rank, point=point.name, attempt=attempt)
    if injector:  # after the memory step: an OOM meets the step's agreement
        replica.inject_faults(injector)
        replica.inject("start")
    phases.enter("timed steps")
    timing, extras = probe_timing.time_steps(replica, cfg, point.name)
    retried: dict[str, int] = {}
    phases.enter("peaks and input")
    mine = _this_rank(replica, cfg, first_steps, retried)
    phases.enter("gathering")
    gathered: list[Any] = [None] * wenv.world_size
    torch_dist.all_gather_object(gathered, mine)
    if rank != 0:
        return replica, startup_s, None
    loader_workers = replica.stream.loader.num_workers
    measured = probe_measurement.measurement(
        probe_measurement.Stepped.of(replica),
        gathered,
        timing,
        extras,
        grad_bytes_per_step=mem.grad_bytes,
        memory=mem.to_dict(),
        profiler_retries=retried,  # extra steps: CPU profiler failures
        env=dist.env_info(
            device, backend, wenv, [g["host"] for g in gathered], cfg, loader_workers
        ),
        # its first steps were the process's (what a production job pays at its start)
        fresh_process=job.is_first(point.name),
    )
    return replica, startup_s, measured


def _memory_step(replica: Replica):
    """One step's memory, counted (Eq. 3's terms), at the step's micro-batch where
    train.accumulate splits it; it took a batch but no position, so the epoch's iterator starts
    over."""
    x, y = next(replica.walk.epoch_batches())
    m = -(-len(y) // micro_steps(len(y), replica.accumulate, replica.max_micro_batch))
    mem = measure_step(
        replica.ddp,
        replica.update.opt,
        functools.partial(replica.forward_loss, eager=True),
        *replica.to_device(x[:m], y[:m]),
    )
    replica.forget_feed()
    return mem


def _probe(
    cfg: config_mod.Config,
    point: Point,
    result_dir: Path,
    max_local_batch: int | None,
    attempt: int,
    now: Standing,
    phases: Phases,
    job: JobState,
) -> None:
    """The probe's phases on this rank, each part of the record the value its function returns,
    saved as soon as it stands (the measurement first: it stands even if what follows fails):
    the measurement, what the job pays besides steps (at the job's first point), the gradient
    noise scale and the compute sweep (at the job's first point too: every point of one N
    sweeps the same local batches, the grid's, less the job's own, so one sweep serves the
    job)."""
    rank = now.result.rank
    replica, startup_s, measured = _measure_point(
        cfg, point, attempt, rank, phases, job, max_local_batch
    )
    now.stands(now.result.measured_as(measured))
    phases.enter("overheads")
    overheads = job.overheads_of(lambda: _overheads(replica, result_dir, startup_s))
    if rank == 0:
        now.stands(now.result.with_overheads(*overheads))
    if cfg.probe.noise_steps > 0:
        phases.enter("noise")
        # before the sweep changes the batch
        noise = gradnoise.measure(replica, cfg.probe.noise_steps)
        now.stands(now.result.with_noise(noise if rank == 0 else None))
    if cfg.probe.sweep_steps > 0:
        rows = None
        if job.swept_at is None:  # once per process: the other local batches are the same
            phases.enter("sweep")
            start_extra = (measured.epoch_start_extra_s if measured else None) or 0.0
            rows = sweep.run_sweep(replica, cfg, point, max_local_batch, start_extra, job.probed)
            job.swept(point.name)
        now.stands(now.result.swept(rows, job.swept_at), save=False)


def _this_rank(
    replica: Replica,
    cfg: config_mod.Config,
    first_steps: tuple[float, float],
    retried: dict[str, int],
) -> dict[str, Any]:
    """What this rank measured, for rank 0 to gather: its first steps, its memory peaks (a
    plain step and an AGS refresh step, each measured alone; none, and why, where torch's
    profiler failed every try: the timing stands without them) and its input pipeline alone."""
    try:
        peaks, peak_error = step_peak_bytes(replica, retries=retried), None
    except NoTimeline as exc:  # every rank, together
        peaks, peak_error = {}, str(exc)
    reads = (
        max(cfg.probe.input_batches, 3 * replica.stream.loader.num_workers)
        if cfg.probe.input_batches
        else 0
    )
    return {
        "host": dist.hostname(),
        "first_steps": sum(first_steps),
        "first_short_step": first_steps[1],
        "peak": max(peaks.values(), default=None),
        "peaks": peaks,
        "peak_error": peak_error,
        "input": input_time_s(replica, reads)
        if reads
        else None,  # all ranks at once: they share the node
        "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def _failure(result: RankResult, exc: Exception, after: str) -> RankResult:
    """A failed worker's result: after the measurement (``after``: the phase, overheads, noise
    or sweep) a note kept beside it; before, the record's status and error."""
    first = (str(exc).splitlines() or [""])[0]
    if after:
        return result.noted(after, f"rank {result.rank}: {type(exc).__name__}: {first}")
    if isinstance(exc, torch.OutOfMemoryError):
        return result.failed_with(Failure("oom", f"out of memory on rank {result.rank}: {first}"))
    return result.failed_with(
        Failure(
            "error",
            f"rank {result.rank}: {type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(),
            failed_at=time.time(),
        )
    )


def _overheads(
    replica: Replica, result_dir: Path, startup_s: float
) -> tuple[Overheads | None, str | None]:
    """What the production job pays besides its steps, measured as it pays it: start-up
    (process start to the first step), two evaluation passes (:meth:`Replica.evaluate`: the
    job's first pass pays what a first pass does -- the test loader, first forwards at the
    evaluation batch -- and its later ones do not: one pass timed alone under-predicted the
    job's evaluation, BENCHMARKS.md "Production confirms the prediction") and one checkpoint write
    (:func:`tula.runtime.step.snapshot.write_checkpoint`, beside the probe's result, then removed);
    each the slowest rank's. An epoch's start is in the step time already
    (``epoch_start_extra_s``). Out of memory here is noted (the second value), not the
    probe's outcome."""
    try:
        t0 = time.perf_counter()
        replica.evaluate()
        t1 = time.perf_counter()
        replica.evaluate()
        t2 = time.perf_counter()
        write_checkpoint(replica, result_dir / "checkpoint", keep=1, extra={"probe": True})
        mine = (startup_s, t1 - t0, t2 - t1, time.perf_counter() - t2)
    except StepOOM as exc:
        return None, f"out of memory {exc.where} on rank(s) {exc.ranks}"
    finally:
        if replica.rank == 0:
            shutil.rmtree(result_dir / "checkpoint", ignore_errors=True)
    gathered: list[Any] = [None] * replica.world
    torch_dist.all_gather_object(gathered, mine)
    startup, first, ev, ck = (max(g[i] for g in gathered) for i in range(4))
    return Overheads(startup, first, ev, ck), None


def _worker_main(argv: list[str] | None = None) -> None:
    a = parse_worker_args("tula.runtime.probe.probe_worker", argv, batch_list=True)
    bmax = max_local_batch(a.memory_probe) if a.memory_probe else None
    run_worker(
        config_mod.load(a.config),
        [Point(a.workers, b) for b in a.global_batch],
        Path(a.result_dir),
        bmax,
        a.attempt,
    )


if __name__ == "__main__":
    _worker_main()
