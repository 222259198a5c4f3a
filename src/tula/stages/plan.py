"""``tula plan``: the answer to take away, for a user who trains with their own script
(``snakemake plan`` runs everything up to the choice and the report, and trains nothing).

- ``results/plan/plan.json``: the chosen N and B, the batch per worker, the nodes and workers
  per node, the LR and schedule the method would use at that B, and the predicted step, wall
  time and cost, each with its 95 % interval where predictions.csv has one.
- ``results/plan/train.sbatch``: a SLURM batch script that trains at that point. Its
  ``#SBATCH`` lines are the production job's shape (:func:`tula.slurm.shapes.job_shape`, what
  the probes ran, ``--exclusive`` where they had it) with the profile's partition, account and
  memory, a time limit from the prediction, and ``--signal``/``--requeue``; it activates the
  environment the plan ran in, exports ``hardware.comm_env`` and the threads per worker. With
  ``workload.script`` it runs that script with its arguments at (N, B), one task per worker,
  and hands it Tula's production role (checkpoints under ``results/plan/run/``, resumed after
  SLURM's requeue: :mod:`tula.script`); without, it is a skeleton for one's own script
  (``YOUR_TRAIN_SCRIPT``) under torchrun.
- plan.json says which of Tula's guarantees carry over to that batch script
  (:func:`guarantees`).
"""

from __future__ import annotations

import math
import shlex
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from tula import checkpoint, model_inputs, pipeline
from tula import config as config_mod
from tula.io import atomic_write, read_json, write_json
from tula.model.grid import steps_per_epoch
from tula.model.selection import Selection
from tula.slurm import shapes
from tula.workers import script_launch
from tula.workers.processes import THREAD_VARIABLES
from tula.workers.script_run import ScriptRun, TrainAsk

RDZV_PORT = 29500  # torchrun's c10d rendezvous on the first node


def plan_record(
    cfg: config_mod.Config,
    selection: Selection,
    predictions: pd.DataFrame,
    train_samples: int,
    timeout_min: int | None,
) -> dict[str, Any]:
    """plan.json's content: the chosen point and what it takes to train there."""
    s = selection.selected
    n, b = s.key
    row = predictions[(predictions["workers"] == n) & (predictions["global_batch"] == b)]
    r = row.iloc[0].to_dict() if len(row) else {}
    shape = shapes.job_shape(cfg, n)
    t, lr = cfg.train, model_inputs.lr_plan(cfg.train)
    spe, k = steps_per_epoch(train_samples, b, n), s.micro_batches
    wall = r.get("wall_time_s")
    return {
        "workers": n,
        "global_batch": b,
        "local_batch": s.local_batch,
        # train.accumulate: the micro-batches a step runs as, and the largest of them
        "accumulate": k,
        "micro_batch": -(-s.local_batch // k),
        "nodes": shape.nodes,
        "workers_per_node": shape.tasks_per_node,
        "gpus_per_node": shape.gpus_per_node,
        "objective": selection.objective,
        "reason": selection.reason,
        "epochs": cfg.workload.epochs,
        "steps_per_epoch": spe,
        "method": t.method,
        "method_reason": t.method_reason,
        "optimizer": t.optimizer,
        "optimizer_args": dict(t.optimizer_args),
        "lr": lr.peak(b),
        "lr_note": (
            f"train.lr times k = B / base_batch = {b}/{t.base_batch}"
            if lr.linear_scaling
            else "train.lr: the method does not scale it with B"
        ),
        "warmup_epochs": lr.warmup_epochs,
        "warmup_steps": round(lr.warmup_epochs * spe),
        "schedule": t.schedule,
        "schedule_args": dict(t.schedule_args),
        "lr_decay_epochs": list(t.lr_decay_epochs),
        "lr_decay_factor": t.lr_decay_factor,
        "loss": t.loss,
        "label_smoothing": t.label_smoothing,
        "precision": t.precision,
        "predicted_step_time_s": s.step_time_s,
        "predicted_step_time_interval_s": _interval(r, "step_time"),
        "predicted_train_time_s": s.train_time_s,
        "predicted_wall_time_s": float(wall) if wall is not None else None,
        "predicted_wall_time_interval_s": _interval(r, "wall_time"),
        "predicted_cost": s.cost,
        "currency": s.currency,
        "mem_bytes_per_worker": s.mem_bytes,
        "time_limit_min": timeout_min,
        "trained": False,
    }


def _interval(row: dict[str, Any], name: str) -> list[float] | None:
    """predictions.csv's 95 % interval of ``name`` at the chosen point, where it has one."""
    lo, hi = row.get(f"{name}_lo_s"), row.get(f"{name}_hi_s")
    ok = lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi)
    return [float(lo), float(hi)] if ok else None


def guarantees(cfg: config_mod.Config, kept: dict[str, str] | None) -> dict[str, str]:
    """Which of Tula's guarantees carry over to the plan's batch script, each in a sentence:
    the prediction, AGS, checkpoints and requeue, the relaunch after an out-of-memory error,
    the drift monitor. ``kept``: the parts the user's script hands Tula (the check's record)."""
    if not cfg.workload.script:
        return {
            "prediction": "of Tula's own loop (workload.model and workload.dataset): your own "
            "script's step may differ; give it as workload.script to have it probed",
            "ags": "only where Tula trains (snakemake without the plan target)",
            "checkpoint_and_requeue": "only where Tula trains, or in your script",
            "oom_relaunch": "only where Tula trains (tula launch)",
            "drift_monitor": "only where Tula trains (tula launch)",
        }
    return {
        "prediction": "carries over: the probes timed this script's own steps, and the batch "
        "script runs it at the same point with the same environment",
        "ags": "does not carry over: AGS is Tula's optimizer wrapper, and the script trains with "
        "its own optimizer (train.method only sets the {lr} it is given)",
        "checkpoint_and_requeue": (
            f"carries over: tula.script checkpoints the parts the script keeps "
            f"({', '.join(kept)}) and, on SLURM's USR2 (--signal), the job checkpoints and is "
            "requeued (--requeue, scontrol requeue); it resumes where it stopped"
            if kept
            else "does not carry over: the script keeps no parts (run.keep), so a requeued job "
            "starts over"
        ),
        "oom_relaunch": "only under tula launch (snakemake without the plan target): the batch "
        "script stays at its B",
        "drift_monitor": "not for a script: its production job pairs no compute-only step",
    }


def _header(p: dict[str, Any], cfg: config_mod.Config, slurm: dict[str, Any]) -> list[str]:
    """The comments and #SBATCH lines: the job's shape, the limit, the signal and requeue."""
    script = cfg.workload.script
    lines = [
        "#!/bin/bash",
        f"# Tula's plan: N={p['workers']} workers, global batch B={p['global_batch']} "
        f"({p['local_batch']} per worker"
        + (
            f", as {p['accumulate']} micro-batches of {p['micro_batch']} a step"
            if p["accumulate"] > 1
            else ""
        )
        + f"), objective {p['objective']}.",
        f"# Predicted: step {p['predicted_step_time_s']:.4g} s, training "
        f"{p['predicted_train_time_s']:.4g} s, cost {p['predicted_cost']:.4g} {p['currency']} "
        "(results/plan/plan.json, which says what carries over of Tula's guarantees).",
        f"# LR {p['lr']:.6g} ({p['lr_note']}); {p['epochs']} epochs of "
        f"{p['steps_per_epoch']} steps.",
        "#SBATCH --job-name=tula-plan",
        f"#SBATCH --nodes={p['nodes']}",
    ]
    if script:  # one task per worker: srun starts each (tula.workers.script_run)
        lines += [
            f"#SBATCH --ntasks-per-node={p['workers_per_node']}",
            f"#SBATCH --cpus-per-task={cfg.hardware.threads_per_worker}",
        ]
    else:
        lines += [
            "#SBATCH --ntasks-per-node=1  # one torchrun per node; it starts the node's workers",
            f"#SBATCH --cpus-per-task={p['cpus_per_node']}",
        ]
    if p["gpus_per_node"]:
        lines.append(f"#SBATCH --gpus-per-node={p['gpus_per_node']}")
    if cfg.probe.exclusive:
        lines.append("#SBATCH --exclusive  # as the probes ran (probe.exclusive)")
    lines.append(f"#SBATCH --time={int(p['time_limit_min'])}  # {p['time_limit_why']}")
    for key, flag in (("partition", "--partition"), ("account", "--account")):
        if slurm.get(key):
            lines.append(f"#SBATCH {flag}={slurm[key]}")
    if slurm.get("mem_mb"):
        lines.append(f"#SBATCH --mem={int(slurm['mem_mb'])}M")
    if script:
        lines += [
            f"#SBATCH --signal=USR2@{cfg.launch.signal_delay_s}  # checkpoint, then requeue",
            "#SBATCH --requeue",
            "#SBATCH --open-mode=append",
            f"#SBATCH --output={p['run_dir']}/slurm-%j.out",
        ]
    return lines


def _environment(cfg: config_mod.Config) -> list[str]:
    """The environment the plan ran in, activated, in the folder it ran from; the communication
    variables (hardware.comm_env) and the threads per worker, as every probe had them."""
    prefix = Path(sys.prefix)
    activate = prefix / "bin" / "activate"
    lines = [
        "set -euo pipefail",
        f"cd {shlex.quote(str(Path.cwd()))}",
        "# the environment the plan ran in (Tula and the script's packages)",
        f"source {shlex.quote(str(activate))}"
        if activate.exists()
        else f"export PATH={shlex.quote(str(prefix / 'bin'))}:$PATH",
    ]
    for k, v in sorted(cfg.hardware.comm_env.items()):
        lines.append(f"export {k}={shlex.quote(v)}  # hardware.comm_env")
    threads = cfg.hardware.threads_per_worker
    lines += [f"export {v}={threads}" for v in THREAD_VARIABLES]
    return lines + ["export PYTHONUNBUFFERED=1"]


def script_run_spec(cfg: config_mod.Config, p: dict[str, Any]) -> ScriptRun:
    """What the batch script asks of the user's script: Tula's production role, its records
    and checkpoints in the plan's run folder, requeued by SLURM itself."""
    run_dir = Path(p["run_dir"])
    n, b = p["workers"], p["global_batch"]
    L = cfg.launch
    return ScriptRun(
        "production",
        n,
        b,
        p["lr"],
        cfg.workload.epochs,
        train=TrainAsk(
            out_dir=str(run_dir),
            checkpoint_dir=str(run_dir / "checkpoints"),
            fingerprint=checkpoint.fingerprint(pipeline.stage_settings(cfg, "launch"), n, b),
            every_steps=L.checkpoint_every_steps,
            every_epochs=L.checkpoint_every_epochs,
            keep=L.keep_checkpoints,
            attempt=1,
            requeue="scontrol",
            metric=config_mod.metric_name(cfg.train.metric),
            metric_goal=cfg.train.metric_goal,
        ),
    )


def sbatch_script(p: dict[str, Any], cfg: config_mod.Config, slurm: dict[str, Any]) -> str:
    """A batch script that trains at the plan's point (module docstring)."""
    lines = _header(p, cfg, slurm) + [""] + _environment(cfg)
    if cfg.workload.script:
        spec = script_run_spec(cfg, p)
        argv = script_launch.argv(cfg, spec)
        lines += [
            "# Tula's production role in the script (tula.script): its checkpoints, its records "
            "and, on USR2, checkpoint and requeue",
            f"export TULA_SCRIPT_RUN={shlex.quote(spec.to_env()['TULA_SCRIPT_RUN'])}",
            "srun --kill-on-bad-exit=1 python -m " + " ".join(shlex.quote(a) for a in argv),
            "",
        ]
        return "\n".join(lines)
    lines += [
        "",
        "# YOUR_TRAIN_SCRIPT and YOUR_ARGS are placeholders: put your own training script and",
        "# its arguments there (or give it to Tula as workload.script: then this script runs",
        "# it, and its step is what the probes timed). Pass it the batch per worker and the LR",
        "# above. Tula's method (AGS, static, lars, polo) is not in your script: it runs only",
        "# where Tula trains (snakemake without the plan target).",
        *(
            [
                f"# Tula priced each step as {p['accumulate']} micro-batches of at most "
                f"{p['micro_batch']} (train.accumulate: the batch per worker is past what fits):",
                "# accumulate their gradients in your script (DDP's no_sync for all but the last).",
            ]
            if p["accumulate"] > 1
            else []
        ),
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "srun torchrun \\",
        '  --nnodes="$SLURM_JOB_NUM_NODES" \\',
        f"  --nproc-per-node={p['workers_per_node']} \\",
        "  --rdzv-backend=c10d \\",
        f'  --rdzv-endpoint="$head:{RDZV_PORT}" \\',
        '  --rdzv-id="$SLURM_JOB_ID" \\',
        "  YOUR_TRAIN_SCRIPT.py \\",
        f"  --batch-size {p['local_batch']} --lr {p['lr']:.6g} --epochs {p['epochs']} \\",
        "  YOUR_ARGS",
        "",
    ]
    return "\n".join(lines)


def run(
    config,
    selection,
    predictions,
    workload,
    out_dir,
    timeout_min: int | None = None,
    slurm_partition: str | None = None,
    slurm_account: str | None = None,
    mem_mb: int | None = None,
) -> dict[str, Any]:
    """``tula plan``: write plan.json and train.sbatch in ``out_dir`` (launch.* settings win
    over the profile's partition, account and runtime, as they do for `tula launch`)."""
    cfg = config_mod.load(config)
    L = cfg.launch
    timeout = L.timeout_min or timeout_min  # else a margin over the prediction (below)
    partition, account = L.slurm_partition or slurm_partition, L.slurm_account or slurm_account
    p = plan_record(
        cfg,
        Selection.read(selection),
        pd.read_csv(predictions),
        int(read_json(workload)["train_samples"]),
        timeout,
    )
    p["partition"], p["account"] = partition, account
    w = read_json(workload)
    p["workload"] = "script" if cfg.workload.script else "tula"
    p["run_dir"] = str((Path(out_dir) / "run").resolve())
    if cfg.workload.script:
        p["script"], p["script_args"] = cfg.workload.script, list(cfg.workload.args)
    p["guarantees"] = guarantees(cfg, (w.get("check") or {}).get("parts"))
    if not timeout:  # no limit given: half as much again as the prediction's upper end, +5 min
        hi = (p["predicted_wall_time_interval_s"] or [p["predicted_wall_time_s"] or 0.0])[-1]
        p["time_limit_min"] = math.ceil(1.5 * hi / 60) + 5
        p["time_limit_why"] = "1.5 x the predicted wall time's upper end, + 5 min"
    else:
        p["time_limit_why"] = "launch.timeout_min" if L.timeout_min else "the profile's runtime"
    p["cpus_per_node"] = p["workers_per_node"] * cfg.hardware.threads_per_worker
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.workload.script:  # SLURM opens the job's output there before the script runs
        Path(p["run_dir"]).mkdir(parents=True, exist_ok=True)
    write_json(out / "plan.json", p)
    slurm = {"partition": partition, "account": account, "mem_mb": mem_mb}
    with atomic_write(out / "train.sbatch") as fh:
        fh.write(sbatch_script(p, cfg, slurm))
    print(
        f"[plan] N={p['workers']} B={p['global_batch']} on {p['nodes']} node(s) of "
        f"{p['workers_per_node']} worker(s), LR {p['lr']:.4g}: {out / 'plan.json'}, "
        f"{out / 'train.sbatch'} (no training ran)"
    )
    return p
