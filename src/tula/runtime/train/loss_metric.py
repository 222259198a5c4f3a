"""What a step minimises and what an epoch reports: ``train.loss`` (cross-entropy with
``train.label_smoothing``, or the user's callable) and ``train.metric`` (top-1 hits, the user's
callable, or a torchmetrics class computed over the whole epoch). The probe, the production
job, the evaluation and the config check build them here.
"""

from __future__ import annotations

import sys
from typing import Callable

import torch

from tula.config import ConfigError, TrainSettings
from tula.runtime.input.data import import_callable


def build_loss(t: TrainSettings) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``train.loss``: cross-entropy with ``train.label_smoothing``, or the user's callable."""
    if t.loss == "cross_entropy":
        return torch.nn.CrossEntropyLoss(label_smoothing=t.label_smoothing)
    return import_callable(t.loss, "train.loss")


class EpochMetric:
    """``train.metric`` given as a torchmetrics ``Metric`` class (``train.metric_args`` its
    arguments): updated with every batch's outputs where they are (no host read in the step),
    computed over the whole epoch at its end and synced across the ranks by torchmetrics itself
    (its states gathered on the default process group), then reset. Called like a batch-sum
    metric, it updates and adds nothing to the epoch's sums; a checkpoint keeps its states."""

    def __init__(self, metric, device: torch.device):
        self.metric = metric.to(device)
        self.metric.persistent(True)  # its states in state_dict(): a checkpoint mid-epoch

    def __call__(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.metric.update(out, y)
        return torch.zeros((), dtype=torch.float64, device=out.device)

    def compute(self) -> float:
        """The epoch's value over every rank's batches (a collective: every rank calls it);
        the states start over."""
        value = float(self.metric.compute())
        self.metric.reset()
        return value

    def reset(self) -> None:
        self.metric.reset()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.metric.state_dict().items()}

    def load_state_dict(self, states: list[dict[str, torch.Tensor]]) -> None:
        """This rank's states from a checkpoint: its own (``[own]``), or every rank's of a run
        at another N merged into one (rank 0; the others pass ``[]`` and start empty)."""
        self.metric.reset()
        for state in states:
            self.metric.merge_state({k: v.to(self.metric.device) for k, v in state.items()})


def build_metric(t: TrainSettings, device: torch.device = torch.device("cpu")):
    """``train.metric`` as a batch's *sum* over its samples (a 0-d float64 tensor on the
    outputs' device: no host read in the step): top-1 hits, or the user's callable (a batch
    mean, a float or a tensor) times the batch's size; or, for a torchmetrics class, an
    :class:`EpochMetric` on ``device`` (a new one each call: training's and evaluation's
    apart)."""
    if t.metric == "accuracy":
        return lambda out, y: (out.argmax(1) == y).sum().double()
    fn = import_callable(t.metric, "train.metric")
    if _is_torchmetric(fn):
        try:
            return EpochMetric(fn(**t.metric_args), device)
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"config key 'train.metric_args': {fn.__name__} refused {t.metric_args}: {exc}"
            ) from None
    if t.metric_args:
        raise ConfigError(
            f"config key 'train.metric_args': only a torchmetrics metric class takes arguments; "
            f"{t.metric} is a plain callable"
        )

    def summed(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        value = fn(out, y)
        return torch.as_tensor(value, dtype=torch.float64, device=out.device).detach() * len(y)

    return summed


def _is_torchmetric(fn) -> bool:
    """A torchmetrics Metric class (its module imported torchmetrics: nothing to import here)."""
    tm = sys.modules.get("torchmetrics")
    return tm is not None and isinstance(fn, type) and issubclass(fn, tm.Metric)
