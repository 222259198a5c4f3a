"""Starting the N worker processes of a probe or a memory probe, and reading what they wrote.

One worker command (``python -m tula.runtime.probe_worker ...``) runs unchanged in both
places it is started from:

- :func:`start` runs it as ``srun --ntasks=N`` inside a SLURM allocation with enough tasks
  (the probe rule's job), else under ``torchrun --standalone --nproc-per-node N`` (this
  machine), or the memory probe's one worker by itself (no agent: a group of one needs no
  rendezvous); each worker finds its rank in the variables srun or torchrun sets, or none
  (:func:`tula.runtime.dist.worker_env`);
- :func:`worker_environment` is the environment of every worker, probe and production
  alike (the production job's tasks are started by submitit: ``tula.production.launcher``);
- each rank writes its result to ``<dir>/rank<r>.json`` (:func:`result_path`), which the
  launcher collects after the workers exit, also when they failed;
- a probe's rank says which of its phases (:data:`tula.faults.PROBE_PHASES`) it has reached
  (:func:`mark`), and every worker prints its threads' Python stacks to its log a little
  before the launcher's deadline (:func:`dump_stacks_before_deadline`): a probe stopped by
  ``probe.timeout_s`` says where each rank was (:func:`phases_reached`), and its log shows
  the line it was on.

No torch here: the launchers (``tula probe``, ``tula memprobe``) only start and collect.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from tula.io import read_json, write_json
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
    return _run(cmd, worker_environment(threads_per_worker), timeout_s, cwd, deadline)


def run_srun(
    nproc: int,
    module_args: Sequence[str],
    *,
    threads_per_worker: int,
    timeout_s: float,
    deadline: Callable[[], float] | None = None,
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
    return _run(cmd, worker_environment(threads_per_worker), timeout_s, deadline=deadline)


def run_one(
    module_args: Sequence[str],
    *,
    threads_per_worker: int,
    timeout_s: float,
    deadline: Callable[[], float] | None = None,
) -> LaunchResult:
    """Run ``python -m <module_args>`` as the one worker of a world of one, with no agent: the
    worker finds no launcher's variables and joins a group of itself on a free port
    (:func:`tula.runtime.dist.worker_env`, "single"). torchrun's agent has no rendezvous to
    run for one worker, and its start (its own torch import, 2-3 s of CPU on 2 cores) came
    before the worker's: the memory probe waited for it.

    The timing probe keeps torchrun at N = 1 too: its steps are compared across N by the fits,
    so every N is started alike. A worker that hosts the group's store itself (here, as under
    submitit and srun) rather than an agent hosting it may step differently at small batches
    (``bench/store_host.py``; not settled on 2 cores, BENCHMARKS.md)."""
    cmd = [sys.executable, "-m", *module_args]
    return _run(cmd, worker_environment(threads_per_worker), timeout_s, deadline=deadline)


def start(
    nproc: int,
    module_args: Sequence[str],
    *,
    threads_per_worker: int,
    timeout_s: float,
    deadline: Callable[[], float] | None = None,
    one_alone: bool = False,
) -> LaunchResult:
    """Start the workers and wait for them: ``srun`` inside a SLURM allocation with enough
    tasks, else torchrun, or with ``one_alone`` a single worker by itself (:func:`run_one`:
    the memory probe, which times nothing). ``deadline``: when the launch must end (epoch
    seconds), asked again every POLL_S while it runs (a probe job's current point's own
    limit), within ``timeout_s``."""
    if rendezvous.in_allocation(nproc):
        return run_srun(
            nproc,
            module_args,
            threads_per_worker=threads_per_worker,
            timeout_s=timeout_s,
            deadline=deadline,
        )
    if nproc == 1 and one_alone:
        return run_one(
            module_args,
            threads_per_worker=threads_per_worker,
            timeout_s=timeout_s,
            deadline=deadline,
        )
    return run_torchrun(
        nproc,
        module_args,
        threads_per_worker=threads_per_worker,
        timeout_s=timeout_s,
        deadline=deadline,
    )


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


def dump_stacks_before_deadline(margin_s: float = 5.0, left_s: float | None = None) -> None:
    """In a worker: print every thread's Python stack to stderr (the rule's log) ``margin_s``
    before the launcher's deadline (at most a fifth of the time left), so a worker that hangs
    shows the line it hangs on before it is killed. ``left_s``: the deadline is that far off
    (a probe job's next point, which gets its own); else the launcher's, and nothing where no
    launcher set one."""
    if left_s is None:
        deadline = os.environ.get(DEADLINE_ENV)
        if not deadline:
            return
        left_s = float(deadline) - time.time()
    if left_s > 0:
        faulthandler.dump_traceback_later(left_s - min(margin_s, left_s / 5), exit=False)


def phase_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rank{rank}.phase.json"


def mark(directory: str | Path, rank: int, phase: str, began: float | None = None) -> None:
    """Rank ``rank`` has reached ``phase`` (one of :data:`tula.faults.PROBE_PHASES`), now;
    ``began``: when this rank began the point the phase is of (a probe job's later points)."""
    write_json(phase_path(directory, rank), {"phase": phase, "since": time.time(), "began": began})


def point_dir(directory: str | Path, point_name: str) -> Path:
    """Where the ranks of a probe job write what they have of one of its points."""
    return Path(directory) / point_name


def began(directory: str | Path, nproc: int) -> float | None:
    """When the first of the ``nproc`` ranks began the point whose phases are in ``directory``
    (None: none has said so, or said no time: the job's first point, begun at its start)."""
    times = []
    for rank in range(nproc):
        try:
            times.append(float(read_json(phase_path(directory, rank))["began"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return min(times) if times else None


def marked(directory: str | Path, nproc: int) -> bool:
    """Has any of the ``nproc`` ranks said a phase in ``directory``."""
    return any(phase_path(directory, rank).exists() for rank in range(nproc))


def phases_reached(directory: str | Path, nproc: int) -> list[dict]:
    """Which phase each of the ``nproc`` ranks had reached and for how long it had been in it
    (and, at a probe job's later point, ``point_for_s``: since it began that point);
    ``"not started"`` for a rank that never said (not launched, or still importing)."""
    now, out = time.time(), []
    for rank in range(nproc):
        try:
            said = read_json(phase_path(directory, rank))
            out.append({"rank": rank, "phase": said["phase"], "for_s": now - said["since"]})
            if said.get("began") is not None:  # a probe job's later point: since it began
                out[-1]["point_for_s"] = now - said["began"]
        except (OSError, ValueError, KeyError, TypeError):
            out.append({"rank": rank, "phase": "not started", "for_s": None})
    return out


def describe_phases(reached: list[dict]) -> str:
    """``rank 0 in 'timed steps' for 512 s, rank 1 in 'process group' for 590 s``."""
    return ", ".join(
        f"rank {r['rank']} in {r['phase']!r}"
        + (f" for {r['for_s']:.0f} s" if r.get("for_s") is not None else "")
        for r in reached
    )


def parse_worker_args(
    prog: str,
    argv: list[str] | None = None,
    batch_flag: str = "--global-batch",
    batch_list: bool = False,
) -> argparse.Namespace:
    """Arguments of a worker entry point (``python -m tula.runtime.probe_worker`` /
    ``memprobe_worker``); with ``batch_list`` the batch flag takes a comma-separated list."""
    p = argparse.ArgumentParser(
        prog=f"python -m {prog}", description="One worker, started by torchrun or srun."
    )
    p.add_argument("--config", required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument(
        batch_flag,
        required=True,
        type=(lambda s: [int(v) for v in s.split(",")]) if batch_list else int,
    )
    p.add_argument("--result-dir", required=True)
    p.add_argument(
        "--memory-probe",
        default=None,
        help="results/memory_probe.json: b_max for the compute sweep",
    )
    p.add_argument(
        "--attempt",
        type=int,
        default=1,
        help="which launch of this probe (one more after a lost rank)",
    )
    return p.parse_args(argv)


def result_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rank{rank}.json"
