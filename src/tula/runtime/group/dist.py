"""Process groups for data-parallel workers, under torchrun, srun or submitit.

One worker command runs unchanged in every place it is started from
(:mod:`tula.workers` starts probe workers, submitit the production job's tasks):

- torchrun (the embedded default) sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT;
- srun sets SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and SLURM_JOB_NODELIST: the master
  is the first host of the job's node list and the port is derived from the job id, so
  every task of one job agrees on it without talking first.

Backend: NCCL on CUDA devices (ring all-reduce when NCCL_ALGO=Ring), gloo on CPU.
"""

from __future__ import annotations

import atexit
import ctypes
import datetime
import functools
import gc
import os
import platform
import socket
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as torch_dist

from tula import devices
from tula.config import Cluster, Config, Hardware
from tula.runtime.group import agreement
from tula.slurm import rendezvous


@dataclass(frozen=True)
class WorkerEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    launcher: str  # "torchrun" | "slurm" | "single"


def worker_env(environ: os._Environ | dict | None = None) -> WorkerEnv:
    """Rank and rendezvous of this process, from torchrun's or SLURM's variables."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return WorkerEnv(
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", 29500)),
            launcher="torchrun",
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return WorkerEnv(
            rank=int(env["SLURM_PROCID"]),
            world_size=int(env["SLURM_NTASKS"]),
            local_rank=int(env.get("SLURM_LOCALID", 0)),
            master_addr=env.get("MASTER_ADDR") or rendezvous.master_addr(env["SLURM_JOB_NODELIST"]),
            master_port=int(env.get("MASTER_PORT") or rendezvous.master_port(env["SLURM_JOB_ID"])),
            launcher="slurm",
        )
    return WorkerEnv(0, 1, 0, "127.0.0.1", 0, "single")


def local_workers(world_size: int) -> int:
    """Workers of this job on this machine (torchrun's LOCAL_WORLD_SIZE, srun's tasks per node;
    a single-host launch: all ``world_size`` of them)."""
    per_node = (
        os.environ.get("LOCAL_WORLD_SIZE")
        or os.environ.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
    )
    return int(per_node) if per_node.isdigit() else world_size


def resolve_device(hw: Hardware, wenv: WorkerEnv) -> tuple[torch.device, str]:
    """This worker's device and backend: :func:`tula.devices.decide` with the GPUs this worker
    sees. The workflow and `tula launch` decide ``auto`` before a job starts; a worker started
    by hand (``tula probe``) decides it here, alike. ``cuda`` with fewer GPUs than this
    machine's workers is refused, naming the keys, before NCCL would put two ranks on one GPU."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    try:
        d = devices.decide(
            hw.device, hw.backend, local_workers(wenv.world_size), gpus, f"this node ({hostname()})"
        )
    except devices.DeviceError as exc:
        raise RuntimeError(str(exc)) from None
    if d.device == "cuda":
        return torch.device("cuda", wenv.local_rank % gpus), d.backend
    return torch.device("cpu"), d.backend


LAB_SUBNET = "10.77.0"  # scripts/netlab.sh: node i is LAB_SUBNET.(i+1), the root namespace .254
CLONE_NEWNET = 0x40000000


def join_lab_node(lab: str, rank: int, workers_per_node: int) -> str:
    """Move this worker into its node of the network lab (scripts/netlab.sh): the network
    namespace ``<lab>-n<rank // workers_per_node>``, before any socket of the process group
    exists. Its peers on the same node are then reached over that node's own stack; the others
    across the lab's shaped links. gloo advertises the node's lab address (lab0). The
    rendezvous: rank 0's node, or under torchrun its agent's store in the root namespace
    (the lab's bridge address)."""
    node = rank // workers_per_node
    path = f"/var/run/netns/{lab}-n{node}"
    if not os.path.exists(path):
        raise RuntimeError(
            f"config key 'cluster.netlab' is {lab!r} but {path} does not exist: run "
            f"`scripts/netlab.sh up` (as root) with at least {node + 1} node(s)"
        )
    fd = os.open(path, os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {path} (needs root)")
    finally:
        os.close(fd)
    os.environ["GLOO_SOCKET_IFNAME"] = "lab0"
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    os.environ["MASTER_ADDR"] = f"{LAB_SUBNET}.254" if agent else f"{LAB_SUBNET}.1"
    return f"{lab}-n{node}"


def init(
    hw: Hardware, timeout_s: float = 300.0, cluster: Cluster | None = None
) -> tuple[WorkerEnv, torch.device, str]:
    """Join the process group described by the environment; return (env, device, backend).
    With ``cluster.netlab``, first move into this rank's node of the network lab."""
    steady_host_memory()
    release_at_exit()
    wenv = worker_env()
    if cluster is not None and cluster.netlab:
        join_lab_node(cluster.netlab, wenv.rank, cluster.workers_per_node)
    torch.set_num_threads(hw.threads_per_worker)
    device, backend = resolve_device(hw, wenv)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # cuDNN picks the fastest convolution per shape; the first step at each shape pays the
        # search, which the probe measures as first_steps_time_s (start-up), not as the step
        torch.backends.cudnn.benchmark = True
    # the same in every probe and production worker
    os.environ.update({**LAUNCHER_ENV, **hw.comm_env})
    if not torch_dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", wenv.master_addr)
        os.environ.setdefault("MASTER_PORT", str(wenv.master_port or _free_port()))
        torch_dist.init_process_group(
            backend=backend,
            rank=wenv.rank,
            world_size=wenv.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        # the step's flags (OOM, stop) travel over the CPU: beside NCCL, a gloo group of the same
        # ranks
        agreement.HOST_GROUP[0] = (
            torch_dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
            if backend == "nccl" and wenv.world_size > 1
            else None
        )
    return wenv, device, backend


# glibc's malloc as every worker sets it (steady_host_memory): blocks below 32 MiB from the heap
# (glibc's own ceiling for its moving threshold), and up to twice that kept free at the heap's top
HOST_MALLOC = {"mmap_threshold": 32 << 20, "trim_threshold": 64 << 20}
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)


@functools.cache  # once per process: a later call says what the first one set
def steady_host_memory() -> dict[str, int] | None:
    """Set glibc's malloc in this process as a long-running one ends up by itself, from its
    first step, so that a step's host memory costs the same whatever the process ran before.

    glibc serves a block above its mmap threshold by mmap and gives it back on free; the
    threshold starts at 128 KiB and rises to the largest such block freed (up to 32 MiB).
    Where it stands then depends on the process's history: measured on 2 cores (small_cnn,
    digits), the compute of B = 64 took 10.1 ms in a process started at B = 64 and 8.0 ms in
    one that had run B = 512 first, because the first pays page faults on every step (its
    activations mmapped and unmapped each time). The probe's compute sweep measures each
    local batch in a process that ran another first, production runs a fresh one: without
    this, the compute curve reads smaller batches 15-25 % faster than training pays them.
    Fixed as here, both read 7.9-8.6 ms. Returns the settings made, or None where the C
    library has no ``mallopt`` (not glibc) or refuses them. Every worker calls it
    (:func:`init`); the forked data-loader workers inherit it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    ok = mallopt(M_MMAP_THRESHOLD, HOST_MALLOC["mmap_threshold"]) == 1
    ok = mallopt(M_TRIM_THRESHOLD, HOST_MALLOC["trim_threshold"]) == 1 and ok
    return dict(HOST_MALLOC) if ok else None


COMM_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "TP_SOCKET_")
# What torchrun sets in its workers and srun / submitit do not: set in every worker, whoever
# started it, so a probe run under torchrun and production under srun communicate alike
# (hardware.comm_env can override it).
LAUNCHER_ENV = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


def comm_env() -> dict[str, str]:
    """The communication library's variables this worker runs with (from hardware.comm_env or
    inherited from the job's environment): recorded with every measurement."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(COMM_PREFIXES)}


@functools.cache  # registered once per process
def release_at_exit() -> None:
    """At the interpreter's exit, while it still runs: what still holds a process group (a
    DDP model's reducer, in a cycle the worker's return left) is collected, so gloo's group is
    destroyed then, not in the finalization after it, where a rank that had trained to the end
    aborted ("terminate called without an active exception": the job FAILED in sacct after its
    final.json was written). Torch's own atexit proposal, pytorch/pytorch#179291, is the same
    idea."""
    atexit.register(_collect_groups)


def _collect_groups() -> None:
    loaders = sys.modules.get("tula.runtime.input.loader")  # imported by whoever made loaders
    if loaders is not None:
        loaders.close_loaders()
    agreement.HOST_GROUP[0] = None
    gc.collect()


def shutdown(ok: bool = True) -> None:
    """Leave the process group. On success all ranks meet at a barrier first: a rank that
    tears gloo down while a peer is still working (rank 0 writing results) can abort the
    peer ("terminate called without an active exception"). After a failure there is no
    barrier: a peer may be stuck in a collective, and this rank must exit so that torchrun
    or srun ends the others."""
    if not torch_dist.is_initialized():
        return
    if ok:
        torch_dist.barrier()
    torch_dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hostname() -> str:
    return socket.gethostname()


def hostnames() -> list[str]:
    """Every rank's host, in rank order (a collective: every rank calls it)."""
    out: list[Any] = [None] * torch_dist.get_world_size()
    torch_dist.all_gather_object(out, hostname())
    return [str(h) for h in out]


def env_info(device, backend: str, wenv, hosts: list[str], cfg: Config, data_workers: int) -> dict:
    """What a probe's workers ran with, for its record: device, backend, versions, hosts."""
    return {
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        "backend": backend,
        "comm_env": comm_env(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "world_size": wenv.world_size,
        "launcher": wenv.launcher,
        "hostnames": hosts,
        "threads_per_worker": cfg.hardware.threads_per_worker,
        "precision": cfg.train.precision,
        "method": cfg.train.method,
        "data_workers": data_workers,  # data.num_workers, "auto" decided
        "host_malloc": steady_host_memory(),  # what init set (cached; None: not glibc)
    }
