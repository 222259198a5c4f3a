"""Starting the user's script (``workload.script``) as Tula's workers: its command line at a
point, the environment that tells it what Tula asks (:class:`tula.workers.script_run.ScriptRun`)
and the one every worker runs in, and the launch itself (:func:`tula.workers.processes.start`:
srun inside an allocation, else torchrun; one worker alone with the variables torchrun would
give it). No torch: the stages start it and read what it wrote."""

from __future__ import annotations

import socket
import subprocess
import sys
from typing import Callable

from tula.config import Config
from tula.slurm import rendezvous
from tula.workers import processes
from tula.workers.script_run import ScriptRun, script_argv

ENTRY = "tula.workers.script_run"  # python -m ENTRY SCRIPT ARGS...: the script in a worker


def argv(cfg: Config, spec: ScriptRun) -> list[str]:
    """``python -m`` arguments that run the script at the spec's point."""
    assert cfg.workload.script is not None
    epochs = spec.epochs if spec.epochs is not None else cfg.workload.epochs
    return [
        ENTRY,
        *script_argv(
            cfg.workload.script,
            list(cfg.workload.args),
            spec.local_batch,
            spec.global_batch,
            spec.lr if spec.lr is not None else cfg.train.lr,
            epochs,
        ),
    ]


def environment(cfg: Config, spec: ScriptRun, alone: bool = False) -> dict[str, str]:
    """What the script's processes get besides the workers' environment: the spec,
    ``hardware.comm_env`` (Tula's own workers set it themselves as they join the group; a
    script joins its own) and, for one worker started alone, torchrun's variables for a world
    of one on a free port."""
    env = {**spec.to_env(), **cfg.hardware.comm_env}
    if alone:
        env.update(
            RANK="0",
            WORLD_SIZE="1",
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),
        )
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(
    cfg: Config,
    spec: ScriptRun,
    timeout_s: float,
    deadline: Callable[[], float] | None = None,
) -> processes.LaunchResult:
    """The script's ``spec.workers`` workers at the spec's point, waited for (a world of one
    by itself, as the memory probe's; more under srun or torchrun)."""
    alone = spec.workers == 1 and spec.role in ("check", "memory")
    return processes.start(
        spec.workers,
        argv(cfg, spec),
        threads_per_worker=cfg.hardware.threads_per_worker,
        timeout_s=timeout_s,
        deadline=deadline,
        one_alone=alone,
        env=environment(cfg, spec, alone and not rendezvous.in_allocation(spec.workers)),
    )


def run_captured(cfg: Config, spec: ScriptRun, timeout_s: float) -> subprocess.CompletedProcess:
    """One worker of the script, alone, its output kept (the check reads the script's own
    error from it); past ``timeout_s`` it is stopped."""
    env = processes.worker_environment(cfg.hardware.threads_per_worker)
    env.update(environment(cfg, spec, alone=True))
    return subprocess.run(
        [sys.executable, "-m", *argv(cfg, spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
