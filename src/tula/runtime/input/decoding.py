"""``data.decode: auto``, decided by measuring. Where both decoders can serve (every training
file a JPEG, on CUDA: the loader workers' libjpeg-turbo, or nvJPEG on the device) the training
stream reads a few batches with each, alone (the feed, no model, as the probe times its input),
and keeps the faster. Every rank keeps the same one: each decoder's time is the slowest rank's.
On an H100 with 16 loader workers the CPU decoded 224 px JPEGs 2.4x faster than nvJPEG, against
what a fixed rule on CUDA chose (``../shared/gpu/h100-2026-11-27``), so neither is assumed.

What was measured and kept is the stream's ``decode`` (:func:`choose`): the probe's record and
the report say which decoder and by how much; the production job's log says it at its start.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from tula.config import Data
from tula.runtime.group.agreement import max_over_ranks
from tula.runtime.input.images import decode_on_device

DECODERS = ("cpu", "gpu")
WHERE = {"cpu": "on the CPU (loader workers)", "gpu": "on the GPU (nvJPEG)"}
TIMED_BATCHES = 3  # of each decoder, after the one that starts its loader workers


def contested(d: Data, device_type: str, train: Any) -> bool:
    """Can both decoders serve this training set here, and is the choice left to Tula?
    ``data.decode: auto`` on CUDA with every file a JPEG."""
    return d.decode == "auto" and device_type == "cuda" and decode_on_device(d, "cuda", train)


def choose(seconds: dict[str, float]) -> dict[str, Any]:
    """The faster decoder from each one's seconds per batch, and by how much."""
    fast = min(DECODERS, key=lambda m: seconds[m])
    slow = next(m for m in DECODERS if m != fast)
    ratio = seconds[slow] / seconds[fast] if seconds[fast] > 0 else float("inf")
    return {
        "chosen": fast,
        "seconds_per_batch": {m: seconds[m] for m in DECODERS},
        "faster_by": ratio,
        "why": (
            f"data.decode auto: decoding {WHERE[fast]} read a batch in "
            f"{1e3 * seconds[fast]:.1f} ms, {WHERE[slow]} in {1e3 * seconds[slow]:.1f} ms "
            f"({ratio:.2f}x)"
        ),
    }


def measure(
    read: Callable[[str], float], agree: Callable[[list[float]], list[float]] = max_over_ranks
) -> dict[str, Any]:
    """Each decoder's seconds per batch (``read(decoder)``), the slowest rank's, and the
    choice (:func:`choose`). Every rank calls it at the same place."""
    own = [read(m) for m in DECODERS]
    return choose(dict(zip(DECODERS, agree(own))))


def seconds_per_batch(feed, device: torch.device, batches: int = TIMED_BATCHES) -> float:
    """A feed's seconds per batch, read alone from the start of an epoch: the first batch (its
    loader workers starting) left out, the device's work waited for on CUDA."""
    times, t0 = [], time.perf_counter()
    for i, (x, _) in enumerate(feed):
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()
        t1 = time.perf_counter()
        if i:
            times.append(t1 - t0)
        if len(times) >= batches:
            break
        t0 = time.perf_counter()
    return sum(times) / len(times) if times else float("inf")
