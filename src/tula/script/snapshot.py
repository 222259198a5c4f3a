"""A user's script's checkpoint as a file (:mod:`tula.checkpoint`: atomic, verified, the
newest usable one picked): the parts it keeps, each saved by its own ``state_dict``, where its
loop stands (:class:`tula.script.walk.Walk`) and each rank's random state, now and as its
epoch's loader began; written by every rank together, rank 0 writing. The production job
writes it; a probe times the same write."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch.distributed as torch_dist

from tula import checkpoint
from tula.script.parts import Parts
from tula.script.walk import Walk


def _grouped(world: int) -> bool:
    return world > 1 and torch_dist.is_initialized()


def write(
    directory: str | Path,
    parts: Parts,
    walk: Walk,
    batches: tuple[int, int],
    keep: int,
    extra: dict[str, Any],
    after_write: Callable[[Path], None] | None = None,
) -> None:
    """Every rank's random states to rank 0, which writes them with the parts, where the loop
    stands and ``extra``; ``batches``: (global batch, workers)."""
    global_batch, world = batches
    mine = {"rng": checkpoint.rng_state(), "epoch_rng": walk.epoch_rng}
    ranks: list[Any] = [mine]
    if _grouped(world):
        ranks = [None] * world
        torch_dist.all_gather_object(ranks, mine)
    if not _grouped(world) or torch_dist.get_rank() == 0:
        state = {
            "parts": parts.state_dict(),
            "walk": walk.state_dict(),
            "position": {"epoch": walk.epoch + 1, "offset": walk.batches_done * global_batch},
            "ranks": ranks,
            "global_batch": global_batch,
            "workers": world,
            **extra,
        }
        checkpoint.save(directory, state, walk.steps_done, keep, after_write)
    if _grouped(world):
        torch_dist.barrier()


def newest(directory: str | Path, fingerprint: str, rank: int) -> dict[str, Any] | None:
    """The newest usable checkpoint of this run (its ``fingerprint``, not finished), picked by
    rank 0 (a damaged or foreign one skipped, said), loaded by every rank."""
    chosen: list[Any] = [None]
    state = None
    if rank == 0:

        def accept(s: dict[str, Any]) -> str:
            if s.get("fingerprint") != fingerprint:
                return "written by a run with other settings, N or selected B"
            return "the run it belongs to had finished" if s.get("complete") else ""

        loaded, warnings = checkpoint.load_latest(directory, accept)
        for w in warnings:
            print(f"warning: {w}", flush=True)
        chosen[0] = str(loaded.path) if loaded else None
        state = loaded.state if loaded else None
    if torch_dist.is_initialized():
        torch_dist.broadcast_object_list(chosen, src=0)
    if rank != 0 and chosen[0] is not None:
        state = checkpoint.from_bytes(Path(chosen[0]).read_bytes())  # rank 0 verified this file
    return state


def restore(state: dict[str, Any], parts: Parts, walk: Walk, rank: int, global_batch: int) -> None:
    """The parts and the walk as ``state`` holds them, with this rank's random states (a
    checkpoint of other N: the rank's of the same index modulo its ranks); a checkpoint of
    another global batch (a relaunch after an out-of-memory error) skips as many samples."""
    ranks = state["ranks"]
    mine = ranks[rank % len(ranks)]
    parts.load_state_dict(state["parts"])
    ratio = state["global_batch"] / global_batch
    walk.load_state_dict(state["walk"], mine["epoch_rng"], mine["rng"], ratio)
