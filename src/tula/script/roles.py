"""What a :class:`tula.script.run.Run` does at each call of the script, by its role: nothing
beyond the script's own loop without Tula (:class:`Plain`); the check before any job runs a
few steps and says what the script called (:class:`Check`); the memory probe measures one
step's peak (:class:`Memory`); a timing probe (:mod:`tula.script.probe`) and the production
job (:mod:`tula.script.production`) have modules of their own."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import time
import traceback
import weakref
from pathlib import Path
from typing import Any, Iterator

import torch

from tula.io import write_json
from tula.runtime.probe.measure import PROFILER_TRIES, cpu_peak_counter
from tula.script.base import Loop, Plain, Stepping, param_bytes
from tula.workers.processes import result_path


def driver_for(run: Loop) -> Plain:
    """The driver of ``run``'s role."""
    role = run.spec.role if run.spec else None
    if role == "probe":
        from tula.script.probe import Probe  # its timer and record: a probe's processes only

        return Probe(run)
    if role == "production":
        # checkpoints, records and curves: the production job's processes only
        from tula.script.production import Production

        return Production(run)
    return {"check": Check, "memory": Memory}[role](run) if role else Plain(run)


class Check(Plain):
    """``tula check``: a few steps on the login node, then a record of what the script called
    (attach, the step marker, run.batches, the parts kept, DDP), the batches it loaded and its
    training set's size; a failing step's error is recorded with the script's own line."""

    def __init__(self, run: Loop):
        super().__init__(run)
        self.steps: list[float] = []
        self.batches_used = False
        self.error: str | None = None
        self.t0 = 0.0
        # the script ended before its steps: say what it did (held weakly: the run's parts
        # must not outlive the exit's collection, tula.runtime.group.dist.release_at_exit)
        atexit.register(_at_exit, weakref.ref(self))

    def epoch_starts(self) -> None:
        self.batches_used = True

    def epoch_ends(self) -> None:
        if not self.steps:  # a whole epoch and no step marked: it never will be
            self.end(self.record("ended"))

    @contextlib.contextmanager
    def step(self, now: Stepping) -> Iterator[None]:
        self.sync()
        self.t0 = time.perf_counter()
        try:
            yield
        except BaseException:
            self.error = traceback.format_exc()
            self.record("error")
            raise
        self.sync()
        self.steps.append(time.perf_counter() - self.t0)

    def stepped(self, now: Stepping) -> None:
        assert self.run.spec is not None
        if len(self.steps) >= self.run.spec.check_steps:
            self.end(self.record("ok"))

    def record(self, status: str) -> dict[str, Any]:
        run = self.run
        rec = {
            "status": status,
            "steps": len(self.steps),
            "step_s": self.steps,
            "batches_used": self.batches_used,
            "batch_lengths": sorted(run.walk.seen_lengths),
            "train_samples": run.walk.train_samples,
            "parts": run.parts.describe(),
            "ddp": run.parts.ddp is not None,
            "device": str(run.parts.device()),
            "local_batch": run.local_batch,
            "world": run.world,
            "error": self.error,
        }
        if status != "ok":
            write_json(result_path(run.spec.result_dir, run.rank), rec)
        return rec

    def at_exit(self) -> None:
        path = result_path(self.run.spec.result_dir, self.run.rank)
        if not path.exists():
            self.record("ended")


def _at_exit(check: weakref.ref[Check]) -> None:
    alive = check()
    if alive is not None:
        alive.at_exit()


class Memory(Plain):
    """The memory probe at one local batch: the first step (which makes the optimizer's
    state) untimed, then one step's peak memory (``torch.cuda.max_memory_allocated``, or on
    the CPU torch's profiler's memory timeline, tried again where it fails to build one)."""

    def __init__(self, run: Loop):
        super().__init__(run)
        self.counter: Any = None
        self.tries = 0
        self.point: dict[str, Any] = {"local_batch": run.local_batch, "verifies_b_max": False}

    @contextlib.contextmanager
    def step(self, now: Stepping) -> Iterator[None]:
        measuring = self.walk.steps_done >= 1
        device = self.parts.device()
        try:
            if not measuring:
                yield
            elif device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
                yield
                torch.cuda.synchronize(device)
                self.point["peak_mem_bytes"] = int(torch.cuda.max_memory_allocated(device))
            else:
                try:
                    with cpu_peak_counter(self.parts.module, self.parts.optimizer) as peak:
                        yield
                    self.point["peak_mem_bytes"] = peak["bytes"]
                except AssertionError:  # torch's profiler: no timeline now and then
                    self.tries += 1
                    if self.tries >= PROFILER_TRIES:
                        raise
        except torch.OutOfMemoryError as exc:
            first = (str(exc).splitlines() or [""])[0]
            self.point.update(
                status="oom", error=f"out of memory at local batch {self.run.local_batch}: {first}"
            )
            self.end({"rank": 0, "status": "ok", "points": [self.point], "env": self.env()})

    def stepped(self, now: Stepping) -> None:
        if "peak_mem_bytes" not in self.point:
            return
        peak = self.point["peak_mem_bytes"]
        self.point.update(
            status="ok",
            plain_peak_bytes=peak,
            refresh_peak_bytes=None,
            memory={**param_bytes(self.run), "act_bytes": None, "batch_bytes": None},
        )
        self.end({"rank": 0, "status": "ok", "points": [self.point], "env": self.env()})

    def env(self) -> dict[str, Any]:
        return {
            "device": self.parts.device().type,
            "script": os.path.basename(sys.argv[0]),
            "torch": torch.__version__,
            "cwd": str(Path.cwd()),
        }
