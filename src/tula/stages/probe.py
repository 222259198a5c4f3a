"""``tula probe``: a short DDP run at one (N, B) that measures step time and memory.

``tula probe`` (this launcher) starts N workers (:mod:`tula.runtime.probe_worker`) -- under torchrun
on one machine, or as the N tasks of a SLURM job step -- and always writes
``results/probes/N{n}_B{b}.json``, also when the workers fail (status ``oom``, ``error`` or
``timeout``), so a failing point is recorded and the DAG goes on.

What is timed is the production step itself: :meth:`tula.runtime.replica.Replica.step`, with
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

The launcher only starts and collects: it imports no torch.
"""

from __future__ import annotations

import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tula import config as config_mod
from tula import slurm, workers
from tula.io import read_json, write_json
from tula.model.grid import Point, batch_sizes, search_set
from tula.model.memory import max_local_batch, smaller_batches

SCHEMA = "tula.probe/1"


def _combine(
    point: Point,
    rank_results: list[dict],
    launch: workers.LaunchResult | None,
    cfg: config_mod.Config,
    reached: list[dict] | None = None,
) -> dict:
    """Merge the per-rank files (and how the launch ended) into one probe record; ``reached``:
    the phase each rank had reached (:func:`tula.workers.phases_reached`), kept for a probe
    that did not end well."""
    record: dict[str, Any] = {
        "schema": SCHEMA,
        "workers": point.workers,
        "nodes": slurm.job_shape(cfg, point.workers).nodes,
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
        record.update(
            status="timeout", error=f"probe exceeded probe.timeout_s={cfg.probe.timeout_s:g}s"
        )
        if reached:  # where each rank was when it was stopped (their stacks are in the log)
            record["error"] += f": {workers.describe_phases(reached)}"
    elif failed:
        oom = [r for r in failed if r["status"] == "oom"]
        # the rank that failed first is the cause; the others lost their peer in a collective
        first = oom[0] if oom else min(failed, key=lambda r: r.get("failed_at", float("inf")))
        record.update(status=first["status"], error=first.get("error", "unknown error"))
        if "traceback" in first:
            record["traceback"] = first["traceback"]
    elif rank0 is None or "step_time_s" not in rank0:
        code = launch.returncode if launch else "?"
        record.update(
            status="error", error=f"workers exited (code {code}) before reporting a measurement"
        )
    else:
        record["status"] = "ok"
        record.update({k: v for k, v in rank0.items() if k not in ("rank", "status")})
    if launch is not None:
        record["wall_s"] = launch.wall_s
    if reached and record["status"] != "ok":
        record["ranks_reached"] = reached
    return record


def _input_note(record: dict) -> str:
    t = record.get("input_time_s")
    if not t:
        return ""
    bound = (
        " — INPUT-BOUND: the input pipeline sets the pace (see the report)"
        if record.get("input_bound")
        else ""
    )
    decoded = (
        f", decoded on the {record['decode'].upper()} (measured {record['decode_faster_by']:.2f}x"
        " faster)"
        if record.get("decode")
        else ""
    )
    return f"; input alone {t * 1e3:.2f} ms per batch{decoded}{bound}"


def _host_note(record: dict) -> str:
    share = record.get("step_host_share")
    if not record.get("host_bound") or share is None:
        return ""
    return (
        f" — HOST-BOUND: queuing a step took {100 * share:.0f} % of its time on the device "
        "(the GPU waits for Python; see the report)"
    )


def _say(point: Point, record: dict) -> None:
    """The probe's outcome, one line for the log."""
    if record["status"] == "ok":
        print(
            f"[probe {point.name}] ok: step {record['step_time_s'] * 1e3:.2f} ms = compute "
            f"{record['compute_time_s'] * 1e3:.2f} ms + sync {record['sync_time_s'] * 1e3:.2f} ms; "
            f"memory {record['peak_mem_bytes'] / 2**20:.1f} MiB; compute swept at "
            f"{len([w for w in record.get('sweep', []) if w['status'] == 'ok'])} other local "
            "batches" + _input_note(record) + _host_note(record),
            flush=True,
        )
        if record.get("after_error"):
            print(f"[probe {point.name}] WARNING: {record['after_error']}", flush=True)
    else:
        print(f"[probe {point.name}] {record['status'].upper()}: {record.get('error')}", flush=True)


def _probe_once(
    cfg: config_mod.Config,
    cfg_path: str | Path,
    point: Point,
    work: Path,
    memory_probe: str | Path | None,
    attempt: int = 1,
) -> dict:
    """Launch the N workers at one point and combine what they wrote into a record."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    print(
        f"[probe {point.name}] N={point.workers} B={point.global_batch} (b={point.local_batch} per "
        f"worker), model={cfg.workload.model}, dataset={cfg.workload.dataset}",
        flush=True,
    )
    worker_args = ["tula.runtime.probe_worker", "--config", str(cfg_path)]
    worker_args += ["--workers", str(point.workers), "--global-batch", str(point.global_batch)]
    worker_args += ["--result-dir", str(work)]
    if memory_probe:
        worker_args += ["--memory-probe", str(memory_probe)]
    if attempt > 1:
        worker_args += ["--attempt", str(attempt)]
    launch = workers.start(
        point.workers,
        worker_args,
        threads_per_worker=cfg.hardware.threads_per_worker,
        timeout_s=cfg.probe.timeout_s,
    )
    ranks = []
    for r in range(point.workers):
        p = workers.result_path(work, r)
        if p.exists():
            try:
                ranks.append(read_json(p))
            except ValueError:
                pass
    reached = workers.phases_reached(work, point.workers)
    shutil.rmtree(work, ignore_errors=True)
    record = _combine(point, ranks, launch, cfg, reached)
    record["started_at"] = started
    lost = sorted(set(range(point.workers)) - {r.get("rank") for r in ranks})
    if lost and not launch.timed_out:
        _note_lost(record, lost)
    _say(point, record)
    return record


def _note_lost(record: dict, lost: list[int]) -> None:
    """Say in the record that ranks ``lost`` died without writing their result."""
    died = (
        f"rank(s) {lost} died without writing a result (killed by a signal: a segfault or the "
        "out-of-memory killer, or stopped by the launcher after a peer died)"
    )
    if record["status"] == "error":
        # a rank that died without a word (a segfault, the out-of-memory killer): its peers only
        # saw the connection drop, so the error they report is not the cause; a peer may also have
        # been stopped by the launcher before it wrote its own (torchrun tears the group down)
        record.update(lost_ranks=lost, error=f"{died}; {record['error']}")
    elif record["status"] == "ok":
        # rank 0 wrote the measurement as soon as it stood; what came after it (the overheads,
        # the gradient noise, the compute sweep) ended with the lost rank: said, never silent
        record.update(
            lost_ranks=lost,
            after_error=f"{died} after the measurement stood: this record holds what rank 0 "
            f"wrote before ({len(record.get('sweep') or [])} sweep rows)",
        )


def _probe_point(
    cfg: config_mod.Config,
    cfg_path: str | Path,
    point: Point,
    work: Path,
    memory_probe: str | Path | None,
) -> dict:
    """One probe, launched once more when a rank died without writing its result: such a
    crash is the machine's (torch's CPU profiler segfaulted once in a CI run), not the
    point's, and one lost launch should not cost the user the point (nor its sweep rows, where
    the rank died after the measurement stood: lost twice so, the measurement is kept and
    ``after_error`` says what is missing). An error the ranks
    reported, an OOM or a timeout is the point's own and recorded as it is. The record keeps
    the first launch's error under ``retried_after``."""
    record = _probe_once(cfg, cfg_path, point, work, memory_probe)
    if not record.get("lost_ranks"):
        return record
    print(f"[probe {point.name}] a worker was lost: launching the probe once more", flush=True)
    again = _probe_once(cfg, cfg_path, point, work, memory_probe, attempt=2)
    why = record.get("error") or record["after_error"]
    again["retried_after"] = {"error": why, "lost_ranks": record["lost_ranks"]}
    return again


def fallback_batches(
    cfg: config_mod.Config, point: Point, memory_probe: str | Path | None
) -> list[int]:
    """Smaller global batches to try, largest first, when a partial search's largest-B corner
    runs out of memory: down to (not including) the smallest B that fits at this N."""
    if cfg.search != "partial":
        return []  # a full search probes every smaller batch anyway
    bmax = max_local_batch(memory_probe) if memory_probe else None
    at_n = sorted(p.global_batch for p in search_set(cfg, bmax) if p.workers == point.workers)
    if not at_n or point.global_batch != at_n[-1]:
        return []
    return smaller_batches(batch_sizes(cfg), point.global_batch, point.workers, floor=at_n[0] + 1)


def run(
    cfg_path: str | Path,
    workers: int,
    global_batch: int,
    out: str | Path,
    memory_probe: str | Path | None = None,
) -> dict:
    """Launch the N workers of one probe, then write ``out``; returns the record.

    ``memory_probe`` (results/memory_probe.json) bounds the compute sweep at b_max. When a
    partial search's largest-B corner runs out of memory anyway, the next smaller batches are
    probed in the same job until one fits; their records go under ``fallbacks``."""
    cfg = config_mod.load(cfg_path)
    if global_batch % workers:
        raise config_mod.ConfigError(
            f"probe: global batch B={global_batch} is not divisible by N={workers}"
        )
    point = Point(workers, global_batch)
    out = Path(out)
    work = out.parent / f".{out.stem}.ranks"
    record = _probe_point(cfg, cfg_path, point, work, memory_probe)
    if record.get("lost_ranks") and record["status"] != "ok" and os.environ.get("SLURM_JOB_ID"):
        # lost in both launches, inside a SLURM job: its node died or its link went (the machine,
        # not the point); failing the job lets SLURM's requeue or Snakemake's retries run it again
        raise RuntimeError(
            f"probe {point.name}: rank(s) {record['lost_ranks']} were lost in both launches "
            f"({record['error']}); nothing recorded: this job fails so that it is run again "
            "(the profile's `retries`)"
        )
    if record["status"] == "oom":
        record["fallbacks"] = []
        for b in fallback_batches(cfg, point, memory_probe):
            print(f"[probe {point.name}] out of memory: falling back to B={b}", flush=True)
            fb = _probe_point(cfg, cfg_path, Point(workers, b), work, memory_probe)
            record["fallbacks"].append(fb)
            if fb["status"] != "oom":
                break
    write_json(out, record)
    print(f"[probe {point.name}] recorded in {out}", flush=True)
    return record
