"""A probe's ranks say which of their phases (:data:`tula.faults.PROBE_PHASES`) each has reached
(:func:`mark`, in ``rank<r>.phase.json``), and the launcher reads where each was when a point
ended or was stopped (:func:`phases_reached`, :func:`describe_phases`)."""

from __future__ import annotations

import time
from pathlib import Path

from tula.io import read_json, write_json


def phase_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rank{rank}.phase.json"


def mark(directory: str | Path, rank: int, phase: str, began: float | None = None) -> None:
    """Rank ``rank`` has reached ``phase`` (one of :data:`tula.faults.PROBE_PHASES`), now;
    ``began``: when this rank began the point the phase is of (a probe job's later points)."""
    write_json(phase_path(directory, rank), {"phase": phase, "since": time.time(), "began": began})


def point_dir(directory: str | Path, point_name: str) -> Path:
    """Where the ranks of a probe job write what they have of one of its points."""
    return Path(directory) / point_name


def began(directory: str | Path, nproc: int) -> float | None:
    """When the first of the ``nproc`` ranks began the point whose phases are in ``directory``
    (None: none has said so, or said no time: the job's first point, begun at its start)."""
    times = []
    for rank in range(nproc):
        try:
            times.append(float(read_json(phase_path(directory, rank))["began"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return min(times) if times else None


def marked(directory: str | Path, nproc: int) -> bool:
    """Has any of the ``nproc`` ranks said a phase in ``directory``."""
    return any(phase_path(directory, rank).exists() for rank in range(nproc))


def phases_reached(directory: str | Path, nproc: int) -> list[dict]:
    """Which phase each of the ``nproc`` ranks had reached and for how long it had been in it
    (and, at a probe job's later point, ``point_for_s``: since it began that point);
    ``"not started"`` for a rank that never said (not launched, or still importing)."""
    now, out = time.time(), []
    for rank in range(nproc):
        try:
            said = read_json(phase_path(directory, rank))
            out.append({"rank": rank, "phase": said["phase"], "for_s": now - said["since"]})
            if said.get("began") is not None:  # a probe job's later point: since it began
                out[-1]["point_for_s"] = now - said["began"]
        except (OSError, ValueError, KeyError, TypeError):
            out.append({"rank": rank, "phase": "not started", "for_s": None})
    return out


def describe_phases(reached: list[dict]) -> str:
    """``rank 0 in 'timed steps' for 512 s, rank 1 in 'process group' for 590 s``."""
    return ", ".join(
        f"rank {r['rank']} in {r['phase']!r}"
        + (f" for {r['for_s']:.0f} s" if r.get("for_s") is not None else "")
        for r in reached
    )
