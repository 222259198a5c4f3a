"""A user's own model and dataset, loss and metric, given to Tula by import path (tests put
tests/ on PYTHONPATH):

    workload:
      model: user_workload:make_model        # (input_shape, num_classes) -> nn.Module
      dataset: user_workload:make_datasets   # () -> (train_dataset, test_dataset)
    train:
      loss: user_workload:margin_loss        # (outputs, targets) -> scalar loss
      metric: user_workload:error_rate       # (outputs, targets) -> float; metric_goal: min
      optimizer: user_workload:nesterov_sgd  # (params, lr) -> torch.optim.Optimizer
      schedule: user_workload:quarters       # (optimizer, total_steps) -> LR scheduler

The dataset is map-style and built lazily per item, like a real on-disk dataset would be.
"""

import time

import torch
from torch import nn
from torch.utils.data import Dataset


class Blobs(Dataset):
    """Three Gaussian blobs in 16-D, as (1, 16) signals; sample i is generated from its index."""

    classes = ["a", "b", "c"]

    def __init__(self, n: int, offset: int):
        self.n, self.offset = n, offset
        g = torch.Generator().manual_seed(1234)
        self.centers = torch.randn(3, 16, generator=g) * 3

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(self.offset + i)
        label = (self.offset + i) % 3
        return (self.centers[label] + torch.randn(16, generator=g)).unsqueeze(0), label


def make_datasets():
    return Blobs(300, 0), Blobs(90, 10_000)


class SlowBlobs(Blobs):
    """Blobs read as from a slow disk: SLOW_SAMPLE_S of sleep per training sample."""

    def __getitem__(self, i: int):
        time.sleep(SLOW_SAMPLE_S)
        return super().__getitem__(i)


# 10 ms: at 4 ms a CI host whose step paid 12 ms beside the input (the loader, DDP, the optimizer
# in Python on a slow core) read 46 ms of input in a 58 ms step, 0.79 of it: under the 80 % that
# makes a probe input-bound (tula.model.measurements.INPUT_BOUND)
SLOW_SAMPLE_S = 0.010


def make_slow_datasets():
    """A training set whose input, not its model, sets the step's pace."""
    return SlowBlobs(300, 0), Blobs(90, 10_000)


class TinyNet(nn.Module):
    def __init__(self, in_shape, num_classes):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_shape[0] * in_shape[1], 32),
            nn.ReLU(),
            nn.Linear(32, num_classes),
        )

    def forward(self, x):
        return self.net(x)


def make_model(in_shape, num_classes):
    return TinyNet(in_shape, num_classes)


# -- a user's own loss and metric (train.loss, train.metric) ---------------------------------


def margin_loss(outputs, targets):
    """A loss of the user's: the multi-class hinge loss (a scalar with a gradient)."""
    return torch.nn.functional.multi_margin_loss(outputs, targets)


def error_rate(outputs, targets):
    """A metric of the user's where smaller is better (train.metric_goal: min): the share of
    the batch misclassified, as a 0-d tensor (no host read in the step)."""
    return (outputs.argmax(1) != targets).double().mean()


# -- a user's own optimizer and schedule (train.optimizer, train.schedule) --------------------


def nesterov_sgd(params, lr):
    """An optimizer of the user's: SGD with Nesterov momentum (its state: a momentum buffer)."""
    return torch.optim.SGD(params, lr=lr, momentum=0.9, nesterov=True)


def quarters(optimizer, total_steps):
    """A schedule of the user's: the LR halved after each quarter of the run's steps."""
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=max(total_steps // 4, 1), gamma=0.5)


# -- broken specs, for the error messages --------------------------------------------------
NOT_CALLABLE = 42


def returns_a_string(in_shape, num_classes):
    return "not a module"


def wrong_output(in_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(in_shape[0] * in_shape[1], num_classes + 1))


def returns_one_dataset():
    return Blobs(10, 0)


def yields_dicts():
    class D(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return {"x": torch.zeros(1, 16), "y": 0}

    return D(), D()


HIDDEN = 256


def linear_stack(in_shape, num_classes):
    """Flatten, Linear(D, 256), ReLU, Linear(256, K): a model whose step memory is known by hand
    (tests/runtime/test_estimate.py)."""
    d = 1
    for s in in_shape:
        d *= s
    return nn.Sequential(
        nn.Flatten(), nn.Linear(d, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, num_classes)
    )


class ReadsItsValues(nn.Module):
    """A forward that reads a tensor's value (``.item()``): it cannot run without data."""

    def __init__(self, in_shape, num_classes):
        super().__init__()
        self.fc = nn.Linear(in_shape[-1], num_classes)

    def forward(self, x):
        if x.abs().max().item() > 1e6:
            x = x / 1e6
        return self.fc(x.flatten(1)[:, : self.fc.in_features])


def reads_its_values(in_shape, num_classes):
    return ReadsItsValues(in_shape, num_classes)
