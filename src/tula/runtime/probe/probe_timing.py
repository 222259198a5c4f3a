"""How the probe times its steps (:mod:`tula.runtime.timer.timing`'s one timer): the process's first
steps, warm-up, synced and compute-only steps alternating to the stated precision, and the
epoch starts (and AGS refreshes) that training pays apart."""

from __future__ import annotations

from typing import Any

from tula import config as config_mod
from tula.model.grid import paid_mix
from tula.progress import Progress
from tula.runtime.group.agreement import max_over_ranks
from tula.runtime.step.epoch_walk import EpochWalk
from tula.runtime.step.replica import Replica
from tula.runtime.timer.timing import Run, StepTimer, Target, Timing, progress_shown

# epoch-start (and mid-epoch AGS refresh) steps timed at least; forced if too few fell there
EXTRA_STEPS = 3


def probe_target(cfg: config_mod.Config) -> Target:
    """When a probe's timing stops: ``probe.precision`` reached after ``probe.timed_steps``
    steps of each kind, or ``probe.time_budget_s`` spent."""
    p = cfg.probe
    return Target(p.precision, p.timed_steps, p.time_budget_s)


def step_timer(
    replica: Replica, target: Target, block_steps: int | None, mix: dict[str, float] | None = None
) -> StepTimer:
    """The timer that fits the replica's device, its samples the slowest rank's;
    ``block_steps``: probe.block_steps (None: sized from the first steps); ``mix``: the kinds
    of step training pays besides plain ones (:func:`tula.model.grid.paid_mix`)."""
    return StepTimer(
        replica.timer.clock,
        target,
        combine=max_over_ranks,
        block_steps=block_steps,
        mix=mix,
    )


def compute_only(replica: Replica, counted: dict[str, int] | None = None) -> Run:
    """Run the next steps as :meth:`EpochWalk.next_steps` does, under ``DDP.no_sync()``: the
    compute-only arm of the probe and its sweep. ``counted``: the probe's arm, its steps
    counted ("steps") and their micro-batches' part timed (the replica's ``spans``)."""

    def run(steps: int) -> tuple[int, str]:
        with replica.no_sync():
            if counted is None:
                return replica.walk.next_steps(steps)
            with replica.spans.timing():
                n, kind = replica.walk.next_steps(steps)
            counted["steps"] = counted.get("steps", 0) + n
            return n, kind

    return run


def micro_time(replica: Replica, counted: dict[str, int]) -> float | None:
    """Seconds of a compute-only step's micro-batches (their move to the device, forward and
    backward; every micro-batch of an accumulated step), the mean over the ``counted`` steps,
    the slowest rank's; the rest of the compute-only step is what an accumulated step pays once
    (:meth:`tula.model.perf.PerfModel.accumulated`). None where no step was counted."""
    steps = counted.get("steps", 0)
    mean = max_over_ranks([replica.spans.take() / max(steps, 1)])[0]  # every rank calls it
    return mean if steps else None


def synced_lead_in(
    walk: EpochWalk,
    counts: dict[str, int] | None = None,
    until_plain: int = 0,
    rotate: bool = False,
) -> Run:
    """The untimed synced steps that lead a timed step, so that it follows what every training
    step follows: a step that synced. Back to back, compute-only steps read under what they
    cost after a synced one on 2 cores, and synced steps after compute-only ones under
    training's (BENCHMARKS.md "Probe precision"). The probe's timer runs it before each round
    (:meth:`tula.runtime.timer.timing.StepTimer.run`), the compute sweep before each timed block.

    ``counts``: the steps run, added by kind. ``until_plain``: up to that many more single
    steps while the next block is not plain (an epoch's short last batch, its first, an AGS
    refresh), so that the sweep's timed blocks fall on full batches about as often as without
    a lead-in; the probe's timer keeps 0, as its arms time the kinds training pays.

    ``rotate`` (the probe's timer): where a round would start at the same place of the epoch
    (and of the AGS refreshes) as the round before, one more synced step leads it. A round as
    long as the epoch (a lead-in and two arms, an epoch of 3 steps: its first, one plain, its
    short last batch) would otherwise give each arm one kind of step for ever, and the arm that
    never met a plain step would be timed at epoch starts alone (:func:`starts_alike`), its
    other steps set aside."""
    before: tuple[int, int] | None = None  # where the last round started

    def synced(steps: int) -> tuple[int, str]:
        n, kind = walk.next_steps(steps)
        if counts is not None:
            counts[kind] = counts.get(kind, 0) + n
        return n, kind

    def run(steps: int) -> tuple[int, str]:
        nonlocal before
        if rotate:
            here = walk.cycle_place()
            if here == before:
                synced(1)
            before = here
        led = synced(steps)
        for _ in range(until_plain):
            if walk.plain_steps_ahead() >= steps:
                break
            synced(1)
        return led

    return run


def first_steps(replica: Replica) -> tuple[float, float]:
    """Seconds of the first step at this shape (an epoch's first) and of the first short last
    batch (0.0 where the epoch has none), each timed alone, and the first step's compute-only
    twin untimed: what training pays once per shape (compilation, cuDNN's autotuning, the
    allocator's growth, DDP's first buckets, the loader's first batches), as the production
    job's first steps pay it."""
    first, _ = replica.walk.next_timed_step()
    with replica.no_sync():
        replica.walk.next_timed_step()
    # the epoch's short last batch is a shape of its own: its first step now, so that what follows
    # (warm-up from a new epoch's start, the timed steps, the memory steps) is not changed by it
    return first, replica.walk.first_short_step_time()


def time_steps(
    replica: Replica, cfg: config_mod.Config, name: str
) -> tuple[Timing, dict[str, Any]]:
    """Warm-up pairs, then the timer (:class:`tula.runtime.timer.timing.StepTimer`): synced and
    compute-only steps alternating until both means reach ``probe.precision`` or the budget is
    spent; then further epoch starts (and mid-epoch AGS refreshes) until EXTRA_STEPS of each
    are timed. Returns the timing and the other kinds' step times (the slowest rank's), with
    the lead-in steps counted by kind (``lead_in``)."""
    progress = Progress(f"probe {name}", cfg.probe.timed_steps, enabled=replica.rank == 0)
    compute = compute_only(replica)
    warm = 0.0
    for _ in range(cfg.probe.warmup_steps):  # the warm-up pairs meet both kinds of step, untimed
        warm, _ = replica.walk.next_timed_step()
        compute(1)
    mix = paid_mix(
        replica.data.train_size,
        replica.global_batch,
        replica.world,
        replica.cadence.midepoch_refreshes_per_step(),
    )
    timer = step_timer(replica, probe_target(cfg), cfg.probe.block_steps, mix)
    if cfg.probe.warmup_steps:
        timer.size_block(warm)

    shown = progress_shown(progress, cfg.probe.precision, cfg.probe.time_budget_s)

    counted: dict[str, int] = {}  # the compute-only arm's steps, their micro-batches timed
    arms = {"step": replica.walk.next_steps, "compute": compute_only(replica, counted)}
    led: dict[str, int] = {}  # the rounds' untimed synced lead-in steps, by kind
    timing = timer.run(arms, on_check=shown, lead_in=synced_lead_in(replica.walk, led, rotate=True))
    starts_alike(replica, timing, arms)
    micro = micro_time(replica, counted)
    return timing, {**extra_kinds(replica, timing), "lead_in": led, "micro": micro}


def starts_alike(replica: Replica, timing: Timing, arms: dict[str, Run]) -> None:
    """Where an arm met no plain step, every arm is measured at the epoch's first step. An
    epoch of two steps is the case: alternation gives one arm every epoch start and the other
    every short last batch (or every plain step, where B divides D in two), so the arms' mean
    times would be of different kinds. Each arm gets its own epoch starts, timed alone, up to
    EXTRA_STEPS, and its plain samples are set aside; the slowest rank's."""
    if all(arm.times for arm in timing.arms.values()) or replica.steps_per_epoch < 2:
        return
    for name, run in arms.items():
        arm = timing.arms[name]
        own = []
        for _ in range(EXTRA_STEPS - len(arm.other.get("start", []))):
            replica.walk.restart_epoch()
            own.append(replica.timer.time_once(run)[0])
        for t in max_over_ranks(own) if own else []:
            arm.add(t, 1, "start")
        arm.starts_only()


def extra_kinds(replica: Replica, timing: Timing) -> dict[str, list[float]]:
    """Epoch starts (and mid-epoch AGS refreshes) met while timing, then more started until
    EXTRA_STEPS of each are timed, each timed alone; the slowest rank's."""
    met = {k: list(timing.arms["step"].other.get(k, [])) for k in ("start", "refresh", "partial")}
    more: dict[str, list[float]] = {"start": [], "refresh": []}
    while len(met["start"]) + len(more["start"]) < EXTRA_STEPS and replica.steps_per_epoch > 1:
        replica.walk.restart_epoch()
        t, kind = replica.walk.next_timed_step()
        more.setdefault(kind, []).append(t)
    while replica.cadence.midepoch_refreshes_per_step() > 0 and (
        len(met["refresh"]) + len(more["refresh"]) < EXTRA_STEPS
    ):
        replica.refresh_next()
        t, kind = replica.walk.next_timed_step()
        more.setdefault(kind, []).append(t)
    flat = [(k, t) for k in sorted(more) for t in more[k]]
    agreed = max_over_ranks([t for _, t in flat]) if flat else []
    for (k, _), t in zip(flat, agreed):
        met.setdefault(k, []).append(t)
    return met
