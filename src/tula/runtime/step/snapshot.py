"""A replica's checkpoint, written by every rank together (the production job writes it at
its checkpoints, and the probe times the same call: the write a job will pay), and the
newest usable one loaded alike on every rank when a job resumes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from tula import checkpoint
from tula.runtime.group.agreement import StepOOM, agree
from tula.runtime.step.replica import Replica
from tula.runtime.train.optim_state import optimizer_parts


def write_checkpoint(
    replica: Replica, directory: Path, keep: int, extra: dict[str, Any], after_write=None
) -> None:
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
        replica.inject("checkpoint")
        mine = {"rng": checkpoint.rng_state(), "epoch_stats": replica.walk.stats.cpu().clone()}
        if replica.walk.metric is not None:  # train.metric's torchmetrics states, this rank's
            mine["epoch_metric"] = replica.walk.metric.state_dict()
        # rank 0's model and optimizer are the file's own
        if replica.cadence.replicas_differ and rank != 0:
            mine["replica"] = _to_cpu(
                {"model": replica.ddp.module.state_dict(), **optimizer_parts(replica.update.opt)}
            )
    except (torch.OutOfMemoryError, MemoryError) as exc:
        err = str(exc) or type(exc).__name__
    per_rank: list[Any] = [None] * world
    torch_dist.all_gather_object(per_rank, mine)
    if rank == 0 and all(p is not None for p in per_rank):
        try:
            state = {**replica.state_dict(), **extra, "ranks": per_rank}
            checkpoint.save(
                directory, state, replica.steps_done, keep=keep, after_write=after_write
            )
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


def load_newest(ckpt: checkpoint.Checkpointing, rank: int) -> dict[str, Any] | None:
    """Rank 0 picks the newest usable checkpoint of this run; every rank loads that one."""
    chosen: list[Any] = [None]
    if rank == 0:

        def accept(state: dict[str, Any]) -> str:
            if state.get("fingerprint") != ckpt.fingerprint:
                return "written by a run with other settings, N or selected B"
            return "the run it belongs to had finished" if state.get("complete") else ""

        loaded, warnings = checkpoint.load_latest(ckpt.directory, accept)
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr, flush=True)
            print(f"warning: {w}", flush=True)
        chosen[0] = str(loaded.path) if loaded else None
        state = loaded.state if loaded else None
    torch_dist.broadcast_object_list(chosen, src=0)
    if rank != 0 and chosen[0] is not None:
        state = checkpoint.from_bytes(Path(chosen[0]).read_bytes())  # rank 0 verified this file
    return state if chosen[0] is not None else None
