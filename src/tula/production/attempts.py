"""A production job's record of attempts (``attempts.json``): each submitted job at one
global batch, how it ended and what it trained (:class:`Attempt`), and the record of them all
(:class:`History`), written where users read it and beside the checkpoints it describes. No
torch here."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tula.io import read_json, write_json


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

    def report_lines(self) -> list[str]:
        """What the terminal is told once the attempt has ended: each network drift its job
        found and what was done, then how it ended (its requeues, each resumed from a
        checkpoint, and why where it did not complete)."""
        lines = [
            f"attempt {self.attempt}: network drift at step {d['step']}: {d['reason']} "
            f"— {d['action']}"
            for d in self.drift
        ]
        resumed = max(len(self.segments) - 1, 0)  # each segment after the first resumed
        lines.append(
            f"attempt {self.attempt} ended: {self.outcome}"
            + (
                f" after {resumed} preemption/requeue(s), each resumed from its checkpoint"
                if resumed
                else ""
            )
            + (f" — {self.reason}" if self.reason and self.outcome != "completed" else "")
        )
        return lines

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

    def close_interrupted(self, job_alive: bool) -> None:
        """The last attempt still reads ``running`` but its job is gone (its launcher died):
        it ended, and a new attempt resumes from the newest checkpoint."""
        if self.attempts and self.attempts[-1].outcome == "running" and not job_alive:
            self.attempts[-1].end(
                "interrupted",
                "tula launch stopped while the job ran; resumed by a new attempt from the newest "
                "checkpoint",
            )

    def oom_batches(self) -> set[int]:
        """The global batches an attempt ran out of memory at (none is tried again)."""
        return {a.global_batch for a in self.attempts if a.outcome == "oom"}

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
