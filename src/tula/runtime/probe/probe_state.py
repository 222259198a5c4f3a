"""What a probe worker (:mod:`tula.runtime.probe.probe_worker`) keeps while it works: across its
job's points, the process's own (:class:`JobState`: the process group, the sets loaded once,
its start-up, what the first point measured for every point), and at one point, this rank's
result as it stands (:class:`Standing`, written as each part stands)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from tula.io import write_json
from tula.model.probe_measured import Overheads
from tula.model.probe_record import RankResult


class JobState:
    """What one probe process keeps across its job's points: the local batches the job probes
    (the compute sweep leaves them to their points' own arms), the process group (joined at
    the first point), the workload's sets (loaded once), this process's start-up (to its
    first point's first step, as the production job counts it), its first point, and what
    that point measured for every point of the job: the overheads, and where the sweep is."""

    def __init__(self, probed: list[int]):
        self.probed = probed
        self.group: tuple[Any, ...] | None = None  # (worker env, device, backend)
        self.data: Any = None
        self.startup_s: float | None = None
        self.first: str | None = None
        self.overheads: tuple[Overheads | None, str | None] | None = None
        self.swept_at: str | None = None

    def joined(self, group: tuple[Any, ...]) -> None:
        self.group = group

    def started(self, data: Any, startup_s: float) -> None:
        """A point's replica stands on ``data``; the first one's ends the process's start-up."""
        if self.data is None:
            self.data, self.startup_s = data, startup_s

    def is_first(self, point: str) -> bool:
        """Is ``point`` the process's first (its first steps were the process's)?"""
        if self.first is None:
            self.first = point
        return self.first == point

    def overheads_of(
        self, measure: Callable[[], tuple[Overheads | None, str | None]]
    ) -> tuple[Overheads | None, str | None]:
        """The overheads (and an error), measured at the first point that asks."""
        if self.overheads is None:
            self.overheads = measure()
        return self.overheads

    def swept(self, point: str) -> None:
        """The job's compute sweep ran at ``point``: it serves every point of the job."""
        self.swept_at = point


class Standing:
    """This rank's result at a point as it stands (:class:`RankResult`, a new one as each part
    stands), written to ``path``: rank 0's as each part stands (what the launcher reads if a
    later phase never ends), every rank's when the point ends."""

    def __init__(self, path: Path, result: RankResult):
        self.path, self.result = path, result

    def stands(self, result: RankResult, save: bool = True, every_rank: bool = False) -> None:
        self.result = result
        if save and (every_rank or result.rank == 0):
            write_json(self.path, result.to_json())
