"""A probe job's workers over its points (:mod:`tula.stages.probe`): one launch for all of
them while they go well, each point with ``probe.timeout_s`` of its own (its limit counted
from when it began), what each rank wrote turned into one record per point, the points a
failure cut off launched again, and a rank lost without a word given one more launch. No
torch: it only starts and collects."""

from __future__ import annotations

import shutil
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tula import config as config_mod
from tula.io import read_json
from tula.model.grid import Point
from tula.slurm import shapes
from tula.workers import phases, processes

SCHEMA = "tula.probe/1"


def combine(
    point: Point,
    rank_results: list[dict],
    launch: processes.LaunchResult | None,
    cfg: config_mod.Config,
    reached: list[dict] | None = None,
    timed_out: bool | None = None,
) -> dict:
    """Merge the per-rank files (and how the launch ended) into one probe record; ``reached``:
    the phase each rank had reached (:func:`tula.workers.phases.phases_reached`), kept for a probe
    that did not end well; ``timed_out``: this point was the one stopped by its limit (the
    launch's own timeout where not given)."""
    if timed_out is None:
        timed_out = launch is not None and launch.timed_out
    record: dict[str, Any] = {
        "schema": SCHEMA,
        "workers": point.workers,
        "nodes": shapes.job_shape(cfg, point.workers).nodes,
        "global_batch": point.global_batch,
        "local_batch": point.local_batch,
        "model": cfg.workload.model,
        "dataset": cfg.workload.dataset,
        "warmup_steps": cfg.probe.warmup_steps,
        "timed_steps": cfg.probe.timed_steps,
    }
    failed = [r for r in rank_results if r.get("status") != "ok"]
    rank0 = next((r for r in rank_results if r.get("rank") == 0 and r.get("status") == "ok"), None)
    if timed_out:
        record.update(
            status="timeout", error=f"probe exceeded probe.timeout_s={cfg.probe.timeout_s:g}s"
        )
        if reached:  # where each rank was when it was stopped (their stacks are in the log)
            record["error"] += f": {phases.describe_phases(reached)}"
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
        record["wall_s"] = record["job_wall_s"] = launch.wall_s
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


def _sweep_note(point: Point, record: dict, launch: dict[str, dict]) -> str:
    """Where the compute curve of the point's job is: its own sweep, or the job's first point's
    (``launch``: this launch's records by point name); none where the job probes every other
    local batch of the grid itself."""
    swept_at = record.get("sweep_in")
    at = record if swept_at == point.name else launch.get(swept_at or "")
    if at is not None and swept_at and not at.get("sweep"):
        return "no compute sweep: the job probes every local batch of the grid it would sweep"
    if swept_at and swept_at != point.name:
        return f"compute curve swept once for the job, at {swept_at}"
    ok = len([w for w in record.get("sweep") or [] if w["status"] == "ok"])
    return f"compute swept at {ok} other local batches"


def _say(point: Point, record: dict, launch: dict[str, dict]) -> None:
    """The probe's outcome, one line for the log (``launch``: this launch's records by name)."""
    if record["status"] == "ok":
        print(
            f"[probe {point.name}] ok: step {record['step_time_s'] * 1e3:.2f} ms = compute "
            f"{record['compute_time_s'] * 1e3:.2f} ms + sync {record['sync_time_s'] * 1e3:.2f} ms; "
            f"memory {record['peak_mem_bytes'] / 2**20:.1f} MiB; "
            f"{_sweep_note(point, record, launch)}" + _input_note(record) + _host_note(record),
            flush=True,
        )
        if record.get("after_error"):
            print(f"[probe {point.name}] WARNING: {record['after_error']}", flush=True)
    else:
        print(f"[probe {point.name}] {record['status'].upper()}: {record.get('error')}", flush=True)


def _launch(
    cfg: config_mod.Config,
    cfg_path: str | Path,
    points: list[Point],
    work: Path,
    memory_probe: str | Path | None,
    attempt: int = 1,
) -> dict[Point, dict]:
    """Launch the N workers over ``points`` (one N, in order) and combine what they wrote
    into a record for each point they reached; a point they never began is left out (to be
    launched again). Each point has ``probe.timeout_s`` to itself, the first one counted
    from the launch (its start-up is the process's)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    n = points[0].workers
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for point in points:
        print(
            f"[probe {point.name}] N={n} B={point.global_batch} (b={point.local_batch} per "
            f"worker), model={cfg.workload.model}, dataset={cfg.workload.dataset}",
            flush=True,
        )
    worker_args = ["tula.runtime.probe_worker", "--config", str(cfg_path), "--workers", str(n)]
    worker_args += ["--global-batch", ",".join(str(p.global_batch) for p in points)]
    worker_args += ["--result-dir", str(work)]
    if memory_probe:
        worker_args += ["--memory-probe", str(memory_probe)]
    if attempt > 1:
        worker_args += ["--attempt", str(attempt)]
    limit = cfg.probe.timeout_s
    launch = processes.start(
        n,
        worker_args,
        threads_per_worker=cfg.hardware.threads_per_worker,
        timeout_s=limit * len(points),
        deadline=_point_deadline(work, points, limit, time.time()),
    )
    dirs = {p: phases.point_dir(work, p.name) for p in points}
    begun = [p for p in points if phases.marked(dirs[p], n)] or points
    ended_badly = launch.timed_out or launch.returncode != 0
    records = {}
    for point in begun:
        ranks = _rank_results(dirs[point], n)
        reached = phases.phases_reached(dirs[point], n)
        last = point is begun[-1] and ended_badly
        record = combine(point, ranks, launch, cfg, reached, timed_out=last and launch.timed_out)
        record["started_at"] = started
        lost = sorted(set(range(n)) - {r.get("rank") for r in ranks})
        if lost and not (last and launch.timed_out):
            _note_lost(record, lost)
        records[point] = record
    _share_wall(records, launch.wall_s)
    shutil.rmtree(work, ignore_errors=True)
    by_name = {p.name: r for p, r in records.items()}
    for point, record in records.items():
        _say(point, record, by_name)
    return records


def _rank_results(directory: Path, n: int) -> list[dict]:
    """What each of the ``n`` ranks wrote of one point (a rank that wrote nothing left out)."""
    ranks = []
    for r in range(n):
        p = processes.result_path(directory, r)
        if p.exists():
            try:
                ranks.append(read_json(p))
            except ValueError:
                pass
    return ranks


def _point_deadline(work: Path, points: list[Point], limit_s: float, launched: float):
    """When the launch must end: ``limit_s`` after the point the workers are at began (the
    first from the launch itself)."""
    n = points[0].workers

    def deadline() -> float:
        at = None
        for p in points:
            if phases.marked(phases.point_dir(work, p.name), p.workers):
                at = p
        began = phases.began(phases.point_dir(work, at.name), n) if at is not None else None
        return (began or launched) + limit_s

    return deadline


def _share_wall(records: dict[Point, dict], job_wall_s: float) -> None:
    """Each point's wall: its own time in the launch (none for a point that failed) plus an
    equal share of what the launch paid once (start-up, the process group, the teardown), so
    a launch's points sum to its wall (``job_wall_s``, kept beside)."""
    own = {p: r.get("point_wall_s") or 0.0 for p, r in records.items()}
    share = max(job_wall_s - sum(own.values()), 0.0) / max(len(records), 1)
    for p, record in records.items():
        record["wall_s"] = own[p] + share


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


def lost_a_worker(record: dict) -> bool:
    """A rank died without writing its result, or the error the ranks reported is a peer
    that vanished (processes.LOST_PEER: every rank that wrote one lost its peer, a node died
    under the job): the machine's failure, not the point's."""
    return bool(record.get("lost_ranks")) or (
        record.get("status") == "error"
        and bool(processes.LOST_PEER.search(record.get("error", "")))
    )


def probe_points(
    cfg: config_mod.Config,
    cfg_path: str | Path,
    points: list[Point],
    work: Path,
    memory_probe: str | Path | None,
) -> dict[Point, dict]:
    """Every point of ``points`` (one N) probed, one launch for all while they go well: a
    point that fails ends its launch, and the points after it are launched again. A point
    whose rank died without writing its result is launched once more: such a crash is the
    machine's (torch's CPU profiler segfaulted once in a CI run), not the point's, and one lost
    launch should not cost the user the point (nor its sweep rows, where the rank died after
    the measurement stood: lost twice so, the measurement is kept and ``after_error`` says
    what is missing). So is a point whose ranks reported a vanished peer (a node died under the
    job: the lab's drill saw the ranks left write "Connection reset by peer" before the dead
    node's were counted lost). Any other error the ranks reported, an OOM or a timeout is the
    point's own and recorded as it is. The record keeps the first launch's error under
    ``retried_after``."""
    records: dict[Point, dict] = {}
    attempt = dict.fromkeys(points, 1)
    retried: dict[Point, dict] = {}
    todo = list(points)
    while todo:
        for point, record in _launch(
            cfg, cfg_path, todo, work, memory_probe, attempt[todo[0]]
        ).items():
            if lost_a_worker(record) and attempt[point] == 1:
                print(f"[probe {point.name}] a worker was lost: launching it once more", flush=True)
                why = record.get("error") or record["after_error"]
                retried[point] = {"error": why, "lost_ranks": record.get("lost_ranks", [])}
                attempt[point] = 2
                continue
            if point in retried:
                record["retried_after"] = retried[point]
            records[point] = record
        todo = [p for p in todo if p not in records]
    return records
