"""Fault injection for tests and drills (off by default): one spec language, one injector,
for the probes and the production job alike.

Set ``TULA_INJECT_FAULT`` in the environment of ``snakemake``, ``tula probe`` or ``tula
launch`` (torchrun, the local executor and sbatch all pass it on to the workers). Faults are
separated by ``;``, each is ``kind:key=value,...``. ``step`` counts optimizer steps already
taken (global); ``point=N2_B64`` limits a fault to the probe of that (N, B) -- a fault
without ``point`` is for the production job (and the runs of the generalization suite),
never for a probe. ``rank`` limits it to one rank; each fault fires at most once in a process.

``oom:[step=K][,rank=R][,batch=B][,where=W][,point=P]``
    a real ``torch.OutOfMemoryError`` at place W of step K (any step when not given; only
    while the global batch is B, when given). The recovery path is the real one:

    - ``forward`` (default): inside the model's forward pass. All ranks agree in the step;
      the attempt ends as ``oom`` and ``tula launch`` relaunches at a smaller B (a probe is
      recorded with status ``oom``).
    - ``backward``: at the start of backward, while the peers are inside DDP's gradient
      all-reduce, where no agreement is possible: the rank leaves a record in ``oom/`` and
      exits, and the launcher classifies the attempt as ``oom`` from it.
    - ``refresh``: in the forward of AGS's factor refresh (an epoch's first step, or every
      ``ags_refresh_every_steps``); agreed through the refresh's all-reduce.
    - ``eval``: in the evaluation that follows the epoch ending at step K; agreed, and the
      evaluation runs again at half the evaluation batch, without a relaunch.
    - ``checkpoint``: while writing the checkpoint of step K; agreed, nothing half-written,
      the attempt ends as ``oom`` and resumes from the previous checkpoint.
``error:point=P[,rank=R]``
    a ``RuntimeError`` as the probe starts (a crashing worker).
``profiler:point=P[,rank=R][,tries=T]``
    the probe's first T CPU memory timelines (default 1) fail, as torch's profiler's "version
    mismatch" AssertionError does about once in ten probes here: the ranks measure one more
    step. Where every try fails (``tries=6``, seen once in a CI run), the point keeps its timing
    without its memory peak, and its record says why (``peak_error``).
``crash:point=P[,rank=R][,attempts=A][,where=profiler|sweep]``
    the worker dies by SIGSEGV without writing its result (torch's CPU profiler did this once
    in a CI run; a node's hiccup looks the same), in the probe's first A launches (default 1):
    where the profiler's memory timeline is built (default), before the measurement stands, or
    as the compute sweep starts, after rank 0 wrote the measurement (seen in a benchmark run).
    A probe that loses a rank so is launched once more.
``hang:point=P[,rank=R][,where=PHASE]``
    the worker stops as it reaches PHASE (one of :data:`PROBE_PHASES`; default
    ``started``) and waits there for ever, as a rank stuck in a collective or a dead file system
    would: the probe ends at ``probe.timeout_s``, and its record says where each rank was.
``signal:step=K,sig=USR2|TERM[,rank=R]``
    before step K every rank (or only rank R) sends itself the signal, as SLURM does on
    preemption/timeout (USR2, submitit's requeue signal) or on scancel/requeue (TERM). A run
    resumed at step K does not send it again.
``slowsync:step=K,ms=M[,workers=N]``
    from step K on, every synced step of the production job waits M ms after backward, as a
    slower network would make its gradient all-reduce (only at N workers, when given;
    compute-only steps under ``no_sync`` do not wait). The network lab (scripts/netlab.sh)
    slows a real link; this is the same drift where no lab can be made.
``truncate:step=K``
    the checkpoint written at step K is cut to half its size after it was written, as a torn
    write would leave it. The next resume must fall back to the previous one.

Example: ``TULA_INJECT_FAULT="oom:step=12,rank=1,batch=128;truncate:step=10"``, or for the
probe at N=2, B=128: ``TULA_INJECT_FAULT="oom:point=N2_B128,rank=1"``.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from dataclasses import dataclass

# torch is imported inside the functions that touch tensors (they run in the workers, where it is
# loaded already): `tula launch` checks a fault spec without paying its start-up.

ENV = "TULA_INJECT_FAULT"
# a probe worker's phases, in order (:class:`tula.runtime.probe.probe_worker.Phases` enters them;
# :func:`tula.workers.phases.mark` says them beside the rank's result): where a hang can wait
PROBE_PHASES = (
    "started",  # the worker's Python has imported torch and Tula
    "process group",  # the rendezvous of the N workers
    "model and data",  # the model, the optimizer, the dataset and its DataLoader
    "first steps",  # the first training steps, as the production job pays them
    "memory step",
    "timed steps",
    "peaks and input",  # each step's memory peaks, then the input pipeline alone
    "gathering",  # rank 0 collects every rank's measurement
    "overheads",  # start-up, evaluation passes, a checkpoint
    "noise",  # the gradient noise scale
    "sweep",  # the compute curve at the other local batches
    "leaving",  # the result is written; the process group shuts down
)
KINDS = {
    "oom": {"step", "rank", "batch", "where", "point"},
    "error": {"rank", "point"},
    "profiler": {"rank", "point", "tries"},
    "crash": {"rank", "point", "attempts", "where"},
    "hang": {"rank", "point", "where"},
    "signal": {"step", "sig", "rank"},
    "truncate": {"step"},
    "slowsync": {"step", "ms", "workers"},
}
NEEDS = {
    "oom": (),
    "error": ("point",),
    "profiler": ("point",),
    "crash": ("point",),
    "hang": ("point",),
    "signal": ("step", "sig"),
    "truncate": ("step",),
    "slowsync": ("step", "ms"),
}
# the kinds a probe can be given
PROBE_KINDS = {kind for kind, fields in KINDS.items() if "point" in fields}
INTEGERS = (
    "step",
    "rank",
    "batch",
    "ms",
    "workers",
    "attempts",
    "tries",
)  # the fields that are numbers
WHERE = ("forward", "backward", "refresh", "eval", "checkpoint")
SIGNALS = {"USR2": signal.SIGUSR2, "TERM": signal.SIGTERM, "USR1": signal.SIGUSR1}
CRASH_WHERE = ("profiler", "sweep")  # where a crash may be put (the first is its default)
PLACE_OF = {
    "error": "start",
    "profiler": "profiler",
}  # where the other kinds fire


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int | None = None
    rank: int | None = None
    batch: int | None = None
    sig: str | None = None
    where: str = "forward"
    point: str | None = None
    ms: int | None = None
    workers: int | None = None
    attempts: int | None = None
    tries: int | None = None  # a profiler fault: how many timelines fail

    @property
    def place(self) -> str:
        return PLACE_OF.get(self.kind, self.where)


def parse(spec: str | None) -> list[Fault]:
    """Faults of a ``TULA_INJECT_FAULT`` value; a malformed one is an error naming it."""
    return [_parse_one(item.strip()) for item in (spec or "").split(";") if item.strip()]


def _parse_one(item: str) -> Fault:
    kind, _, rest = item.partition(":")
    kind = kind.strip()
    if kind not in KINDS:
        raise ValueError(f"{ENV}: unknown fault kind {kind!r} in {item!r} ({', '.join(KINDS)})")
    kv: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in rest.split(","))):
        k, eq, v = pair.partition("=")
        if not eq or k not in KINDS[kind]:
            raise ValueError(
                f"{ENV}: bad field {pair!r} in {item!r} (a {kind} fault takes "
                f"{sorted(KINDS[kind])})"
            )
        kv[k] = v.strip()
    missing = [k for k in NEEDS[kind] if k not in kv]
    if missing:
        raise ValueError(f"{ENV}: {item!r} needs {', '.join(f'{k}=' for k in missing)}")
    if kind == "signal" and kv["sig"] not in SIGNALS:
        raise ValueError(f"{ENV}: {item!r} needs sig= one of {', '.join(SIGNALS)}")
    places = {"crash": CRASH_WHERE, "hang": PROBE_PHASES}.get(kind, WHERE)
    where = kv.get("where", places[0])
    if where not in places:
        raise ValueError(f"{ENV}: where={where!r} in {item!r} is not one of {', '.join(places)}")
    try:
        number = {k: int(kv[k]) for k in INTEGERS if k in kv}
    except ValueError:
        names = f"{', '.join(INTEGERS[:-1])} and {INTEGERS[-1]}"
        raise ValueError(f"{ENV}: {names} must be integers in {item!r}") from None
    return Fault(kind, sig=kv.get("sig"), where=where, point=kv.get("point"), **number)


def from_env() -> list[Fault]:
    return parse(os.environ.get(ENV))


class Injector:
    """Raises the faults due in this process where the step calls it: ``injector(place, step,
    global_batch)`` at each place an error can happen (inside the model's forward, at the
    start of backward, while checkpointing, as a probe starts, after a memory timeline).
    ``point``: the probe's (N, B) name; None in the production job; ``attempt``: which launch
    of that probe this is (a ``crash`` fires in the first ``attempts``). Each fault fires once
    (a ``profiler`` fault ``tries`` times)."""

    def __init__(self, faults: list[Fault], rank: int, point: str | None = None, attempt: int = 1):
        self.rank, self.point = rank, point
        self.faults = [
            f
            for f in faults
            if f.kind in PROBE_KINDS - {"hang"}  # a hang waits at a phase: hang_if_due
            and f.point == point
            and f.rank in (None, rank)
            and (f.kind != "crash" or attempt <= (f.attempts or 1))
        ]
        self.fired: Counter[Fault] = Counter()

    def __bool__(self) -> bool:
        return bool(self.faults)

    def __call__(self, place: str, step: int, global_batch: int) -> None:
        for f in self.faults:
            if (
                f.place == place
                and f.step in (None, step)
                and f.batch in (None, global_batch)
                and self.fired[f] < (f.tries or 1)
            ):
                self.fired[f] += 1
                if f.kind == "crash":  # dies as a segfault does: no exception, no result written
                    os.kill(os.getpid(), signal.SIGSEGV)
                raise _exception(f, place, step, self.rank, global_batch, self.point)


def _exception(
    f: Fault, place: str, step: int, rank: int, global_batch: int, point: str | None
) -> Exception:
    at = f"{place} at step {step} on rank {rank} (global batch {global_batch}" + (
        f", probe {point})" if point else ")"
    )
    if f.kind == "oom":
        import torch  # the worker's torch, loaded already

        return torch.OutOfMemoryError(f"injected by {ENV}: out of memory in {at}")
    if f.kind == "profiler":
        return AssertionError(
            f"version mismatch (injected by {ENV}: the profiler's memory timeline, {at})"
        )
    return RuntimeError(f"injected by {ENV}: error in {at}")


def hang_if_due(faults: list[Fault], rank: int, point: str, phase: str) -> None:
    """A ``hang`` fault for this rank of probe ``point`` at ``phase``: wait here for ever."""
    if any(
        f.kind == "hang" and f.point == point and f.rank in (None, rank) and f.where == phase
        for f in faults
    ):
        while True:
            time.sleep(3600)


def maybe_signal(faults: list[Fault], step: int, rank: int, resumed_at: int) -> None:
    for f in faults:
        if f.kind == "signal" and f.step == step and step != resumed_at and f.rank in (None, rank):
            os.kill(os.getpid(), SIGNALS[f.sig])


def sync_delay_s(faults: list[Fault], step: int, world: int) -> float:
    """Seconds a synced step at ``step`` waits in its communication (``slowsync``), 0 if none."""
    return sum(
        f.ms / 1e3
        for f in faults
        if f.kind == "slowsync" and step >= f.step and f.workers in (None, world)
    )


def truncate_due(faults: list[Fault], step: int) -> bool:
    return any(f.kind == "truncate" and f.step == step for f in faults)
