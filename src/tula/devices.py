"""Where the probes and training run: one decision of ``hardware.device`` and ``hardware.backend``.

``hardware.device: auto`` is decided here, once, for every stage, job and launcher:

- under SLURM (the workflow's SLURM executor, `tula check --cluster`, `tula launch` with the
  slurm executor) from the partition's GRES, since the login node has no GPU to look at:
  GPUs on its nodes -> CUDA (jobs ask for ``--gres gpu:<workers per node>``), none -> CPU;
- on this machine (the local executor) from the GPUs it has: CUDA only where every grid
  point has a GPU per worker (``max(grid.workers)`` <= GPUs here), otherwise CPU and gloo,
  so the shipped default (N = 1 and 2) runs on a one-GPU machine instead of putting two
  NCCL ranks on one GPU.

The workflow writes the decision into the config snapshot every job reads (``hardware.device``
and the sentence that says why, ``hardware.device_why``), `tula check` prints it and writes it
to results/workload.json, and the report shows it. ``hardware.device: cuda`` with fewer GPUs
than the grid needs is refused before anything runs, naming ``grid.workers``. The workers
(:func:`tula.runtime.group.dist.init`) only check what they are given against the GPUs they see.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from tula.config import Config
from tula.slurm import controller, partition_info

__all__ = ["Decision", "DeviceError", "apply", "decide", "for_config", "local_gpus", "gpus_needed"]


class DeviceError(ValueError):
    """``hardware.device`` cannot run here; the message names the config keys to change."""


@dataclass(frozen=True)
class Decision:
    device: str  # "cuda" | "cpu"
    backend: str  # "nccl" | "gloo"
    why: str  # one sentence, said in tula check's output, the workflow's log and the report


# The device files a GPU driver gives a machine (NVIDIA's, AMD's ROCm for torch's HIP build,
# WSL's): where none is present, torch can see no CUDA device, and the 2-3 s of importing torch
# (in every `snakemake` run's parse, on a login node) are not spent to hear so.
GPU_DRIVER_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia", "/dev/kfd", "/dev/dxg")


def gpu_driver_present() -> bool:
    """A GPU driver's file is on this machine (GPU_DRIVER_FILES): only then can torch see one."""
    return any(os.path.exists(f) for f in GPU_DRIVER_FILES)


def local_gpus() -> int:
    """CUDA devices this process can see (0 without torch's CUDA, or without a GPU driver)."""
    if not gpu_driver_present():
        return 0
    import torch  # only when a local decision is needed: the SLURM path reads the partition instead

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpus_needed(cfg: Config) -> int:
    """GPUs one machine needs for every grid point under the local executor: one per worker of
    the largest N (all of a local job's workers are on this machine)."""
    return max(cfg.grid.workers)


def decide(setting: str, backend: str, needed: int, gpus: int | None, where: str) -> Decision:
    """The decision. ``setting``: hardware.device (auto | cpu | cuda); ``backend``:
    hardware.backend (auto | gloo | nccl); ``needed``: GPUs the jobs need on one machine;
    ``gpus``: GPUs there (None: not known, e.g. a cluster that cannot be read); ``where``:
    what was looked at, for the sentence ("this machine", "partition 'gpu'")."""
    if setting == "cuda":
        if gpus == 0:
            raise DeviceError(
                f"config key 'hardware.device' is cuda, but {where} has no GPU: set "
                "hardware.device: auto (or cpu) to run on CPU, or run where the GPUs are"
            )
        if gpus is not None and gpus < needed:
            raise DeviceError(
                f"config key 'hardware.device' is cuda, but {where} has {gpus} GPU(s) and config "
                f"key 'grid.workers' goes up to N={needed} workers, one GPU each: lower the "
                f"largest grid.workers to {gpus} or fewer, or set hardware.device: auto (CPU and "
                "gloo) or cpu"
            )
        device, why = "cuda", "hardware.device is cuda"
    elif setting == "cpu":
        device, why = "cpu", "hardware.device is cpu"
    elif gpus is None:
        device, why = (
            "cpu",
            (
                f"hardware.device auto: {where} could not be read, so no GPU is asked for and the "
                "jobs run on CPU; set hardware.device: cuda if the nodes have GPUs"
            ),
        )
    elif gpus == 0:
        device, why = "cpu", f"hardware.device auto: {where} has no GPU: CPU and gloo"
    elif gpus < needed:
        device, why = (
            "cpu",
            (
                f"hardware.device auto: {where} has {gpus} GPU(s) but grid.workers goes up to "
                f"N={needed}, one GPU per worker: CPU and gloo. Lower the largest grid.workers to "
                f"{gpus} to run on the GPU(s)"
            ),
        )
    else:
        device, why = (
            "cuda",
            (
                f"hardware.device auto: {where} has {gpus} GPU(s), one for each of up to {needed} "
                "workers: CUDA"
            ),
        )
    chosen = backend if backend != "auto" else ("nccl" if device == "cuda" else "gloo")
    if chosen == "nccl" and device != "cuda":
        raise DeviceError(
            f"config key 'hardware.backend' is nccl, but the jobs run on CPU ({why}): set "
            "hardware.backend: auto or gloo"
        )
    return Decision(device, chosen, f"{why}; backend {chosen}")


def for_config(
    cfg: Config, executor: str = "local", partition: str | None = None, gpus: int | None = None
) -> Decision:
    """:func:`decide` for ``cfg`` as jobs of ``executor`` (local | slurm) will run it. Local:
    this machine's GPUs (``gpus`` overrides the count) against ``max(grid.workers)``. SLURM:
    the GPUs per node of ``partition`` (the profile's, or the cluster's default) against the
    workers a node holds (cluster.workers_per_node, capped by the largest N)."""
    hw = cfg.hardware
    if hw.device_why and hw.device != "auto":  # decided already (the workflow's snapshot)
        return Decision(
            hw.device,
            hw.backend if hw.backend != "auto" else ("nccl" if hw.device == "cuda" else "gloo"),
            hw.device_why,
        )
    if executor == "slurm":
        needed = min(max(cfg.grid.workers), cfg.cluster.workers_per_node)
        if hw.device != "auto" and gpus is None:
            return decide(hw.device, hw.backend, needed, None, "the partition")
        try:
            part = partition_info.read_partition(partition)
        except controller.ClusterUnreadable as err:
            return decide(hw.device, hw.backend, needed, None, f"the SLURM partition ({err})")
        return decide(
            hw.device,
            hw.backend,
            needed,
            max(part.node_gpus, default=0) if gpus is None else gpus,
            f"partition '{part.name}'",
        )
    if gpus is None and hw.device != "cpu":
        gpus = local_gpus()
    return decide(hw.device, hw.backend, gpus_needed(cfg), gpus, "this machine")


def apply(cfg: Config, d: Decision) -> Config:
    """``cfg`` with the decision written in (what the jobs read)."""
    return replace(
        cfg, hardware=replace(cfg.hardware, device=d.device, backend=d.backend, device_why=d.why)
    )
