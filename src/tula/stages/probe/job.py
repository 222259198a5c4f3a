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

from tula import config as config_mod
from tula import model_inputs
from tula.io import read_json
from tula.model.grid import Point, micro_steps
from tula.model.memory import max_local_batch
from tula.model.probe_measured import Measurement
from tula.model.probe_record import Failure, Probed, ProbeRecord, RankResult
from tula.slurm import shapes
from tula.workers import phases, processes, script_launch
from tula.workers.script_run import ProbeAsk, ScriptRun


def combine(
    point: Point,
    rank_results: list[dict],
    launch: processes.LaunchResult | None,
    cfg: config_mod.Config,
    reached: list[dict] | None = None,
    timed_out: bool | None = None,
    accumulate: int = 1,
) -> ProbeRecord:
    """Merge the per-rank files (and how the launch ended) into one probe record; ``reached``:
    the phase each rank had reached (:func:`tula.workers.phases.phases_reached`), kept for a probe
    that did not end well; ``timed_out``: this point was the one stopped by its limit (the
    launch's own timeout where not given); ``accumulate``: the micro-batches a step ran as."""
    if timed_out is None:
        timed_out = launch is not None and launch.timed_out
    ranks = [RankResult.from_json(r) for r in rank_results]
    failure = _ended_by(ranks, launch, cfg, reached, timed_out)
    rank0 = next((r for r in ranks if r.rank == 0 and not r.failed), None)
    probed = Probed(
        workers=point.workers,
        global_batch=point.global_batch,
        local_batch=point.local_batch,
        nodes=shapes.job_shape(cfg, point.workers).nodes,
        # a user's script brings its own model and data
        model=cfg.workload.script or cfg.workload.model,
        dataset="(the script's own)" if cfg.workload.script else cfg.workload.dataset,
        warmup_steps=cfg.probe.warmup_steps,
        timed_steps=cfg.probe.timed_steps,
        accumulate=accumulate if accumulate > 1 else None,
    )
    wall = launch.wall_s if launch is not None else None
    return ProbeRecord(
        probed,
        status=failure.status if failure else "ok",
        error=failure.error if failure else None,
        traceback=failure.traceback if failure else None,
        result=None if failure else rank0,
        wall_s=wall,
        job_wall_s=wall,
        ranks_reached=reached if reached and failure else None,
    )


def _ended_by(
    ranks: list[RankResult],
    launch: processes.LaunchResult | None,
    cfg: config_mod.Config,
    reached: list[dict] | None,
    timed_out: bool,
) -> Failure | None:
    """What ended the point, None where it measured: its limit, the rank that failed first
    (the others lost their peer in a collective), or workers that exited without a word."""
    failed = [r.failure for r in ranks if r.failure is not None]
    rank0 = next((r for r in ranks if r.rank == 0 and not r.failed), None)
    if timed_out:
        error = f"probe exceeded probe.timeout_s={cfg.probe.timeout_s:g}s"
        if reached:  # where each rank was when it was stopped (their stacks are in the log)
            error += f": {phases.describe_phases(reached)}"
        return Failure("timeout", error)
    if failed:
        oom = [f for f in failed if f.status == "oom"]
        first = oom[0] if oom else min(failed, key=lambda f: f.failed_at or float("inf"))
        return Failure(first.status, first.error or "unknown error", first.traceback)
    if rank0 is None or rank0.measured is None or rank0.measured.step_time_s is None:
        code = launch.returncode if launch else "?"
        return Failure("error", f"workers exited (code {code}) before reporting a measurement")
    return None


def _input_note(m: Measurement) -> str:
    if not m.input_time_s:
        return ""
    bound = (
        " — INPUT-BOUND: the input pipeline sets the pace (see the report)" if m.input_bound else ""
    )
    decoded = (
        f", decoded on the {m.decode.upper()} (measured {m.decode_faster_by:.2f}x faster)"
        if m.decode
        else ""
    )
    return f"; input alone {m.input_time_s * 1e3:.2f} ms per batch{decoded}{bound}"


def _host_note(m: Measurement) -> str:
    share = m.timing.step.host_share if m.timing else None
    if not m.host_bound or share is None:
        return ""
    return (
        f" — HOST-BOUND: queuing a step took {100 * share:.0f} % of its time on the device "
        "(the GPU waits for Python; see the report)"
    )


def _sweep_note(point: Point, record: ProbeRecord, launch: dict[str, ProbeRecord]) -> str:
    """Where the compute curve of the point's job is: its own sweep, or the job's first point's
    (``launch``: this launch's records by point name); none where the job probes every other
    local batch of the grid itself."""
    swept_at = record.sweep_in
    if swept_at is None and not record.sweep:
        return "no compute sweep (the compute at other local batches: their own probes)"
    at = record if swept_at == point.name else launch.get(swept_at or "")
    if at is not None and swept_at and not at.sweep:
        return "no compute sweep: the job probes every local batch of the grid it would sweep"
    if swept_at and swept_at != point.name:
        return f"compute curve swept once for the job, at {swept_at}"
    ok = len([w for w in record.sweep if w["status"] == "ok"])
    return f"compute swept at {ok} other local batches"


def _say(point: Point, record: ProbeRecord, launch: dict[str, ProbeRecord]) -> None:
    """The probe's outcome, one line for the log (``launch``: this launch's records by name)."""
    if record.ok:
        m = record.measured
        print(
            f"[probe {point.name}] ok: step {m.step_time_s * 1e3:.2f} ms = compute "
            f"{m.compute_time_s * 1e3:.2f} ms + sync {m.sync_time_s * 1e3:.2f} ms; "
            f"memory {m.peak_mem_bytes / 2**20:.1f} MiB; "
            f"{_sweep_note(point, record, launch)}" + _input_note(m) + _host_note(m),
            flush=True,
        )
        if record.after_error:
            print(f"[probe {point.name}] WARNING: {record.after_error}", flush=True)
    else:
        print(f"[probe {point.name}] {record.status.upper()}: {record.error}", flush=True)


def _launch(
    cfg: config_mod.Config,
    cfg_path: str | Path,
    points: list[Point],
    work: Path,
    memory_probe: str | Path | None,
    attempt: int = 1,
) -> dict[Point, ProbeRecord]:
    """Launch the N workers over ``points`` (one N, in order) and combine what they wrote
    into a record for each point they reached; a point they never began is left out (to be
    launched again). Each point has ``probe.timeout_s`` to itself, the first one counted
    from the launch (its start-up is the process's)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    n = points[0].workers
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    # train.accumulate at the memory probe's b_max: each point's micro-batches, as its workers
    # (tula.runtime.probe.probe_worker) split its steps
    bmax = max_local_batch(memory_probe) if memory_probe else None
    acc = model_inputs.grid_spec(cfg).accumulate
    k = {p: micro_steps(p.local_batch, acc, bmax) for p in points}
    for point in points:
        print(
            f"[probe {point.name}] N={n} B={point.global_batch} (b={point.local_batch} per "
            f"worker{f', {k[point]} micro-batches' if k[point] > 1 else ''}), "
            + (
                f"script {cfg.workload.script}"
                if cfg.workload.script
                else f"model={cfg.workload.model}, dataset={cfg.workload.dataset}"
            ),
            flush=True,
        )
    launch = _start(cfg, cfg_path, points, work, memory_probe, attempt)
    dirs = {p: phases.point_dir(work, p.name) for p in points}
    begun = [p for p in points if phases.marked(dirs[p], n)] or points
    ended_badly = launch.timed_out or launch.returncode != 0
    records = {}
    for point in begun:
        ranks = _rank_results(dirs[point], n)
        reached = phases.phases_reached(dirs[point], n)
        last = point is begun[-1] and ended_badly
        timed_out = last and launch.timed_out
        record = combine(point, ranks, launch, cfg, reached, timed_out, k[point])
        lost = sorted(set(range(n)) - {r.get("rank") for r in ranks})
        if lost and not (last and launch.timed_out):
            record = record.with_lost(lost)
        records[point] = record.with_launch(started)
    records = _share_wall(records, launch.wall_s)
    shutil.rmtree(work, ignore_errors=True)
    by_name = {p.name: r for p, r in records.items()}
    for point, record in records.items():
        _say(point, record, by_name)
    return records


def _start(
    cfg: config_mod.Config,
    cfg_path: str | Path,
    points: list[Point],
    work: Path,
    memory_probe: str | Path | None,
    attempt: int,
) -> processes.LaunchResult:
    """The N workers over ``points``, waited for: Tula's own probe worker over every point,
    or the user's script (workload.script) at its one point."""
    n, limit = points[0].workers, cfg.probe.timeout_s
    deadline = _point_deadline(work, points, limit, time.time())
    if cfg.workload.script:
        (point,) = points
        ask = ProbeAsk(
            point.name,
            str(work),
            cfg.probe.warmup_steps,
            cfg.probe.precision,
            cfg.probe.timed_steps,
            cfg.probe.time_budget_s,
            cfg.probe.block_steps,
        )
        b = point.global_batch
        spec = ScriptRun("probe", n, b, model_inputs.lr_at(cfg, b), cfg.workload.epochs, probe=ask)
        return script_launch.start(cfg, spec, limit, deadline)
    worker_args = [
        "tula.runtime.probe.probe_worker",
        "--config",
        str(cfg_path),
        "--workers",
        str(n),
    ]
    worker_args += ["--global-batch", ",".join(str(p.global_batch) for p in points)]
    worker_args += ["--result-dir", str(work)]
    if memory_probe:
        worker_args += ["--memory-probe", str(memory_probe)]
    if attempt > 1:
        worker_args += ["--attempt", str(attempt)]
    return processes.start(
        n,
        worker_args,
        threads_per_worker=cfg.hardware.threads_per_worker,
        timeout_s=limit * len(points),
        deadline=deadline,
    )


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


def _share_wall(records: dict[Point, ProbeRecord], job_wall_s: float) -> dict[Point, ProbeRecord]:
    """Each point's wall: its own time in the launch (none for a point that failed) plus an
    equal share of what the launch paid once (start-up, the process group, the teardown), so
    a launch's points sum to its wall (``job_wall_s``, kept beside)."""
    own = {p: (r.result.point_wall_s if r.result else None) or 0.0 for p, r in records.items()}
    share = max(job_wall_s - sum(own.values()), 0.0) / max(len(records), 1)
    return {p: record.with_wall(own[p] + share) for p, record in records.items()}


def lost_a_worker(record: ProbeRecord) -> bool:
    """A rank died without writing its result, or the error the ranks reported is a peer
    that vanished (processes.LOST_PEER: every rank that wrote one lost its peer, a node died
    under the job): the machine's failure, not the point's."""
    return bool(record.lost_ranks) or (
        record.status == "error" and bool(processes.LOST_PEER.search(record.error or ""))
    )


def probe_points(
    cfg: config_mod.Config,
    cfg_path: str | Path,
    points: list[Point],
    work: Path,
    memory_probe: str | Path | None,
) -> dict[Point, ProbeRecord]:
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
    records: dict[Point, ProbeRecord] = {}
    attempt = dict.fromkeys(points, 1)
    retried: dict[Point, ProbeRecord] = {}
    todo = list(points)
    while todo:
        # Tula's own worker probes the job's points in one process; a user's script probes
        # the one batch it was started with
        batch = todo[:1] if cfg.workload.script else todo
        for point, record in _launch(
            cfg, cfg_path, batch, work, memory_probe, attempt[todo[0]]
        ).items():
            if lost_a_worker(record) and attempt[point] == 1:
                print(f"[probe {point.name}] a worker was lost: launching it once more", flush=True)
                retried[point] = record
                attempt[point] = 2
                continue
            if point in retried:
                first = retried[point]
                record = record.with_retry(first.error or first.after_error, first.lost_ranks or [])
            records[point] = record
        todo = [p for p in todo if p not in records]
    return records
