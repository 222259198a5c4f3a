"""Process groups for data-parallel workers, under torchrun or under SLURM's srun.

One ``tula`` worker command runs unchanged in both places:

- torchrun (the embedded default) sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT;
- srun sets SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and SLURM_JOB_NODELIST: the master
  is the first host of the job's node list and the port is derived from the job id, so
  every task of one job agrees on it without talking first.

Backend: NCCL on CUDA devices (ring all-reduce when NCCL_ALGO=Ring), gloo on CPU.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from tula.config import Config, Hardware

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions that need it, so launchers (``tula probe``'s parent,
# ``tula launch``, Snakemake parsing the workflow) do not pay its start-up time.


class StepOOM(Exception):
    """Every rank agreed that some rank ran out of memory: in the forward pass of a step
    (the step's flag all-reduce), in AGS's refresh (its all-reduce), in evaluation at the
    smallest evaluation batch, or while checkpointing. ``where`` names the place."""

    def __init__(self, ranks: list[int], message: str, where: str = "forward"):
        super().__init__(message)
        self.ranks, self.message, self.where = ranks, message, where


def oom_place(where: str, step: int) -> str:
    """Where an out-of-memory error happened, in words ("in the backward pass of step 12")."""
    if where == "eval":
        return f"in evaluation after step {step}"
    if where == "checkpoint":
        return f"while writing the checkpoint of step {step}"
    return {"refresh": f"in AGS's factor refresh of step {step}"}.get(where, f"in the {where} pass of step {step}")


@dataclass(frozen=True)
class WorkerEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    launcher: str  # "torchrun" | "slurm" | "single"


def slurm_master_addr(nodelist: str) -> str:
    """First host of a SLURM node list (``node[01-04],gpu7`` -> ``node01``)."""
    if shutil.which("scontrol"):
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=False
        ).stdout.split()
        if out:
            return out[0]
    # Fallback parser for the common forms when scontrol is not on PATH.
    first = nodelist.split(",")[0]
    if "[" in first:
        prefix, rest = first.split("[", 1)
        first = prefix + rest.split("-")[0].split(",")[0].rstrip("]")
    return first


def slurm_master_port(job_id: str) -> int:
    """A port every task of one job derives alike: 15000 + (job id mod 20000)."""
    return 15000 + int(job_id) % 20000


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
            master_addr=env.get("MASTER_ADDR") or slurm_master_addr(env["SLURM_JOB_NODELIST"]),
            master_port=int(env.get("MASTER_PORT") or slurm_master_port(env["SLURM_JOB_ID"])),
            launcher="slurm",
        )
    return WorkerEnv(0, 1, 0, "127.0.0.1", 0, "single")


def resolve_device(hw: Hardware, local_rank: int = 0) -> torch.device:
    import torch

    if hw.device == "cuda" or (hw.device == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("config key 'hardware.device' is cuda but no CUDA device is visible")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def resolve_backend(hw: Hardware, device: torch.device) -> str:
    if hw.backend != "auto":
        return hw.backend
    return "nccl" if device.type == "cuda" else "gloo"


def init(hw: Hardware, timeout_s: float = 300.0) -> tuple[WorkerEnv, torch.device, str]:
    """Join the process group described by the environment; return (env, device, backend)."""
    import torch
    import torch.distributed as torch_dist

    wenv = worker_env()
    torch.set_num_threads(hw.threads_per_worker)
    device = resolve_device(hw, wenv.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = resolve_backend(hw, device)
    if backend == "nccl" and hw.collective == "ring":
        os.environ.setdefault("NCCL_ALGO", "Ring")  # the collective the sync model assumes (paper §IV-B)
    if not torch_dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", wenv.master_addr)
        os.environ.setdefault("MASTER_PORT", str(wenv.master_port or _free_port()))
        torch_dist.init_process_group(
            backend=backend,
            rank=wenv.rank,
            world_size=wenv.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    return wenv, device, backend


def shutdown(ok: bool = True) -> None:
    """Leave the process group. On success all ranks meet at a barrier first: a rank that
    tears gloo down while a peer is still working (rank 0 writing results) can abort the
    peer ("terminate called without an active exception"). After a failure there is no
    barrier: a peer may be stuck in a collective, and this rank must exit so that torchrun
    or srun ends the others."""
    import torch.distributed as torch_dist

    if not torch_dist.is_initialized():
        return
    if ok:
        torch_dist.barrier()
    torch_dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_resources(cfg: Config, nodes: int, runtime_min: int | None = None,
                  exclusive: bool = False) -> dict[str, int | str | None]:  # fmt: skip
    """What one SLURM job for N workers asks for (Snakemake resources -> sbatch flags).

    ============== ==================================== =========================
    resource       value                                sbatch flag
    ============== ==================================== =========================
    tasks          N (one task per worker / GPU)        --ntasks=N
    nodes          ceil(N / grid.workers_per_node)      --nodes
    mpi            "srun" when N > 1, else unset        (the job's command is run
                                                         as is; tula starts the N
                                                         tasks with srun itself)
    cpus_per_task  hardware.threads_per_worker          --cpus-per-task
    gres           "gpu:<GPUs per node>" on CUDA        --gres
    runtime        minutes (None: the profile's)        -t
    slurm_extra    "--exclusive" with ``exclusive``     --exclusive (whole nodes:
                   (probe jobs, probe.exclusive)         no other job shares a
                                                         timing)
    ============== ==================================== =========================

    A value of None leaves the resource unset. GPUs are requested when
    ``hardware.device`` is ``cuda`` (``auto`` cannot know the cluster's nodes).
    """
    wpn = cfg.grid.workers_per_node
    n_nodes = -(-nodes // wpn)
    return {
        "tasks": nodes,
        "nodes": n_nodes,
        "mpi": "srun" if nodes > 1 else None,
        "cpus_per_task": cfg.hardware.threads_per_worker,
        "gres": f"gpu:{min(nodes, wpn)}" if cfg.hardware.device == "cuda" else None,
        "runtime": runtime_min,
        "slurm_extra": "--exclusive" if exclusive else None,
    }


@dataclass
class LaunchResult:
    returncode: int
    timed_out: bool
    wall_s: float


def run_torchrun(
    nproc: int, module_args: Sequence[str], *, threads_per_worker: int, timeout_s: float, cwd: str | None = None
) -> LaunchResult:
    """Run ``python -m <module_args>`` in ``nproc`` local processes under torchrun.

    This is ``torchrun --standalone --nproc-per-node N -m ...`` (through this Python, so
    the same virtual environment is used). Output streams to our stdout/stderr, so a
    Snakemake rule's log shows the workers' progress. Past ``timeout_s`` the whole
    process group is killed and ``timed_out`` is set.
    """
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={nproc}", "--max-restarts=0", "-m", *module_args,
    ]  # fmt: skip
    return _run(cmd, worker_environment(threads_per_worker), timeout_s, cwd)


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")  # fmt: skip


def worker_environment(threads_per_worker: int, base: dict | None = None) -> dict[str, str]:
    """The environment of every worker, probe and production alike: the thread pools sized
    to ``hardware.threads_per_worker`` (whatever Snakemake exported for the rule's threads),
    unbuffered output, and kineto (the profiler behind the CPU memory measurement) quiet
    about the GPU a CUDA build of torch looks for."""
    env = dict(os.environ if base is None else base, PYTHONUNBUFFERED="1")
    env.update({v: str(threads_per_worker) for v in THREAD_VARIABLES})
    env.setdefault("KINETO_LOG_LEVEL", "5")
    return env


def _run(cmd: list[str], env: dict, timeout_s: float, cwd: str | None = None) -> LaunchResult:
    """Run a launcher in its own process group; kill the whole group past ``timeout_s``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, start_new_session=True)
    try:
        rc = proc.wait(timeout=timeout_s)
        return LaunchResult(rc, False, time.perf_counter() - t0)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return LaunchResult(proc.returncode if proc.returncode is not None else -9, True, time.perf_counter() - t0)
    except BaseException:
        _kill_group(proc)
        raise


def slurm_job_tasks(job_id: str) -> int:
    """Tasks allocated to a SLURM job, from ``scontrol show job`` (NumTasks); 1 if unknown."""
    if not shutil.which("scontrol"):
        return 1
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=False).stdout
    for field in out.split():
        if field.startswith("NumTasks="):
            return int(field.split("=", 1)[1])
    return 1


def in_slurm_allocation(nproc: int, environ: os._Environ | dict | None = None) -> bool:
    """True inside a SLURM job (sbatch/salloc, not yet a job step) with at least nproc tasks.

    Snakemake's SLURM executor clears every SLURM_* variable but SLURM_JOB_ID before it runs
    a rule's command inside a job, so without SLURM_NTASKS the task count comes from scontrol.
    """
    env = os.environ if environ is None else environ
    if "SLURM_JOB_ID" not in env or "SLURM_STEP_ID" in env:
        return False
    if "SLURM_NTASKS" in env:
        return int(env["SLURM_NTASKS"]) >= nproc
    return nproc > 1 and slurm_job_tasks(env["SLURM_JOB_ID"]) >= nproc


def run_srun(nproc: int, module_args: Sequence[str], *, threads_per_worker: int, timeout_s: float) -> LaunchResult:
    """Run ``python -m <module_args>`` as ``nproc`` tasks of a job step: ``srun -n N``.

    Each task finds its rank, the master (first host of the job) and the port (from the
    job id) in SLURM's variables (:func:`worker_env`). ``--kill-on-bad-exit`` ends every
    task when one fails, as torchrun does.
    """
    cmd = ["srun", f"--ntasks={nproc}", f"--cpus-per-task={threads_per_worker}", "--kill-on-bad-exit=1",
           sys.executable, "-m", *module_args]  # fmt: skip
    return _run(cmd, worker_environment(threads_per_worker), timeout_s)


def launch(nproc: int, module_args: Sequence[str], *, threads_per_worker: int, timeout_s: float) -> LaunchResult:
    """Start the workers: ``srun`` inside a SLURM allocation with enough tasks, else torchrun."""
    if in_slurm_allocation(nproc):
        return run_srun(nproc, module_args, threads_per_worker=threads_per_worker, timeout_s=timeout_s)
    return run_torchrun(nproc, module_args, threads_per_worker=threads_per_worker, timeout_s=timeout_s)


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def parse_worker_args(prog: str, out_flag: str, argv: list[str] | None = None, batch_list: bool = False) -> argparse.Namespace:
    """Arguments of a worker entry point (``python -m tula.probe`` / ``tula.memprobe``);
    ``batch_list``: --global-batch is a comma-separated list."""
    p = argparse.ArgumentParser(prog=f"python -m {prog}", description="One worker, started by torchrun or srun.")
    p.add_argument("--config", required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--global-batch", required=True,
                   type=(lambda s: [int(v) for v in s.split(",")]) if batch_list else int)  # fmt: skip
    p.add_argument(out_flag, required=True)
    p.add_argument("--memory-probe", default=None, help="results/memory_probe.json: b_max for the compute sweep")
    return p.parse_args(argv)


def hostname() -> str:
    return socket.gethostname()


def result_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rank{rank}.json"
