"""One timer for the training step: the probe's timed steps, its compute sweep, the production
job's monitor and ``bench/gpu_step.py`` all time steps through :class:`StepTimer`.

How it times fits the device, as the measurement tools do (torch.utils.benchmark's blocked
autorange, pyperf, Triton's ``do_bench``):

- **No queue (CPU).** A step runs when the host calls it, so every timed step is timed alone
  (host clock, device drained before and after) and the arms (a synced step, a compute-only
  step) alternate one step at a time: ``sync = step - compute`` is then taken from steps that
  met the same moments of the machine's noise. An untimed synced step leads each round
  (``lead_in``), so that both arms follow a synced step, as every step of training does.
- **A queue (CUDA).** The host only queues work, and a synchronisation costs tens of
  microseconds. Steps are timed in blocks long enough that the block's one synchronisation
  costs under SYNC_SHARE (1 %) of it, sized from the first steps; each block is a pair of
  CUDA events on the step's stream, read only when the timer checks its precision (one host
  wait per check, none between blocks). The arms' blocks alternate.

**A stated precision.** Each arm's samples (a step, or a block's mean step) give a mean and the
95 % confidence half-width of that mean, relative: ``t(0.975, k-1) * sd / sqrt(k) / mean``. The
timer goes on, round after round, until every arm has at least ``min_steps`` steps (of the kinds
its half-width weighs) and its half-width is at most ``precision``, or until ``budget_s``
seconds of timing are spent; the result says which ended it. The production job pays its slow
steps too, so the figure is the mean (not the median) and its precision is the mean's (on a
queued clock, where a few steps spike, judged by the robust spread:
:mod:`tula.runtime.timer.precision`). Where training pays other kinds of step often (an epoch of 3
steps: its first, one plain, its short last batch), the precision is that of the mean it pays,
weighing every kind's samples by its share (:class:`Series`'s ``mix``): the plain steps alone
would be a third of the samples, and the others' noise unsaid.

**Who sets the pace (a queued clock).** The host's own time to queue a block (``now`` around
the run) over the block's time between its events is the arm's ``host_share`` (its record's
``*_host_share``). Near 1, the device waited for the host (Python, the launch of many small
kernels): a faster device would not help. It is taken only on a block queued onto a drained
device (the first after each check, whose reads wait for the device): once the host is a
queue's length ahead, CUDA holds each launch until a slot frees, so the host's time per block
is the device's whether or not the device ever waited, and the share reads 1 at every batch
(an H200's ResNet-50 probes read about 1 from B = 32, host-bound, to B = 1,024, where the
step grows with B: BENCHMARKS.md "On a GPU"). A step with more kernels than the queue holds
still reads high on a drained device. The host's time also holds any wait the step makes on the
device (a ``.item()``, a copy from pageable memory), which reads the same; Tula's step makes
none (its batches are pinned, copied without blocking).

**Every rank alike.** A step's time is the slowest rank's (the step waits for it); at each check
the ranks combine their new samples with an element-wise maximum (``combine``: one small
all-reduce on the host group), so every rank sees the same series and stops at the same round.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from tula.model.probe_measured import Arm, TimingFigures
from tula.progress import Progress
from tula.runtime.timer.clocks import EventClock, HostClock, block_for
from tula.runtime.timer.precision import Series, spread

# a run of steps: (steps run, their kind): "plain" (a full batch), or "start" (an epoch's first),
# "refresh" (a mid-epoch AGS refresh), "partial" (the epoch's short last batch), each run alone
Run = Callable[[int], tuple[int, str]]


@dataclass(frozen=True)
class Target:
    """When a timer stops: every arm's mean within ``precision`` (relative 95 % half-width)
    after at least ``min_steps`` steps of each arm, or ``budget_s`` seconds of timing spent.
    ``max_steps``: no arm times more steps than this (None: the budget alone bounds it)."""

    precision: float
    min_steps: int
    budget_s: float
    max_steps: int | None = None


@dataclass
class Timing:
    """What a timer measured: each arm's series (the slowest rank's per sample), whether the
    precision was reached, what stopped it, the seconds it took and the block it timed."""

    arms: dict[str, Series]
    target: Target
    reached: bool
    stopped_by: str  # precision | budget | max_steps
    elapsed_s: float
    block_steps: int
    mode: str  # steps (one at a time, host clock) | blocks (device events)

    @property
    def robust(self) -> bool:
        """Judged by the robust spread where steps spike: on a queued clock (a GPU), where a
        step that waited on the host spikes among steps that did not. A host clock's steps are
        judged by their standard deviation, as before (its predictions rest on it)."""
        return self.mode == "blocks"

    def figures(self) -> TimingFigures:
        """The figures a probe record keeps: per arm the steps timed and the half-width
        reached; the target, whether it was reached and what ended the timing."""
        return TimingFigures(
            **{name: self._arm(s) for name, s in self.arms.items()},
            precision_target=self.target.precision,
            precision_reached=self.reached,
            timing_stopped_by=self.stopped_by,
            timing_s=self.elapsed_s,
            timing_budget_s=self.target.budget_s,
            timing_mode=self.mode,
            block_steps=self.block_steps,
        )

    def _arm(self, s: Series) -> Arm:
        mixed = s.mixed_half_width()
        hw = mixed if math.isfinite(mixed) else s.half_width()
        # what the precision rule judged: on a queued clock, the robust spread where a few
        # steps spike
        judged = s.half_width(robust=self.robust)
        return Arm(
            timed_steps=s.n_steps,
            judged_steps=s.judged_steps(),  # what the minimum counts
            other_steps={k: len(v) for k, v in sorted(s.other.items())},
            # the shares of the other kinds the half-width weighed in (None: plain steps alone)
            halfwidth_mix=s.mix if math.isfinite(mixed) else None,
            time_halfwidth_rel=hw if math.isfinite(hw) else None,
            time_halfwidth_judged_rel=judged if math.isfinite(judged) else None,
            spread=_spread_of(s) if self.robust else "sd",
            spikes=s.spikes(),
            host_share=s.host_share(),
        )


def _spread_of(s: Series) -> str:
    """``mad`` where the precision rule judged any kind of the arm's steps by its robust
    spread (a few of them spiked), else ``sd``."""
    kinds = {spread(xs, robust=True)[1] for xs in (s.times, *s.other.values()) if len(xs) >= 2}
    return "mad" if "mad" in kinds else "sd"


def _same(values: list[float]) -> list[float]:
    return values


class StepTimer:
    """Times alternating arms of steps until a :class:`Target` is met (module docstring).

    ``combine(values) -> values``: the element-wise maximum over the ranks (identity for one
    process). ``block_steps``: a queued clock's block (None: sized from the first steps)."""

    def __init__(
        self,
        clock: HostClock | EventClock,
        target: Target | None = None,
        combine: Callable[[list[float]], list[float]] = _same,
        block_steps: int | None = None,
        check_every: int = 4,
        mix: dict[str, float] | None = None,
        now: Callable[[], float] = time.perf_counter,
    ):
        self.clock, self.target, self.combine = clock, target, combine
        self.now = now  # the host's clock: the timer's budget, and a queued block's enqueue time
        self.mix = mix  # each arm's :attr:`Series.mix`: the kinds training pays, and how often
        self.block = 1 if not clock.queued else block_steps
        self.check_every = check_every
        self._elapsed = 0.0  # seconds of timing so far, the slowest rank's (at the last check)

    def size_block(self, first_step_s: float) -> int:
        """A queued clock's block, from a step's seconds and the sync's cost, agreed over ranks."""
        if self.block is None:
            own = block_for(first_step_s, self.clock.sync_cost_s())
            self.block = int(max(self.combine([float(own)])))
        return self.block

    def time_once(self, run: Run, steps: int = 1) -> tuple[float, int, str]:
        """One run timed at once, read at once: (seconds per step, steps, kind)."""
        seconds, (n, kind) = self.time_call(lambda: run(steps))
        return seconds / max(n, 1), n, kind

    def time_call(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        """Any call timed as the steps are, read at once: (seconds, what it returned)."""
        mark = self.clock.begin()
        value = fn()
        return self.clock.read(self.clock.end(mark)), value

    def run(
        self,
        arms: dict[str, Run],
        on_check: Callable[[Timing], None] | None = None,
        lead_in: Run | None = None,
    ) -> Timing:
        """Round after round, one sample of each arm in turn, until the target is met or the
        budget is spent, judged every ``check_every`` rounds (one host wait for a queued clock,
        one all-reduce over the ranks). ``on_check`` sees the timing so far (progress).

        ``lead_in``: a step run untimed before each round where steps are timed one by one (a
        clock without a queue), so that the round's first arm follows what it follows in
        training. The probe's is a synced step: its synced arm then follows a synced step, as
        every training step does, not a compute-only one, which on 2 cores made it read faster
        than production (BENCHMARKS.md "Probe precision"). A queued clock's blocks follow their
        own kind but for their first step, so there it is left out.

        The timer runs the steps itself here; :class:`Rounds` is the same schedule for a
        caller that runs them (a user's own training loop, :mod:`tula.script`)."""
        rounds = Rounds(self, list(arms), on_check, lead_in is not None)
        while (run := rounds.next()) is not None:
            name, steps = run
            if name != LEAD_IN:
                rounds.begin()
            n, kind = (lead_in if name == LEAD_IN else arms[name])(steps)
            rounds.ran(n, kind)
        return rounds.timing()

    def _settle(
        self,
        pending: list[tuple[str, Any, int, str, float | None]],
        series: dict[str, Series],
        elapsed: float,
    ) -> None:
        """Read the pending samples (the device is drained after), take the slowest rank's of
        each, and add them (on a queued clock with the host's time to queue the block queued
        onto a drained device, the slowest rank's too; -1 stands for none in the all-reduce,
        at the same place on every rank)."""
        own = [self.clock.read(h) / max(n, 1) for _, h, n, _, _ in pending]
        host = (
            [-1.0 if q is None else q / max(n, 1) for _, _, n, _, q in pending]
            if self.clock.queued
            else []
        )
        agreed = self.combine([*own, *host, elapsed])
        self._elapsed = agreed[-1]
        hosts = [None if q < 0 else q for q in agreed[len(own) : -1]] or [None] * len(own)
        for (name, _, n, kind, _), t, q in zip(pending, agreed[: len(own)], hosts):
            series[name].add(t, n, kind, q)

    def _verdict(self, series: dict[str, Series]) -> tuple[bool, str]:
        """Reached: every arm has its minimum of the steps its half-width is over (with a mix,
        every kind's in it: an H200's B = 1,024 probe was at 0.4 % on 14 plain steps and 6
        epoch starts, and was said to have missed) and a half-width within the target. Else
        the budget, once every arm has its minimum of steps of any kind (an epoch whose every
        step is its first still ends), or the step cap."""
        tg = self.target
        assert tg is not None
        if all(
            s.judged_steps() >= tg.min_steps
            and s.half_width(robust=self.clock.queued) <= tg.precision
            for s in series.values()
        ):
            return True, "precision"
        least = min(s.n_steps + sum(map(len, s.other.values())) for s in series.values())
        if self._elapsed >= tg.budget_s and least >= tg.min_steps:
            return False, "budget"
        if tg.max_steps is not None and least >= tg.max_steps:
            return False, "max_steps"
        return False, ""

    def _timing(
        self, series: dict[str, Series], reached: bool, stopped: str, t0: float, block: int
    ) -> Timing:
        assert self.target is not None
        return Timing(
            series,
            self.target,
            reached,
            stopped,
            self.now() - t0,
            block,
            "blocks" if self.clock.queued else "steps",
        )


def progress_shown(
    progress: Progress, precision: float, budget_s: float
) -> Callable[[Timing], None]:
    """The timer's check, shown: the steps timed, the precision reached, and the steps the
    precision still asks (the half-width falls as 1/sqrt(n)) or the budget allows."""

    def shown(t: Timing) -> None:
        n = t.arms["step"].n_steps
        hw = max((s.half_width(robust=t.robust) for s in t.arms.values()), default=math.inf)
        want = n * (hw / precision) ** 2 if math.isfinite(hw) else n
        progress.retotal(max(n, int(min(want, n * budget_s / max(t.elapsed_s, 1e-9)))))
        progress.update(n, "timed ", f"precision {100 * hw:.1f} % (target {100 * precision:g} %)")

    return shown


# the untimed step that leads each round on a clock without a queue (StepTimer.run's lead_in)
LEAD_IN = "lead-in"


class Rounds:
    """:meth:`StepTimer.run`'s schedule, for a caller that runs the steps: :meth:`next` says
    what to run (an arm's name, or :data:`LEAD_IN`, and how many steps), :meth:`begin` marks
    where a timed run starts (again, if what the caller does first should not count), and
    :meth:`ran` says that it ran; :meth:`timing` is the result once :meth:`next` says None.
    The timer's own loop and a user's training loop (:mod:`tula.script`) keep one schedule,
    one precision rule and one record."""

    def __init__(
        self,
        timer: StepTimer,
        arms: list[str],
        on_check: Callable[[Timing], None] | None = None,
        lead_in: bool = False,
    ):
        assert timer.target is not None, "StepTimer.run needs a Target"
        self.timer, self.arms, self.on_check = timer, arms, on_check
        self.lead_in = lead_in and not timer.clock.queued
        self.sizing = timer.block is None  # the first run, timed alone, sizes the block
        self.drained = self.sizing  # is the device idle as the next block is queued
        self.series = {name: Series(mix=timer.mix) for name in arms}
        self.pending: list[tuple[str, Any, int, str, float | None]] = []
        self.rounds, self.stopped, self.reached = 0, "", False
        self.mark: Any = None
        self.queued_at = 0.0
        self.t0 = timer.now()
        self.todo: list[str] = []
        if not self.sizing:
            self._new_round()

    def _new_round(self) -> None:
        self.todo = ([LEAD_IN] if self.lead_in else []) + list(self.arms)

    @property
    def block(self) -> int:
        return int(self.timer.block or 1)

    def next(self) -> tuple[str, int] | None:
        """What to run next: (an arm's name or LEAD_IN, steps), or None once stopped."""
        if self.sizing:
            return self.arms[0], 1
        return None if self.stopped else (self.todo[0], self.block)

    def begin(self) -> None:
        """A timed run starts now (taken again where called again before :meth:`ran`)."""
        self.mark = self.timer.clock.begin()
        self.queued_at = self.timer.now()

    def ran(self, n: int, kind: str) -> None:
        """What :meth:`next` asked for ran: ``n`` steps of ``kind``."""
        timer = self.timer
        if self.sizing:
            seconds = timer.clock.read(timer.clock.end(self.mark))
            timer.size_block(seconds / max(n, 1))
            self.sizing, self.t0 = False, timer.now()
            self._new_round()
            return
        name = self.todo.pop(0)
        if name != LEAD_IN:
            # on a queued clock, the host's time to queue it, where no full queue held it
            host = timer.now() - self.queued_at if self.drained else None
            self.drained = False
            self.pending.append((name, timer.clock.end(self.mark), n, kind, host))
        if self.todo:
            return
        self.rounds += 1
        if self.rounds % timer.check_every == 0:
            timer._settle(self.pending, self.series, timer.now() - self.t0)
            self.pending, self.drained = [], True
            self.reached, self.stopped = timer._verdict(self.series)
            if self.on_check is not None:
                self.on_check(self.timing("running"))
        if not self.stopped:
            self._new_round()

    def timing(self, stopped: str | None = None) -> Timing:
        return self.timer._timing(
            self.series, self.reached, stopped or self.stopped, self.t0, self.block
        )
