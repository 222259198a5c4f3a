"""Tula in a user's own Lightning script: :class:`TulaCallback`, added to their ``Trainer``,
does what ``run.step``, ``run.batches`` and ``run.epoch_end`` do in a plain script, around
Lightning's own fit loop (DDP): each training batch is a marked step (a probe's compute-only
step runs under the DDP model's ``no_sync()``), each epoch's batches and their kinds are told
to the run, and each epoch's logged metrics go to metrics.csv, TensorBoard and final.json. A
probe does not end Lightning's epochs early (an epoch so ended skips its validation, which the
job pays): it steps to one epoch's end, to time what follows it. In the production job Tula's
checkpoints hold Lightning's own (its whole trainer state), and
``trainer.fit(..., ckpt_path=callback.resume_path())`` resumes from the newest one after a
requeue.

.. code-block:: python

    run = tula.script.attach(local_batch=args.batch_size, epochs=args.epochs, lr=args.lr)
    tula_cb = TulaCallback(run)
    trainer = L.Trainer(strategy="ddp", max_epochs=run.num_epochs, callbacks=[tula_cb], ...)
    trainer.fit(module, datamodule, ckpt_path=tula_cb.resume_path())
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from tula import checkpoint
from tula.script.run import Run

# metrics.csv's names for what the module logs (self.log), as the callback reads them
LOGGED = {
    "loss": "train_loss",
    "metric": "train_acc",
    "test_loss": "val_loss",
    "test_metric": "val_acc",
}


class LightningState:
    """Lightning's own checkpoint of the whole trainer (model, optimizers, schedulers, loops,
    callbacks), kept as one part of Tula's: what ``trainer.save_checkpoint`` writes."""

    def __init__(self, trainer: pl.Trainer):
        self.trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        # what Trainer.save_checkpoint writes, as a dict (Tula writes it, atomic and verified)
        return self.trainer._checkpoint_connector.dump_checkpoint(weights_only=False)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing here: Lightning loads it itself, before fit (``TulaCallback.resume_path``)."""


class TulaCallback(pl.Callback):
    """The run's calls around Lightning's fit loop (module docstring). ``logged``: the names
    the module logs its train loss and metric and its validation loss and metric under."""

    def __init__(self, run: Run, logged: dict[str, str] | None = None):
        self.run = run
        self.logged = {**LOGGED, **(logged or {})}
        self.steps = contextlib.ExitStack()

    def resume_path(self) -> str | None:
        """Lightning's checkpoint from Tula's newest of this run (production job), written to a
        file of this rank's for ``trainer.fit(ckpt_path=...)``; None when there is none."""
        ask = self.run.spec.train if self.run.spec else None
        if ask is None:
            return None

        def ours(s: dict[str, Any]) -> str:
            return "" if s.get("fingerprint") == ask.fingerprint and not s.get("complete") else "no"

        loaded, _ = checkpoint.load_latest(ask.checkpoint_dir, ours)
        if loaded is None:
            return None
        # beside Tula's own, in the run's folder (a new run's start clears it)
        where = Path(ask.checkpoint_dir) / f"lightning-resume-rank{self.run.rank}.ckpt"
        where.write_bytes(checkpoint.to_bytes(loaded.state["parts"]["lightning"]))
        return str(where)

    # -- Lightning's hooks --------------------------------------------------------------
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.run.watch(model=trainer.strategy.model, optimizer=trainer.optimizers[0])
        self.run.keep(lightning=LightningState(trainer))

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        loader = trainer.train_dataloader
        dataset = getattr(loader, "dataset", None)
        size = len(dataset) if hasattr(dataset, "__len__") else None
        self.run.loop_epoch_starts(int(trainer.num_training_batches), size)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.run.loop_batch(batch)
        self.steps.enter_context(self.run.step())

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self.steps.close()  # the step ends: timed, and perhaps the probe's last
        if batch_idx + 1 >= trainer.num_training_batches:
            self.run.loop_epoch_ends()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        m = trainer.callback_metrics
        row = {k: (float(m[name]) if name in m else None) for k, name in self.logged.items()}
        self.run.epoch_end(**row)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.run.finish()
