"""The production job's launcher (``tula launch`` and each run of ``tula compare``): the job
submitted with submitit and watched to the end.

Paper §IV-B: "frequent job checkpointing and relaunching progressively smaller batches
until a feasible configuration is found". One *attempt* is one submitit job at one global
batch B at one N (:class:`tula.production.attempts.Attempt`):

- the job is a :class:`tula.production.job.ProductionJob` (``submitit.helpers.Checkpointable``):
  SLURM's USR2 before the time limit or on preemption makes every rank checkpoint at the next
  step boundary, and submitit requeues the job, which resumes from that checkpoint (TERM, from
  scancel or ``scontrol requeue``, also checkpoints first). Requeues stay inside one attempt;
- if a rank runs out of memory, all ranks agree, the job ends with outcome ``oom``, and
  the next attempt resumes from the last checkpoint at the next smaller feasible B (the
  memory model's order from predictions.csv, else B/2) until one trains or none is left;
- with ``launch.replan: move``, a drift the job reports (its sync outside the predicted band,
  :mod:`tula.production.monitor`) is re-planned (:func:`tula.model.refit.decide`); if another
  (N, B) pays for the relaunch, the job is asked to checkpoint and stop, and the next attempt
  continues there from that checkpoint (every sample once per epoch: the position is in
  samples, independent of N and B);
- on SLURM, a node lost under the job (:mod:`tula.production.nodes`): the job is resubmitted
  or requeued at its shape; if the nodes are not back within ``launch.node_wait_min``, the
  rest is re-planned onto the nodes left and continues there from the checkpoint.

Every attempt is written to ``results/train/attempts.json``
(:class:`tula.production.attempts.History`);
submitit's job folder and logs are in ``results/train/submitit/``. The rank-0 log is echoed
to the terminal while the job runs. At the end, final.json gets the prediction for the point
the job trained beside what the job measured (:func:`tula.production.confirm.record_prediction`).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import submitit

from tula import checkpoint, devices, model_inputs, pipeline, preflight
from tula import config as config_mod
from tula import faults as tula_faults
from tula.io import write_json
from tula.model import drift
from tula.production import jobdir, nodes, relaunch, submission
from tula.production.attempts import Attempt, History
from tula.production.confirm import prediction_row, record_prediction
from tula.production.job import ProductionJob
from tula.production.nodes import NodeWatch
from tula.production.replan import Replan
from tula.slurm import controller


class Launch:
    """One `tula launch`: the run's settings, its history of attempts, and the steps of the
    attempt loop in :func:`run`."""

    def __init__(
        self,
        cfg: config_mod.Config,
        point: tuple[int, int],
        out_dir: str | Path,
        predictions,
        executor_hint,
        timeout_min,
        partition,
        account,
        job_name: str,
    ):
        self.cfg = cfg
        self.kind = submission.resolve_executor(self.cfg, executor_hint)
        # where the job runs (tula.devices; the workflow's config has it decided already): by hand
        # on SLURM with device auto, the partition's GRES decides, so a GPU partition gets --gres
        try:
            self.device = devices.for_config(
                self.cfg, self.kind, self.cfg.launch.slurm_partition or partition
            )
        except preflight.PreflightError as exc:  # a partition the cluster does not have, named
            raise RuntimeError(str(exc)) from None
        self.cfg = devices.apply(self.cfg, self.device)
        # workers: the current attempt's N (a move changes it)
        self.workers, self.selected_batch = point
        self.selected_workers = self.workers
        self.out = Path(out_dir).resolve()
        self.ck = self.out / "checkpoints"
        self.predictions, self.partition, self.account, self.job_name = (
            predictions,
            partition,
            account,
            job_name,
        )
        self.fingerprint = checkpoint.fingerprint(
            pipeline.stage_settings(self.cfg, "launch"), self.selected_workers, self.selected_batch
        )
        self.replan = Replan(self.cfg, predictions, self.out)  # launch.replan: move
        self.limit = self.cfg.launch.timeout_min or timeout_min or 1440
        self.tried: set[int] = set()  # global batches that ran out of memory
        self.train_partition = self.cfg.launch.slurm_partition or partition
        self.lost = NodeWatch(self.cfg, predictions, self.train_partition)  # nodes lost (SLURM)
        self.history: History
        self.started = time.time()

    def preflight(self) -> None:
        """On SLURM: the job as it will be asked for (nodes, GPUs, time) fits the partition?"""
        if tula_faults.from_env():  # a malformed spec fails here, naming it, not inside the job
            print(
                "[launch] fault injection is ON: "
                f"{tula_faults.ENV}={os.environ[tula_faults.ENV]!r}",
                flush=True,
            )
        if self.kind != "slurm":
            return
        try:
            preflight.preflight(
                self.cfg,
                train_partition=self.train_partition,
                train_runtime_min=self.limit,
                training_only=True,
                train_nodes=self.workers,
                node_states=False,  # a node lost: waited for, then re-planned (Launch.watch)
            )
        except controller.ClusterUnreadable:
            pass  # sbatch says what is wrong
        except preflight.PreflightError as exc:
            raise RuntimeError(str(exc)) from None

    def resume(self, fresh: bool) -> submitit.Job | None:
        """Continue this run's history, re-attaching to its job if an earlier `tula launch`
        left it running; or start over (another run's checkpoints, ``--fresh``). Returns the
        job still running, if any."""
        prior = History.read(self.out)
        same_run = not fresh and prior.get("fingerprint") == self.fingerprint
        # after a move, the run goes on at the last attempt's N
        if same_run and prior.get("attempts"):
            self.workers = prior["attempts"][-1].get("workers") or self.workers
        job = submission.still_running(prior, self.out, self.workers) if same_run else None
        if not (job or (not fresh and jobdir.resumable(self.ck, self.fingerprint))):
            jobdir.start_over(self.out)
            prior = {}
        elif not same_run:
            # the checkpoints are this run's but its record is gone: the history starts here
            prior = {}
        self.history = History(
            self.out,
            self.fingerprint,
            self.workers,
            self.selected_batch,
            prior.get("executor", self.kind) if job else self.kind,
            attempts=History.attempts_of(prior),
        )
        self.history.close_interrupted(job_alive=job is not None)
        self.tried = self.history.oom_batches()
        if job:
            self.started = 0.0  # a re-attached job may have written final.json already
        return job

    def first_batch(self) -> int:
        attempts = self.history.attempts
        batch = attempts[-1].global_batch if attempts else self.selected_batch
        if batch in self.tried:
            batch = self.next_batch(batch)
        print(
            f"[launch] training N={self.workers} B={batch} on {self.device.device.upper()} "
            f"({self.device.why}) with the {self.history.executor} executor; job folder "
            f"{self.out / 'submitit'}"
            + (
                f"; resuming ({len(attempts)} earlier attempt(s), newest checkpoint: step "
                f"{self.checkpoint_step()})"
                if attempts
                else ""
            ),
            flush=True,
        )
        return batch

    def checkpoint_step(self) -> int:
        return checkpoint.newest_intact(self.ck) or 0

    def submit(self, batch: int) -> tuple[Attempt, submitit.Job]:
        n, L = len(self.history.attempts) + 1, self.cfg.launch
        ckpt = checkpoint.Checkpointing(
            self.ck,
            self.fingerprint,
            L.checkpoint_every_steps,
            L.checkpoint_every_epochs,
            L.keep_checkpoints,
            attempt=n,
        )
        row = prediction_row(self.predictions, self.workers, batch)
        band = (
            asdict(drift.Band.from_prediction(row))
            if row is not None and self.workers > 1
            else None
        )
        # the job first, then the executor that submits it (self.cfg has the device decision)
        lr = model_inputs.lr_at(self.cfg, batch)  # a user's script's {lr} at this B
        # train.accumulate: the micro-batch the plan priced at this point (None: not planned)
        m = (row or {}).get("micro_batch")
        micro = int(m) if m is not None and m == m else None  # NaN: none
        job_fn = ProductionJob(self.cfg, self.workers, batch, str(self.out), ckpt, band, lr, micro)
        executor = submission.make_executor(
            self.cfg,
            self.kind,
            self.out / "submitit",
            self.workers,
            self.limit,
            self.partition,
            self.account,
            self.job_name,
        )
        jobdir.move_request_path(self.out).unlink(missing_ok=True)
        submitted = time.time()
        job = submission.submit(executor, job_fn, self.kind)
        att = Attempt(
            n,
            batch,
            batch // self.workers,
            str(job.job_id),
            self.checkpoint_step(),
            workers=self.workers,
            submitted=submitted,
        )
        self.history.add(att)
        print(
            f"[launch] attempt {n}: job {job.job_id}, N={self.workers}, global batch {batch} "
            f"({batch // self.workers} per worker), from step {att.start_step}",
            flush=True,
        )
        return att, job

    def reattached(self, job: submitit.Job) -> Attempt:
        att = self.history.attempts[-1]
        print(
            f"[launch] attempt {att.attempt}: re-attached to job {job.job_id} (global batch "
            f"{att.global_batch}), submitted by an earlier tula launch",
            flush=True,
        )
        return att

    def watch(self, att: Attempt, job: submitit.Job) -> None:
        """Wait for the attempt's job, then record how it ended (Ctrl-C or Snakemake stopping
        cancels it: scancel; the workers checkpoint on the TERM)."""
        self.history.write()
        drift = self.replan.watch(att, self.workers)
        check = self.lost.around(att, self.history.executor, drift, job)
        try:
            submission.wait(job, self.cfg.launch.poll_s, check=check)
        except BaseException:
            job.cancel(check=False)
            att.end("cancelled", "tula launch was interrupted; the job was cancelled")
            self.history.write("cancelled")
            raise
        att.end(*self.lost.outcome(submission.outcome(job, self.out, att.attempt), job))
        drift = [self.replan.decided(d) for d in jobdir.drifts(self.out, att.attempt)]
        ck = self.checkpoint_step()
        att.account(jobdir.attempt_segments(self.out, att.attempt, ck), ck, drift)
        if self.replan.move is not None and att.outcome == "stopped":
            att.end("moved", self.replan.move.reason)
        self.history.write()
        for line in att.report_lines():
            print(f"[launch] {line}", flush=True)

    def move_to(self, move) -> int:
        """launch.replan: move: the rest at the re-planned N; returns the global batch."""
        self.workers = move.workers
        return move.global_batch

    def after(self, att: Attempt, job: submitit.Job, shrink: bool) -> int:
        """The global batch of the next attempt after one that did not complete; raises when
        there is none (stopped, failed, out of memory without ``shrink``, no batch left),
        the run's record written first."""
        try:
            if self.lost.resubmits(self.history.attempts):  # a node or peer lost: same shape
                return att.global_batch
            if att.outcome == "oom" and shrink:
                self.tried.add(att.global_batch)
                return self.next_batch(att.global_batch)
            raise relaunch.why_it_ends(att, job, self.workers, self.out, shrink)
        except relaunch.RunEnds as end:
            self.history.write(end.status)
            raise end.error from None

    def next_batch(self, batch: int) -> int:
        """The next smaller batch after an OOM at ``batch`` (none left: the run ends)."""
        try:
            return relaunch.next_batch(
                self.workers, batch, self.tried, self.predictions, self.cfg.grid.batch_min
            )
        except relaunch.RunEnds as end:
            self.history.write(end.status)
            raise end.error from None

    def finish(self) -> dict[str, Any]:
        final = self.out / "final.json"
        if not final.exists() or final.stat().st_mtime < self.started:
            raise RuntimeError(
                f"training at N={self.workers} reported success but wrote no {final}"
            )
        self.history.write("completed")
        result = record_prediction(final, self.predictions)
        # with what tula launch decided on each
        drifts = [d for a in self.history.attempts for d in a.drift]
        lost = nodes.events(self.history.attempts)  # each node lost, and what Tula did
        if drifts != result.get("drift", []) or lost:
            result = {**result, "drift": drifts, "nodes_lost": lost}
            write_json(final, result)
        return result


def train(
    cfg: config_mod.Config,
    point: tuple[int, int],
    out_dir: str | Path,
    predictions: str | Path | None = None,
    executor_hint: str | None = None,
    timeout_min: int | None = None,
    partition: str | None = None,
    account: str | None = None,
    fresh: bool = False,
    shrink: bool = True,
    job_name: str = "tula-train",
) -> dict[str, Any]:
    """Train ``cfg`` at the selected ``point`` (N, B) until done; relaunch smaller after an OOM
    (``shrink``; without it an OOM raises :class:`OutOfMemory`: `tula compare` trains a cell at
    its own B or not at all). Returns final.json. The records, not their files: `tula launch`
    reads the config and selection.json (:func:`selected_point`), `tula compare` builds each
    run's config."""
    launch = Launch(
        cfg,
        point,
        out_dir,
        predictions,
        executor_hint,
        timeout_min,
        partition,
        account,
        job_name,
    )
    launch.preflight()
    job = launch.resume(fresh)
    batch = launch.first_batch()
    while True:
        # a job of an earlier `tula launch` of this run is still queued or running
        if job is not None:
            att = launch.reattached(job)
        else:
            att, job = launch.submit(batch)
        launch.watch(att, job)
        if att.outcome == "completed":
            return launch.finish()
        # launch.replan: move, or a node lost for good: the rest at the re-planned (N, B), from
        # the checkpoint
        if att.outcome in ("moved", "replanned"):
            move = launch.replan.move if att.outcome == "moved" else launch.lost.decision
            batch, job = launch.move_to(move), None
            continue
        batch, job = launch.after(att, job, shrink), None
