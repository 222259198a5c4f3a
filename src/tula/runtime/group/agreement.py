"""Rank agreement: every rank of the group learns which ranks failed (ran out of memory, or
could not measure) from an all-reduce, so that all of them stop, retry or go on together.

A rank that raises alone leaves its peers waiting in the next collective until the process
group's timeout; so wherever a failure can happen, the ranks agree on it through a
collective they make anyway (the step's flags, AGS's refresh all-reduce, evaluation's sums,
one all-reduce after a checkpoint), and all raise :class:`StepOOM` together.
"""

from __future__ import annotations

import torch
import torch.distributed as torch_dist


class StepOOM(Exception):
    """Every rank agreed that some rank ran out of memory: in the forward pass of a step
    (the step's flag all-reduce), in AGS's refresh (its all-reduce), in evaluation at the
    smallest evaluation batch, or while checkpointing. ``where`` names the place."""

    def __init__(self, ranks: list[int], message: str, where: str = "forward"):
        super().__init__(message)
        self.ranks, self.message, self.where = ranks, message, where


def oom_place(where: str, step: int) -> str:
    """Where an out-of-memory error happened, in words ("in the backward pass of step 12")."""
    if where == "eval":
        return f"in evaluation after step {step}"
    if where == "checkpoint":
        return f"while writing the checkpoint of step {step}"
    if where == "step":
        return f"in training step {step + 1}"
    return {"refresh": f"in AGS's factor refresh of step {step}"}.get(
        where, f"in the {where} pass of step {step}"
    )


def agree(
    failed: bool, payload: torch.Tensor | None = None, op: str = "sum"
) -> tuple[torch.Tensor | None, list[int]]:
    """One all-reduce of ``payload`` with one flag per rank riding along: returns the payload
    reduced over the ranks (``op``: "sum" or "max") and the ranks whose ``failed`` was set.

    Every rank must call it at the same place; with one process (no group, or a group of one)
    there is nothing to agree on and the payload comes back as it was."""
    if (
        not (torch_dist.is_available() and torch_dist.is_initialized())
        or torch_dist.get_world_size() == 1
    ):
        return payload, [0] if failed else []
    world, rank = torch_dist.get_world_size(), torch_dist.get_rank()
    device = payload.device if payload is not None else _device()
    dtype = payload.dtype if payload is not None and payload.is_floating_point() else torch.float32
    flags = torch.zeros(world, dtype=dtype, device=device)
    flags[rank] = float(bool(failed))
    buf = flags if payload is None else torch.cat([payload.reshape(-1).to(dtype), flags])
    torch_dist.all_reduce(
        buf, op=torch_dist.ReduceOp.MAX if op == "max" else torch_dist.ReduceOp.SUM
    )
    failed_ranks = [k for k in range(world) if buf[buf.numel() - world + k] > 0]
    if payload is None:
        return None, failed_ranks
    return buf[: payload.numel()].view_as(payload).to(payload.dtype), failed_ranks


# a gloo group beside an NCCL one (tula.runtime.group.dist.init): flags the host knows
HOST_GROUP: list = [None]


def ensure_host_group() -> None:
    """A gloo group beside the default one where that is NCCL's (a user's script joined the
    group itself): the host's flags and timings travel over it, never waiting for the device."""
    if HOST_GROUP[0] is not None or not torch_dist.is_initialized():
        return
    if torch_dist.get_backend() == "nccl" and torch_dist.get_world_size() > 1:
        HOST_GROUP[0] = torch_dist.new_group(backend="gloo")


def agree_host(failed: bool, code: int = 0) -> tuple[int, list[int]]:
    """The step's agreement on what each rank's host already knows (it caught an out-of-memory
    error, a stop was asked: ``code``): one all-reduce of a small CPU tensor, over the gloo
    group beside NCCL's (or gloo's own group on CPU). It never waits for the device, so the
    host can queue the next step while the device still runs this one. Returns (the largest
    code, the ranks that failed); with one process nothing is sent."""
    if (
        not (torch_dist.is_available() and torch_dist.is_initialized())
        or torch_dist.get_world_size() == 1
    ):
        return code, [0] if failed else []
    world, rank = torch_dist.get_world_size(), torch_dist.get_rank()
    buf = torch.zeros(world + 1, dtype=torch.float64)
    buf[rank], buf[world] = float(bool(failed)), float(code)
    torch_dist.all_reduce(buf, op=torch_dist.ReduceOp.MAX, group=HOST_GROUP[0])
    vals = buf.tolist()  # a CPU tensor: no device read
    return int(vals[world]), [k for k in range(world) if vals[k] > 0]


def _device() -> torch.device:
    """The device collectives of this group run on: NCCL needs CUDA tensors, gloo takes CPU ones."""
    if torch_dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def max_over_ranks(values: list[float]) -> list[float]:
    """The element-wise maximum of ``values`` over the ranks (the slowest rank's times): one
    all-reduce of a CPU tensor over the host group; with one process, ``values`` as they are.
    Every rank must call it at the same place with as many values."""
    if (
        not (torch_dist.is_available() and torch_dist.is_initialized())
        or torch_dist.get_world_size() == 1
    ):
        return list(values)
    buf = torch.tensor(values, dtype=torch.float64)
    torch_dist.all_reduce(buf, op=torch_dist.ReduceOp.MAX, group=HOST_GROUP[0])
    return buf.tolist()
