"""The production job running the user's own script: what :class:`tula.production.trainer.Trainer`
does around Tula's own step, done around the script's.

- **Resume.** ``run.keep(...)`` puts the parts back from the newest checkpoint of this run
  (its fingerprint: the settings, N and the launch's B), with each rank's random state and
  where the epoch stood; ``run.batches`` then skips the batches already stepped, from the
  random state the epoch's loader began with, so the run goes on as if uninterrupted.
- **Stops.** SLURM's USR2 (time limit, preemption) and TERM set a flag that every rank agrees
  on before the next step (one small all-reduce); they checkpoint and stop, and submitit (or,
  under the plan's batch script, ``scontrol requeue``) requeues the job.
- **Out of memory** in a step leaves the record `tula launch` reads, which relaunches at the
  next smaller batch from the last checkpoint.
- **Accounts and records**: the steps' time in stretches closed where the device is
  synchronised anyway (an epoch's end, a checkpoint), each batch shape's first step timed
  apart, the script's time between epochs as its evaluation, checkpoints, start-up; the
  epochs' rows in metrics.csv and TensorBoard; final.json at the end, which `tula launch`
  puts beside the prediction."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import torch
import torch.distributed as torch_dist

from tula import checkpoint, faults
from tula.io import write_bytes, write_csv, write_json
from tula.production import jobdir, monitor, records, stops
from tula.production.curves import Curves
from tula.production.ledger import Ledger
from tula.production.trainer import METRIC_COLUMNS
from tula.progress import Progress, fmt_duration
from tula.runtime.group import dist
from tula.runtime.group.agreement import HOST_GROUP, agree_host, ensure_host_group
from tula.runtime.probe.measure import process_started
from tula.runtime.timer.clocks import clock_for
from tula.runtime.timer.timing import StepTimer
from tula.script import snapshot
from tula.script.base import Loop, Plain, Stepping
from tula.script.parts import inner


class Production(Plain):
    """The production job's side of one rank of the script (module docstring)."""

    def __init__(self, run: Loop):
        super().__init__(run)
        assert run.spec is not None and run.spec.train is not None
        self.ask = ask = run.spec.train
        self.out, self.rank = Path(ask.out_dir), run.rank
        self.label = f"train N={run.world} B={run.global_batch}"
        self.stops = stops.StopSignals()
        self.faults = faults.from_env()
        # the ledger's timer times nothing here (the stretches are the steps' time)
        timer = StepTimer(clock_for(torch.device("cpu")))
        self.ledger = Ledger(self.out, self.rank, ask.attempt, self.label, timer, process_started())
        self.curves: Curves | None = None
        self.stretch: float | None = None  # when the steps' stretch under way began
        self.stretch_steps = 0  # the steps in it
        self.eval_from: float | None = None  # the epoch's batches ended: the script evaluates
        self.progress: Progress | None = None
        self.outcome: dict[str, Any] | None = None

    # -- resume -------------------------------------------------------------------------
    def kept(self) -> None:
        """The parts handed: put back from the newest checkpoint of this run, if any."""
        if self.curves is not None:
            return  # kept again: the run has begun
        if self.run.world > 1 and not torch_dist.is_initialized():
            raise RuntimeError(
                "tula.script: call run.keep() after torch.distributed.init_process_group(): "
                "every rank loads the checkpoint rank 0 picks"
            )
        state = snapshot.newest(self.ask.checkpoint_dir, self.ask.fingerprint, self.rank)
        if state is not None:
            self.restore(state)
        if self.rank == 0:
            resumed = self.walk.steps_done or None
            self.curves = Curves(self.out / "tensorboard", resumed, self.ask.metric)
            print(
                f"[{self.label}] {Path(sys.argv[0]).name}: {self.run.num_epochs} epochs, local "
                f"batch {self.run.local_batch}, attempt {self.ask.attempt}, parts kept: "
                + ", ".join(self.parts.describe()),
                flush=True,
            )
        self.progress = Progress(
            self.label,
            self.run.num_epochs or 1,
            unit="epoch",
            every_s=0.0,
            enabled=self.rank == 0,
            start=self.walk.epoch,
        )
        if self.rank == 0:
            lost = jobdir.unrecorded_stretch(self.out, self.ask.attempt, self.walk.steps_done)
            if lost:
                jobdir.add_segment(self.out, lost)
            # no monitor pairs a user's step: the monitor's files, empty, say so
            write_csv(self.out / "steps.csv", pd.DataFrame([], columns=monitor.COLUMNS))
            write_json(self.out / "drift.json", [])
        self.ledger.begin_segment(
            {
                "attempt": self.ask.attempt,
                "global_batch": self.run.global_batch,
                "start_step": self.walk.steps_done,
                "host": dist.hostname(),
                "started": jobdir.utc_now(),
                "job_id": os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID"),
            }
        )

    def restore(self, state: dict[str, Any]) -> None:
        snapshot.restore(state, self.parts, self.walk, self.rank, self.run.global_batch)
        self.ledger.load_state_dict(state["ledger"], step=state["step"])
        if self.rank == 0:
            print(
                f"[{self.label}] resumed from the checkpoint of step {state['step']} (epoch "
                f"{self.walk.epoch + 1}, {state['walk']['batches_done']} batches into it; written "
                f"at N={state['workers']} B={state['global_batch']})",
                flush=True,
            )

    # -- the steps ----------------------------------------------------------------------
    def epoch_starts(self) -> None:
        self.open()

    def epoch_ends(self) -> None:
        self.close()
        self.eval_from = time.perf_counter()

    def open(self) -> None:
        if self.stretch is None:
            self.stretch = time.perf_counter()

    def close(self, account: str = "train_time_s") -> float:
        """The steps' stretch ends: the device drained, its seconds into ``account``."""
        if self.stretch is None:
            return 0.0
        self.sync()
        spent = time.perf_counter() - self.stretch
        self.stretch, self.stretch_steps = None, 0
        self.ledger.spend(account, spent, in_epoch=True)
        if self.curves:
            self.curves.flush(spent)
        return spent

    @contextlib.contextmanager
    def step(self, now: Stepping) -> Iterator[None]:
        walk, ledger = self.walk, self.ledger
        faults.maybe_signal(self.faults, walk.steps_done, self.rank, ledger.resumed_from)
        if ledger.first_step_at is None:
            self.first_step()
        code = self.stop_code()
        if code:
            self.stop(code)
        shape = self.first_of_shape(now.kind)
        if shape and self.stretch_steps:  # timed apart: from here (or its loader's start)
            self.close()
        self.open()
        try:
            yield
        except torch.OutOfMemoryError as exc:
            records.oom_record(
                ledger, walk.steps_done, self.run.global_batch, "step", str(exc) or "out of memory"
            )
            raise
        if shape:
            self.sync()
            seconds = time.perf_counter() - (self.stretch or time.perf_counter())
            self.stretch = None
            ledger.first_of_shape(shape, seconds)
            if self.curves:
                self.note(now)
                self.curves.flush(seconds)
            self.open()
            return
        self.stretch_steps += 1
        if self.curves:
            self.note(now)

    def note(self, now: Stepping) -> None:
        value = now.value
        loss = value if torch.is_tensor(value) and value.numel() == 1 else None
        if isinstance(value, (int, float)):
            loss = float(value)
        loss = loss.detach() if torch.is_tensor(loss) else loss
        opt = self.parts.optimizer
        lr = float(inner(opt).param_groups[0]["lr"]) if opt is not None else 0.0
        assert self.curves is not None
        self.curves.note_step(self.walk.steps_done + 1, loss, lr, self.run.global_batch)

    def stepped(self, now: Stepping) -> None:
        every = self.ask.every_steps
        if every and self.walk.steps_done % every == 0:
            self.close()
            self.checkpoint()

    def first_step(self) -> None:
        """The attempt's first step is about to run: start-up ends here."""
        ensure_host_group()
        at = self.ledger.first_step()
        if self.rank == 0:
            started = {"attempt": self.ask.attempt, "first_step_time": at}
            started.update(process_started=self.ledger.process_started, step=self.walk.steps_done)
            write_json(jobdir.started_path(self.out), started)

    def first_of_shape(self, kind: str) -> str:
        """ "full" or "short" where this step is the attempt's first at that batch shape."""
        shape = "short" if kind == "partial" else "full"
        return "" if shape in self.ledger.shapes_met else shape

    def stop_code(self) -> int:
        """The stop every rank agrees on before a step (a signal; rank 0: a move request)."""
        mine = (
            self.stops.move_requested(jobdir.move_request_path(self.out))
            if self.rank == 0
            else self.stops.code
        )
        code, _ = agree_host(False, mine)
        return code

    def stop(self, code: int) -> None:
        self.close()
        self.checkpoint()
        requeue = self.scontrol_requeue if self.ask.requeue == "scontrol" else None
        stops.stop(code, self.stops, self.ledger, self.walk.steps_done, requeue)

    def scontrol_requeue(self, signum: int, frame: Any) -> None:
        """The plan's batch script: SLURM requeues the job itself (rank 0 asks it)."""
        job = os.environ.get("SLURM_JOB_ID")
        if self.rank == 0 and job:
            subprocess.run(["scontrol", "requeue", job], check=False)

    # -- epochs, checkpoints, the end ---------------------------------------------------
    def epoch_end(self, row: dict[str, float | None]) -> None:
        self.close()
        if self.eval_from is not None:
            self.ledger.spend("eval_time_s", time.perf_counter() - self.eval_from)
            self.eval_from = None
        walk, run = self.walk, self.run
        opt = run.parts.optimizer
        samples = walk.train_samples
        epoch_time = self.ledger.epoch_time
        epoch = walk.epochs_done()
        full = {
            "epoch": epoch,
            "step": walk.steps_done,
            "lr": float(inner(opt).param_groups[0]["lr"]) if opt is not None else None,
            **row,
            "epoch_time_s": epoch_time,
            "samples_per_s": (samples or 0) / max(epoch_time, 1e-9),
            "samples": samples,
            "workers": run.world,
            "global_batch": run.global_batch,
        }
        self.ledger.close_epoch(full)
        if self.curves:
            self.curves.epoch(full)
        if self.rank == 0:
            write_csv(
                self.out / "metrics.csv", pd.DataFrame(self.ledger.rows, columns=METRIC_COLUMNS)
            )
            if self.progress is not None:
                said = [f"{k} {v:.4f}" for k, v in row.items() if v is not None]
                self.progress.update(epoch, "epoch ", extra="  ".join(said))
        every = self.ask.every_epochs
        if every and epoch % every == 0 and epoch < (run.num_epochs or 0):
            self.checkpoint()

    def checkpoint(self, complete: bool = False) -> None:
        """This run's checkpoint (:func:`tula.script.snapshot.write`), its time counted."""
        t0 = time.perf_counter()
        if self.curves:
            self.curves.writer.flush()
        steps = self.walk.steps_done
        snapshot.write(
            self.ask.checkpoint_dir,
            self.parts,
            self.walk,
            (self.run.global_batch, self.run.world),
            self.ask.keep,
            {
                "ledger": self.ledger.state_dict(),
                "fingerprint": self.ask.fingerprint,
                "complete": complete,
                "attempt": self.ask.attempt,
                "script": Path(sys.argv[0]).name,
            },
            checkpoint.truncate if faults.truncate_due(self.faults, steps) else None,
        )
        self.ledger.spend("checkpoint_time_s", time.perf_counter() - t0)

    def finish(self) -> dict[str, Any]:
        """Training is over: the last checkpoint, final.json and the segment's end."""
        if self.outcome is not None:
            return self.outcome
        self.close()
        walk, run, ledger = self.walk, self.run, self.ledger
        grouped = torch_dist.is_initialized()
        self.checkpoint(complete=True)
        hosts = dist.hostnames() if grouped else [dist.hostname()]
        if self.rank == 0:
            final = self.final_record(hosts, torch_dist.get_backend() if grouped else "none")
            module = run.parts.module
            if module is not None:
                write_bytes(self.out / "model.pt", checkpoint.to_bytes(module.state_dict()))
            write_json(self.out / "final.json", final)
            jobdir.add_segment(
                self.out,
                ledger.segment(
                    end_step=walk.steps_done,
                    outcome="completed",
                    ended=jobdir.utc_now(),
                    reason="trained every epoch",
                ),
            )
            print(
                f"[{self.label}] done: {fmt_duration(final['train_time_s'])} in "
                f"{walk.steps_done} steps (mean step {1e3 * final['mean_step_time_s']:.2f} ms), "
                f"between epochs {fmt_duration(final['eval_time_s'])}, checkpoints "
                f"{fmt_duration(final['checkpoint_time_s'])}",
                flush=True,
            )
        if self.curves:
            self.curves.close()
        if grouped:  # no rank leaves (the script then tears gloo down) while rank 0 still
            # writes: a peer's teardown mid-write aborts it ("terminate called without an
            # active exception", as tula.runtime.group.dist.shutdown says)
            torch_dist.barrier(group=HOST_GROUP[0])
        self.outcome = {"outcome": "completed", "step": walk.steps_done}
        return self.outcome

    def final_record(self, hosts: list[str], backend: str) -> dict[str, Any]:
        """final.json, with the keys `tula launch` compares with the prediction."""
        run, ledger = self.run, self.ledger
        times, rows = ledger.times, ledger.rows
        steps = max(run.walk.steps_done, 1)
        tests = [r["test_acc"] for r in rows if r.get("test_acc") is not None]
        best = (min if self.ask.metric_goal == "min" else max)(tests) if tests else None
        return {
            "workers": run.world,
            "global_batch": run.global_batch,
            "local_batch": run.local_batch,
            "workload": "script",
            "script": sys.argv[0],
            "script_args": sys.argv[1:],
            "epochs": run.num_epochs,
            "metric": self.ask.metric,
            "metric_goal": self.ask.metric_goal,
            "method": "the script's own",
            "parts_kept": run.parts.describe(),
            "steps": run.walk.steps_done,
            "train_samples": run.walk.train_samples,
            "final_test_acc": rows[-1].get("test_acc") if rows else None,
            "best_test_acc": best,
            "final_train_loss": rows[-1].get("train_loss") if rows else None,
            **times,
            "mean_step_time_s": times["train_time_s"] / max(steps - times["first_steps"], 1),
            "wall_time_s": ledger.wall_time(),
            "backend": backend,
            "device": str(run.parts.device()),
            "comm_env": dist.comm_env(),
            "hostnames": hosts,
            "monitored_steps": 0,
            "drift": [],
        }
