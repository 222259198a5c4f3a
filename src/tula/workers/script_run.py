"""A user's own training script as a Tula worker: what Tula asks of one run of it (the
:class:`ScriptRun` its launcher hands it in the environment, ``TULA_SCRIPT_RUN``), the
command line it is run with (``workload.args`` with ``{local_batch}``, ``{global_batch}``,
``{lr}`` and ``{epochs}`` put in) and the entry that runs it in a worker process
(:func:`run_script`: the rank and rendezvous torchrun would give it, where srun or submitit
started it). No torch: the launchers (check, memory probe, probe, production job, the plan's
batch script) build these; ``tula.script`` reads them inside the script."""

from __future__ import annotations

import json
import os
import runpy
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from tula.slurm import rendezvous

ENV = "TULA_SCRIPT_RUN"
LAUNCHER = "TULA_LAUNCHER"  # srun, where torchrun's variables were made from SLURM's
ROLES = ("check", "memory", "probe", "production")


@dataclass(frozen=True)
class ProbeAsk:
    """What a probe asks of the script's steps (probe.*), and where each rank's result goes."""

    point: str  # N{n}_B{b}
    result_dir: str  # the probe job's work folder: <point>/rank<r>.json
    warmup_steps: int
    precision: float  # probe.precision
    min_steps: int  # probe.timed_steps
    budget_s: float  # probe.time_budget_s
    block_steps: int | None  # probe.block_steps (CUDA)


@dataclass(frozen=True)
class TrainAsk:
    """What the production job asks: where its records and checkpoints go, which checkpoint
    it may resume (``fingerprint``), how often it checkpoints, and who requeues it."""

    out_dir: str
    checkpoint_dir: str
    fingerprint: str
    every_steps: int | None
    every_epochs: int | None
    keep: int
    attempt: int
    requeue: str  # submitit | scontrol (the plan's batch script) | none
    metric: str  # train.metric's name, as final.json and the curves call it
    metric_goal: str  # max | min


@dataclass(frozen=True)
class ScriptRun:
    """One run of the user's script as Tula asks it: the role, the point (N, B), the LR and
    epochs it is given, and the role's own asks."""

    role: str  # check | memory | probe | production
    workers: int
    global_batch: int
    lr: float | None = None
    epochs: int | None = None
    result_dir: str | None = None  # check and memory: where rank0.json goes
    check_steps: int = 2  # check: the steps it runs before it ends
    probe: ProbeAsk | None = None
    train: TrainAsk | None = None

    @property
    def local_batch(self) -> int:
        return self.global_batch // self.workers

    def to_env(self) -> dict[str, str]:
        """The variable that hands it to the script."""
        return {ENV: json.dumps(asdict(self), sort_keys=True)}

    @classmethod
    def from_env(cls, environ: dict | None = None) -> ScriptRun | None:
        """The run Tula asks of this process, or None (the script runs without Tula)."""
        text = (os.environ if environ is None else environ).get(ENV)
        if not text:
            return None
        d = json.loads(text)
        if d.get("role") not in ROLES:
            raise ValueError(f"{ENV}: role {d.get('role')!r} is not one of {ROLES}")
        probe, train = d.pop("probe", None), d.pop("train", None)
        return cls(
            **d,
            probe=ProbeAsk(**probe) if probe else None,
            train=TrainAsk(**train) if train else None,
        )


def script_argv(
    script: str, args: list[str], local_batch: int, global_batch: int, lr: float, epochs: int
) -> list[str]:
    """The script and its arguments at one point, the placeholders put in."""
    values = {
        "local_batch": local_batch,
        "global_batch": global_batch,
        "lr": f"{lr:g}",
        "epochs": epochs,
    }
    return [str(Path(script).resolve()), *(a.format_map(values) for a in args)]


# callables the script's Tula registers to run once the script returns (tula.script: the
# production job's end, where the script did not say so itself); the last one's value is
# what run_script returns
AFTER_SCRIPT: list[Callable[[], Any]] = []


def after_script(fn: Callable[[], Any]) -> None:
    """Call ``fn`` once the script returns (:func:`run_script`)."""
    AFTER_SCRIPT.append(fn)


def torchrun_env(environ: dict | None = None) -> dict[str, str]:
    """The variables torchrun gives a worker (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT), from SLURM's where a task of srun or submitit has none; those
    already set are kept."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env or "SLURM_PROCID" not in env:
        return {}
    per_node = env.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
    return {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": env["SLURM_NTASKS"],
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "LOCAL_WORLD_SIZE": per_node if per_node.isdigit() else env["SLURM_NTASKS"],
        "MASTER_ADDR": env.get("MASTER_ADDR") or rendezvous.master_addr(env["SLURM_JOB_NODELIST"]),
        "MASTER_PORT": env.get("MASTER_PORT") or str(rendezvous.master_port(env["SLURM_JOB_ID"])),
        LAUNCHER: "srun",  # who started it, for the records (the variables are torchrun's)
    }


def run_script(argv: list[str]) -> Any:
    """Run the user's script (``argv``: its path and arguments) in this process as
    ``python script.py args`` would: its folder first on ``sys.path``, ``sys.argv`` its own,
    ``__name__ == "__main__"``; with torchrun's variables from SLURM's where needed. Returns
    what the last :data:`AFTER_SCRIPT` callable returns (None without one)."""
    os.environ.update(torchrun_env())
    script = Path(argv[0]).resolve()
    sys.path.insert(0, str(script.parent))
    sys.argv = [str(script), *argv[1:]]
    AFTER_SCRIPT.clear()
    runpy.run_path(str(script), run_name="__main__")
    value = None
    try:
        for after in AFTER_SCRIPT:
            value = after()
    finally:
        # let go of the run (its DDP model holds the process group): collected at the exit
        # while the interpreter still runs, not torn down in its finalization, where a gloo
        # thread dropping its last work aborted the rank (tula.runtime.group.dist.release_at_exit)
        AFTER_SCRIPT.clear()
    return value


def _main() -> None:
    """``python -m tula.workers.script_run SCRIPT [ARGS...]``: one worker of a script
    workload (srun's tasks, the plan's batch script)."""
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m tula.workers.script_run SCRIPT [ARGS...]")
    # this module by its name, not __main__: the script's `import tula.script` registers its
    # end (AFTER_SCRIPT) there
    from tula.workers import script_run

    script_run.run_script(sys.argv[1:])


if __name__ == "__main__":
    _main()
