"""The GPUs ``hardware.gpu`` can name: memory, memory bandwidth and peak dense throughput.

Figures are the vendors' data-sheet numbers for dense math (no structured sparsity), per GPU,
for the SXM board unless the name says PCIe. Memory is the marketed size in GB (10^9 bytes),
a little below what the device reports (an H100 80 GB has 85.0e9 bytes), so a budget derived
from it errs on the safe side. They bound what a step can do (a roofline: no step runs faster
than its FLOPs at peak or its bytes at full bandwidth); they predict nothing on their own.
A GPU not listed is given by its figures instead of a name (``hardware.gpu: {memory_gb: …}``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gb: float
    bandwidth_gbs: float  # memory bandwidth, GB/s
    fp32_tflops: float  # plain fp32 (CUDA cores)
    tf32_tflops: float | None = None  # fp32 matmuls and convolutions on tensor cores (Ampere on)
    bf16_tflops: float | None = None
    fp16_tflops: float | None = None

    def peak_flops(self, precision: str) -> float:
        """The fastest this GPU can do a step's math at ``train.precision`` (FLOP/s): fp32 may
        run on TF32 tensor cores (PyTorch's convolutions do by default), bf16 and fp16 on
        their own; a GPU without one falls back to the next it has."""
        order = {
            "fp32": (self.tf32_tflops, self.fp32_tflops),
            "bf16": (self.bf16_tflops, self.tf32_tflops, self.fp32_tflops),
            "fp16": (self.fp16_tflops, self.bf16_tflops, self.fp32_tflops),
        }[precision]
        return 1e12 * next(v for v in order if v)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# name: memory GB, bandwidth GB/s, fp32, tf32, bf16, fp16 TFLOP/s (dense)
TABLE: dict[str, GPU] = {
    g.name: g
    for g in (
        GPU("h100", 80, 3350, 67, 494.7, 989.4, 989.4),  # H100 SXM5 80 GB
        GPU("h100-pcie", 80, 2000, 51, 378, 756, 756),
        GPU("h200", 141, 4800, 67, 494.7, 989.4, 989.4),
        GPU("a100-80gb", 80, 2039, 19.5, 156, 312, 312),  # A100 SXM4
        GPU("a100-40gb", 40, 1555, 19.5, 156, 312, 312),
        GPU("a40", 48, 696, 37.4, 74.8, 149.7, 149.7),
        GPU("l40s", 48, 864, 91.6, 183, 362, 362),
        GPU("l4", 24, 300, 30.3, 60, 121, 121),
        GPU("a10", 24, 600, 31.2, 62.5, 125, 125),
        GPU("v100-32gb", 32, 900, 15.7, None, None, 125),  # V100 SXM2
        GPU("v100-16gb", 16, 900, 15.7, None, None, 125),
    )
}
ALIASES = {"h100-sxm": "h100", "h200-sxm": "h200", "a100": "a100-80gb", "v100": "v100-32gb"}


def names() -> list[str]:
    return sorted([*TABLE, *ALIASES])


def lookup(name: str) -> GPU | None:
    key = name.strip().lower()
    return TABLE.get(ALIASES.get(key, key))


def from_config(value: str | dict[str, Any]) -> GPU:
    """The GPU of a validated ``hardware.gpu``: a known name or explicit figures."""
    if isinstance(value, str):
        gpu = lookup(value)
        if gpu is None:
            raise ValueError(f"unknown GPU {value!r}")
        return gpu
    return GPU(**{"name": "custom", **value})
