"""A timing probe of the user's own script: the probe Tula's own loop gets
(:mod:`tula.runtime.probe.probe_worker`), with the script's loop running the steps.

The schedule is the same: the first step timed alone and its compute-only twin (what a job
pays once), the warm-up pairs, then :class:`tula.runtime.timer.timing.Rounds`, the timer's own
rounds of a synced and a compute-only step (under DDP's ``no_sync()``) led by an untimed
synced step, until ``probe.precision`` or the budget; one step's memory peak; epoch starts
timed alone until there are three (``run.batches`` ends an epoch early to reach one); one
checkpoint of the kept parts timed. Each step's kind comes from ``run.batches``. Rank 0
builds the same :class:`tula.model.probe_measured.Measurement` from every rank's samples, and
each rank writes its :class:`tula.model.probe_record.RankResult` where the probe job reads
it; then the process ends (the script's epochs are not trained)."""

from __future__ import annotations

import contextlib
import time
import traceback
from dataclasses import dataclass
from typing import Any, Generator, Iterator

import torch
import torch.distributed as torch_dist

from tula import faults
from tula.io import write_json
from tula.model.grid import paid_mix
from tula.model.probe_record import Failure, RankResult
from tula.progress import Progress
from tula.runtime.group.agreement import agree, agree_host, ensure_host_group, max_over_ranks
from tula.runtime.probe.measure import PROFILER_TRIES, cpu_peak_counter
from tula.runtime.probe.probe_timing import EXTRA_STEPS
from tula.runtime.timer.clocks import clock_for
from tula.runtime.timer.timing import LEAD_IN, Rounds, StepTimer, Target, Timing, progress_shown
from tula.script import probe_result
from tula.script.base import Loop, Plain, Stepping
from tula.workers.phases import mark, point_dir
from tula.workers.processes import result_path


@dataclass(frozen=True)
class Ask:
    """What the next step is to be: synced or compute-only, timed alone, in the timer's
    rounds or not at all, and whether its memory peak is measured."""

    synced: bool = True
    timed: str | None = None  # alone | round
    memory: bool = False
    first: bool = True  # the first step of a timed run: its clock starts before it


@dataclass(frozen=True)
class Ran:
    """How the step asked for went: its seconds (timed alone), kind and peak bytes."""

    seconds: float | None
    kind: str
    peak: int | None = None


Schedule = Generator[Ask, Ran, None]


class Probe(Plain):
    """The probe's driver in one rank of the script (module docstring)."""

    def __init__(self, run: Loop):
        super().__init__(run)
        assert run.spec is not None and run.spec.probe is not None
        self.ask = run.spec.probe
        self.dir = point_dir(self.ask.result_dir, self.ask.point)
        self.faults = faults.from_env()
        self.phase("started")
        self.sched: Schedule | None = None
        self.now: Ask | None = None
        self.mark: Any = None  # a step timed alone: the clock's mark
        self.fresh = False  # the timed step asked for has not begun (re-marked at an epoch start)
        self.rounds: Rounds | None = None
        self.first_s = 0.0
        self.gaps: list[float] = []  # the script's time between an epoch and the next
        self.epoch_ended_at: float | None = None
        self.first_step_at = 0.0
        self.result: dict[str, Any] = {}  # what the schedule measured, for the record

    def phase(self, name: str) -> None:
        mark(self.dir, self.run.rank, name)
        faults.hang_if_due(self.faults, self.run.rank, self.ask.point, name)

    # -- the run's calls ----------------------------------------------------------------
    def epoch_starts(self) -> None:
        if self.epoch_ended_at is not None:
            self.gaps.append(time.perf_counter() - self.epoch_ended_at)
            self.epoch_ended_at = None
        self.start()
        if self.fresh:  # the loader's start is the step's, what the script did before is not
            self.begin()

    def epoch_ends(self) -> None:
        self.sync()
        self.epoch_ended_at = time.perf_counter()

    @contextlib.contextmanager
    def step(self, now: Stepping) -> Iterator[None]:
        self.start()
        ask = self.now
        assert ask is not None
        self.fresh = False
        # the production job's agreement before each step (its stop: a signal, a move)
        agree_host(False, 0)
        try:
            with contextlib.ExitStack() as stack:
                if not ask.synced:
                    stack.enter_context(self.parts.no_sync())
                if ask.memory:
                    peak = stack.enter_context(self.peak_counter())
                yield
            if ask.memory:
                self.result["peak"] = peak["bytes"]
        except AssertionError:  # the CPU profiler built no memory timeline: tried again
            if not ask.memory:
                raise
            self.result["peak"] = None
        except torch.OutOfMemoryError as exc:
            first = (str(exc).splitlines() or [""])[0]
            self.failed(Failure("oom", f"out of memory on rank {self.run.rank}: {first}"))
            raise
        except Exception as exc:
            self.failed(
                Failure(
                    "error",
                    f"rank {self.run.rank}: {type(exc).__name__}: {exc}",
                    traceback=traceback.format_exc(),
                    failed_at=time.time(),
                )
            )
            raise

    def stepped(self, now: Stepping) -> None:
        ask = self.now
        assert ask is not None and self.sched is not None
        seconds = None
        if ask.timed == "alone":
            seconds = self.clock.read(self.clock.end(self.mark))
        ran = Ran(seconds, now.kind, self.result.pop("peak", None) if ask.memory else None)
        try:
            self.now = self.sched.send(ran)
        except StopIteration:
            self.done()
        self.begin()

    # -- the schedule -------------------------------------------------------------------
    def start(self) -> None:
        """At the first step (or the loader's start before it): the clock and the schedule."""
        if self.sched is not None:
            return
        module = self.parts.module
        if module is None:
            raise RuntimeError(
                "tula.script: a probe needs the model: hand it to Tula with "
                "run.keep(model=ddp_model, optimizer=...) before the first step"
            )
        if self.run.world > 1 and self.parts.ddp is None:
            raise RuntimeError(
                "tula.script: a probe of N > 1 times a compute-only step under DDP's no_sync(): "
                "hand Tula the DDP-wrapped model, run.keep(model=DistributedDataParallel(...))"
            )
        ensure_host_group()
        self.device = self.parts.device()
        self.clock = clock_for(self.device, self.sync)
        self.first_step_at = time.time()
        self.phase("first steps")
        self.sched = self.schedule()
        self.now = next(self.sched)
        self.begin()

    def begin(self) -> None:
        """The asked step's clock starts now (the end of the last step, or a loader's start)."""
        ask = self.now
        if ask is None or ask.timed is None or not ask.first:
            return
        self.fresh = True
        if ask.timed == "alone":
            self.mark = self.clock.begin()
        elif self.rounds is not None:
            self.rounds.begin()

    def schedule(self) -> Schedule:
        """Every step the probe asks of the script, in turn (module docstring)."""
        ask = self.ask
        self.first_s = (yield Ask(True, "alone")).seconds or 0.0
        yield Ask(False)
        warm = 0.0
        for _ in range(ask.warmup_steps):
            warm = (yield Ask(True, "alone")).seconds or 0.0
            yield Ask(False)
        self.phase("timed steps")
        walk = self.walk
        timer = StepTimer(
            self.clock,
            Target(ask.precision, ask.min_steps, ask.budget_s),
            combine=max_over_ranks,
            block_steps=ask.block_steps,
            mix=self.mix(),
        )
        if ask.warmup_steps:
            timer.size_block(warm)
        progress = Progress(f"probe {ask.point}", ask.min_steps, enabled=self.run.rank == 0)
        self.rounds = rounds = Rounds(
            timer, ["step", "compute"], progress_shown(progress, ask.precision, ask.budget_s), True
        )
        led, before = 0, None
        while (todo := rounds.next()) is not None:
            name, steps = todo
            if name == LEAD_IN:  # untimed synced steps, one more where the round would start
                here = walk.place()  # where the round before started (each arm every kind)
                extra = int(here == before)
                before = here
                for _ in range(steps + extra):
                    yield Ask(True)
                led += steps + extra
                rounds.ran(steps, "plain")
                continue
            ahead = walk.plain_ahead()
            k = steps if ahead is None else min(steps, ahead) if steps > 1 and ahead > 1 else 1
            for i in range(k):
                ran = yield Ask(name == "step", "round", first=i == 0)
            rounds.ran(k, ran.kind if k == 1 else "plain")
        self.rounds = None
        self.phase("peaks and input")
        missing = f"torch's profiler built no memory timeline in {PROFILER_TRIES} tries"
        for _ in range(PROFILER_TRIES):
            peak = (yield Ask(True, memory=True)).peak
            if not agree(peak is None)[1]:
                missing = None
                break
        # every try failed on some rank: the timing stands without the peak (peak_error)
        timing = rounds.timing()
        self.result.update(
            timing=timing, peak_bytes=None if missing else peak, peak_error=missing, lead_in=led
        )
        yield from self.epoch_starts_timed(timing)

    def epoch_starts_timed(self, timing: Timing) -> Schedule:
        """Epoch starts timed alone until EXTRA_STEPS of them, the slowest rank's: each an
        epoch ended early (run.batches can: its next step is the next epoch's first); in a
        loop that cannot end them early (Lightning's), the steps to an epoch's end, each timed
        alone, so that what the script does between epochs (its validation) is timed once."""
        walk = self.walk
        met = timing.arms["step"].other
        starts, more = list(met.get("start", [])), []
        if walk.cuttable:
            tries = 2 * EXTRA_STEPS  # a loop that starts no epoch where run.batches ends one
            while len(starts) + len(more) < EXTRA_STEPS and (walk.length or 0) > 1 and tries:
                tries -= 1
                walk.cut_epoch()
                ran = yield Ask(True, "alone")
                if ran.kind == "start":
                    more.append(ran.seconds or 0.0)
        else:
            ends = len(self.gaps)
            while len(self.gaps) == ends or not more:  # an epoch's end, and the next one's start
                ran = yield Ask(True, "alone")
                if ran.kind == "start":
                    more.append(ran.seconds or 0.0)
        self.result["extras"] = {
            "start": starts + (max_over_ranks(more) if more else []),
            "refresh": [],
            "partial": list(met.get("partial", [])),
        }

    def mix(self) -> dict[str, float] | None:
        d = self.walk.train_samples
        if d is None:
            return None
        return paid_mix(d, self.run.global_batch, self.run.world, 0.0)

    @contextlib.contextmanager
    def peak_counter(self) -> Iterator[dict[str, int]]:
        """One step's peak memory: the allocator's on CUDA, the profiler's timeline on CPU."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            out = {"bytes": 0}
            yield out
            torch.cuda.synchronize(self.device)
            out["bytes"] = int(torch.cuda.max_memory_allocated(self.device))
            return
        with cpu_peak_counter(self.parts.module, self.parts.optimizer) as peak:
            yield peak

    def finish(self) -> None:
        """The script ended before the probe had measured: the record says so."""
        steps = self.walk.steps_done
        self.failed(
            Failure(
                "error",
                f"the script ended after {steps} step(s), before the probe had measured what "
                "it needs: let its loop run as long as Tula asks (run.epochs(), or "
                "max_epochs=run.num_epochs)",
            )
        )

    # -- the record ---------------------------------------------------------------------
    def failed(self, failure: Failure) -> None:
        write_json(
            result_path(self.dir, self.run.rank),
            RankResult(self.run.rank, failure=failure).to_json(),
        )

    def done(self) -> None:
        """Every step measured: the record made, written by every rank, and the process ends."""
        self.phase("overheads")
        batches = (self.run.global_batch, self.run.world)
        ckpt_s = probe_result.checkpoint_time(self.dir, self.parts, self.walk, batches)
        overheads = probe_result.overheads(self.first_step_at, self.gaps, ckpt_s)
        self.phase("gathering")
        result = probe_result.rank_result(self.run, self.result, self.first_s, overheads)
        write_json(result_path(self.dir, self.run.rank), result.to_json())
        self.phase("leaving")
        torch_dist.barrier()  # every rank's result is written; the script's group is its own
        raise SystemExit(0)
