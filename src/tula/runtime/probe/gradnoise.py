"""The gradient noise scale: measured at a probe's (N, B) from each worker's gradient and
their mean on the same batch, and in training from AGS's refreshes over an epoch; both
estimated by :mod:`tula.model.noise`."""

from __future__ import annotations

import time

import torch
import torch.distributed as torch_dist

from tula.model import noise
from tula.model.grid import micro_steps
from tula.model.probe_measured import Noise
from tula.runtime.step.replica import Replica


def measure(replica, steps: int) -> Noise:
    """The gradient noise scale at the probe's (N, B) and the weights its timed steps reached
    (rank 0's, given to every rank first): ``steps`` untimed steps of
    :func:`gradient_norms` over full batches, none twice (every rank takes part),
    estimated by tula.model.noise. One worker has no second batch size."""
    if replica.world == 1:
        return Noise({"b_noise": None, "why": "one worker: no second batch size to compare with"})
    full = replica.data.train_size // replica.global_batch  # batches of the full size in an epoch
    if full == 0:
        return Noise({"b_noise": None, "why": "the training set is smaller than one global batch"})
    t0 = time.perf_counter()
    # The compute-only (no_sync) steps timed before stepped each replica on its own gradient, so
    # the replicas differ; the workers' gradients must be taken at one point: rank 0's weights.
    replica.take_weights_of_rank0()
    small, big = [], []
    batches = None
    for i in range(steps):
        # an epoch's full batches, then those of the next epoch's new order: no batch twice
        if i % full == 0:  # on the device, decoded there where data.decode is gpu
            batches = replica.stream.batches(replica.epoch + i // full)
        s, g = gradient_norms(replica, *next(batches))
        small.append(s)
        big.append(g)
    seconds = time.perf_counter() - t0
    est = noise.estimate(
        small,
        big,
        replica.global_batch // replica.world,
        replica.global_batch,
        population=replica.data.train_size,
    )
    return Noise(
        gradient_noise={**est.to_dict(), "time_s": seconds, "time_per_step_s": seconds / steps},
        grad_noise_scale=est.b_noise,
        grad_sq=est.grad_sq,
        grad_trace=est.trace,
        grad_sq_se=est.grad_sq_se,
        grad_trace_se=est.trace_se,
    )


def gradient_norms(replica: Replica, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(|G_b|^2 averaged over the workers, |G_B|^2 of their all-reduced mean) on this rank's
    share of one global batch, at the replica's current weights: forward and backward under
    ``no_sync`` (each worker's own gradient; as the step's micro-batches where
    train.accumulate splits it), then one all-reduce of the gradient with the worker's squared
    norm riding along. No optimizer step; the gradients are cleared."""
    replica.update.clear_gradients()
    k = min(micro_steps(len(y), replica.accumulate, replica.max_micro_batch), len(y))
    with replica.no_sync():
        for xi, yi in zip(torch.tensor_split(x, k), torch.tensor_split(y, k)):
            _, loss = replica.forward_loss(*replica.to_device(xi, yi))
            (loss.float() * (len(yi) / len(y))).backward()
    params = replica.ddp.parameters()
    flat = torch.cat([p.grad.reshape(-1).float() for p in params if p.grad is not None])
    buf = torch.cat([flat, flat.pow(2).sum().view(1)])
    torch_dist.all_reduce(buf)
    buf /= replica.world
    replica.update.clear_gradients()
    return float(buf[-1].item()), float(buf[:-1].pow(2).sum().item())


def epoch_noise(replica: Replica) -> dict[str, float | None]:
    """The gradient noise scale of the epoch from AGS's refreshes (McCandlish et al.;
    tula.model.noise): the reference sub-batch's gradient against the step's, both all-reduced,
    so every rank holds the same numbers. Usually one refresh an epoch, so one noisy
    pair; None where there was none (other methods) or |G|^2 came out <= 0."""
    pairs = replica.update.take_noise_pairs()
    small = replica.small_local * replica.world
    if not pairs or not small < replica.global_batch:
        return {"grad_noise_scale": None, "grad_sq": None, "grad_trace": None}
    est = noise.estimate(
        [p[0] for p in pairs],
        [p[1] for p in pairs],
        small,
        replica.global_batch,
        population=replica.data.train_size,
    )
    return {"grad_noise_scale": est.b_noise, "grad_sq": est.grad_sq, "grad_trace": est.trace}
