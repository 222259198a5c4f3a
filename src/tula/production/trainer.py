"""The production run of one worker (``tula launch`` submits it): :class:`Trainer`, the loop
around the one training step (:class:`tula.runtime.step.replica.Replica`), in named phases:
restore, step, end of epoch, checkpoint, finish.

It survives what a cluster does to a job: SLURM's USR2 before the time limit or on preemption and
TERM (scancel, ``scontrol requeue``) set a flag (:class:`tula.production.stops.StopSignals`) that
every rank agrees on at the next step, checkpoint, and stop (submitit requeues the job on USR2); an
out-of-memory error anywhere ends the attempt with a record the launcher reads."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from tula import checkpoint
from tula import config as config_mod
from tula import faults as tula_faults
from tula.checkpoint import Checkpointing
from tula.io import write_bytes, write_csv, write_json
from tula.model import drift
from tula.production import jobdir, records, stops
from tula.production.curves import Curves
from tula.production.ledger import Ledger
from tula.production.monitor import Monitor
from tula.progress import Progress, fmt_duration
from tula.runtime.group import dist
from tula.runtime.group.agreement import StepOOM
from tula.runtime.probe import gradnoise
from tula.runtime.probe.measure import process_started
from tula.runtime.step.replica import Replica
from tula.runtime.step.snapshot import load_newest, write_checkpoint
from tula.runtime.step.stepstate import StepHooks

METRIC_COLUMNS = [
    "epoch",
    "step",
    "lr",
    "train_loss",
    "train_acc",
    "test_loss",
    "test_acc",
    "epoch_time_s",
    "samples_per_s",
    "grad_noise_scale",
    "grad_sq",
    "grad_trace",
    "samples",
    "workers",
    "global_batch",
]


class Trainer:
    """The production run of one worker in named phases: :meth:`restore`, :meth:`train_epoch`
    (steps), :meth:`end_of_epoch`, :meth:`checkpoint`, :meth:`finish`."""

    def __init__(
        self,
        cfg: config_mod.Config,
        workers: int,
        global_batch: int,
        out_dir: Path,
        ckpt: Checkpointing | None = None,
        band: dict[str, float] | None = None,
        micro_batch: int | None = None,
    ):
        self.wenv, self.device, self.backend = dist.init(cfg.hardware, cluster=cfg.cluster)
        if self.wenv.world_size != workers:
            raise RuntimeError(
                f"launched {self.wenv.world_size} workers for training at N={workers}"
            )
        self.workers, self.global_batch = workers, global_batch
        self.out, self.ckpt = out_dir, ckpt
        # what of the config the run's phases ask, read here once: the settings final.json
        # echoes, the epochs to train, and the monitor's (launch.*)
        self.settings = records.run_settings(cfg)
        self.epochs = cfg.workload.epochs
        self.monitor_every = cfg.launch.monitor_every_steps if cfg.launch.replan != "off" else None
        self.replan = cfg.launch.replan
        self.rank, self.attempt = self.wenv.rank, ckpt.attempt if ckpt else 1
        self.faults = tula_faults.from_env()
        self.stops = stops.StopSignals() if ckpt else None
        self.replica = Replica(  # micro_batch: train.accumulate's largest, as planned
            cfg, self.device, global_batch, self.rank, workers, self._hooks(), None, micro_batch
        )
        self.label = f"train N={workers} B={global_batch}"
        self.ledger = Ledger(
            out_dir, self.rank, self.attempt, self.label, self.replica.timer, process_started()
        )
        # the predicted sync at (N, B): the drift detector's
        self.band = drift.Band(**band) if band else None
        self.monitor: Monitor | None = None
        self.curves: Curves | None = None  # rank 0's TensorBoard writer, opened by run()
        self.metric = cfg.train.metric

    def _hooks(self) -> StepHooks:
        """What the replica's step asks of the job: the agreed stop (a signal, or on rank 0 a
        move request too) and the fault drills' injections."""
        hooks: dict[str, Any] = {}
        if self.stops:
            request, signals = jobdir.move_request_path(self.out), self.stops
            hooks["stop_code"] = (
                (lambda: signals.move_requested(request))
                if self.rank == 0
                else (lambda: signals.code)
            )
        faults, workers = self.faults, self.workers
        if any(f.kind == "slowsync" for f in faults):
            hooks["sync_delay"] = lambda step: tula_faults.sync_delay_s(faults, step, workers)
        injector = tula_faults.Injector(faults, self.rank)
        return StepHooks(**hooks, injector=injector if injector else None)

    # -- phases ------------------------------------------------------------------------
    def restore(self) -> None:
        """Continue from the newest usable checkpoint of this run, if there is one."""
        if not self.ckpt:
            return
        state = load_newest(self.ckpt, self.rank)
        if not state:
            return
        replica, ranks = self.replica, state["ranks"]
        metrics = [r["epoch_metric"] for r in ranks if "epoch_metric" in r]
        if len(ranks) == self.workers:
            checkpoint.set_rng_state(ranks[self.rank]["rng"])
            stats = ranks[self.rank]["epoch_stats"]
            metrics = metrics[self.rank : self.rank + 1]
        # written at another N (a move): the epoch's sums so far on rank 0, each rank a saved RNG
        else:
            checkpoint.set_rng_state(ranks[self.rank % len(ranks)]["rng"])
            total = sum(r["epoch_stats"] for r in ranks)
            stats = total if self.rank == 0 else torch.zeros_like(total)
            metrics = metrics if self.rank == 0 else []
        # post-local SGD between two averages: this rank's own model and momentum
        own = ranks[self.rank].get("replica") if len(ranks) == self.workers else None
        replica.load_state_dict(state, stats, own, metrics)
        self.ledger.load_state_dict(state["ledger"], step=state["step"])
        if self.rank == 0:
            print(
                f"[{self.label}] resumed from the checkpoint of step {replica.steps_done} (epoch "
                f"{replica.epoch}, {replica.epoch_offset}/{replica.data.train_size} samples; "
                f"written at N={len(ranks)} B={state['global_batch']})",
                flush=True,
            )

    def train_epoch(self) -> None:
        """Steps until the epoch's data is used up (or a stop is agreed on). Steps are queued
        without waiting for the device; their time is taken over a stretch of steps, with one
        synchronisation where the stretch ends (the epoch's end, a checkpoint, a monitored
        pair). The first step of the attempt and the first short last batch are timed alone:
        they pay what a new shape costs once (compilation, cuDNN's autotuning, the allocator's
        growth) and are counted in ``first_steps_time_s``, not in the step time."""
        replica, ledger = self.replica, self.ledger
        batches = replica.walk.epoch_batches()
        stretch = time.perf_counter()

        def close() -> None:  # the stretch's time, into the epoch's, training's and the curves'
            replica.sync_device()
            spent = time.perf_counter() - stretch
            ledger.spend("train_time_s", spent, in_epoch=True)
            if self.curves:
                self.curves.flush(spent, replica.update.ags_mean_factor())

        while True:
            tula_faults.maybe_signal(
                self.faults, replica.steps_done, self.rank, ledger.resumed_from
            )
            if ledger.first_step_at is None:
                self._first_step()
            first = self._first_of_shape()
            if first or (self.monitor and self.monitor.due()):
                close()
                timed = self._timed_first(batches) if first else self.monitor.paired_step(batches)
                if timed is not None and first:
                    ledger.first_of_shape(first, timed[0])
                elif timed is not None:
                    ledger.spend("train_time_s", timed[0], in_epoch=True)
                if timed is not None and self.curves:
                    self.curves.note(replica)
                    self.curves.flush(timed[0], replica.update.ags_mean_factor())
                stop = timed[1] if timed is not None else None
                stretch = time.perf_counter()
            else:
                stop = replica.walk.run_step(batches)
                timed = None if stop is None else (0.0, stop)
                if timed is not None and self.curves:
                    self.curves.note(replica)
            if timed is None:
                close()
                return
            every = self.ckpt.every_steps if self.ckpt else None
            if self.ckpt and (stop or (every and replica.steps_done % every == 0)):
                close()
                self.checkpoint()
                stretch = time.perf_counter()
            if stop:
                stops.stop(stop, self.stops, self.ledger, replica.steps_done)

    def _timed_first(self, batches) -> tuple[float, int] | None:
        """The first step at a batch shape, timed alone by the ledger's timer: (seconds, stop
        code), or None when the epoch has no batch left."""
        seconds, stop = self.ledger.timer.time_call(lambda: self.replica.walk.run_step(batches))
        return None if stop is None else (seconds, stop)

    def _first_step(self) -> None:
        """The attempt's first step is about to run: start-up ends here."""
        at = self.ledger.first_step()
        # tula launch: what a (re)launch costs, submission to first step
        if self.rank == 0 and self.ckpt:
            started = {"attempt": self.attempt, "first_step_time": at}
            started.update(
                process_started=self.ledger.process_started, step=self.replica.steps_done
            )
            write_json(jobdir.started_path(self.out), started)

    def _first_of_shape(self) -> str:
        """ "full" or "short" where the next step is the first of this attempt at that batch
        shape (the epoch's short last batch has its own), else ""."""
        r = self.replica
        left = r.data.train_size - r.epoch_offset
        shape = "full" if left >= r.global_batch else "short" if left >= r.world else ""
        return shape if shape and shape not in self.ledger.shapes_met else ""

    def end_of_epoch(self, epochs: int, progress: Progress) -> None:
        replica = self.replica
        train_loss, train_acc, samples = replica.walk.end_epoch()
        t0 = time.perf_counter()
        test_loss, test_acc = replica.evaluate()
        # train.ema_decay: the weights' moving average evaluated beside them
        ema = {"test_acc_ema": replica.evaluate(ema=True)[1]} if replica.update.ema else {}
        self.ledger.spend("eval_time_s", time.perf_counter() - t0)
        epoch_time = self.ledger.epoch_time
        row = {
            "epoch": replica.epoch - 1,
            "step": replica.steps_done,
            "lr": replica.update.lr,
            "train_loss": train_loss,
            "train_acc": train_acc,
            "test_loss": test_loss,
            "test_acc": test_acc,
            "epoch_time_s": epoch_time,
            "samples_per_s": samples / max(epoch_time, 1e-9),
            "samples": samples,
            "workers": self.workers,
            "global_batch": self.global_batch,
            **gradnoise.epoch_noise(replica),
            **ema,
        }
        self.ledger.close_epoch(row)
        if self.curves:
            self.curves.epoch(row)
        if self.rank == 0:
            rows = pd.DataFrame(self.ledger.rows, columns=METRIC_COLUMNS + list(ema))
            write_csv(self.out / "metrics.csv", rows)
            progress.update(
                row["epoch"],
                "epoch ",
                extra=f"loss {train_loss:.4f}  test acc {100 * test_acc:.2f}%  "
                f"{row['samples_per_s']:.0f} samples/s",
            )
        every = self.ckpt.every_epochs if self.ckpt else None
        if every and row["epoch"] % every == 0 and replica.epoch <= epochs:
            self.checkpoint()

    def checkpoint(self, complete: bool = False) -> None:
        """This run's checkpoint (:func:`write_checkpoint`), its time counted; the curves up
        to it on disk (a stop after it resumes from here)."""
        t0 = time.perf_counter()
        if self.curves:
            self.curves.writer.flush()
        due = tula_faults.truncate_due(self.faults, self.replica.steps_done)
        hook = checkpoint.truncate if due else None
        write_checkpoint(
            self.replica,
            self.ckpt.directory,
            self.ckpt.keep,
            {
                "fingerprint": self.ckpt.fingerprint,
                "global_batch": self.global_batch,
                "workers": self.workers,
                "complete": complete,
                "ledger": self.ledger.state_dict(),
                "method": self.settings["method"],
                "attempt": self.attempt,
            },
            hook,
        )
        self.ledger.spend("checkpoint_time_s", time.perf_counter() - t0)

    def finish(self) -> dict[str, Any]:
        replica = self.replica
        if self.ckpt:
            self.checkpoint(complete=True)
        hosts = dist.hostnames()  # every rank: a collective
        if self.rank == 0:
            final = records.final_record(
                self.settings, self.ledger, replica, self.backend, self.monitor, hosts
            )
            write_bytes(self.out / "model.pt", checkpoint.to_bytes(replica.ddp.module.state_dict()))
            if replica.update.ema is not None:
                ema_weights = replica.update.ema.module.state_dict()
                write_bytes(self.out / "model_ema.pt", checkpoint.to_bytes(ema_weights))
            write_json(self.out / "final.json", final)
            if self.ckpt:
                jobdir.add_segment(
                    self.out,
                    self.ledger.segment(
                        end_step=replica.steps_done,
                        outcome="completed",
                        ended=jobdir.utc_now(),
                        reason="trained every epoch",
                    ),
                )
            print(
                f"[{self.label}] done: {fmt_duration(final['train_time_s'])} in "
                f"{replica.steps_done} steps (mean step {1e3 * final['mean_step_time_s']:.2f} ms), "
                f"evaluation {fmt_duration(final['eval_time_s'])}, checkpoints "
                f"{fmt_duration(final['checkpoint_time_s'])}; "
                f"test accuracy {100 * final['final_test_acc']:.2f}% (best "
                f"{100 * final['best_test_acc']:.2f}%)",
                flush=True,
            )
        if self.curves:
            self.curves.close()
        dist.shutdown()
        return {"outcome": "completed", "step": replica.steps_done}

    # -- the run -----------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train every epoch. Returns ``{"outcome": "completed" | "oom", ...}``; on a stop
        signal it checkpoints and exits (SystemExit) without returning."""
        self.restore()
        replica, run, epochs = self.replica, self.settings, self.epochs
        if self.rank == 0:
            resumed = replica.steps_done or None  # its step was logged before its checkpoint
            self.curves = Curves(self.out / "tensorboard", resumed, self.metric)
        # the production job: it keeps measuring its sync (steps.csv, empty if it does not)
        if self.ckpt:
            self.monitor = Monitor(replica, self.monitor_every, self.ledger, self.band, self.replan)
        if self.rank == 0:
            print(
                f"[{self.label}] {run['model']} on {run['dataset']}: "
                f"{replica.data.train_size} training samples, {replica.steps_per_epoch} "
                f"steps/epoch x {epochs} epochs, method {run['method']}, {run['precision']}, "
                f"backend {self.backend} on {self.device}, "
                f"{replica.loader_workers} loader worker(s)"
                + (f"; {replica.decode['why']}" if replica.decode else "")
                + (f", attempt {self.attempt}" if self.ckpt else ""),
                flush=True,
            )
        progress = Progress(
            self.label,
            epochs,
            unit="epoch",
            every_s=0.0,
            enabled=self.rank == 0,
            start=replica.epoch - 1,
        )
        if self.rank == 0 and self.ckpt:  # requeued after a start that left no record
            lost = jobdir.unrecorded_stretch(self.out, self.attempt, replica.steps_done)
            if lost:
                jobdir.add_segment(self.out, lost)
        self.ledger.begin_segment(
            {
                "attempt": self.attempt,
                "global_batch": self.global_batch,
                "start_step": replica.steps_done,
                "host": dist.hostname(),
                "started": jobdir.utc_now(),
                "job_id": os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID"),
            }
        )
        try:
            while replica.epoch <= epochs:
                self.train_epoch()
                self.end_of_epoch(epochs, progress)
            return self.finish()
        except StepOOM as exc:
            return records.oom_outcome(self.ledger, replica, exc, bool(self.ckpt))
        except torch.OutOfMemoryError as exc:
            # Where ranks cannot agree (backward, in DDP's all-reduce): a record for the launcher,
            # and fail; the peers' collectives end with this process (gloo at once, NCCL later).
            at = (replica.steps_done, replica.global_batch, replica.phase)
            records.oom_record(self.ledger, *at, str(exc) or "out of memory")
            raise
