"""``tula launch``: the production training job, submitted with submitit and watched to the end.

Paper §IV-B: "frequent job checkpointing and relaunching progressively smaller batches
until a feasible configuration is found". One *attempt* is one submitit job at one global
batch B (N is kept):

- the job is a :class:`ProductionJob` (``submitit.helpers.Checkpointable``): SLURM's USR2 before
  the time limit or on preemption makes every rank checkpoint at the next step boundary,
  and submitit requeues the job, which resumes from that checkpoint (TERM, from scancel or
  ``scontrol requeue``, also checkpoints first). Requeues stay inside one attempt;
- if a rank runs out of memory, all ranks agree, the job ends with outcome ``oom``, and
  the next attempt resumes from the last checkpoint at the next smaller feasible B (the
  memory model's order from predictions.csv, else B/2) until one trains or none is left.

Every attempt (batch, start/end step, outcome, reason, and the requeued segments inside it)
is written to ``results/train/attempts.json``; submitit's job folder and logs are in
``results/train/submitit/``. The rank-0 log is echoed to the terminal while the job runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import submitit

from tula import checkpoint, slurm, workers
from tula import config as config_mod
from tula import faults as tula_faults
from tula.io import read_json, write_json
from tula.stages.select import selected_point

EXECUTORS = ("local", "slurm")


class OutOfMemory(RuntimeError):
    """The job ran out of memory and :func:`run` was told not to relaunch it smaller."""


class ProductionJob(submitit.helpers.Checkpointable):
    """What each of the job's N tasks runs: join the process group that submitit describes
    (``TorchDistributedEnvironment``) and train from the newest checkpoint of this run."""

    def __init__(self, config: str, nodes: int, global_batch: int, out_dir: str, ckpt: checkpoint.Checkpointing):
        self.config, self.nodes, self.global_batch, self.out_dir, self.ckpt = config, nodes, global_batch, out_dir, ckpt

    def __call__(self) -> dict[str, Any]:
        cfg = config_mod.load(self.config)
        os.environ.update(workers.worker_environment(cfg.hardware.threads_per_worker))  # as the probe's workers, before torch
        on_cuda = cfg.hardware.device == "cuda"
        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=on_cuda, overwrite=True)
        from tula.runtime.trainer import Trainer  # torch: imported by the job's tasks, never by tula launch

        return Trainer(cfg, self.nodes, self.global_batch, Path(self.out_dir), self.ckpt).run()

    # checkpoint(): Checkpointable's default resubmits this same call; the state is on disk.


def resolve_executor(cfg: config_mod.Config, hint: str | None) -> str:
    """``launch.executor``; ``auto`` follows Snakemake's executor (the --executor-hint the
    train rule passes: slurm under the slurm profile), else local."""
    if cfg.launch.executor != "auto":
        return cfg.launch.executor
    return hint if hint in EXECUTORS else "local"


def make_executor(cfg: config_mod.Config, kind: str, folder: Path, n_workers: int, timeout_min: int,
                  partition: str | None = None, account: str | None = None,
                  name: str = "tula-train") -> submitit.Executor:  # fmt: skip
    """A submitit executor for one attempt's job (SLURM or local processes)."""
    if kind == "slurm" and not shutil.which("sbatch"):
        raise RuntimeError("config key 'launch.executor' is slurm but sbatch is not on PATH: run on the cluster's "
                           "login node, or set launch.executor: local")  # fmt: skip
    shape = slurm.job_shape(cfg, n_workers) if kind == "slurm" else slurm.JobShape(1, n_workers, cfg.hardware.threads_per_worker,
                                                                       n_workers if cfg.hardware.device == "cuda" else 0)  # fmt: skip
    ex = submitit.AutoExecutor(folder=folder, cluster=kind, slurm_max_num_timeout=cfg.launch.max_requeues)
    params: dict[str, Any] = {"name": name, "timeout_min": timeout_min, "tasks_per_node": shape.tasks_per_node,
                              "nodes": shape.nodes, "cpus_per_task": shape.cpus_per_task}  # fmt: skip
    if shape.gpus_per_node:
        params["gpus_per_node"] = shape.gpus_per_node
    if kind == "slurm":
        L = cfg.launch
        params.update(slurm_signal_delay_s=L.signal_delay_s, slurm_additional_parameters={**L.slurm_additional})
        if L.slurm_partition or partition:
            params["slurm_partition"] = L.slurm_partition or partition
        if L.slurm_account or account:
            params["slurm_account"] = L.slurm_account or account
        if L.mem_gb:
            params["mem_gb"] = L.mem_gb
    ex.update_parameters(**params)
    return ex


def smaller_batches(nodes: int, batch: int, predictions: str | Path | None, floor: int) -> list[int]:
    """Global batches to try after an OOM at ``batch``, best first: the grid's batches for N
    below ``batch`` that the memory model calls feasible, largest predicted memory first;
    without predictions, halving. Each must split over N workers and be >= ``floor``."""
    if predictions and Path(predictions).exists():
        p = pd.read_csv(predictions)
        p = p[(p["nodes"] == nodes) & (p["global_batch"] < batch) & p["feasible"].astype(bool)]
        cands = [int(b) for b in p.sort_values("mem_bytes", ascending=False)["global_batch"]]
    else:
        cands, b = [], batch // 2
        while b >= 1:
            cands.append(b)
            b //= 2
    return [b for b in cands if b % nodes == 0 and b >= max(floor, nodes)]


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


class Record:
    """attempts.json, written twice: ``results/train/attempts.json`` (what users and the report
    read; a Snakemake output, so Snakemake deletes it when the rule fails) and a copy beside
    the checkpoints it describes, which a re-run reads to continue the history."""

    def __init__(self, out: Path):
        self.paths = (out / "checkpoints" / "attempts.json", out / "attempts.json")

    def read(self) -> dict[str, Any]:
        for p in self.paths:
            if p.exists():
                return read_json(p)
        return {}

    def write(self, record: dict[str, Any]) -> None:
        for p in self.paths:
            write_json(p, record)


def _resumable(ck: Path, fingerprint: str) -> bool:
    """Is the newest checkpoint one of this run (same settings, N, selected B) that did not
    finish? (Older ones of a finished run must never be resumed.)"""
    found = checkpoint.manifests(ck)
    if not found:
        return False
    try:
        meta = read_json(found[0][1])
    except ValueError:
        return len(found) > 1  # a damaged newest manifest: the worker falls back to the previous one
    return meta.get("fingerprint") == fingerprint and not meta.get("complete")


def _segments(out: Path, attempt: int) -> list[dict[str, Any]]:
    path = out / "segments.json"
    segs = read_json(path) if path.exists() else []
    return [s for s in segs if s.get("attempt") == attempt]


def _still_running(prior: dict[str, Any], out: Path, nodes: int) -> submitit.Job | None:
    """The job of the last attempt when an earlier `tula launch` left it running (its login
    session died, Snakemake was killed): a SLURM job is re-attached to, never submitted twice."""
    last = (prior.get("attempts") or [{}])[-1]
    if last.get("outcome") != "running":
        return None
    if prior.get("executor") == "slurm":
        job = submitit.SlurmJob(folder=out / "submitit", job_id=last["job_id"], tasks=tuple(range(nodes)))
        return None if slurm.job_state(last["job_id"]) in ("", "NOT_FOUND") else job
    pid = int(last["job_id"])
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return None
    raise RuntimeError(f"the local training job of an earlier tula launch (process {pid}) is still running; wait "
                       f"for it to end or stop it (kill {pid}), then run this again")  # fmt: skip


def _latest_checkpoint_step(ck: Path) -> int:
    return checkpoint.newest_intact(ck) or 0


def _log_tail(job: submitit.Job, n: int = 30) -> str:
    try:
        lines = Path(job.paths.stderr).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def _wait(job: submitit.Job, echo: Echo, poll_s: float) -> None:
    last_force = time.monotonic()
    while True:
        echo()
        force = time.monotonic() - last_force > max(poll_s, 15)
        if job.done(force_check=force):
            break
        if force:
            last_force = time.monotonic()
        time.sleep(poll_s)
    time.sleep(0.2)
    echo()


def run(cfg_path: str | Path, selection: str | Path, out_dir: str | Path, predictions: str | Path | None = None,
        executor_hint: str | None = None, timeout_min: int | None = None, partition: str | None = None,
        account: str | None = None, fresh: bool = False, shrink: bool = True,
        job_name: str = "tula-train") -> dict[str, Any]:  # fmt: skip
    """Train at the selected (N, B) until done; relaunch smaller after an OOM (``shrink``;
    without it an OOM raises :class:`OutOfMemory`: `tula compare` trains a cell at its own B
    or not at all). Returns final.json."""
    cfg = config_mod.load(cfg_path)
    nodes, selected_batch = selected_point(selection)
    if tula_faults.from_env():  # a malformed spec fails here, naming it, not inside the job
        print(f"[launch] fault injection is ON: {tula_faults.ENV}={os.environ[tula_faults.ENV]!r}", flush=True)
    out = Path(out_dir).resolve()
    ck = out / "checkpoints"
    fp = checkpoint.fingerprint(config_mod.stage_settings(cfg, "train"), nodes, selected_batch)
    kind = resolve_executor(cfg, executor_hint)
    limit = cfg.launch.timeout_min or timeout_min or 1440
    if kind == "slurm":  # the job as it will be asked for: nodes, GPUs and time the partition allows?
        try:
            slurm.preflight(cfg, train_partition=cfg.launch.slurm_partition or partition, train_runtime_min=limit,
                              training_only=True, train_nodes=nodes)  # fmt: skip
        except slurm.ClusterUnreadable:
            pass  # sbatch says what is wrong
        except slurm.PreflightError as exc:
            raise RuntimeError(str(exc)) from None
    history = Record(out)
    prior = history.read()
    same_run = not fresh and prior.get("fingerprint") == fp
    job = _still_running(prior, out, nodes) if same_run else None
    if not (job or (not fresh and _resumable(ck, fp))):
        for stale in (ck, out / "oom"):
            shutil.rmtree(stale, ignore_errors=True)
        (out / "segments.json").unlink(missing_ok=True)
        prior = {}
    elif not same_run:
        prior = {}  # the checkpoints are this run's but its record is gone: the history starts here
    attempts: list[dict[str, Any]] = list(prior.get("attempts", []))
    record = {"fingerprint": fp, "nodes": nodes, "selected_batch": selected_batch,
              "executor": prior.get("executor", kind) if job else kind, "outcome": "running", "attempts": attempts}  # fmt: skip
    if attempts and attempts[-1]["outcome"] == "running" and not job:  # its launcher died; the job is gone
        attempts[-1].update(outcome="interrupted", reason="tula launch stopped while the job ran; resumed by a new "
                                                          "attempt from the newest checkpoint")  # fmt: skip
    batch = attempts[-1]["global_batch"] if attempts else selected_batch
    tried = {a["global_batch"] for a in attempts if a["outcome"] == "oom"}
    if batch in tried:
        batch = _next_batch(nodes, batch, predictions, cfg, tried, record, history)
    final = out / "final.json"
    started = 0.0 if job else time.time()  # a re-attached job may have written final.json already
    print(f"[launch] training N={nodes} B={batch} with the {record['executor']} executor; job folder "
          f"{out / 'submitit'}" + (f"; resuming ({len(attempts)} earlier attempt(s), newest checkpoint: step "
                                  f"{_latest_checkpoint_step(ck)})" if attempts else ""), flush=True)  # fmt: skip
    while True:
        if job is not None:  # a job of an earlier `tula launch` of this run is still queued or running
            att = attempts[-1]
            n = att["attempt"]
            print(f"[launch] attempt {n}: re-attached to job {job.job_id} (global batch {batch}), submitted by an "
                  "earlier tula launch", flush=True)  # fmt: skip
        else:
            n = len(attempts) + 1
            ckpt = checkpoint.Checkpointing(ck, fp, cfg.launch.checkpoint_every_steps, cfg.launch.checkpoint_every_epochs,
                                       cfg.launch.keep_checkpoints, attempt=n)  # fmt: skip
            executor = make_executor(cfg, kind, out / "submitit", nodes, limit, partition, account, job_name)
            job = _submit(executor, ProductionJob(str(Path(cfg_path).resolve()), nodes, batch, str(out), ckpt), kind)
            att = {"attempt": n, "global_batch": batch, "local_batch": batch // nodes, "job_id": str(job.job_id),
                   "start_step": _latest_checkpoint_step(ck), "end_step": None, "checkpoint_step": None,
                   "outcome": "running", "reason": "", "segments": []}  # fmt: skip
            attempts.append(att)
            print(f"[launch] attempt {n}: job {job.job_id}, global batch {batch} ({batch // nodes} per worker), "
                  f"from step {att['start_step']}", flush=True)  # fmt: skip
        history.write(record)
        try:
            _wait(job, Echo(Path(job.paths.stdout)), cfg.launch.poll_s)  # task 0's log
        except BaseException:
            job.cancel(check=False)  # Ctrl-C / Snakemake stopping: scancel; the workers checkpoint on TERM
            att.update(outcome="cancelled", reason="tula launch was interrupted; the job was cancelled")
            history.write({**record, "outcome": "cancelled"})
            raise
        outcome, reason = _outcome(job, out, n)
        segs = _segments(out, n)
        att.update(outcome=outcome, reason=reason, segments=segs, checkpoint_step=_latest_checkpoint_step(ck))
        if segs:  # where the workers really started (a damaged newest checkpoint was skipped) and ended
            att.update(start_step=segs[0]["start_step"], end_step=segs[-1]["end_step"])
        history.write(record)
        resumed = max(len(segs) - 1, 0)  # each segment after the first resumed from a checkpoint
        print(f"[launch] attempt {n} ended: {outcome}"
              + (f" after {resumed} preemption/requeue(s), each resumed from its checkpoint" if resumed else "")
              + (f" — {reason}" if reason and outcome != "completed" else ""), flush=True)  # fmt: skip
        if outcome == "completed":
            break
        if outcome == "stopped":
            record["outcome"] = "stopped"
            history.write(record)
            raise RuntimeError(f"the training job {job.job_id} was stopped ({reason}); its checkpoint of step "
                               f"{att['checkpoint_step']} is kept: run the same command again to resume from it")  # fmt: skip
        if outcome != "oom":
            record["outcome"] = "failed"
            history.write(record)
            raise RuntimeError(f"training at N={nodes} B={batch} failed (attempt {n}, job {job.job_id}): {reason}\n"
                               f"logs: {out / 'submitit'}\n{_log_tail(job)}")  # fmt: skip
        if not shrink:
            record["outcome"] = "oom"
            history.write(record)
            raise OutOfMemory(f"out of memory training at N={nodes} B={batch} (attempt {n}, job {job.job_id}): {reason}")
        job = None
        tried.add(batch)
        batch = _next_batch(nodes, batch, predictions, cfg, tried, record, history)
    if not final.exists() or final.stat().st_mtime < started:
        raise RuntimeError(f"training at N={nodes} B={batch} reported success but wrote no {final}")
    record["outcome"] = "completed"
    history.write(record)
    return prediction_check(final, predictions)


def prediction_check(final_path: Path, predictions: str | Path | None) -> dict[str, Any]:
    """Put the prediction for the point the job trained beside what the job measured, in
    final.json: predicted step time (with its 95 % interval) against the mean training step,
    predicted training time against the time spent in training steps (evaluation,
    checkpoints and start-up are reported apart: Eq. 4a does not model them)."""
    final = read_json(final_path)
    if not predictions or not Path(predictions).exists():
        return final
    p = pd.read_csv(predictions)
    row = p[(p["nodes"] == final["nodes"]) & (p["global_batch"] == final["global_batch"])]
    if row.empty:
        return final
    r = row.iloc[0]
    pred_step, pred_T = float(r["step_time_s"]), float(r["train_time_s"])
    final.update({
        "predicted_step_time_s": pred_step,
        "predicted_step_time_interval_s": [float(r["step_time_lo_s"]), float(r["step_time_hi_s"])],
        "predicted_train_time_s": pred_T,
        "predicted_train_time_interval_s": [float(r["train_time_lo_s"]), float(r["train_time_hi_s"])],
        "step_time_ratio": final["mean_step_time_s"] / pred_step if pred_step > 0 else None,
        "train_time_ratio": final["train_time_s"] / pred_T if pred_T > 0 else None,
        "prediction_note": "predicted_* come from predictions.csv at the trained (N, B); train_time_s counts "
                           "training steps only; eval_time_s, checkpoint_time_s and startup_time_s are apart",
    })  # fmt: skip
    write_json(final_path, final)
    lo, hi = final["predicted_step_time_interval_s"]
    print(f"[launch] prediction check at N={final['nodes']} B={final['global_batch']}: step predicted "
          f"{1e3 * pred_step:.2f} ms (95 % interval {1e3 * lo:.2f}-{1e3 * hi:.2f}), measured "
          f"{1e3 * final['mean_step_time_s']:.2f} ms (x{final['step_time_ratio']:.3f}); training time predicted "
          f"{pred_T:.1f} s, measured {final['train_time_s']:.1f} s in steps (+ {final['eval_time_s']:.1f} s "
          f"evaluation, {final['checkpoint_time_s']:.1f} s checkpoints, {final['startup_time_s']:.1f} s start-up)",
          flush=True)  # fmt: skip
    return final


def _submit(executor: submitit.Executor, fn: ProductionJob, kind: str) -> submitit.Job:
    try:
        return executor.submit(fn)
    except (subprocess.CalledProcessError, RuntimeError) as exc:  # submitit raises sbatch's stderr as RuntimeError
        said = (getattr(exc, "stderr", None) or getattr(exc, "output", None) or str(exc)).strip()
        said = said.decode(errors="replace") if isinstance(said, bytes) else said
        raise RuntimeError(f"{'sbatch' if kind == 'slurm' else 'the local executor'} refused the training job: "
                           f"{' / '.join(said.splitlines()) if said else exc}. Check launch.slurm_partition, "
                           "launch.slurm_account and launch.slurm_additional in the config (or slurm_partition / "
                           "slurm_account in the profile)") from None  # fmt: skip


def _next_batch(nodes: int, batch: int, predictions, cfg, tried: set[int], record: dict, history: Record) -> int:
    left = [b for b in smaller_batches(nodes, batch, predictions, cfg.grid.batch_min) if b not in tried]
    if not left:
        record["outcome"] = "failed"
        history.write(record)
        raise RuntimeError(f"out of memory at every global batch tried for N={nodes} ({', '.join(map(str, sorted(tried, reverse=True)))}) "
                           f"and no smaller batch >= grid.batch_min={cfg.grid.batch_min} divides over {nodes} workers; "
                           f"lower grid.batch_min, use more workers, or a device with more memory")  # fmt: skip
    print(f"[launch] out of memory at B={batch}: relaunching at B={left[0]} from the last checkpoint", flush=True)
    return left[0]


def _error_line(text: str) -> str:
    """The last 'SomeError: message' line of a worker's traceback."""
    found = re.findall(r"^(?:\[rank\d+\]:\s*)?([\w.]*(?:Error|Exception|Interrupt)\b.*)$", text, flags=re.M)
    return found[-1].strip() if found else ""


def _outcome(job: submitit.Job, out: Path, attempt: int) -> tuple[str, str]:
    """(outcome, reason) of a finished job: completed, oom, or failed."""
    markers = sorted((out / "oom").glob(f"attempt{attempt}-rank*.json"))
    segs = _segments(out, attempt)
    try:
        results = job.results()
    except Exception as exc:  # noqa: BLE001 - a failed job raises whatever the worker raised
        if markers:  # a rank ran out of memory where the ranks cannot agree (backward) and left this record
            m = read_json(markers[0])
            return "oom", f"out of memory {m['place']} ({markers[0].stem.split('-')[1]}): {m['message']}"
        if segs and segs[-1]["outcome"] == "stopped":
            return "stopped", segs[-1]["reason"]
        return "failed", _error_line(str(exc)) or type(exc).__name__
    r = results[0] if isinstance(results, list) else results
    if r.get("outcome") == "oom":
        return "oom", f"out of memory {r['place']} on rank(s) {r['ranks']}: {r['message']}"
    return r.get("outcome", "failed"), "trained every epoch" if r.get("outcome") == "completed" else str(r)
