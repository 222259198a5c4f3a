"""The production job through submitit: the executor for an attempt (SLURM or local
processes), submitting it, re-attaching to a job an earlier `tula launch` left running,
waiting for it while echoing its log, and how a finished job ended. No torch here."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import submitit

from tula.config import Config
from tula.io import read_json
from tula.production.jobdir import segments
from tula.slurm import accounting, shapes

EXECUTORS = ("local", "slurm")


def resolve_executor(cfg: Config, hint: str | None) -> str:
    """``launch.executor``; ``auto`` follows Snakemake's executor (the --executor-hint the
    launch rule passes: slurm under the slurm profile), else local."""
    if cfg.launch.executor != "auto":
        return cfg.launch.executor
    return hint if hint in EXECUTORS else "local"


def executor_parameters(
    cfg: Config,
    kind: str,
    n_workers: int,
    timeout_min: int,
    partition: str | None = None,
    account: str | None = None,
    name: str = "tula-train",
) -> dict[str, Any]:
    """submitit's parameters for one attempt's job: :func:`tula.slurm.shapes.job_shape` on SLURM
    (the shape a probe of N asks for too), N local processes otherwise. A pure function of the
    config: nothing here asks for ``sbatch``."""
    gpus = n_workers if cfg.hardware.device == "cuda" else 0
    shape = (
        shapes.job_shape(cfg, n_workers)
        if kind == "slurm"
        else shapes.JobShape(1, n_workers, cfg.hardware.threads_per_worker, gpus)
    )
    params: dict[str, Any] = {
        "name": name,
        "timeout_min": timeout_min,
        "tasks_per_node": shape.tasks_per_node,
        "nodes": shape.nodes,
        "cpus_per_task": shape.cpus_per_task,
    }
    if shape.gpus_per_node:
        params["gpus_per_node"] = shape.gpus_per_node
    if kind == "slurm":
        L = cfg.launch
        params.update(
            slurm_signal_delay_s=L.signal_delay_s,
            slurm_additional_parameters={**L.slurm_additional},
        )
        if L.slurm_partition or partition:
            params["slurm_partition"] = L.slurm_partition or partition
        if L.slurm_account or account:
            params["slurm_account"] = L.slurm_account or account
        if L.mem_gb:
            params["mem_gb"] = L.mem_gb
    return params


def make_executor(
    cfg: Config,
    kind: str,
    folder: Path,
    n_workers: int,
    timeout_min: int,
    partition: str | None = None,
    account: str | None = None,
    name: str = "tula-train",
) -> submitit.Executor:
    """A submitit executor for one attempt's job, with :func:`executor_parameters`."""
    if kind == "slurm" and not shutil.which("sbatch"):
        raise RuntimeError(
            "config key 'launch.executor' is slurm but sbatch is not on PATH: run on the cluster's "
            "login node, or set launch.executor: local"
        )
    ex = submitit.AutoExecutor(
        folder=folder, cluster=kind, slurm_max_num_timeout=cfg.launch.max_requeues
    )
    ex.update_parameters(
        **executor_parameters(cfg, kind, n_workers, timeout_min, partition, account, name)
    )
    return ex


def submit(executor: submitit.Executor, fn: Any, kind: str) -> submitit.Job:
    """Submit ``fn``; a refusal (sbatch's message) is an error naming the keys to check."""
    try:
        return executor.submit(fn)
    except (
        subprocess.CalledProcessError,
        RuntimeError,
    ) as exc:  # submitit raises sbatch's stderr as RuntimeError
        said = (getattr(exc, "stderr", None) or getattr(exc, "output", None) or str(exc)).strip()
        said = said.decode(errors="replace") if isinstance(said, bytes) else said
        raise RuntimeError(
            f"{'sbatch' if kind == 'slurm' else 'the local executor'} refused the training job: "
            f"{' / '.join(said.splitlines()) if said else exc}. Check launch.slurm_partition, "
            "launch.slurm_account and launch.slurm_additional in the config (or slurm_partition / "
            "slurm_account in the profile)"
        ) from None


def still_running(prior: dict[str, Any], out: Path, workers: int) -> submitit.Job | None:
    """The job of the last attempt when an earlier `tula launch` left it running (its login
    session died, Snakemake was killed): a SLURM job is re-attached to, never submitted twice."""
    last = (prior.get("attempts") or [{}])[-1]
    if last.get("outcome") != "running":
        return None
    if prior.get("executor") == "slurm":
        job = submitit.SlurmJob(
            folder=out / "submitit", job_id=last["job_id"], tasks=tuple(range(workers))
        )
        return None if accounting.job_state(last["job_id"]) in ("", "NOT_FOUND") else job
    pid = int(last["job_id"])
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return None
    raise RuntimeError(
        f"the local training job of an earlier tula launch (process {pid}) is still running; wait "
        f"for it to end or stop it (kill {pid}), then run this again"
    )


class Echo:
    """Prints what a job's rank-0 log gained since the last look."""

    def __init__(self, path: Path):
        self.path, self.pos = path, 0

    def __call__(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.pos)
                data = fh.read()
        except FileNotFoundError:
            return
        if data:
            cut = data.rfind(b"\n") + 1  # whole lines only
            self.pos += cut
            sys.stdout.write(data[:cut].decode(errors="replace"))
            sys.stdout.flush()


def wait(job: submitit.Job, poll_s: float, check=None) -> None:
    """Until the job ends, echoing task 0's log; the scheduler is asked at most every 15 s.
    ``check()`` (if given) is called at every poll (tula launch's drift watch)."""
    echo = Echo(Path(job.paths.stdout))
    last_force = time.monotonic()
    while True:
        echo()
        if check is not None:
            check()
        force = time.monotonic() - last_force > max(poll_s, 15)
        if job.done(force_check=force):
            break
        if force:
            last_force = time.monotonic()
        time.sleep(poll_s)
    time.sleep(0.2)
    echo()


def log_tail(job: submitit.Job, n: int = 30) -> str:
    try:
        lines = Path(job.paths.stderr).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def _error_line(text: str) -> str:
    """The last 'SomeError: message' line of a worker's traceback."""
    found = re.findall(
        r"^(?:\[rank\d+\]:\s*)?([\w.]*(?:Error|Exception|Interrupt)\b.*)$", text, flags=re.MULTILINE
    )
    return found[-1].strip() if found else ""


def _has_result(job: submitit.Job) -> bool:
    tasks = [job.task(i) for i in range(job.num_tasks)] if job.num_tasks > 1 else [job]
    return any(t.paths.result_pickle.exists() for t in tasks)


def outcome(job: submitit.Job, out: Path, attempt: int) -> tuple[str, str]:
    """(outcome, reason) of a finished job: completed, oom, stopped or failed."""
    markers = sorted((out / "oom").glob(f"attempt{attempt}-rank*.json"))
    segs = segments(out, attempt)
    if segs and segs[-1]["outcome"] == "stopped" and not _has_result(job):
        # the ranks checkpointed, wrote this record and left by SystemExit, for which submitit
        # writes no result: do not wait its 15 s for one that cannot come
        return "stopped", segs[-1]["reason"]
    try:
        results = job.results()
    except Exception as exc:  # noqa: BLE001 - a failed job raises whatever the worker raised
        # a rank ran out of memory where the ranks cannot agree (backward) and left this record
        if markers:
            m = read_json(markers[0])
            return (
                "oom",
                f"out of memory {m['place']} ({markers[0].stem.split('-')[1]}): {m['message']}",
            )
        if segs and segs[-1]["outcome"] == "stopped":
            return "stopped", segs[-1]["reason"]
        return "failed", _error_line(str(exc)) or type(exc).__name__
    result = results[0] if isinstance(results, list) else results
    if result.get("outcome") == "oom":
        return (
            "oom",
            f"out of memory {result['place']} on rank(s) {result['ranks']}: {result['message']}",
        )
    return result.get("outcome", "failed"), "trained every epoch" if result.get(
        "outcome"
    ) == "completed" else str(result)
