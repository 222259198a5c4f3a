"""``tula probe``: short DDP runs at (N, B) that measure step time and memory, one job per N.

``tula probe`` (this launcher) starts N workers (:mod:`tula.runtime.probe.probe_worker`) -- under
torchrun on one machine, or as the N tasks of a SLURM job step -- that probe every batch the search
set has at that N in turn, in one process each (start-up, imports and the process group paid once
per job; :mod:`tula.stages.probe.job`), and always writes
``results/partitions/<name>/probes/N{n}/B{b}.json`` for each, also when the workers fail (status
``oom``, ``error`` or ``timeout``), so a failing point is recorded and the DAG goes on; then
``results/partitions/<name>/probes/N{n}/job.json``, the job's list.

What is timed is the production step itself: :meth:`tula.runtime.step.replica.Replica.step`, with
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
from pathlib import Path

from tula import config as config_mod
from tula import model_inputs
from tula.io import read_json, write_json
from tula.model.grid import Point, batch_sizes, batches_at, search_set
from tula.model.measurements import PROBE_JOB_SCHEMA
from tula.model.memory import max_local_batch, smaller_batches
from tula.model.probe_record import SCHEMA, ProbeRecord
from tula.pipeline import stage_settings
from tula.stages.probe import job
from tula.stages.probe.job import combine

__all__ = ["SCHEMA", "combine", "fallback_batches", "run", "run_at", "run_batches"]


def fallback_batches(
    cfg: config_mod.Config, point: Point, memory_probe: str | Path | None
) -> list[int]:
    """Smaller global batches to try, largest first, when a partial search's largest-B corner
    runs out of memory: down to (not including) the smallest B that fits at this N."""
    if cfg.search != "partial":
        return []  # a full search probes every smaller batch anyway
    bmax = max_local_batch(memory_probe) if memory_probe else None
    at_n = sorted(
        p.global_batch
        for p in search_set(model_inputs.grid_spec(cfg), bmax)
        if p.workers == point.workers
    )
    if not at_n or point.global_batch != at_n[-1]:
        return []
    return smaller_batches(
        batch_sizes(model_inputs.grid_spec(cfg)),
        point.global_batch,
        point.workers,
        floor=at_n[0] + 1,
    )


def run(
    cfg_path: str | Path,
    workers: int,
    global_batch: int,
    out: str | Path,
    memory_probe: str | Path | None = None,
) -> dict:
    """One probe at (N, B): launch its N workers, then write ``out``; returns the record
    (:func:`run_batches` with one batch)."""
    return run_batches(cfg_path, workers, [global_batch], {global_batch: out}, memory_probe)[
        global_batch
    ]


def run_at(
    cfg_path: str | Path, workers: int, job_file: str | Path, memory_probe: str | Path | None
) -> dict[int, dict]:
    """The probe job at N = ``workers``: every point the search set probes there, measured in
    turn in one process, each record written beside ``job_file``
    (``results/partitions/<name>/probes/N{n}/B{b}.json``), then ``job_file`` (``job.json``: the
    batches, their records and how each ended, which were probed and which kept). A record
    already there, ok and measured with the same settings (:func:`tula.pipeline.stage_settings`: the
    workload, the step, the probe's own keys), is kept, not bought again: a grid that grows
    probes only its new batches. Returns the records by B."""
    cfg = config_mod.load(cfg_path)
    batches = batches_at(
        model_inputs.grid_spec(cfg),
        workers,
        max_local_batch(memory_probe) if memory_probe else None,
    )
    if not batches:
        raise config_mod.ConfigError(
            f"probe: the search set has no point at N={workers} (grid.workers, grid.batches)"
        )
    job_file = Path(job_file)
    outs = {b: job_file.parent / f"B{b}.json" for b in batches}
    settings = stage_settings(cfg, "probe")
    kept = {b: rec for b in batches if (rec := _bought(outs[b], settings)) is not None}
    for b in kept:
        print(
            f"[probe {Point(workers, b).name}] kept: {outs[b]} was measured with the same "
            "settings (delete it to measure again)",
            flush=True,
        )
    todo = [b for b in batches if b not in kept]
    probed = run_batches(cfg_path, workers, todo, outs, memory_probe, settings) if todo else {}
    records = {**kept, **probed}
    write_json(
        job_file,
        {
            "schema": PROBE_JOB_SCHEMA,
            "workers": workers,
            "batches": batches,
            "records": [outs[b].name for b in batches],
            "status": {str(b): records[b]["status"] for b in batches},
            "probed": todo,
            "kept": sorted(kept),
        },
    )
    return records


def _bought(path: Path, settings: str) -> dict | None:
    """The record at ``path`` where it is ok and was measured with ``settings``, else None
    (also where it is no probe record this Tula reads: it is measured again)."""
    try:
        rec = ProbeRecord.from_json(read_json(path))
    except (OSError, ValueError, TypeError):
        return None
    return rec.to_json() if rec.ok and rec.settings == settings else None


def run_batches(
    cfg_path: str | Path,
    workers: int,
    batches: list[int],
    outs: dict[int, str | Path],
    memory_probe: str | Path | None = None,
    settings: str | None = None,
) -> dict[int, dict]:
    """Probe each of ``batches`` at N = ``workers`` in one process (start-up paid once), then
    write each record to ``outs[B]``; returns the records by B.

    ``memory_probe`` (results/memory_probe.json) bounds the compute sweep at b_max. When a
    partial search's largest-B corner runs out of memory anyway, the next smaller batches are
    probed in the same job until one fits; their records go under ``fallbacks``. ``settings``:
    what the records were measured with, kept in each (:func:`run_at`). The records are
    :class:`tula.model.probe_record.ProbeRecord`; returned as written (their JSON)."""
    cfg = config_mod.load(cfg_path)
    for b in batches:
        if b % workers:
            raise config_mod.ConfigError(
                f"probe: global batch B={b} is not divisible by N={workers}"
            )
    points = [Point(workers, b) for b in sorted(batches)]
    first = Path(outs[points[0].global_batch])
    work = first.parent / f".N{workers}.ranks"
    records = job.probe_points(cfg, cfg_path, points, work, memory_probe)
    # lost in both launches, inside a SLURM job: its node died or its link went (the machine,
    # not the point); the points measured are written, and the job fails so that SLURM's
    # requeue or Snakemake's retries run it again (and keep what was written: run_at)
    lost = [
        p
        for p, r in records.items()
        if job.lost_a_worker(r) and not r.ok and os.environ.get("SLURM_JOB_ID")
    ]
    written = {}
    for point, record in records.items():
        if point in lost:
            continue
        if record.status == "oom":
            record = record.with_fallbacks(_fall_back(cfg, cfg_path, point, work, memory_probe))
        if settings is not None:
            record = record.with_settings(settings)
        out = outs[point.global_batch]
        written[point.global_batch] = record.to_json()
        write_json(out, written[point.global_batch])
        print(f"[probe {point.name}] recorded in {out}", flush=True)
    if lost:
        said = "; ".join(
            f"{p.name}: rank(s) {records[p].lost_ranks or '(a peer vanished)'}" for p in lost
        )
        raise RuntimeError(
            f"probe {said} were lost in both launches ({records[lost[0]].error}); not "
            "recorded: this job fails so that it is run again (the profile's `retries`)"
        )
    return written


def _fall_back(
    cfg: config_mod.Config,
    cfg_path: str | Path,
    point: Point,
    work: Path,
    memory_probe: str | Path | None,
) -> list[ProbeRecord]:
    """The smaller batches probed, in turn, after ``point`` ran out of memory: until one ran
    (:func:`fallback_batches`)."""
    fallbacks: list[ProbeRecord] = []
    for b in fallback_batches(cfg, point, memory_probe):
        print(f"[probe {point.name}] out of memory: falling back to B={b}", flush=True)
        at = Point(point.workers, b)
        fallbacks.append(job.probe_points(cfg, cfg_path, [at], work, memory_probe)[at])
        if fallbacks[-1].status != "oom":
            break
    return fallbacks
