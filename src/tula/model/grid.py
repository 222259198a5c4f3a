"""Grid of candidate (N, B) configurations and the search set that gets probed (§III-A.2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from tula.model.inputs import GridSpec


@dataclass(frozen=True, order=True)
class Point:
    """One configuration: N workers, global batch B, local batch b = B / N."""

    workers: int
    global_batch: int

    @property
    def local_batch(self) -> int:
        return self.global_batch // self.workers

    @property
    def name(self) -> str:
        """File stem used under results/partitions/<name>/probes/."""
        return f"N{self.workers}_B{self.global_batch}"


def micro_steps(local_batch, accumulate="auto", max_local_batch=None):
    """k, the micro-batches a step of ``local_batch`` samples per worker runs as
    (``train.accumulate``): an integer fixes it; ``auto``: 1 where the local batch fits
    (b <= b_max, or b_max unknown), else the smallest k whose micro-batch ceil(b / k) fits.
    An int for one local batch, an int array for arrays."""
    b = np.asarray(local_batch)
    if accumulate != "auto":
        k = np.full(b.shape, int(accumulate))
    elif max_local_batch is None:
        k = np.ones(b.shape, dtype=int)
    else:
        k = np.maximum(np.ceil(b / max(int(max_local_batch), 1)), 1).astype(int)
    return int(k) if k.ndim == 0 else k


def batch_sizes(g: GridSpec) -> list[int]:
    """Global batches from grid.batch_min to grid.batch_max, doubling."""
    out, b = [], g.batch_min
    while b <= g.batch_max:
        out.append(b)
        b *= 2
    return out


def grid(g: GridSpec) -> list[Point]:
    """Every candidate (N, B): each N of grid.workers times each B (B divisible by N by config
    check)."""
    return [Point(n, b) for n in g.workers for b in batch_sizes(g)]


def nodes_of(workers, workers_per_node: int) -> np.ndarray:
    """Nodes a job of N workers takes: ceil(N / cluster.workers_per_node) (the layout of
    :func:`tula.slurm.shapes.job_shape`, which the shared layer computes itself)."""
    return np.ceil(np.asarray(workers, dtype=float) / workers_per_node)


def boundary_workers(g: GridSpec) -> tuple[int, ...]:
    """(largest N > 1 on one node, smallest N on several) when the grid has both, else ()."""
    wpn = g.workers_per_node
    inside = [n for n in g.workers if 1 < n <= wpn]
    across = [n for n in g.workers if n > wpn]
    return (max(inside), min(across)) if inside and across else ()


def search_set(g: GridSpec, max_local_batch: int | None = None) -> list[Point]:
    """The points to probe, never one the memory model rules out (a local batch, or under
    ``train.accumulate`` its micro-batch, above ``max_local_batch``, b_max of the memory probe;
    None = unbounded).

    ``full``: every grid point that fits. ``partial`` (§III-A.2): min and max N, each at the
    smallest B and at the largest B that fits there in one batch (grid.batch_max when memory
    allows); when the grid crosses a node boundary (:func:`boundary_workers`), also the largest
    one-node N and the smallest multi-node N, alike, so the sync model sees both sides of it.
    Where a probe job cannot sweep the compute curve between its points (``g.swept`` false: a
    user's script), a partial search probes every B that fits at those N: the points between
    are the sweep (without them the compute curve between the corners is a guess; the plain
    script's production ran x1.12 and x1.18 of a prediction at a B between them: BENCHMARKS.md,
    "Your own training script"). Where points fit only as micro-batches, a partial search also
    probes the largest B at the largest N so: the step model, fitted on single batches,
    predicts it, and its own probe checks that (held out of the fit).
    """

    def fits(p: Point, k: int = 1) -> bool:  # at k micro-batches a step
        return max_local_batch is None or -(-p.local_batch // k) <= max_local_batch

    every = grid(g)
    accumulated = [
        p
        for p in every
        if not fits(p) and fits(p, micro_steps(p.local_batch, g.accumulate, max_local_batch))
    ]
    if g.search == "full":
        return sorted([p for p in every if fits(p)] + accumulated)
    points = [p for p in every if fits(p)]
    ns = g.workers
    corners: set[Point] = set()
    for n in {min(ns), max(ns), *boundary_workers(g)}:
        at_n = sorted(p.global_batch for p in points if p.workers == n)
        if at_n:
            kept = at_n if not g.swept else (at_n[0], at_n[-1])
            corners |= {Point(n, b) for b in kept}
    if accumulated:
        corners.add(max(accumulated))  # order: the largest N, then the largest B
    return sorted(corners)


def batches_at(g: GridSpec, workers: int, max_local_batch: int | None = None) -> list[int]:
    """The global batches the search set probes at N = ``workers``, smallest first: what the
    probe job at that N measures, in one process (``results/partitions/<name>/probes/N{n}/``)."""
    return sorted(p.global_batch for p in search_set(g, max_local_batch) if p.workers == workers)


def sweep_local_batches(
    g: GridSpec,
    workers: int,
    own_local_batch: int,
    max_local_batch: int | None,
    train_samples: int | None = None,
    probed: Iterable[int] = (),
) -> list[int]:
    """The other local batches a probe job at N=``workers`` times compute at (the
    compute curve from every probe job): every local batch of the grid (B'/N' for each B'
    and N'), up to b_max, whose global batch at this N fits in one epoch of data, less those
    the job probes anyway (``probed``: its points' local batches, whose compute-only arm
    gives the compute time there, more precisely than a sweep would)."""
    out = set()
    skip = {own_local_batch, *probed}
    for n in g.workers:
        for b in batch_sizes(g):
            lb = b // n
            if lb in skip or lb < 1:
                continue
            if max_local_batch is not None and lb > max_local_batch:
                continue
            if train_samples is not None and lb * workers > train_samples:
                continue
            out.add(lb)
    return sorted(out)


def short_last_batch(train_samples: int, global_batch, workers=1):
    """Whether an epoch of D samples at global batch B ends in a short batch that is trained:
    D mod B samples, kept where every one of the N workers gets one (a tail smaller than N is
    left out, :func:`tula.runtime.input.loader.next_chunk`). A bool, or a bool array for arrays."""
    tail = np.asarray(train_samples) % np.asarray(global_batch)
    kept = (tail > 0) & (tail >= np.asarray(workers))
    return bool(kept) if kept.ndim == 0 else kept


def steps_per_epoch(train_samples: int, global_batch, workers=1):
    """Optimizer steps in an epoch of D samples at global batch B on N workers (Eq. 4a's I / E):
    floor(D / B), and one more for a short last batch that is trained (:func:`short_last_batch`;
    ceil(D / B) but where a tail smaller than N is left out). An int for one B, an int array
    for arrays."""
    full = np.asarray(train_samples) // np.asarray(global_batch)
    steps = (full + short_last_batch(train_samples, global_batch, workers)).astype(int)
    return int(steps) if steps.ndim == 0 else steps


def paid_mix(
    train_size: int, global_batch: int, workers: int, refresh_per_step: float
) -> dict | None:
    """The share of training's steps at this batch on N workers that are an epoch's first, its
    short last batch (where one is trained) and a mid-epoch AGS refresh: the weights of the mean
    step it pays (as :func:`tula.runtime.probe.probe_worker._measurement` adds them up), so that the
    probe's precision is that mean's. None where no plain step is left (an epoch of one or two
    steps: the starts stand in, :func:`tula.runtime.probe.probe_timing.starts_alike`)."""
    spe = steps_per_epoch(train_size, global_batch, workers)
    mix = {"start": 1.0 / spe}
    if short_last_batch(train_size, global_batch, workers):
        mix["partial"] = 1.0 / spe
    if refresh_per_step > 0:
        mix["refresh"] = refresh_per_step
    return mix if spe > 1 and sum(mix.values()) < 1.0 else None
