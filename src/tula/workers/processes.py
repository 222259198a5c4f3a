"""Starting a probe's N worker processes (srun inside an allocation, else torchrun, or one
worker by itself) and waiting for them within a deadline; the environment every worker runs
in, probe and production alike; where each rank writes its result. No torch here."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from tula.slurm import rendezvous

THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


# A worker's error when a peer vanished (its node died, its link went): gloo's and NCCL's
# words. Not the point's or the job's own failure: the probe job launches the point once more,
# `tula launch` resubmits (tula.production.nodes).
LOST_PEER = re.compile(
    r"Connection (reset|closed) by peer|remote process exited|died without writing|"
    r"NCCL communicator was aborted|Broken pipe",
    re.IGNORECASE,
)

# where a launch must end (seconds since the epoch), for its workers: set by the launcher
DEADLINE_ENV = "TULA_WORKERS_DEADLINE"
# how often a launch with a moving deadline asks it again (seconds)
POLL_S = 0.5


@dataclass
class LaunchResult:
    returncode: int
    timed_out: bool
    wall_s: float


def worker_environment(threads_per_worker: int, base: dict | None = None) -> dict[str, str]:
    """The environment of every worker, probe and production alike: the thread pools sized
    to ``hardware.threads_per_worker`` (whatever Snakemake exported for the rule's threads),
    unbuffered output, and kineto (the profiler behind the CPU memory measurement) quiet: at
    torch 2.14 its level 5 still wrote two "USDT: ... profiler_start/stop" lines per measured
    step into every probe's log, 6 writes none (a user's own KINETO_LOG_LEVEL wins)."""
    env = dict(os.environ if base is None else base, PYTHONUNBUFFERED="1")
    env.update({v: str(threads_per_worker) for v in THREAD_VARIABLES})
    env.setdefault("KINETO_LOG_LEVEL", "6")
    return env


def run_torchrun(
    nproc: int,
    module_args: Sequence[str],
    *,
    threads_per_worker: int,
    timeout_s: float,
    cwd: str | None = None,
    deadline: Callable[[], float] | None = None,
    env: dict[str, str] | None = None,
) -> LaunchResult:
    """Run ``python -m <module_args>`` in ``nproc`` local processes under torchrun.

    This is ``torchrun --standalone --nproc-per-node N -m ...`` (through this Python, so
    the same virtual environment is used). Output streams to our stdout/stderr, so a
    Snakemake rule's log shows the workers' progress. Past ``timeout_s`` the whole
    process group is killed and ``timed_out`` is set.
    """
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--max-restarts=0",
        "-m",
        *module_args,
    ]
    return _run(
        cmd, {**worker_environment(threads_per_worker), **(env or {})}, timeout_s, cwd, deadline
    )


def run_srun(
    nproc: int,
    module_args: Sequence[str],
    *,
    threads_per_worker: int,
    timeout_s: float,
    deadline: Callable[[], float] | None = None,
    env: dict[str, str] | None = None,
) -> LaunchResult:
    """Run ``python -m <module_args>`` as ``nproc`` tasks of a job step: ``srun -n N``.

    Each task finds its rank, the master (first host of the job) and the port (from the
    job id) in SLURM's variables. ``--kill-on-bad-exit`` ends every task when one fails,
    as torchrun does.
    """
    cmd = [
        "srun",
        f"--ntasks={nproc}",
        f"--cpus-per-task={threads_per_worker}",
        "--kill-on-bad-exit=1",
        sys.executable,
        "-m",
        *module_args,
    ]
    env = {**worker_environment(threads_per_worker), **(env or {})}
    return _run(cmd, env, timeout_s, deadline=deadline)


def run_one(
    module_args: Sequence[str],
    *,
    threads_per_worker: int,
    timeout_s: float,
    deadline: Callable[[], float] | None = None,
    env: dict[str, str] | None = None,
) -> LaunchResult:
    """Run ``python -m <module_args>`` as the one worker of a world of one, with no agent: the
    worker finds no launcher's variables and joins a group of itself on a free port
    (:func:`tula.runtime.group.dist.worker_env`, "single"). torchrun's agent has no rendezvous to
    run for one worker, and its start (its own torch import, 2-3 s of CPU on 2 cores) came
    before the worker's: the memory probe waited for it.

    The timing probe keeps torchrun at N = 1 too: its steps are compared across N by the fits,
    so every N is started alike. A worker that hosts the group's store itself (here, as under
    submitit and srun) rather than an agent hosting it may step differently at small batches
    (``bench/store_host.py``; BENCHMARKS.md "Start-up and overheads")."""
    cmd = [sys.executable, "-m", *module_args]
    env = {**worker_environment(threads_per_worker), **(env or {})}
    return _run(cmd, env, timeout_s, deadline=deadline)


def start(
    nproc: int,
    module_args: Sequence[str],
    *,
    threads_per_worker: int,
    timeout_s: float,
    deadline: Callable[[], float] | None = None,
    one_alone: bool = False,
    env: dict[str, str] | None = None,
) -> LaunchResult:
    """Start the workers and wait for them: ``srun`` inside a SLURM allocation with enough
    tasks, else torchrun, or with ``one_alone`` a single worker by itself (:func:`run_one`:
    the memory probe, which times nothing). ``deadline``: when the launch must end (epoch
    seconds), asked again every POLL_S while it runs (a probe job's current point's own
    limit), within ``timeout_s``. ``env``: added to the workers' environment (a script
    workload's ask of its workers)."""
    how = {"threads_per_worker": threads_per_worker, "timeout_s": timeout_s, "deadline": deadline}
    if rendezvous.in_allocation(nproc):
        return run_srun(nproc, module_args, env=env, **how)
    if nproc == 1 and one_alone:
        return run_one(module_args, env=env, **how)
    return run_torchrun(nproc, module_args, env=env, **how)


def _run(
    cmd: list[str],
    env: dict,
    timeout_s: float,
    cwd: str | None = None,
    deadline: Callable[[], float] | None = None,
) -> LaunchResult:
    """Run a launcher in its own process group; kill the whole group past ``timeout_s`` or,
    where given, past ``deadline()``."""
    t0 = time.perf_counter()
    last = time.time() + timeout_s
    first = min(deadline(), last) if deadline else last
    env = {**env, DEADLINE_ENV: f"{first:.3f}"}
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, start_new_session=True)
    try:
        while True:
            try:
                rc = proc.wait(timeout=POLL_S if deadline else timeout_s)
                return LaunchResult(rc, False, time.perf_counter() - t0)
            except subprocess.TimeoutExpired:
                now = time.time()
                if now >= last or (deadline is not None and now >= deadline()):
                    break
        _kill_group(proc)
        return LaunchResult(
            proc.returncode if proc.returncode is not None else -9, True, time.perf_counter() - t0
        )
    except BaseException:
        _kill_group(proc)
        raise


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


def result_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rank{rank}.json"
