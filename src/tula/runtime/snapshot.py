"""A replica's checkpoint, written by every rank together: the production job writes it at
its checkpoints and the probe times the same call (the write a job will pay)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from tula import checkpoint
from tula.runtime.agreement import StepOOM, agree
from tula.runtime.replica import Replica


def write_checkpoint(replica: Replica, directory: Path, keep: int, extra: dict[str, Any], after_write=None) -> None:
    """The production job's checkpoint (the probe times the same call): every rank's RNG
    states and partial-epoch sums (and its own model between post-local SGD averages) go to
    rank 0, which writes them with the replica's state and ``extra``.

    Out of memory on any rank (device or host) while it gathers its part or while rank 0
    serialises and writes: nothing half-written is left (the writes are atomic and the
    manifest comes last), every rank learns it from one all-reduce after the write, and
    all raise :class:`StepOOM` (``where="checkpoint"``)."""
    rank, world = replica.rank, replica.world
    err, mine = "", None
    try:
        if replica.inject is not None:
            replica.inject("checkpoint")
        mine = {"rng": checkpoint.rng_state(), "epoch_stats": replica.stats.cpu().clone()}
        if replica.replicas_differ() and rank != 0:  # rank 0's model and optimizer are the file's own
            mine["replica"] = _to_cpu({"model": replica.ddp.module.state_dict(), "optimizer": replica.opt.state_dict()})
    except (torch.OutOfMemoryError, MemoryError) as exc:
        err = str(exc) or type(exc).__name__
    per_rank: list[Any] = [None] * world
    torch_dist.all_gather_object(per_rank, mine)
    if rank == 0 and all(p is not None for p in per_rank):
        try:
            state = {**replica.state(), **extra, "ranks": per_rank}
            checkpoint.save(directory, state, replica.pos.step, keep=keep, after_write=after_write)
        except (torch.OutOfMemoryError, MemoryError) as exc:
            err = str(exc) or type(exc).__name__
    _, failed = agree(bool(err))
    if failed:
        replica.free_cached_memory()
        raise StepOOM(failed, err, where="checkpoint")


def _to_cpu(obj: Any) -> Any:
    """A copy of a (nested) state dict with every tensor on the CPU, to send to rank 0."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj
