"""A plain PyTorch DDP training script, as an engineer keeps one, with Tula's few lines in it.

Run it yourself, on 2 CPU processes:

    torchrun --nproc-per-node 2 examples/ddp_train/train.py --batch-size 128 --epochs 3

or let Tula size it (``workload.script: examples/ddp_train/train.py`` in
``workflow/config.yaml``; ``examples/ddp_train/config.yaml`` is that config): Tula then runs it
in its check, its memory probe, every timing probe and the production job, with the batch per
worker, the LR and the epochs it chose in ``{local_batch}``, ``{lr}`` and ``{epochs}``.

The lines that are Tula's are marked ``# Tula``; without Tula's launcher each is a pass-through.
The data: MNIST-1D (made by the mnist1d package, no download), a dataset class of the script's
own, standardised with the training set's mean and std; the model: three 1-D convolutions with
batch norm; SGD with momentum and a step schedule; cross-entropy; accuracy on the test set.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

import tula.script  # Tula


class MNIST1D(Dataset):
    """MNIST-1D signals (1 x 40) and their labels, from an .npz the script makes once."""

    def __init__(self, x: np.ndarray, y: np.ndarray, mean: float, std: float):
        self.x = torch.from_numpy((x - mean) / std)
        self.y = torch.from_numpy(y)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def load_data(path: Path, samples: int, seed: int) -> tuple[MNIST1D, MNIST1D]:
    if not path.exists():  # made once (every rank makes the same; the last write wins whole)
        from mnist1d.data import get_dataset_args, make_dataset

        args = get_dataset_args()
        args.num_samples, args.seed = samples, seed
        d = make_dataset(args)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(tmp, x=d["x"], y=d["y"], x_test=d["x_test"], y_test=d["y_test"])
        os.replace(tmp, path)
    z = np.load(path)
    x, x_test = z["x"].astype(np.float32)[:, None, :], z["x_test"].astype(np.float32)[:, None, :]
    mean, std = float(x.mean()), float(x.std()) or 1.0
    y, y_test = z["y"].astype(np.int64), z["y_test"].astype(np.int64)
    return MNIST1D(x, y, mean, std), MNIST1D(x_test, y_test, mean, std)


def small_cnn(channels: int, classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv1d(channels, 32, 3, padding=1),
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
        nn.Linear(64, classes),
    )


def evaluate(model: nn.Module, loader: DataLoader) -> tuple[float, float]:
    """(loss, accuracy) over the test set, summed over every rank."""
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64)
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            sums += torch.tensor(
                [nn.functional.cross_entropy(out, y, reduction="sum").item(),
                 (out.argmax(1) == y).sum().item(), len(y)], dtype=torch.float64
            )  # fmt: skip
    model.train()
    dist.all_reduce(sums)
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


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
    dist.init_process_group("gloo")
    torch.manual_seed(a.seed)  # the same initial weights on every rank
    train_set, test_set = load_data(a.data, a.samples, a.seed)
    sampler = DistributedSampler(train_set, shuffle=True, seed=a.seed)
    loader = DataLoader(train_set, batch_size=run.local_batch, sampler=sampler)  # Tula's batch
    test_loader = DataLoader(
        test_set, batch_size=512, sampler=DistributedSampler(test_set, shuffle=False)
    )
    model = DDP(small_cnn(1, 10))
    opt = torch.optim.SGD(model.parameters(), lr=run.lr, momentum=0.9, weight_decay=5e-4)
    steps = len(loader)
    sched = torch.optim.lr_scheduler.MultiStepLR(
        opt, milestones=[e * steps for e in a.decay_epochs], gamma=0.1
    )
    run.keep(model=model, optimizer=opt, scheduler=sched)  # Tula: checkpointed, resumed

    @run.step  # Tula: timed (and, in a probe, also timed without the gradient all-reduce)
    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = nn.functional.cross_entropy(out, y)
        loss.backward()
        opt.step()
        sched.step()
        sums[0] += loss.detach() * len(y)
        sums[1] += (out.detach().argmax(1) == y).sum()
        sums[2] += len(y)
        return loss

    for epoch in run.epochs():  # Tula: from where a resumed run stands
        sampler.set_epoch(epoch)
        sums = torch.zeros(3, dtype=torch.float64)
        for x, y in run.batches(loader):  # Tula: a resumed epoch skips what it stepped
            train_step(x, y)
        dist.all_reduce(sums)
        test_loss, test_acc = evaluate(model, test_loader)
        run.epoch_end(  # Tula: metrics.csv, TensorBoard, final.json
            loss=sums[0] / sums[2], metric=sums[1] / sums[2], test_loss=test_loss,
            test_metric=test_acc,
        )  # fmt: skip
        if run.rank == 0 and not run.role:
            print(f"epoch {epoch + 1}: test accuracy {test_acc:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
