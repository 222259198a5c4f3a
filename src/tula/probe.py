"""Probe: a short DDP run at one (N, B) that measures step time and memory.

``tula probe`` (the parent) launches N workers -- under torchrun on one machine, or as
the N tasks of a SLURM job step -- and always writes ``results/probes/N{n}_B{b}.json``,
also when the workers fail (status ``oom``, ``error`` or ``timeout``), so a failing
point is recorded and the DAG goes on.

What is timed is the production step itself: :meth:`tula.train.Replica.timed_step`, with
the configured method (AGS by default, refreshing when due), precision and input pipeline
(the DataLoader and sampler of training), from fetching the batch to the end of the step.
Timed steps come in pairs. A synced step is that step as training runs it; a compute-only
step is the same call under ``DDP.no_sync()``, so no gradient is communicated.
compute_time = mean compute-only step; step_time = mean synced step (training time is
steps x mean step, Eq. 4a); sync_time = step_time - compute_time: the communication a step
actually pays after DDP overlaps what it can with the backward pass. Each rank times its
own steps and the per-step time is the slowest rank's. Medians are recorded beside them.

The first step of an epoch costs more than the others: a new DataLoader iterator refills
its pipeline, and AGS refreshes its factors there (a forward/backward on the reference
sub-batch and an all-reduce). Training pays that once per epoch; a probe, whenever an epoch
boundary happens to fall among its timed steps. So the means above are over the other
steps; epoch-start steps are timed apart (further epochs are started until there are
EXTRA_STEPS of them) and their extra time is added at training's rate:
step_time = mean plain step + epoch-start extra / steps per epoch (+ mid-epoch refresh
extra / k with ``ags_refresh_every_steps: k``).

The parent (``tula probe``) only launches and collects: it imports no torch.
"""

from __future__ import annotations

import os
import platform
import resource
import shutil
import statistics
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tula import config as config_mod
from tula import dist
from tula.grid import Point
from tula.io import read_json, write_json

SCHEMA = "tula.probe/1"

EXTRA_STEPS = 3  # epoch-start (and mid-epoch AGS refresh) steps timed at least; forced if too few fell there

# Fault injection for tests (off unless set): "N2_B128=oom" makes the last rank of that
# probe raise a real torch.OutOfMemoryError; "=error" raises RuntimeError. Several
# points are separated by commas.
FAULT_ENV = "TULA_INJECT_PROBE_FAULT"


def _inject_fault(point: Point, replica, rank: int, world_size: int) -> None:
    """``oom``: the last rank raises a real OutOfMemoryError inside the model's forward, where
    the step's agreement must catch it on every rank; ``error``: a RuntimeError at once."""
    import torch

    spec = dict(item.split("=", 1) for item in os.environ.get(FAULT_ENV, "").split(",") if "=" in item)
    kind = spec.get(point.name)
    if kind is None or rank != world_size - 1:
        return
    if kind == "oom":
        def hook(module, args):
            raise torch.OutOfMemoryError(f"injected by {FAULT_ENV} at {point.name}")

        replica.ddp.module.register_forward_pre_hook(hook)
        return
    raise RuntimeError(f"injected by {FAULT_ENV} at {point.name}")


def _stats(xs: list[float]) -> dict[str, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    mean = statistics.fmean(xs)
    cv = statistics.pstdev(xs) / mean if mean > 0 else float("nan")
    return {"mean": mean, "median": statistics.median(xs), "iqr": q[2] - q[0], "cv": cv}


def _env_info(device, backend: str, wenv, hosts: list[str], cfg: config_mod.Config) -> dict:
    import torch

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


def run_worker(cfg: config_mod.Config, point: Point, result_dir: Path) -> None:
    """Body of one worker process (rank r of N). Writes result_dir/rank{r}.json."""
    import contextlib

    import torch
    import torch.distributed as torch_dist

    from tula.memory import cpu_step_peak_bytes, measure_step
    from tula.progress import Progress
    from tula.optim import TulaOptimizer
    from tula.train import Replica, StepOOM

    rank = dist.worker_env().rank
    out: dict[str, Any] = {"rank": rank, "status": "ok"}
    try:
        wenv, device, backend = dist.init(cfg.hardware, timeout_s=cfg.probe.timeout_s)
        if wenv.world_size != point.nodes:
            raise RuntimeError(f"launched {wenv.world_size} workers for a probe of N={point.nodes}")
        r = Replica(cfg, device, point.global_batch, rank, wenv.world_size)
        batches = r.epoch_batches()

        def timed(sync: bool) -> tuple[float, str]:
            """(seconds, kind) of one training step; kind: "start" (an epoch's first step),
            "refresh" (a mid-epoch AGS refresh) or "plain"."""
            nonlocal batches
            with contextlib.nullcontext() if sync else r.ddp.no_sync():
                while True:
                    start = r.pos.offset == 0
                    if (got := r.timed_step(batches)) is not None:
                        break
                    r.end_epoch()  # epoch over: close it, untimed, as training does
                    batches = r.epoch_batches()
            return got[0], "start" if start else "refresh" if r.refreshed else "plain"

        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        mem = measure_step(r.ddp, r.opt, r.forward_loss, *r.to_device(*next(batches)))
        batches = r.epoch_batches()  # the memory step took a batch but no position: the epoch starts over
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
            r.end_epoch()
            batches = r.epoch_batches()
            synced.append(timed(sync=True))
        while r.midepoch_refreshes_per_step() > 0 and count("refresh") < EXTRA_STEPS:
            r.force_refresh = True
            synced.append(timed(sync=True))
        if device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(device)
        else:
            peak = cpu_step_peak_bytes(r.ddp, r.opt, lambda: timed(sync=True))
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        gathered: list[Any] = [None] * wenv.world_size
        torch_dist.all_gather_object(gathered, {"host": dist.hostname(), "step": [t for t, _ in synced],
                                                "compute": [t for t, _ in compute], "peak": peak, "rss": rss})  # fmt: skip
        if rank == 0:
            def slowest(key: str) -> list[float]:  # per step, the slowest rank's time
                return [max(g[key][i] for g in gathered) for i in range(len(gathered[0][key]))]

            step_max, comp_max = slowest("step"), slowest("compute")
            kinds = {k: [t for t, (_, kind) in zip(step_max, synced) if kind == k] for k in ("plain", "start", "refresh")}
            plain_comp = [t for t, (_, kind) in zip(comp_max, compute) if kind == "plain"]
            # Extra cost of an epoch's first step and of a mid-epoch refresh, added at training's rate.
            s = _stats(kinds["plain"] or kinds["start"])
            c = _stats(plain_comp or comp_max)
            start_extra = max(statistics.fmean(kinds["start"]) - s["mean"], 0.0) if kinds["plain"] and kinds["start"] else 0.0
            refresh_extra = max(statistics.fmean(kinds["refresh"]) - s["mean"], 0.0) if kinds["refresh"] else 0.0
            extra = start_extra / r.steps_per_epoch + refresh_extra * r.midepoch_refreshes_per_step()
            out.update(
                step_time_s=s["mean"] + extra,
                compute_time_s=c["mean"] + extra,
                sync_time_s=max(s["mean"] - c["mean"], 0.0),
                epoch_start_extra_s=start_extra,
                refresh_extra_s=refresh_extra,
                steps_per_epoch=r.steps_per_epoch,
                epoch_start_step_times_s=kinds["start"],
                refresh_step_times_s=kinds["refresh"],
                step_time_median_s=s["median"],
                compute_time_median_s=c["median"],
                step_time_iqr_s=s["iqr"],
                compute_time_iqr_s=c["iqr"],
                step_time_cv=s["cv"],
                step_times_s=kinds["plain"],
                compute_times_s=plain_comp,
                peak_mem_bytes=int(max(g["peak"] for g in gathered)),
                rss_peak_bytes=int(max(g["rss"] for g in gathered)),
                grad_bytes_per_step=mem.grad_bytes,
                memory=mem.to_dict(),
                train_samples=r.data.train_size,
                steps_run=r.pos.step,
                optimizer_counters=dict(r.opt.counters) if isinstance(r.opt, TulaOptimizer) else None,
                env=_env_info(device, backend, wenv, [g["host"] for g in gathered], cfg),
            )
    except StepOOM as exc:  # every rank agreed in the step (forward-pass OOM on some rank)
        out.update(status="oom", error=f"out of memory on rank(s) {exc.ranks}: {(exc.message or '').splitlines()[0]}")
        write_json(dist.result_path(result_dir, rank), out)
        dist.shutdown(ok=True)
        sys.exit(1)
    except torch.OutOfMemoryError as exc:
        out.update(status="oom", error=f"out of memory on rank {rank}: {str(exc).splitlines()[0]}")
    except Exception as exc:  # recorded, never silently dropped
        out.update(status="error", error=f"rank {rank}: {type(exc).__name__}: {exc}", traceback=traceback.format_exc())
    write_json(dist.result_path(result_dir, rank), out)
    dist.shutdown(ok=out["status"] == "ok")
    if out["status"] != "ok":
        sys.exit(1)


def _combine(point: Point, rank_results: list[dict], launch: dist.LaunchResult | None, cfg: config_mod.Config) -> dict:
    """Merge the per-rank files (and how the launch ended) into one probe record."""
    record: dict[str, Any] = {
        "schema": SCHEMA,
        "nodes": point.nodes,
        "global_batch": point.global_batch,
        "local_batch": point.local_batch,
        "model": cfg.workload.model,
        "dataset": cfg.workload.dataset,
        "warmup_steps": cfg.probe.warmup_steps,
        "timed_steps": cfg.probe.timed_steps,
    }
    failed = [r for r in rank_results if r.get("status") != "ok"]
    rank0 = next((r for r in rank_results if r.get("rank") == 0 and r.get("status") == "ok"), None)
    if launch is not None and launch.timed_out:
        record.update(status="timeout", error=f"probe exceeded probe.timeout_s={cfg.probe.timeout_s:g}s")
    elif failed:
        oom = [r for r in failed if r["status"] == "oom"]
        first = (oom or failed)[0]
        record.update(status=first["status"], error=first.get("error", "unknown error"))
        if "traceback" in first:
            record["traceback"] = first["traceback"]
    elif rank0 is None or "step_time_s" not in rank0:
        code = launch.returncode if launch else "?"
        record.update(status="error", error=f"workers exited (code {code}) before reporting a measurement")
    else:
        record["status"] = "ok"
        record.update({k: v for k, v in rank0.items() if k not in ("rank", "status")})
    if launch is not None:
        record["wall_s"] = launch.wall_s
    return record


def run(cfg_path: str | Path, nodes: int, global_batch: int, out: str | Path) -> dict:
    """Launch the N workers of one probe, then write ``out``; returns the record."""
    cfg = config_mod.load(cfg_path)
    if global_batch % nodes:
        raise config_mod.ConfigError(f"probe: global batch B={global_batch} is not divisible by N={nodes}")
    point = Point(nodes, global_batch)
    out = Path(out)
    work = out.parent / f".{out.stem}.ranks"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    print(f"[probe {point.name}] N={nodes} B={global_batch} (b={point.local_batch} per worker), "
          f"model={cfg.workload.model}, dataset={cfg.workload.dataset}", flush=True)  # fmt: skip
    worker_args = ["tula.probe", "--config", str(cfg_path), "--nodes", str(nodes),
                   "--global-batch", str(global_batch), "--result-dir", str(work)]  # fmt: skip
    launch = dist.launch(
        nodes, worker_args, threads_per_worker=cfg.hardware.threads_per_worker, timeout_s=cfg.probe.timeout_s
    )
    ranks = []
    for r in range(nodes):
        p = dist.result_path(work, r)
        if p.exists():
            try:
                ranks.append(read_json(p))
            except ValueError:
                pass
    record = _combine(point, ranks, launch, cfg)
    record["started_at"] = started
    write_json(out, record)
    shutil.rmtree(work, ignore_errors=True)
    if record["status"] == "ok":
        print(f"[probe {point.name}] ok: step {record['step_time_s'] * 1e3:.2f} ms = compute "
              f"{record['compute_time_s'] * 1e3:.2f} ms + sync {record['sync_time_s'] * 1e3:.2f} ms; "
              f"memory {record['peak_mem_bytes'] / 2**20:.1f} MiB -> {out}", flush=True)  # fmt: skip
    else:
        print(f"[probe {point.name}] {record['status'].upper()}: {record.get('error')} (recorded in {out})", flush=True)
    return record


def _worker_main(argv: list[str] | None = None) -> None:
    a = dist.parse_worker_args("tula.probe", "--result-dir", argv)
    run_worker(config_mod.load(a.config), Point(a.nodes, a.global_batch), Path(a.result_dir))


if __name__ == "__main__":
    _worker_main()
