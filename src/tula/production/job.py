"""The production job's entry point: the object `tula launch` hands to submitit
(:class:`ProductionJob`), which each of the job's tasks unpickles and runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import submitit

from tula import checkpoint
from tula.config import Config, metric_name
from tula.slurm import rendezvous
from tula.workers import script_launch, script_run
from tula.workers.processes import worker_environment
from tula.workers.script_run import ScriptRun, TrainAsk


class ProductionJob(submitit.helpers.Checkpointable):
    """What each of the job's N tasks runs: join the process group that submitit describes
    (``TorchDistributedEnvironment``) and train from the newest checkpoint of this run.

    A module of its own, with no torch until the job runs and none of the launcher: submitit
    unpickles this object in every task before it runs, importing its module, and the
    launcher's imports (pandas' frames, the selection) would add start-up that the probe's
    workers do not pay, so the probe's start-up would not predict the job's (BENCHMARKS.md
    "Start-up and overheads"). `tula launch` imports it to submit it."""

    def __init__(
        self,
        config: Config,
        workers: int,
        global_batch: int,
        out_dir: str,
        ckpt: checkpoint.Checkpointing,
        band: dict[str, float] | None = None,
        lr: float | None = None,
        micro_batch: int | None = None,
    ):
        self.config, self.workers, self.global_batch, self.out_dir, self.ckpt = (
            config,
            workers,
            global_batch,
            out_dir,
            ckpt,
        )
        # the predicted sync at (N, B) for the drift detector (tula.model.drift.Band)
        self.band = band
        self.lr = lr  # a user's script's {lr} at this B (tula.model_inputs.lr_at)
        self.micro_batch = micro_batch  # train.accumulate's largest micro-batch, as planned

    def __call__(self) -> dict[str, Any]:
        cfg = self.config  # with tula launch's device decision in it (tula.devices.apply)
        # as the probe's workers, before torch
        os.environ.update(worker_environment(cfg.hardware.threads_per_worker))
        on_cuda = cfg.hardware.device == "cuda"
        # every task derives the rendezvous port alike, outside the ephemeral range (see
        # rendezvous.master_port); a MASTER_PORT the user exported wins
        os.environ.setdefault(
            "MASTER_PORT", str(rendezvous.master_port(submitit.JobEnvironment().job_id))
        )
        submitit.helpers.TorchDistributedEnvironment().export(
            set_cuda_visible_devices=on_cuda, overwrite=True
        )
        if cfg.workload.script:
            return self.run_script()
        # torch: imported by the job's tasks, never by tula launch
        from tula.production.trainer import Trainer

        return Trainer(
            cfg,
            self.workers,
            self.global_batch,
            Path(self.out_dir),
            self.ckpt,
            self.band,
            getattr(self, "micro_batch", None),  # a job pickled before it had one
        ).run()

    def run_script(self) -> dict[str, Any]:
        """The user's own script in this task (workload.script): run as ``python script.py
        args`` would, at (N, B), told where its checkpoints and records go
        (:class:`tula.workers.script_run.TrainAsk`); ``tula.script`` in it does what the
        trainer does around Tula's own step. Its outcome: completed once its epochs are done
        (the script's Tula wrote final.json), else failed, naming why."""
        cfg, ckpt = self.config, self.ckpt
        spec = ScriptRun(
            "production",
            self.workers,
            self.global_batch,
            self.lr,
            cfg.workload.epochs,
            train=TrainAsk(
                out_dir=self.out_dir,
                checkpoint_dir=str(ckpt.directory),
                fingerprint=ckpt.fingerprint,
                every_steps=ckpt.every_steps,
                every_epochs=ckpt.every_epochs,
                keep=ckpt.keep,
                attempt=ckpt.attempt,
                requeue="submitit",
                metric=metric_name(cfg.train.metric),
                metric_goal=cfg.train.metric_goal,
            ),
        )
        os.environ.update({**spec.to_env(), **cfg.hardware.comm_env})
        argv = script_launch.argv(cfg, spec)[1:]
        outcome = script_run.run_script(argv)
        if outcome is None:
            return {
                "outcome": "failed",
                "reason": f"{cfg.workload.script} ended without tula.script.attach()",
            }
        return outcome

    # checkpoint(): Checkpointable's default resubmits this same call; the state is on disk.
