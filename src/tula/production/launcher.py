"""The production job's launcher (``tula launch`` and each run of ``tula compare``): the job
submitted with submitit and watched to the end.

Paper §IV-B: "frequent job checkpointing and relaunching progressively smaller batches
until a feasible configuration is found". One *attempt* is one submitit job at one global
batch B at one N (:class:`tula.production.history.Attempt`):

- the job is a :class:`tula.production.job.ProductionJob` (``submitit.helpers.Checkpointable``): SLURM's USR2
  before the time limit or on preemption makes every rank checkpoint at the next step
  boundary, and submitit requeues the job, which resumes from that checkpoint (TERM, from
  scancel or ``scontrol requeue``, also checkpoints first). Requeues stay inside one attempt;
- if a rank runs out of memory, all ranks agree, the job ends with outcome ``oom``, and
  the next attempt resumes from the last checkpoint at the next smaller feasible B (the
  memory model's order from predictions.csv, else B/2) until one trains or none is left;
- with ``launch.replan: move``, a drift the job reports (its sync outside the predicted band,
  :mod:`tula.production.monitor`) is re-planned (:func:`tula.model.choice.decide`); if another (N, B)
  pays for the relaunch, the job is asked to checkpoint and stop, and the next attempt
  continues there from that checkpoint (every sample once per epoch: the position is in
  samples, independent of N and B).

Every attempt is written to ``results/train/attempts.json`` (:class:`tula.production.history.History`);
submitit's job folder and logs are in ``results/train/submitit/``. The rank-0 log is echoed
to the terminal while the job runs. At the end, final.json gets the prediction for the point
the job trained beside what the job measured (:func:`tula.production.confirm.record_prediction`).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd
import submitit

from tula import checkpoint, devices, preflight, slurm, workflow
from tula import config as config_mod
from tula import faults as tula_faults
from tula.io import read_json, write_bytes, write_json
from tula.model import choice, drift
from tula.model.memory import smaller_batches
from tula.production import history
from tula.production.confirm import prediction_row, record_prediction
from tula.production.history import Attempt, History
from tula.production.job import ProductionJob


def selected_point(path) -> tuple[int, int]:
    """(workers, global_batch) of a selection.json; the error names the file."""
    sel = read_json(path)
    try:
        return int(sel["selected"]["workers"]), int(sel["selected"]["global_batch"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{path}: no selected.workers / selected.global_batch; re-run `tula select`") from None


class OutOfMemory(RuntimeError):
    """The job ran out of memory and :func:`run` was told not to relaunch it smaller."""


def fallback_batches(workers: int, batch: int, predictions: str | Path | None, floor: int) -> list[int]:
    """Global batches to try after an OOM at ``batch`` (:func:`tula.model.memory.smaller_batches`):
    the grid's batches for N that the memory model calls feasible; without predictions, halving."""
    if predictions and Path(predictions).exists():
        p = pd.read_csv(predictions)
        cands = p[(p["workers"] == workers) & p["feasible"].astype(bool)]["global_batch"].tolist()
    else:
        cands = [batch >> k for k in range(1, batch.bit_length())]
    return smaller_batches(cands, batch, workers, floor)


class Launch:
    """One `tula launch`: the run's settings, its history of attempts, and the steps of the
    attempt loop in :func:`run`."""

    def __init__(self, cfg_path: str | Path, selection: str | Path, out_dir: str | Path, predictions, executor_hint,
                 timeout_min, partition, account, job_name: str):  # fmt: skip
        self.cfg_path, self.cfg = Path(cfg_path).resolve(), config_mod.load(cfg_path)
        self.kind = history.resolve_executor(self.cfg, executor_hint)
        # where the job runs (tula.devices; the workflow's config has it decided already): by hand
        # on SLURM with device auto, the partition's GRES decides, so a GPU partition gets --gres
        try:
            self.device = devices.for_config(self.cfg, self.kind, self.cfg.launch.slurm_partition or partition)
        except preflight.PreflightError as exc:  # a partition the cluster does not have, named
            raise RuntimeError(str(exc)) from None
        self.cfg = devices.apply(self.cfg, self.device)
        self.workers, self.selected_batch = selected_point(selection)  # workers: the current attempt's N (a move changes it)
        self.selected_workers = self.workers
        self.out = Path(out_dir).resolve()
        self.ck = self.out / "checkpoints"
        self.predictions, self.partition, self.account, self.job_name = predictions, partition, account, job_name
        self.fingerprint = checkpoint.fingerprint(workflow.stage_settings(self.cfg, "launch"), self.selected_workers,
                                                  self.selected_batch)  # fmt: skip
        self.move: choice.Decision | None = None  # the move `watch` decided on (launch.replan: move)
        self.decisions: dict[int, dict[str, str]] = {}  # drift step -> what tula launch decided
        self.limit = self.cfg.launch.timeout_min or timeout_min or 1440
        self.tried: set[int] = set()  # global batches that ran out of memory
        self.history: History
        self.started = time.time()

    def preflight(self) -> None:
        """On SLURM: the job as it will be asked for (nodes, GPUs, time) fits the partition?"""
        if tula_faults.from_env():  # a malformed spec fails here, naming it, not inside the job
            print(f"[launch] fault injection is ON: {tula_faults.ENV}={os.environ[tula_faults.ENV]!r}", flush=True)
        if self.kind != "slurm":
            return
        try:
            preflight.preflight(self.cfg, train_partition=self.cfg.launch.slurm_partition or self.partition,
                            train_runtime_min=self.limit, training_only=True, train_nodes=self.workers)  # fmt: skip
        except slurm.ClusterUnreadable:
            pass  # sbatch says what is wrong
        except preflight.PreflightError as exc:
            raise RuntimeError(str(exc)) from None

    def resume(self, fresh: bool) -> submitit.Job | None:
        """Continue this run's history, re-attaching to its job if an earlier `tula launch`
        left it running; or start over (another run's checkpoints, ``--fresh``). Returns the
        job still running, if any."""
        prior = History.read(self.out)
        same_run = not fresh and prior.get("fingerprint") == self.fingerprint
        if same_run and prior.get("attempts"):  # after a move, the run goes on at the last attempt's N
            self.workers = prior["attempts"][-1].get("workers") or self.workers
        job = history.still_running(prior, self.out, self.workers) if same_run else None
        if not (job or (not fresh and history.resumable(self.ck, self.fingerprint))):
            for stale in (self.ck, self.out / "oom"):
                shutil.rmtree(stale, ignore_errors=True)
            (self.out / "segments.json").unlink(missing_ok=True)
            prior = {}
        elif not same_run:
            prior = {}  # the checkpoints are this run's but its record is gone: the history starts here
        executor = prior.get("executor", self.kind) if job else self.kind
        self.history = History(self.out, self.fingerprint, self.workers, self.selected_batch, executor,
                               attempts=History.attempts_of(prior))  # fmt: skip
        attempts = self.history.attempts
        if attempts and attempts[-1].outcome == "running" and not job:  # its launcher died; the job is gone
            attempts[-1].outcome = "interrupted"
            attempts[-1].reason = "tula launch stopped while the job ran; resumed by a new attempt from the newest checkpoint"
        self.tried = {a.global_batch for a in attempts if a.outcome == "oom"}
        if job:
            self.started = 0.0  # a re-attached job may have written final.json already
        return job

    def first_batch(self) -> int:
        attempts = self.history.attempts
        batch = attempts[-1].global_batch if attempts else self.selected_batch
        if batch in self.tried:
            batch = self.next_batch(batch)
        print(f"[launch] training N={self.workers} B={batch} on {self.device.device.upper()} ({self.device.why}) "
              f"with the {self.history.executor} executor; job folder "
              f"{self.out / 'submitit'}" + (f"; resuming ({len(attempts)} earlier attempt(s), newest checkpoint: "
                                           f"step {self.checkpoint_step()})" if attempts else ""), flush=True)  # fmt: skip
        return batch

    def checkpoint_step(self) -> int:
        return checkpoint.newest_intact(self.ck) or 0

    def submit(self, batch: int) -> tuple[Attempt, submitit.Job]:
        n, L = len(self.history.attempts) + 1, self.cfg.launch
        ckpt = checkpoint.Checkpointing(self.ck, self.fingerprint, L.checkpoint_every_steps, L.checkpoint_every_epochs,
                                        L.keep_checkpoints, attempt=n)  # fmt: skip
        executor = history.make_executor(self.cfg, self.kind, self.out / "submitit", self.workers, self.limit,
                                      self.partition, self.account, self.job_name)  # fmt: skip
        history.move_request_path(self.out).unlink(missing_ok=True)
        submitted = time.time()
        row = prediction_row(self.predictions, self.workers, batch)
        band = asdict(drift.Band.from_prediction(row)) if row is not None and self.workers > 1 else None

        job = history.submit(executor, ProductionJob(str(self.cfg_path), self.workers, batch, str(self.out), ckpt, band,
                                                  self.device),
                          self.kind)  # fmt: skip
        att = Attempt(n, batch, batch // self.workers, str(job.job_id), self.checkpoint_step(), workers=self.workers,
                      submitted=submitted)  # fmt: skip
        self.history.attempts.append(att)
        print(f"[launch] attempt {n}: job {job.job_id}, N={self.workers}, global batch {batch} ({batch // self.workers} per worker), "
              f"from step {att.start_step}", flush=True)  # fmt: skip
        return att, job

    def reattached(self, job: submitit.Job) -> Attempt:
        att = self.history.attempts[-1]
        print(f"[launch] attempt {att.attempt}: re-attached to job {job.job_id} (global batch {att.global_batch}), "
              "submitted by an earlier tula launch", flush=True)  # fmt: skip
        return att

    def watch(self, att: Attempt, job: submitit.Job) -> None:
        """Wait for the attempt's job, then record how it ended (Ctrl-C or Snakemake stopping
        cancels it: scancel; the workers checkpoint on the TERM)."""
        self.history.write()
        self.move, self.decisions = None, {}
        watch_drift = self._drift_watch(att, job) if self.cfg.launch.replan == "move" and self.predictions else None
        try:
            history.wait(job, self.cfg.launch.poll_s, check=watch_drift)
        except BaseException:
            job.cancel(check=False)
            att.outcome, att.reason = "cancelled", "tula launch was interrupted; the job was cancelled"
            self.history.write("cancelled")
            raise
        att.outcome, att.reason = history.outcome(job, self.out, att.attempt)
        att.segments, att.checkpoint_step = history.segments(self.out, att.attempt), self.checkpoint_step()
        att.drift = [{**d, **self.decisions.get(d["step"], {})} for d in history.drifts(self.out, att.attempt)]
        if self.move is not None and att.outcome == "stopped":
            att.outcome, att.reason = "moved", self.move.reason
        for d in att.drift:
            print(f"[launch] attempt {att.attempt}: network drift at step {d['step']}: {d['reason']} — {d['action']}",
                  flush=True)  # fmt: skip
        if att.segments:  # where the workers really started (a damaged newest checkpoint was skipped) and ended
            att.start_step, att.end_step = att.segments[0]["start_step"], att.segments[-1]["end_step"]
        self.history.write()
        resumed = max(len(att.segments) - 1, 0)  # each segment after the first resumed from a checkpoint
        print(f"[launch] attempt {att.attempt} ended: {att.outcome}"
              + (f" after {resumed} preemption/requeue(s), each resumed from its checkpoint" if resumed else "")
              + (f" — {att.reason}" if att.reason and att.outcome != "completed" else ""), flush=True)  # fmt: skip

    def _drift_watch(self, att: Attempt, job: submitit.Job):
        """A check for :func:`history.wait`: on each new drift the job reports, decide
        (:func:`choice.decide`); on a move, ask the job to checkpoint and stop (a request file
        rank 0 looks for), and say so. Returns True once a move is asked for."""

        def check() -> bool:
            if self.move is not None:
                return False
            for d in history.drifts(self.out, att.attempt):
                if d["step"] in self.decisions:
                    continue
                dec = choice.decide(self.cfg, pd.read_csv(self.predictions), self.workers, att.global_batch, d, self.relaunch_s(att))
                self.decisions[d["step"]] = {"action": "moved" if dec.move else "stayed", "reason": dec.reason}
                print(f"[launch] drift at step {d['step']}: {dec.reason}", flush=True)
                if dec.move:
                    self.move = dec
                    write_bytes(history.move_request_path(self.out), f"to N={dec.workers} B={dec.global_batch}".encode())
                    return True
            return False

        return check

    def relaunch_s(self, att: Attempt) -> float:
        """What a relaunch costs: this attempt's submission to its first step (started.json;
        after a requeue inside the attempt, its process start to first step: no queue wait seen)."""
        started = history.started_path(self.out)
        if att.submitted and started.exists():
            s = read_json(started)
            if s.get("attempt") == att.attempt:
                since = att.submitted if s.get("step") == att.start_step else s.get("process_started", att.submitted)
                return max(float(s["first_step_time"]) - float(since), 0.0)
        return 0.0

    def after(self, att: Attempt, job: submitit.Job, shrink: bool) -> int:
        """The global batch of the next attempt after one that did not complete; raises when
        there is none (stopped, failed, out of memory without ``shrink``, no batch left)."""
        if att.outcome == "stopped":
            self.history.write("stopped")
            raise RuntimeError(f"the training job {job.job_id} was stopped ({att.reason}); its checkpoint of step "
                               f"{att.checkpoint_step} is kept: run the same command again to resume from it")  # fmt: skip
        if att.outcome != "oom":
            self.history.write("failed")
            raise RuntimeError(f"training at N={self.workers} B={att.global_batch} failed (attempt {att.attempt}, job "
                               f"{job.job_id}): {att.reason}\nlogs: {self.out / 'submitit'}\n{history.log_tail(job)}")  # fmt: skip
        if not shrink:
            self.history.write("oom")
            raise OutOfMemory(f"out of memory training at N={self.workers} B={att.global_batch} (attempt {att.attempt}, "
                              f"job {job.job_id}): {att.reason}")  # fmt: skip
        self.tried.add(att.global_batch)
        return self.next_batch(att.global_batch)

    def next_batch(self, batch: int) -> int:
        left = [b for b in fallback_batches(self.workers, batch, self.predictions, self.cfg.grid.batch_min)
                if b not in self.tried]  # fmt: skip
        if not left:
            self.history.write("failed")
            raise RuntimeError(f"out of memory at every global batch tried for N={self.workers} "
                               f"({', '.join(map(str, sorted(self.tried, reverse=True)))}) and no smaller batch >= "
                               f"grid.batch_min={self.cfg.grid.batch_min} divides over {self.workers} workers; lower "
                               "grid.batch_min, use more workers, or a device with more memory")  # fmt: skip
        print(f"[launch] out of memory at B={batch}: relaunching at B={left[0]} from the last checkpoint", flush=True)
        return left[0]

    def finish(self) -> dict[str, Any]:
        final = self.out / "final.json"
        if not final.exists() or final.stat().st_mtime < self.started:
            raise RuntimeError(f"training at N={self.workers} reported success but wrote no {final}")
        self.history.write("completed")
        result = record_prediction(final, self.predictions)
        drifts = [d for a in self.history.attempts for d in a.drift]  # with what tula launch decided on each
        if drifts != result.get("drift", []):
            result["drift"] = drifts
            write_json(final, result)
        return result


def train(cfg_path: str | Path, selection: str | Path, out_dir: str | Path, predictions: str | Path | None = None,
          executor_hint: str | None = None, timeout_min: int | None = None, partition: str | None = None,
          account: str | None = None, fresh: bool = False, shrink: bool = True,
          job_name: str = "tula-train") -> dict[str, Any]:  # fmt: skip
    """Train at the selected (N, B) until done; relaunch smaller after an OOM (``shrink``;
    without it an OOM raises :class:`OutOfMemory`: `tula compare` trains a cell at its own B
    or not at all). Returns final.json."""
    launch = Launch(cfg_path, selection, out_dir, predictions, executor_hint, timeout_min, partition, account, job_name)
    launch.preflight()
    job = launch.resume(fresh)
    batch = launch.first_batch()
    while True:
        if job is not None:  # a job of an earlier `tula launch` of this run is still queued or running
            att = launch.reattached(job)
        else:
            att, job = launch.submit(batch)
        launch.watch(att, job)
        if att.outcome == "completed":
            return launch.finish()
        if att.outcome == "moved":  # launch.replan: move — the rest at the re-planned (N, B), from the checkpoint
            launch.workers, batch, job = launch.move.workers, launch.move.global_batch, None
            continue
        batch, job = launch.after(att, job, shrink), None
