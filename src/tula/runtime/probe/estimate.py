"""The training step's memory and FLOPs from the model alone, before any job runs.

Tula's own step (the user's model, the optimizer of ``train.method``, ``train.precision``'s
autocast, ``train.channels_last``, cross-entropy) runs under torch's ``FakeTensorMode``: every
tensor has its shape, dtype and strides but no storage, so nothing is computed, no data is
read beyond the one sample that gave the shapes, and no GPU is touched. torch's
``MemTracker`` (``torch.distributed._tools.mem_tracker``) follows each tensor the step creates
and gives the peak by kind (parameters, buffers, gradients, optimizer state, activations,
temporaries); ``FlopCounterMode`` counts the FLOPs of forward and backward.

Two local batches give the two terms of the memory model (Eq. 3): the fixed part (parameters,
gradients, optimizer state: the intercept) and the per-sample part (activations and batch: the
slope). The step runs on the host's fake CPU tensors with the CPU's autocast, whose casts match
CUDA's for the layers vision models use (convolutions, linear layers and matmuls in 16 bits,
batch norm on the 16-bit input, the loss in fp32). What a CUDA worker holds besides, counted
here from the parameters:

- DDP's gradient buckets, one more copy of the gradients (CUDA's ``max_memory_allocated`` sees
  them; the CPU probe's profiler does not, so they are left out for ``cpu``);
- AGS's refresh (``train.method: ags``), which holds the large batch's gradient, the reference
  sub-batch's gradient, its copy and the flat buffer all-reduced, while the activations of the
  large batch are already freed: its peak is the fixed part plus those four gradient copies and
  the sub-batch's activations, and the step's peak is the larger of the two.

Left out: the CUDA context and cuDNN's library handles (outside ``max_memory_allocated``),
the caching allocator's rounding (512-byte blocks: small beside a batch's activations), and
``torch.compile``'s fused kernels, which may keep fewer activations than the eager step counted
here (the estimate is then high). The memory probe measures the real step and stays the truth;
``tula aggregate`` writes how far the estimate was from it.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass
from typing import Any, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils.flop_counter import FlopCounterMode

from tula import config as config_mod
from tula.runtime.step.nets import build_model
from tula.runtime.step.replica import AUTOCAST_DTYPES
from tula.runtime.train.methods import build_method

# gradient-sized buffers alive at the peak of AGS's refresh
# (tula.runtime.train.refresh.refresh_scales): the large batch's gradient kept aside, the
# sub-batch's gradient, its copy, the flat buffer
REFRESH_GRAD_COPIES = 4
# MemTracker's kinds, by the name Eq. 3 gives them
KINDS = {
    "PARAM": "param",
    "BUFFER": "buffer",
    "GRAD": "grad",
    "OPT": "opt",
    "ACT": "act",
    "TEMP": "temp",
    "INP": "batch",
    "OTH": "other",
}


@dataclass(frozen=True)
class StepEstimate:
    """Peak memory of one training step per worker at two local batches (bytes, for
    ``device``), the memory model's two terms from them, and the FLOPs per sample."""

    device: str
    batches: tuple[int, int]
    peak_bytes: tuple[float, float]
    fixed_bytes: float
    per_sample_bytes: float
    flops_per_sample: float
    parameter_bytes: int
    terms: dict[str, dict[str, float]]  # per batch: bytes of each kind at the plain step's peak
    refresh_bytes: dict[str, float] | None  # per batch: AGS's refresh peak (None: no AGS)
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "equation": "peak_mem_bytes = fixed_bytes + per_sample_bytes * local_batch",
            "how": "the training step under FakeTensorMode, MemTracker and FlopCounterMode",
        }


@contextlib.contextmanager
def _fake_step_mode() -> Iterator[FakeTensorMode]:
    rng = torch.get_rng_state()
    try:
        with FakeTensorMode() as mode:
            yield mode
    finally:
        torch.set_rng_state(rng)


def _peak(tracker: MemTracker) -> dict[str, float]:
    snap = tracker.get_tracker_snapshot("peak")
    out = {name: 0.0 for name in KINDS.values()}
    for per_kind in snap.values():  # one device here
        for kind, nbytes in per_kind.items():
            name = KINDS.get(str(kind).rsplit(".", 1)[-1])
            if name:
                out[name] += float(nbytes)
    return out


def estimate_step(
    cfg: config_mod.Config,
    input_shape: tuple[int, ...],
    num_classes: int,
    batches: tuple[int, int],
    device: str = "cuda",
) -> StepEstimate:
    """Run ``cfg``'s training step under FakeTensorMode at two local batches; see the module
    docstring. Raises RuntimeError naming ``workload.model`` when the model cannot run without
    data (a step that reads a tensor's values, e.g. ``.item()`` in forward)."""
    t0 = time.perf_counter()
    t = cfg.train
    b_lo, b_hi = sorted(batches)
    dtype = AUTOCAST_DTYPES[t.precision]
    channels_last = t.channels_last and len(input_shape) == 3
    try:
        with _fake_step_mode():
            torch.manual_seed(cfg.workload.seed)
            # channels_last: the batch carries it (a layout: strides, not bytes; the model's
            # fake parameters refuse the swap that .to(memory_format=...) makes)
            model = build_model(cfg.workload.model, tuple(input_shape), num_classes)
            params = [p for p in model.parameters() if p.requires_grad]
            opt, _ = build_method(t.method, t, model, b_hi, 1)
            tracker = MemTracker()
            tracker.track_external(model, opt)
            terms: dict[str, dict[str, float]] = {}
            counter = FlopCounterMode(display=False)
            # the first step creates the optimizer state (AGS: its factors too, as a refresh
            # sets them); the steps after it are the ones counted
            for b, counted in ((b_lo, False), (b_lo, True), (b_hi, True)):
                if b == b_lo and counted and hasattr(opt, "set_scales"):
                    opt.set_scales(params, [torch.ones_like(p) for p in params], params)
                tracker.reset_mod_stats()
                with tracker, counter if b == b_hi else contextlib.nullcontext():
                    _step(model, opt, input_shape, num_classes, b, dtype, channels_last)
                if counted:
                    terms[str(b)] = _peak(tracker)
            flops = counter.get_total_flops() / b_hi
    except (ValueError, TypeError):
        raise
    except Exception as exc:  # noqa: BLE001 - the user's model under fake tensors
        raise RuntimeError(
            f"config key 'workload.model': {cfg.workload.model} could not run its step without "
            f"data (FakeTensorMode): {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        ) from None
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    return _combine(cfg, device, (b_lo, b_hi), terms, flops, param_bytes, t0)


def _step(model, opt, input_shape, num_classes, b, dtype, channels_last) -> None:
    """One training step on a fake batch of ``b`` samples (the batch made inside, so that the
    tracker counts it)."""
    x = torch.randn(b, *input_shape)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, num_classes, (b,))
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext():
        loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()


def _combine(cfg, device, batches, terms, flops, param_bytes, t0) -> StepEstimate:
    """The peaks at the two batches, what a CUDA worker holds besides (DDP's buckets), AGS's
    refresh, and the memory model's two terms through them."""
    buckets = param_bytes if device == "cuda" else 0
    peaks, refresh = [], {} if cfg.train.method == "ags" else None
    b_lo, b_hi = batches
    per_sample_act = (
        sum(terms[str(b_hi)][k] - terms[str(b_lo)][k] for k in ("act", "batch", "temp"))
    ) / (b_hi - b_lo)
    small = cfg.train.ags_small_batch  # the memory probe's one worker takes all of it
    for b in batches:
        plain = sum(terms[str(b)].values()) + buckets
        peak = plain
        if refresh is not None:
            held = sum(terms[str(b)][k] for k in ("param", "buffer", "opt"))
            refresh[str(b)] = (
                held + buckets + REFRESH_GRAD_COPIES * param_bytes + per_sample_act * min(small, b)
            )
            peak = max(plain, refresh[str(b)])
        peaks.append(peak)
    slope = (peaks[1] - peaks[0]) / (b_hi - b_lo)
    return StepEstimate(
        device=device,
        batches=(b_lo, b_hi),
        peak_bytes=(peaks[0], peaks[1]),
        fixed_bytes=peaks[0] - slope * b_lo,
        per_sample_bytes=slope,
        flops_per_sample=flops,
        parameter_bytes=param_bytes,
        terms=terms,
        refresh_bytes=refresh,
        seconds=time.perf_counter() - t0,
    )
