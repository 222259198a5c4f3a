"""The production job's entry point: the object `tula launch` hands to submitit
(:class:`ProductionJob`), which each of the job's tasks unpickles and runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import submitit

from tula import checkpoint
from tula.config import Config
from tula.slurm import rendezvous
from tula.workers.processes import worker_environment


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
        # torch: imported by the job's tasks, never by tula launch
        from tula.production.trainer import Trainer

        return Trainer(
            cfg, self.workers, self.global_batch, Path(self.out_dir), self.ckpt, self.band
        ).run()

    # checkpoint(): Checkpointable's default resubmits this same call; the state is on disk.
