"""Rank agreement: every rank of the group learns which ranks failed (ran out of memory, or
could not measure) from an all-reduce, so that all of them stop, retry or go on together.

A rank that raises alone leaves its peers waiting in the next collective until the process
group's timeout; so wherever a failure can happen, the ranks agree on it through a
collective they make anyway (the step's flags, AGS's refresh all-reduce, evaluation's sums,
one all-reduce after a checkpoint), and all raise :class:`StepOOM` together.
"""

from __future__ import annotations


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
    return {"refresh": f"in AGS's factor refresh of step {step}"}.get(where, f"in the {where} pass of step {step}")
