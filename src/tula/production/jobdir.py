"""A production job's folder, as the launcher and the job's ranks both see it: where each
record lies, and the segments of training the ranks write there.

The folder (``results/train``, or a run of the suite) holds::

    checkpoints/      the checkpoints (tula.checkpoint) and a copy of attempts.json
    oom/              attempt<k>-rank<r>.json: a rank that ran out of memory where the ranks
                      cannot agree (backward) leaves this for the launcher
    segments.json     rank 0's record of each stretch of training between (re)starts
    started.json      rank 0's first step of each (re)start
    drift.json        the network drift rank 0 found
    move.request      `tula launch` asks the running job to checkpoint and stop
    attempts.json     every attempt, what it trained and how it ended
                      (:class:`tula.production.attempts.History`)
    submitit/         submitit's job folder and the workers' logs
                      (:mod:`tula.production.submission`)
    metrics.csv, final.json, model.pt   the results

One *attempt* is one submitit job at one global batch; the requeues inside it (preemption,
time limit) are its segments. No torch here: ``tula launch`` runs on the login node.
"""

from __future__ import annotations

import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tula import checkpoint
from tula.io import read_json, write_json


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


def start_over(out_dir: Path) -> None:
    """Clear what another run left in the folder (its checkpoints, its ranks' OOM records, its
    segments and starts), so that this run starts from step 0."""
    out = Path(out_dir)
    for stale in (out / "checkpoints", out / "oom"):
        shutil.rmtree(stale, ignore_errors=True)
    for record in ("segments.json", "started.json"):
        (out / record).unlink(missing_ok=True)
