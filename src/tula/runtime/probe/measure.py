"""What a worker measures on the training step: the terms of Eq. 3 and the peak memory of
one step, and summary statistics of step times.

Measurement: parameter, gradient and optimizer-state bytes are counted exactly from the
tensors (:func:`measure_step`); activation bytes are what autograd saves for backward
(``saved_tensors_hooks``, unique storages, parameters excluded); batch bytes are the input
and label tensors. The peak is ``torch.cuda.max_memory_allocated`` on CUDA and the
profiler's memory timeline on CPU (:func:`cpu_step_peak_bytes`).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

import psutil
import torch
from torch.profiler import ProfilerActivity, profile
from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, Category

from tula.runtime.group.agreement import agree
from tula.runtime.train.optim import TulaOptimizer
from tula.runtime.train.optim_state import state_tensors

if TYPE_CHECKING:
    from tula.runtime.step.replica import Replica

# each rank fails a try now and then (about one step in ten): 4 ranks fail one in three tries
PROFILER_TRIES = 6
# what the memory timeline calls the tensors that persist across steps
PERSISTENT = (Category.PARAMETER, Category.OPTIMIZER_STATE)


class NoTimeline(RuntimeError):
    """torch's profiler built no memory timeline of a step in :data:`PROFILER_TRIES` tries on
    some rank (every rank raises it, together). A probe keeps its point's timing without the
    peak; the memory probe, which measures nothing else, fails its point."""


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes of each term of Eq. 3 for one training step at one local batch."""

    param_bytes: int
    grad_bytes: int
    opt_bytes: int
    act_bytes: int
    batch_bytes: int

    @property
    def total_bytes(self) -> int:
        return (
            self.param_bytes + self.grad_bytes + self.opt_bytes + self.act_bytes + self.batch_bytes
        )

    def to_dict(self) -> dict[str, int]:
        return {**asdict(self), "model_total_bytes": self.total_bytes}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


@contextlib.contextmanager
def saved_activation_bytes(exclude: set[tuple[str, int]]) -> Iterator[dict[str, int]]:
    """Count the bytes of unique storages autograd saves for backward inside the block."""

    seen: set[tuple[str, int]] = set(exclude)
    total = {"bytes": 0}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in seen:
            seen.add(key)
            total["bytes"] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield total


def measure_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    forward_loss: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    x: torch.Tensor,
    y: torch.Tensor,
) -> MemoryBreakdown:
    """Run one forward/backward/step and count each term of Eq. 3.

    ``forward_loss(x, y) -> (logits, loss)`` is the training step's own forward (its autocast
    precision and memory format), so saved activations are counted at the dtype training
    keeps them in."""

    params = [p for p in model.parameters()]
    param_keys = {_storage_key(p) for p in params}
    optimizer.zero_grad(set_to_none=True)
    with saved_activation_bytes(param_keys) as act:
        _, loss = forward_loss(x, y)
    loss.backward()
    optimizer.step()
    opt_bytes = sum(_nbytes(v) for v in state_tensors(optimizer))
    return MemoryBreakdown(
        param_bytes=sum(_nbytes(p) for p in params),
        grad_bytes=sum(_nbytes(p.grad) for p in params if p.grad is not None),
        opt_bytes=opt_bytes,
        act_bytes=act["bytes"],
        batch_bytes=_nbytes(x) + _nbytes(y),
    )


def cpu_step_peak_bytes(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    run_step: Callable[[], Any],
    unread_bytes: int = 0,
) -> int:
    """Measured peak of live tensor bytes during one training step on CPU (``run_step``):
    :func:`cpu_peak_counter` around it."""
    with cpu_peak_counter(model, optimizer, unread_bytes) as peak:
        run_step()
    return peak["bytes"]


@contextlib.contextmanager
def cpu_peak_counter(
    model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer | None,
    unread_bytes: int = 0,
) -> Iterator[dict[str, int]]:
    """Measured peak of live tensor bytes during the block on CPU (one training step, batch
    fetch included), in the yielded dict's ``bytes`` once the block ends.

    CPU has no ``max_memory_allocated``; torch's profiler records every allocation and free
    inside the block (memory timeline), whose running peak is taken. The timeline also holds
    the tensors that existed before the step and that the step reads (parameters, optimizer
    state, a set kept on the device, the last step's gradients); parameters and optimizer state
    it did not meet (a frozen layer) are added, counted exactly, so that each is counted once.
    DDP's gradient buckets, allocated when DDP is built, are not seen on CPU (a constant,
    independent of the batch); on CUDA the probe uses ``torch.cuda.max_memory_allocated``
    instead, which sees everything. ``unread_bytes``: what lives through the step that the
    step does not read, so the timeline cannot see it (AGS's old factors in the step that
    replaces them; a plain step reads them). Building the timeline fails now and then
    (torch's "version mismatch" AssertionError), raised as the block ends.
    """
    out = {"bytes": 0}
    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        yield out
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        # deprecated in favour of CUDA-only snapshots
        warnings.simplefilter("ignore", FutureWarning)
        path = f"{tmp}/timeline.json"
        prof.export_memory_timeline(path, device="cpu")
        with open(path) as fh:
            _, sizes = json.load(fh)
    at_peak = max(sizes, key=sum, default=[])
    # the timeline's columns: "unknown", then torch's categories in _CATEGORY_TO_INDEX order
    seen = sum(at_peak[_CATEGORY_TO_INDEX[c] + 1] for c in PERSISTENT) if at_peak else 0
    params = model.parameters() if model is not None else []
    states = optimizer.state.values() if optimizer is not None else []
    persistent = sum(_nbytes(p) for p in params) + sum(
        _nbytes(v) for st in states for v in st.values() if torch.is_tensor(v)
    )
    out["bytes"] = int(sum(at_peak) + max(0, persistent - seen) + unread_bytes)


def step_peak_bytes(
    replica: Replica, refresh: bool = True, retries: dict[str, int] | None = None
) -> dict[str, int]:
    """Peak memory of the replica's next training steps at its current batch: a plain step
    and, with AGS (and ``refresh``), a step that refreshes the factors (``refresh``). Each
    is measured on its own. ``retries`` (if given) gets, per kind, how many extra steps the
    profiler's failures cost."""

    def measure(refresh: bool) -> int:
        if replica.device.type == "cuda":
            replica.refresh_next(refresh)
            torch.cuda.synchronize(replica.device)
            torch.cuda.reset_peak_memory_stats(replica.device)
            replica.walk.next_timed_step()
            return int(torch.cuda.max_memory_allocated(replica.device))
        # torch's profiler now and then fails to build the memory timeline of a step it
        # recorded (an AssertionError "version mismatch" in its data-flow graph, about one
        # probe in ten here). The step ran on every rank; the ranks agree whether every one
        # of them got a peak, and all measure one more step if not, so they stay in step.
        errors, own = [], None  # own: this rank's largest peak of a try that worked here
        for attempt in range(PROFILER_TRIES):
            replica.refresh_next(refresh)
            try:
                # a refresh replaces AGS's factors without reading them: the old ones live on
                opt = replica.update.opt
                old = refresh and isinstance(opt, TulaOptimizer)
                unread = sum(_nbytes(f) for f in opt.factors.values()) if old else 0
                peak = cpu_step_peak_bytes(replica.ddp, opt, replica.walk.next_timed_step, unread)
                # fault injection: the timeline of a step that ran fails
                replica.inject("profiler")
            except AssertionError as exc:
                peak = None
                errors.append(str(exc).splitlines()[0][:200])
            own = peak if own is None or (peak is not None and peak > own) else own
            _, failed = agree(peak is None)
            if not failed:
                if retries is not None:
                    retries["refresh" if refresh else "plain"] = attempt
                return peak
        # No try worked on every rank at once (4 ranks fail a try together often); each rank's own
        # tries measured the same step at the same batch: its largest one is its peak.
        _, failed = agree(own is None)
        if not failed:
            if retries is not None:
                retries["refresh" if refresh else "plain"] = PROFILER_TRIES - 1
            return own
        raise NoTimeline(
            f"torch's profiler could not build a step's memory timeline in {PROFILER_TRIES} tries "
            f"(on this rank: {errors or 'fine; another rank failed'})"
        )

    if replica.epoch_offset == 0 and replica.steps_per_epoch > 1:
        # an epoch's first step (loader refill, AGS refresh): not the plain step
        replica.walk.next_timed_step()
    peaks = {"plain": measure(False)}
    if refresh and replica.cadence.method == "ags":
        peaks["refresh"] = measure(True)
    return peaks


def timing_stats(xs: list[float]) -> dict[str, float]:
    """Mean, median, interquartile range and coefficient of variation of step times."""
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    mean = statistics.fmean(xs)
    cv = statistics.pstdev(xs) / mean if mean > 0 else float("nan")
    return {"mean": mean, "median": statistics.median(xs), "iqr": q[2] - q[0], "cv": cv}


def input_time_s(replica: Replica, batches: int) -> float | None:
    """Seconds per full batch of this rank's input pipeline alone: its feed (loader workers,
    the copy to the device) run from epoch starts with no model, as a step would take it.

    The first batch (the loader workers' start) is left out; short last batches are skipped.
    None where no full batch follows the first. Training's own position is untouched: its
    next step starts a fresh pass over the feed where training stands."""
    epoch, timed = replica.epoch, []
    full = replica.global_batch // replica.world
    for _ in range(batches + 1):  # epochs: enough for `batches` batches even at one per epoch
        t0 = time.perf_counter()
        for x, _ in replica.stream.batches(epoch):
            if replica.device.type == "cuda":
                torch.cuda.current_stream(replica.device).synchronize()
            t1 = time.perf_counter()
            if x.shape[0] == full:
                timed.append(t1 - t0)
            t0 = time.perf_counter()
            if len(timed) > batches:
                break
        if len(timed) > batches:
            break
        epoch += 1
    replica.forget_feed()
    return statistics.fmean(timed[1:]) if len(timed) > 1 else None


def process_started() -> float:
    """When this process started (epoch seconds): start-up is counted from there."""
    try:
        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - psutil missing or /proc unreadable: count from import
        return _IMPORTED


_IMPORTED = time.time()
