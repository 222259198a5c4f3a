"""The probe's worker (``python -m tula.runtime.probe_worker``, started N times by
``tula probe``): a short DDP run at one (N, B) that times the production step and measures
its memory, then the compute curve at the grid's other local batches and the gradient noise
scale. Each rank writes ``<result-dir>/rank<r>.json``, also when it fails; rank 0's holds
the measurement (:mod:`tula.stages.probe` says what is timed and how).
"""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from tula import config as config_mod
from tula import workers
from tula.io import write_json
from tula.model import noise
from tula.model.grid import Point, sweep_local_batches
from tula.model.memory import max_local_batch
from tula.progress import Progress
from tula.runtime import dist, measure
from tula.runtime.agreement import StepOOM
from tula.runtime.measure import measure_step, step_peak_bytes, timing_stats
from tula.runtime.optim import TulaOptimizer
from tula.runtime.replica import Replica

SWEEP_MIN_STEPS = 4  # a swept batch must fit this many times into an epoch (start, short last batch aside)
EXTRA_STEPS = 3  # epoch-start (and mid-epoch AGS refresh) steps timed at least; forced if too few fell there


# Fault injection for tests (off unless set): "N2_B128=oom" makes the last rank of that
# probe raise a real torch.OutOfMemoryError; "=error" raises RuntimeError. Several
# points are separated by commas.
FAULT_ENV = "TULA_INJECT_PROBE_FAULT"


def _inject_fault(point: Point, replica, rank: int, world_size: int) -> None:
    """``oom``: the last rank raises a real OutOfMemoryError inside the model's forward, where
    the step's agreement must catch it on every rank; ``profiler``: the last rank's first CPU
    memory timeline fails after its step; ``error``: a RuntimeError at once."""
    spec = dict(item.split("=", 1) for item in os.environ.get(FAULT_ENV, "").split(",") if "=" in item)
    kind = spec.get(point.name)
    if kind is None or rank != world_size - 1:
        return
    if kind == "oom":
        def hook(module, args):
            raise torch.OutOfMemoryError(f"injected by {FAULT_ENV} at {point.name}")

        replica.ddp.module.register_forward_pre_hook(hook)
        return
    if kind == "profiler":  # the profiler's memory timeline fails once on this rank (a torch bug seen here)
        real, calls = measure.cpu_step_peak_bytes, []

        def flaky(*args, **kwargs):
            calls.append(1)
            if len(calls) == 1:
                real(*args, **kwargs)  # the step runs, as in the real failure
                raise AssertionError(f"version mismatch (injected by {FAULT_ENV} at {point.name})")
            return real(*args, **kwargs)

        measure.cpu_step_peak_bytes = flaky
        return
    raise RuntimeError(f"injected by {FAULT_ENV} at {point.name}")


def _env_info(device, backend: str, wenv, hosts: list[str], cfg: config_mod.Config) -> dict:
    return {
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine(),
        "backend": backend,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "world_size": wenv.world_size,
        "launcher": wenv.launcher,
        "hostnames": hosts,
        "threads_per_worker": cfg.hardware.threads_per_worker,
        "precision": cfg.train.precision,
        "method": cfg.train.method,
        "data_workers": cfg.data.num_workers,
    }


def _sweep(r, cfg: config_mod.Config, point: Point, max_local_batch: int | None, start_extra_s: float) -> list[dict]:
    """Compute-only steps (the training step under ``DDP.no_sync()``) at the other local
    batches that fit, in this process after the probe's own measurement: the compute curve.

    Each local batch gets one untimed step, then ``probe.sweep_steps`` timed ones; an epoch's
    first step and its short last batch are left out of the mean, and the first step's extra
    (measured at the probe's own batch) is added at that batch's rate, as for the probe's own
    compute time. Only batches of which an epoch holds at least SWEEP_MIN_STEPS are swept.
    Peak memory is measured on a plain step. Smallest first; the first OOM (agreed by every
    rank) ends the sweep."""
    rows: list[dict] = []
    for lb in sweep_local_batches(cfg, point.nodes, point.local_batch, max_local_batch,
                                  r.data.train_size // SWEEP_MIN_STEPS):  # fmt: skip
        r.set_global_batch(lb * point.nodes)
        row: dict[str, Any] = {"local_batch": lb}
        try:
            with r.ddp.no_sync():
                r.next_timed_step()  # warm-up: the allocator and caches meet the new shape
                times = [r.next_timed_step() for _ in range(cfg.probe.sweep_steps)]
                peak = step_peak_bytes(r, refresh=False)["plain"]
        except StepOOM as exc:
            row.update(status="oom", error=f"out of memory on rank(s) {exc.ranks}")
            rows.append(row)
            break
        plain = [t for t, kind in times if kind == "plain"] or [t for t, _ in times]
        row.update(status="ok", times=plain, peak=peak, extra=start_extra_s / r.steps_per_epoch)
        rows.append(row)
    return rows


def run_worker(cfg: config_mod.Config, point: Point, result_dir: Path, max_local_batch: int | None = None) -> None:
    """Body of one worker process (rank r of N). Writes result_dir/rank{r}.json."""
    rank = dist.worker_env().rank
    out: dict[str, Any] = {"rank": rank, "status": "ok"}
    result = workers.result_path(result_dir, rank)
    measured = False
    try:
        wenv, device, backend = dist.init(cfg.hardware, timeout_s=cfg.probe.timeout_s)
        if wenv.world_size != point.nodes:
            raise RuntimeError(f"launched {wenv.world_size} workers for a probe of N={point.nodes}")
        r = Replica(cfg, device, point.global_batch, rank, wenv.world_size)

        def timed(sync: bool) -> tuple[float, str]:
            """(seconds, kind) of one training step, synced or compute-only (no_sync)."""
            with contextlib.nullcontext() if sync else r.ddp.no_sync():
                t, kind = r.next_timed_step()
            return t, "plain" if kind == "partial" else kind  # training pays its short batches as they come

        mem = measure_step(r.ddp, r.opt, r.forward_loss, *r.to_device(*next(r.epoch_batches())))
        # the memory step took a batch but no position: the epoch's iterator starts over
        _inject_fault(point, r, rank, wenv.world_size)  # after the memory step: an OOM meets the step's agreement
        total = 2 * (cfg.probe.warmup_steps + cfg.probe.timed_steps)
        progress = Progress(f"probe {point.name}", total, enabled=rank == 0)
        done = 0
        for _ in range(cfg.probe.warmup_steps):  # warm both kinds of step
            timed(sync=True)
            timed(sync=False)
            done += 2
            progress.update(done, "warm-up ")
        synced, compute = [], []
        for _ in range(cfg.probe.timed_steps):
            synced.append(timed(sync=True))
            compute.append(timed(sync=False))
            done += 2
            progress.update(done, "timed ")

        def count(kind: str) -> int:
            return sum(k == kind for _, k in synced)

        while count("start") < EXTRA_STEPS and r.steps_per_epoch > 1:  # start further epochs to time their first step
            r.restart_epoch()
            synced.append(timed(sync=True))
        while r.midepoch_refreshes_per_step() > 0 and count("refresh") < EXTRA_STEPS:
            r.force_refresh = True
            synced.append(timed(sync=True))
        retried: dict[str, int] = {}
        peaks = step_peak_bytes(r, retries=retried)  # a plain step and an AGS refresh step, each measured alone
        peak = max(peaks.values())
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        gathered: list[Any] = [None] * wenv.world_size
        torch_dist.all_gather_object(gathered, {"host": dist.hostname(), "step": [t for t, _ in synced],
                                                "compute": [t for t, _ in compute], "peak": peak, "peaks": peaks,
                                                "rss": rss})  # fmt: skip
        steps_per_epoch = r.steps_per_epoch
        measured = True  # from here on, a failure belongs to the sweep and the probe's own result stands
        if rank == 0:
            def slowest(key: str) -> list[float]:  # per step, the slowest rank's time
                return [max(g[key][i] for g in gathered) for i in range(len(gathered[0][key]))]

            step_max, comp_max = slowest("step"), slowest("compute")
            kinds = {k: [t for t, (_, kind) in zip(step_max, synced) if kind == k] for k in ("plain", "start", "refresh")}
            plain_comp = [t for t, (_, kind) in zip(comp_max, compute) if kind == "plain"]
            # Extra cost of an epoch's first step and of a mid-epoch refresh, added at training's rate.
            s = timing_stats(kinds["plain"] or kinds["start"])
            c = timing_stats(plain_comp or comp_max)
            start_extra = max(statistics.fmean(kinds["start"]) - s["mean"], 0.0) if kinds["plain"] and kinds["start"] else 0.0
            refresh_extra = max(statistics.fmean(kinds["refresh"]) - s["mean"], 0.0) if kinds["refresh"] else 0.0
            extra = start_extra / steps_per_epoch + refresh_extra * r.midepoch_refreshes_per_step()
            out.update(
                step_time_s=s["mean"] + extra,
                compute_time_s=c["mean"] + extra,
                sync_time_s=max(s["mean"] - c["mean"], 0.0),
                epoch_start_extra_s=start_extra,
                refresh_extra_s=refresh_extra,
                steps_per_epoch=steps_per_epoch,
                epoch_start_step_times_s=kinds["start"],
                refresh_step_times_s=kinds["refresh"],
                step_time_median_s=s["median"],
                compute_time_median_s=c["median"],
                step_time_iqr_s=s["iqr"],
                compute_time_iqr_s=c["iqr"],
                step_time_cv=s["cv"],
                compute_time_cv=c["cv"],
                step_times_s=kinds["plain"],
                compute_times_s=plain_comp,
                peak_mem_bytes=int(max(g["peak"] for g in gathered)),
                plain_peak_bytes=int(max(g["peaks"]["plain"] for g in gathered)),  # each the largest rank's
                refresh_peak_bytes=int(max(g["peaks"]["refresh"] for g in gathered)) if "refresh" in peaks else None,
                rss_peak_bytes=int(max(g["rss"] for g in gathered)),
                grad_bytes_per_step=mem.grad_bytes,
                memory=mem.to_dict(),
                train_samples=r.data.train_size,
                steps_run=r.pos.step,
                profiler_retries=retried,  # extra steps the memory measurement took (CPU profiler failures)
                optimizer_counters=dict(r.opt.counters) if isinstance(r.opt, TulaOptimizer) else None,
                env=_env_info(device, backend, wenv, [g["host"] for g in gathered], cfg),
                sweep=[],
            )
            write_json(result, out)  # the probe's own measurement stands even if the sweep fails
        after = "noise"  # what runs after the measurement, named if it fails
        if cfg.probe.noise_steps > 0:
            noise = _gradient_noise(r, cfg.probe.noise_steps)  # before the sweep changes the batch
            if rank == 0:
                out.update(noise)
                write_json(result, out)
        after = "sweep"
        if cfg.probe.sweep_steps > 0:
            start_extra_all: list[Any] = [out.get("epoch_start_extra_s", 0.0)]
            torch_dist.broadcast_object_list(start_extra_all, src=0)
            rows = _sweep(r, cfg, point, max_local_batch, float(start_extra_all[0]))
            swept: list[Any] = [None] * wenv.world_size
            torch_dist.all_gather_object(swept, rows)
            if rank == 0:
                out["sweep"] = _sweep_rows(swept)
    except StepOOM as exc:  # every rank agreed in the step (forward-pass OOM on some rank)
        out = {"rank": rank, "status": "oom",
               "error": f"out of memory on rank(s) {exc.ranks}: {(exc.message or '').splitlines()[0]}"}  # fmt: skip
        write_json(result, out)
        dist.shutdown(ok=True)
        sys.exit(1)
    except Exception as exc:  # recorded, never silently dropped
        first = (str(exc).splitlines() or [""])[0]
        if measured:  # the noise steps or the sweep failed after the probe's own measurement: keep it, say so
            out[f"{after}_error"] = f"rank {rank}: {type(exc).__name__}: {first}"
        elif isinstance(exc, torch.OutOfMemoryError):
            out = {"rank": rank, "status": "oom", "error": f"out of memory on rank {rank}: {first}"}
        else:
            out = {"rank": rank, "status": "error", "error": f"rank {rank}: {type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc(), "failed_at": time.time()}  # fmt: skip
    write_json(result, out)
    clean = out["status"] == "ok" and "sweep_error" not in out and "noise_error" not in out
    dist.shutdown(ok=clean)
    if out["status"] != "ok":
        sys.exit(1)


def _gradient_noise(r, steps: int) -> dict[str, Any]:
    """The gradient noise scale at the probe's (N, B) and the weights its timed steps reached
    (rank 0's, given to every rank first): ``steps`` untimed steps of
    :meth:`Replica.gradient_norms` over full batches, none twice (every rank takes part),
    estimated by tula.model.noise. One worker has no second batch size."""
    if r.world == 1:
        return {"gradient_noise": {"b_noise": None, "why": "one worker: no second batch size to compare with"}}
    full = r.data.train_size // r.global_batch  # batches of the full size in an epoch
    if full == 0:
        return {"gradient_noise": {"b_noise": None, "why": "the training set is smaller than one global batch"}}
    t0 = time.perf_counter()
    # The compute-only (no_sync) steps timed before stepped each replica on its own gradient, so
    # the replicas differ; the workers' gradients must be taken at one point: rank 0's weights.
    with torch.no_grad():
        for t in r.ddp.module.state_dict().values():
            torch_dist.broadcast(t, src=0)
    small, big = [], []
    batches = None
    for i in range(steps):
        if i % full == 0:  # an epoch's full batches, then those of the next epoch's new order: no batch twice
            r.sampler.set_position(r.pos.epoch + i // full, 0)
            batches = iter(r.loader)
        s, g = r.gradient_norms(*next(batches))
        small.append(s)
        big.append(g)
    seconds = time.perf_counter() - t0
    est = noise.estimate(small, big, r.global_batch // r.world, r.global_batch, population=r.data.train_size)
    return {"grad_noise_scale": est.b_noise, "grad_sq": est.grad_sq, "grad_trace": est.trace,
            "grad_sq_se": est.grad_sq_se, "grad_trace_se": est.trace_se,
            "gradient_noise": {**est.to_dict(), "time_s": seconds, "time_per_step_s": seconds / steps}}  # fmt: skip


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
            row.update(compute_time_s=st["mean"] + first["extra"], compute_time_median_s=st["median"],
                       compute_time_cv=st["cv"], compute_times_s=steps,
                       peak_mem_bytes=int(max(peaks)) if peaks else None)  # fmt: skip
        else:
            row["error"] = first.get("error")
        rows.append(row)
    return rows


def _worker_main(argv: list[str] | None = None) -> None:
    a = workers.parse_worker_args("tula.runtime.probe_worker", argv)
    bmax = max_local_batch(a.memory_probe) if a.memory_probe else None
    run_worker(config_mod.load(a.config), Point(a.nodes, a.global_batch), Path(a.result_dir), bmax)


if __name__ == "__main__":
    _worker_main()
