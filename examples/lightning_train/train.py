"""A Lightning training script, as an engineer keeps one, with Tula's callback in it.

Run it yourself, on 2 CPU processes:

    torchrun --nproc-per-node 2 examples/lightning_train/train.py --batch-size 128 --epochs 3

or let Tula size it (``examples/lightning_train/config.yaml``): Tula runs it in its check, its
memory probe, every timing probe and the production job, with the batch per worker, the LR and
the epochs it chose. The lines that are Tula's are marked ``# Tula``: ``attach`` for the batch
and role, ``TulaCallback`` in the Trainer's callbacks, and ``ckpt_path`` from it (a requeued
job resumes from Tula's newest checkpoint, which holds Lightning's own).

The same workload as examples/ddp_train: MNIST-1D (no download), three 1-D convolutions with
batch norm, SGD with momentum and a step schedule, cross-entropy, accuracy.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import tula.script  # Tula
from tula.script.lightning import TulaCallback  # Tula


class MNIST1D(Dataset):
    def __init__(self, x: np.ndarray, y: np.ndarray, mean: float, std: float):
        self.x, self.y = torch.from_numpy((x - mean) / std), torch.from_numpy(y)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


class MNIST1DData(pl.LightningDataModule):
    """MNIST-1D made once by the mnist1d package and kept in an .npz."""

    def __init__(self, path: Path, samples: int, seed: int, batch_size: int):
        super().__init__()
        self.path, self.samples, self.seed, self.batch_size = path, samples, seed, batch_size

    def prepare_data(self) -> None:
        if self.path.exists():
            return
        from mnist1d.data import get_dataset_args, make_dataset

        args = get_dataset_args()
        args.num_samples, args.seed = self.samples, self.seed
        d = make_dataset(args)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(tmp, x=d["x"], y=d["y"], x_test=d["x_test"], y_test=d["y_test"])
        os.replace(tmp, self.path)

    def setup(self, stage: str) -> None:
        z = np.load(self.path)
        x, xt = z["x"].astype(np.float32)[:, None, :], z["x_test"].astype(np.float32)[:, None, :]
        mean, std = float(x.mean()), float(x.std()) or 1.0
        self.train = MNIST1D(x, z["y"].astype(np.int64), mean, std)
        self.test = MNIST1D(xt, z["y_test"].astype(np.int64), mean, std)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.test, batch_size=512)


class SmallCNN(pl.LightningModule):
    def __init__(self, lr: float, decay_epochs: list[int]):
        super().__init__()
        self.lr, self.decay_epochs = lr, decay_epochs
        self.net = nn.Sequential(
            nn.Conv1d(1, 32, 3, padding=1),
            nn.BatchNorm1d(32),
            nn.ReLU(inplace=True),
            nn.Conv1d(32, 64, 3, padding=1),
            nn.BatchNorm1d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool1d(2),
            nn.Conv1d(64, 64, 3, padding=1),
            nn.BatchNorm1d(64),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool1d(1),
            nn.Flatten(),
            nn.Linear(64, 10),
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self.net(x)
        loss = nn.functional.cross_entropy(out, y)
        acc = (out.argmax(1) == y).float().mean()
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        self.log("train_acc", acc, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        out = self.net(x)
        self.log("val_loss", nn.functional.cross_entropy(out, y), sync_dist=True)
        self.log("val_acc", (out.argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, weight_decay=5e-4)
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=self.decay_epochs, gamma=0.1)
        return [opt], [sched]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=128, help="samples per worker and step")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--decay-epochs", type=int, nargs="*", default=[2])
    p.add_argument("--samples", type=int, default=20000, help="MNIST-1D samples made")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", type=Path, help="the .npz the set is kept in (made if missing)")
    a = p.parse_args()
    cache = Path(os.environ.get("TULA_CACHE_DIR", Path.home() / ".cache" / "tula"))
    a.data = a.data or cache / f"example-mnist1d-{a.samples}-seed{a.seed}.npz"

    run = tula.script.attach(local_batch=a.batch_size, epochs=a.epochs, lr=a.lr)  # Tula
    pl.seed_everything(a.seed, verbose=False)
    tula_cb = TulaCallback(run)  # Tula: times the steps, checkpoints, reports the epochs
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", run.world))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=per_node,
        num_nodes=run.world // per_node,
        strategy="ddp",
        max_epochs=run.num_epochs,
        callbacks=[tula_cb],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = MNIST1DData(a.data, a.samples, a.seed, run.local_batch)  # Tula's batch per worker
    trainer.fit(SmallCNN(run.lr, a.decay_epochs), data, ckpt_path=tula_cb.resume_path())  # Tula
    if trainer.global_rank == 0 and not run.role:
        print(f"test accuracy {float(trainer.callback_metrics['val_acc']):.4f}", flush=True)


if __name__ == "__main__":
    main()
