"""A production job as the launcher and its workers both see it: its directory, its record of
attempts, submitit's executor for it, and how a finished job ended.

The job's directory (``results/train``, or a run of the suite) holds::

    checkpoints/      the checkpoints (tula.checkpoint) and a copy of attempts.json
    oom/              attempt<k>-rank<r>.json: a rank that ran out of memory where the ranks
                      cannot agree (backward) leaves this for the launcher
    segments.json     rank 0's record of each stretch of training between (re)starts
    attempts.json     :class:`History`: every attempt, what it trained and how it ended
    submitit/         submitit's job folder and the workers' logs
    metrics.csv, final.json, model.pt   the results

One *attempt* is one submitit job at one global batch; the requeues inside it (preemption,
time limit) are its segments. No torch here: ``tula launch`` runs on the login node.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import submitit

from tula import checkpoint, slurm
from tula.config import Config
from tula.io import read_json, write_json

EXECUTORS = ("local", "slurm")


def utc_now() -> str:
    """Now, as the job's records write a time (UTC, to the second)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def oom_record_path(out_dir: Path, attempt: int, rank: int) -> Path:
    return Path(out_dir) / "oom" / f"attempt{attempt}-rank{rank}.json"


def add_segment(out_dir: Path, seg: dict[str, Any]) -> None:
    """Append a segment (start/end step, outcome) to segments.json (rank 0 of the job)."""
    path = Path(out_dir) / "segments.json"
    write_json(path, [*(read_json(path) if path.exists() else []), seg])


def segments(out_dir: Path, attempt: int) -> list[dict[str, Any]]:
    path = Path(out_dir) / "segments.json"
    return [s for s in (read_json(path) if path.exists() else []) if s.get("attempt") == attempt]


def unrecorded_stretch(out_dir: Path, attempt: int, resumed_step: int) -> dict[str, Any] | None:
    """The stretch an earlier start of this attempt trained and left no segment for: it started
    (started.json: rank 0's first step) but its processes ended without a word (the node rank 0
    ran on was lost, a SIGKILL); training goes on from the checkpoint of ``resumed_step`` (the
    job requeued, or the next attempt). None where that start's segment is there (or this is
    the attempt's first start)."""
    path = started_path(out_dir)
    if not path.exists():
        return None
    start = read_json(path)
    if start.get("attempt") != attempt or start.get("step", 0) > resumed_step:
        return None  # another attempt's start, or not this run's
    if any(s.get("start_step") == start.get("step") for s in segments(out_dir, attempt)):
        return None
    return {
        "attempt": attempt,
        "start_step": start.get("step", 0),
        "end_step": resumed_step,
        "outcome": "lost",
        "reason": "its processes ended without a record (a crash, a lost node, a kill); training "
        f"goes on from the checkpoint of step {resumed_step}, and what came after it is trained "
        "again",
    }


def attempt_segments(out_dir: Path, attempt: int, checkpoint_step: int) -> list[dict[str, Any]]:
    """The segments of ``attempt`` once its job has ended, with the stretch of its last start
    where that start left none (:func:`unrecorded_stretch`, up to the newest checkpoint)."""
    lost = unrecorded_stretch(out_dir, attempt, checkpoint_step)
    if lost:
        add_segment(out_dir, lost)
    return segments(out_dir, attempt)


def move_request_path(out_dir: Path) -> Path:
    """`tula launch` writes this (launch.replan: move) to ask the running job to checkpoint and
    stop."""
    return Path(out_dir) / "move.request"


def started_path(out_dir: Path) -> Path:
    """Rank 0 writes this at the first step of each (re)start: {attempt, first_step_time, step}."""
    return Path(out_dir) / "started.json"


def drifts(out_dir: Path, attempt: int) -> list[dict[str, Any]]:
    """The drifts the job's rank 0 recorded in drift.json during ``attempt``."""
    path = Path(out_dir) / "drift.json"
    return [d for d in (read_json(path) if path.exists() else []) if d.get("attempt") == attempt]


@dataclass
class Attempt:
    """One submitted job at one global batch (``outcome``: running, completed, oom, stopped,
    failed, cancelled or interrupted) and the segments it trained in."""

    attempt: int
    global_batch: int
    local_batch: int
    job_id: str
    start_step: int
    end_step: int | None = None
    checkpoint_step: int | None = None
    outcome: str = "running"
    reason: str = ""
    segments: list[dict[str, Any]] = field(default_factory=list)
    # network drift the job found (tula.model.drift)
    drift: list[dict[str, Any]] = field(default_factory=list)
    # N of this attempt (None in records written before moves existed: the selected N)
    workers: int | None = None
    submitted: float | None = None  # when it was submitted (epoch seconds): what a relaunch costs

    def end(self, outcome: str, reason: str) -> None:
        """How the attempt ended, and why."""
        self.outcome, self.reason = outcome, reason

    def account(self, segments: list[dict[str, Any]], checkpoint_step: int | None, drift) -> None:
        """What its job left: the segments it trained in (and so the steps where the workers
        really started, a damaged newest checkpoint skipped, and ended), its newest checkpoint,
        and the network drift it found."""
        self.segments, self.checkpoint_step, self.drift = segments, checkpoint_step, drift
        if segments:
            self.start_step, self.end_step = segments[0]["start_step"], segments[-1]["end_step"]


@dataclass
class History:
    """attempts.json, written twice: ``<dir>/attempts.json`` (what users and the report read; a
    Snakemake output, so Snakemake deletes it when the rule fails) and a copy beside the
    checkpoints it describes, which a re-run reads to continue the history."""

    out: Path
    fingerprint: str
    workers: int
    selected_batch: int
    executor: str
    outcome: str = "running"
    attempts: list[Attempt] = field(default_factory=list)

    @staticmethod
    def read(out: Path) -> dict[str, Any]:
        for p in (out / "checkpoints" / "attempts.json", out / "attempts.json"):
            if p.exists():
                return read_json(p)
        return {}

    @staticmethod
    def attempts_of(prior: dict[str, Any]) -> list[Attempt]:
        return [Attempt(**a) for a in prior.get("attempts", [])]

    def add(self, attempt: Attempt) -> None:
        """A new attempt, submitted (written with the next :meth:`write`)."""
        self.attempts.append(attempt)

    def write(self, outcome: str | None = None) -> None:
        if outcome is not None:
            self.outcome = outcome
        record = {
            "fingerprint": self.fingerprint,
            "workers": self.workers,
            "selected_batch": self.selected_batch,
            "executor": self.executor,
            "outcome": self.outcome,
            "attempts": [asdict(a) for a in self.attempts],
        }
        for p in (self.out / "checkpoints" / "attempts.json", self.out / "attempts.json"):
            write_json(p, record)


def resolve_executor(cfg: Config, hint: str | None) -> str:
    """``launch.executor``; ``auto`` follows Snakemake's executor (the --executor-hint the
    launch rule passes: slurm under the slurm profile), else local."""
    if cfg.launch.executor != "auto":
        return cfg.launch.executor
    return hint if hint in EXECUTORS else "local"


def make_executor(
    cfg: Config,
    kind: str,
    folder: Path,
    n_workers: int,
    timeout_min: int,
    partition: str | None = None,
    account: str | None = None,
    name: str = "tula-train",
) -> submitit.Executor:
    """A submitit executor for one attempt's job: :func:`tula.slurm.job_shape` on SLURM,
    N local processes otherwise."""
    if kind == "slurm" and not shutil.which("sbatch"):
        raise RuntimeError(
            "config key 'launch.executor' is slurm but sbatch is not on PATH: run on the cluster's "
            "login node, or set launch.executor: local"
        )
    gpus = n_workers if cfg.hardware.device == "cuda" else 0
    shape = (
        slurm.job_shape(cfg, n_workers)
        if kind == "slurm"
        else slurm.JobShape(1, n_workers, cfg.hardware.threads_per_worker, gpus)
    )
    ex = submitit.AutoExecutor(
        folder=folder, cluster=kind, slurm_max_num_timeout=cfg.launch.max_requeues
    )
    params: dict[str, Any] = {
        "name": name,
        "timeout_min": timeout_min,
        "tasks_per_node": shape.tasks_per_node,
        "nodes": shape.nodes,
        "cpus_per_task": shape.cpus_per_task,
    }
    if shape.gpus_per_node:
        params["gpus_per_node"] = shape.gpus_per_node
    if kind == "slurm":
        L = cfg.launch
        params.update(
            slurm_signal_delay_s=L.signal_delay_s,
            slurm_additional_parameters={**L.slurm_additional},
        )
        if L.slurm_partition or partition:
            params["slurm_partition"] = L.slurm_partition or partition
        if L.slurm_account or account:
            params["slurm_account"] = L.slurm_account or account
        if L.mem_gb:
            params["mem_gb"] = L.mem_gb
    ex.update_parameters(**params)
    return ex


def submit(executor: submitit.Executor, fn: Any, kind: str) -> submitit.Job:
    """Submit ``fn``; a refusal (sbatch's message) is an error naming the keys to check."""
    try:
        return executor.submit(fn)
    except (
        subprocess.CalledProcessError,
        RuntimeError,
    ) as exc:  # submitit raises sbatch's stderr as RuntimeError
        said = (getattr(exc, "stderr", None) or getattr(exc, "output", None) or str(exc)).strip()
        said = said.decode(errors="replace") if isinstance(said, bytes) else said
        raise RuntimeError(
            f"{'sbatch' if kind == 'slurm' else 'the local executor'} refused the training job: "
            f"{' / '.join(said.splitlines()) if said else exc}. Check launch.slurm_partition, "
            "launch.slurm_account and launch.slurm_additional in the config (or slurm_partition / "
            "slurm_account in the profile)"
        ) from None


def resumable(ck: Path, fingerprint: str) -> bool:
    """Is the newest checkpoint one of this run (same settings, N, selected B) that did not
    finish? (Older ones of a finished run must never be resumed.)"""
    found = checkpoint.manifests(ck)
    if not found:
        return False
    try:
        meta = read_json(found[0][1])
    except ValueError:
        # a damaged newest manifest: the worker falls back to the previous one
        return len(found) > 1
    return meta.get("fingerprint") == fingerprint and not meta.get("complete")


def still_running(prior: dict[str, Any], out: Path, workers: int) -> submitit.Job | None:
    """The job of the last attempt when an earlier `tula launch` left it running (its login
    session died, Snakemake was killed): a SLURM job is re-attached to, never submitted twice."""
    last = (prior.get("attempts") or [{}])[-1]
    if last.get("outcome") != "running":
        return None
    if prior.get("executor") == "slurm":
        job = submitit.SlurmJob(
            folder=out / "submitit", job_id=last["job_id"], tasks=tuple(range(workers))
        )
        return None if slurm.job_state(last["job_id"]) in ("", "NOT_FOUND") else job
    pid = int(last["job_id"])
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return None
    raise RuntimeError(
        f"the local training job of an earlier tula launch (process {pid}) is still running; wait "
        f"for it to end or stop it (kill {pid}), then run this again"
    )


class Echo:
    """Prints what a job's rank-0 log gained since the last look."""

    def __init__(self, path: Path):
        self.path, self.pos = path, 0

    def __call__(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.pos)
                data = fh.read()
        except FileNotFoundError:
            return
        if data:
            cut = data.rfind(b"\n") + 1  # whole lines only
            self.pos += cut
            sys.stdout.write(data[:cut].decode(errors="replace"))
            sys.stdout.flush()


def wait(job: submitit.Job, poll_s: float, check=None) -> None:
    """Until the job ends, echoing task 0's log; the scheduler is asked at most every 15 s.
    ``check()`` (if given) is called at every poll (tula launch's drift watch)."""
    echo = Echo(Path(job.paths.stdout))
    last_force = time.monotonic()
    while True:
        echo()
        if check is not None:
            check()
        force = time.monotonic() - last_force > max(poll_s, 15)
        if job.done(force_check=force):
            break
        if force:
            last_force = time.monotonic()
        time.sleep(poll_s)
    time.sleep(0.2)
    echo()


def log_tail(job: submitit.Job, n: int = 30) -> str:
    try:
        lines = Path(job.paths.stderr).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def _error_line(text: str) -> str:
    """The last 'SomeError: message' line of a worker's traceback."""
    found = re.findall(
        r"^(?:\[rank\d+\]:\s*)?([\w.]*(?:Error|Exception|Interrupt)\b.*)$", text, flags=re.MULTILINE
    )
    return found[-1].strip() if found else ""


def _has_result(job: submitit.Job) -> bool:
    tasks = [job.task(i) for i in range(job.num_tasks)] if job.num_tasks > 1 else [job]
    return any(t.paths.result_pickle.exists() for t in tasks)


def outcome(job: submitit.Job, out: Path, attempt: int) -> tuple[str, str]:
    """(outcome, reason) of a finished job: completed, oom, stopped or failed."""
    markers = sorted((out / "oom").glob(f"attempt{attempt}-rank*.json"))
    segs = segments(out, attempt)
    if segs and segs[-1]["outcome"] == "stopped" and not _has_result(job):
        # the ranks checkpointed, wrote this record and left by SystemExit, for which submitit
        # writes no result: do not wait its 15 s for one that cannot come
        return "stopped", segs[-1]["reason"]
    try:
        results = job.results()
    except Exception as exc:  # noqa: BLE001 - a failed job raises whatever the worker raised
        # a rank ran out of memory where the ranks cannot agree (backward) and left this record
        if markers:
            m = read_json(markers[0])
            return (
                "oom",
                f"out of memory {m['place']} ({markers[0].stem.split('-')[1]}): {m['message']}",
            )
        if segs and segs[-1]["outcome"] == "stopped":
            return "stopped", segs[-1]["reason"]
        return "failed", _error_line(str(exc)) or type(exc).__name__
    result = results[0] if isinstance(results, list) else results
    if result.get("outcome") == "oom":
        return (
            "oom",
            f"out of memory {result['place']} on rank(s) {result['ranks']}: {result['message']}",
        )
    return result.get("outcome", "failed"), "trained every epoch" if result.get(
        "outcome"
    ) == "completed" else str(result)
