"""Fault injection for the production training job (tests and drills; off by default).

Set ``TULA_INJECT_TRAIN_FAULT`` in the environment of ``tula launch`` (the local executor
and sbatch both pass it on to the workers). Faults are separated by ``;``, each is
``kind:key=value,...``, and ``step`` counts optimizer steps already taken (global):

``oom:step=K,rank=R[,batch=B][,where=W]``
    rank R raises a real ``torch.OutOfMemoryError`` at place W of step K (only while the
    global batch is B, when given). The recovery path is the real one (see train.py):

    - ``forward`` (default): inside the model's forward pass of step K. All ranks agree,
      the attempt ends as ``oom``, ``tula launch`` relaunches at a smaller B.
    - ``backward``: in the backward pass of step K, while the peers are inside DDP's
      gradient all-reduce, where no agreement is possible: rank R leaves a record in
      ``oom/`` and exits, and the launcher classifies the attempt as ``oom`` from it.
    - ``refresh``: in the forward of AGS's factor refresh in step K (an epoch's first
      step, or every ``ags_refresh_every_steps``); agreed through the refresh's all-reduce.
    - ``eval``: in the evaluation that follows the epoch ending at step K; agreed, and the
      evaluation runs again at half the evaluation batch, without a relaunch.
    - ``checkpoint``: while writing the checkpoint of step K; agreed, nothing half-written,
      the attempt ends as ``oom`` and resumes from the previous checkpoint.

    Each fault fires at most once in a process (so an evaluation retried at a smaller
    batch succeeds); a relaunched attempt is a new process and meets it again unless
    ``batch=`` names the batch that ran out of memory.
``signal:step=K,sig=USR2|TERM[,rank=R]``
    before step K every rank (or only rank R) sends itself the signal, as SLURM does on
    preemption/timeout (USR2, submitit's requeue signal) or on scancel/requeue (TERM). It
    fires once: a run resumed at step K does not send it again.
``truncate:step=K``
    the checkpoint written at step K is cut to half its size after it was written, as a
    torn write would leave it. The next resume must fall back to the previous one.

Example: ``TULA_INJECT_TRAIN_FAULT="oom:step=12,rank=1,batch=128;truncate:step=10"``.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

# torch is imported inside the functions that touch tensors (they run in the workers, where it is
# loaded already): `tula launch` checks a fault spec without paying its start-up.

ENV = "TULA_INJECT_TRAIN_FAULT"
KINDS = {"oom": {"step", "rank", "batch", "where"}, "signal": {"step", "sig", "rank"}, "truncate": {"step"}}
WHERE = ("forward", "backward", "refresh", "eval", "checkpoint")
SIGNALS = {"USR2": signal.SIGUSR2, "TERM": signal.SIGTERM, "USR1": signal.SIGUSR1}


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: int | None = None
    batch: int | None = None
    sig: str | None = None
    where: str = "forward"


def parse(spec: str | None) -> list[Fault]:
    """Faults of a ``TULA_INJECT_TRAIN_FAULT`` value; a malformed one is an error naming it."""
    faults: list[Fault] = []
    for item in (spec or "").split(";"):
        item = item.strip()
        if not item:
            continue
        kind, _, rest = item.partition(":")
        kind = kind.strip()
        if kind not in KINDS:
            raise ValueError(f"{ENV}: unknown fault kind {kind!r} in {item!r} ({', '.join(KINDS)})")
        kv: dict[str, str] = {}
        for pair in filter(None, (p.strip() for p in rest.split(","))):
            k, eq, v = pair.partition("=")
            if not eq or k not in KINDS[kind]:
                raise ValueError(f"{ENV}: bad field {pair!r} in {item!r} (a {kind} fault takes {sorted(KINDS[kind])})")
            kv[k] = v.strip()
        if "step" not in kv:
            raise ValueError(f"{ENV}: {item!r} needs step=K")
        sig = kv.get("sig")
        if kind == "signal" and sig not in SIGNALS:
            raise ValueError(f"{ENV}: {item!r} needs sig= one of {', '.join(SIGNALS)}")
        where = kv.get("where", "forward")
        if where not in WHERE:
            raise ValueError(f"{ENV}: where={where!r} in {item!r} is not one of {', '.join(WHERE)}")
        try:
            faults.append(Fault(kind, int(kv["step"]), int(kv["rank"]) if "rank" in kv else None,
                                int(kv["batch"]) if "batch" in kv else None, sig, where))  # fmt: skip
        except ValueError:
            raise ValueError(f"{ENV}: step, rank and batch must be integers in {item!r}") from None
    return faults


def from_env() -> list[Fault]:
    return parse(os.environ.get(ENV))


def maybe_oom(faults: list[Fault], where: str, step: int, rank: int, global_batch: int, fired: set[Fault]) -> None:
    """Raise the ``oom`` fault due at this place, step, rank and batch, unless it fired
    already in this process (``fired`` remembers)."""
    import torch

    for f in faults:
        if (f.kind == "oom" and f.where == where and f.step == step and f.rank in (None, rank)
                and f.batch in (None, global_batch) and f not in fired):  # fmt: skip
            fired.add(f)
            raise torch.OutOfMemoryError(f"injected by {ENV}: out of memory in {where} at step {step} on rank "
                                         f"{rank} (global batch {global_batch})")  # fmt: skip


def maybe_signal(faults: list[Fault], step: int, rank: int, resumed_at: int) -> None:
    for f in faults:
        if f.kind == "signal" and f.step == step and step != resumed_at and f.rank in (None, rank):
            os.kill(os.getpid(), SIGNALS[f.sig])


def truncate_due(faults: list[Fault], step: int) -> bool:
    return any(f.kind == "truncate" and f.step == step for f in faults)
