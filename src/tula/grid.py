"""Grid of candidate (N, B) configurations and the search set that gets probed (§III-A.2)."""

from __future__ import annotations

from dataclasses import dataclass

from tula.config import Config


@dataclass(frozen=True, order=True)
class Point:
    """One configuration: N workers, global batch B, local batch b = B / N."""

    nodes: int
    global_batch: int

    @property
    def local_batch(self) -> int:
        return self.global_batch // self.nodes

    @property
    def name(self) -> str:
        """File stem used under results/probes/."""
        return f"N{self.nodes}_B{self.global_batch}"


def batch_sizes(cfg: Config) -> list[int]:
    """Global batches from grid.batch_min to grid.batch_max in powers of two."""
    out, b = [], cfg.grid.batch_min
    while b <= cfg.grid.batch_max:
        out.append(b)
        b *= 2
    return out


def grid(cfg: Config) -> list[Point]:
    """Every candidate (N, B): each N of grid.nodes times each B (B divisible by N by config check)."""
    return [Point(n, b) for n in cfg.grid.nodes for b in batch_sizes(cfg)]


def search_set(cfg: Config) -> list[Point]:
    """The points to probe: all of them (`full`) or the four corners (`partial`)."""
    points = grid(cfg)
    if cfg.search == "full":
        return points
    ns, bs = cfg.grid.nodes, batch_sizes(cfg)
    corners = {Point(n, b) for n in (min(ns), max(ns)) for b in (min(bs), max(bs))}
    return sorted(corners)
