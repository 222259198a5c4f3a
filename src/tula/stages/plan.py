"""``tula plan``: the answer to take away, for a user who trains with their own script
(``snakemake plan`` runs everything up to the choice and the report, and trains nothing).

- ``results/plan/plan.json``: the chosen N and B, the batch per worker, the nodes and workers
  per node, the LR and schedule the method would use at that B, and the predicted step, wall
  time and cost, each with its 95 % interval where predictions.csv has one.
- ``results/plan/train.sbatch``: a SLURM batch script for the user's own training script at that
  point. Its ``#SBATCH`` lines are the production job's shape
  (:func:`tula.slurm.shapes.job_shape`, what
  the probes ran) with the profile's partition, account, time and memory; its ``srun`` starts
  torchrun on every node. The script and its arguments are placeholders, named in comments.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from tula import config as config_mod
from tula import model_inputs
from tula.io import atomic_write, read_json, write_json
from tula.model.grid import steps_per_epoch
from tula.slurm import shapes

RDZV_PORT = 29500  # torchrun's c10d rendezvous on the first node


def plan_record(
    cfg: config_mod.Config,
    selection: dict[str, Any],
    predictions: pd.DataFrame,
    train_samples: int,
    timeout_min: int | None,
) -> dict[str, Any]:
    """plan.json's content: the chosen point and what it takes to train there."""
    s = selection["selected"]
    n, b = s["workers"], s["global_batch"]
    row = predictions[(predictions["workers"] == n) & (predictions["global_batch"] == b)]
    r = row.iloc[0].to_dict() if len(row) else {}
    shape = shapes.job_shape(cfg, n)
    t, lr = cfg.train, model_inputs.lr_plan(cfg.train)
    spe = steps_per_epoch(train_samples, b, n)

    wall = r.get("wall_time_s")
    return {
        "workers": n,
        "global_batch": b,
        "local_batch": s["local_batch"],
        "nodes": shape.nodes,
        "workers_per_node": shape.tasks_per_node,
        "gpus_per_node": shape.gpus_per_node,
        "objective": selection["objective"],
        "reason": selection["reason"],
        "epochs": cfg.workload.epochs,
        "steps_per_epoch": spe,
        "method": t.method,
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
        "predicted_step_time_s": s["step_time_s"],
        "predicted_step_time_interval_s": _interval(r, "step_time"),
        "predicted_train_time_s": s["train_time_s"],
        "predicted_wall_time_s": float(wall) if wall is not None else None,
        "predicted_wall_time_interval_s": _interval(r, "wall_time"),
        "predicted_cost": s["cost"],
        "currency": s["currency"],
        "mem_bytes_per_worker": s["mem_bytes"],
        "time_limit_min": timeout_min,
        "trained": False,
    }


def _interval(row: dict[str, Any], name: str) -> list[float] | None:
    """predictions.csv's 95 % interval of ``name`` at the chosen point, where it has one."""
    lo, hi = row.get(f"{name}_lo_s"), row.get(f"{name}_hi_s")
    ok = lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi)
    return [float(lo), float(hi)] if ok else None


def sbatch_script(p: dict[str, Any], partition: str | None, account: str | None, mem_mb) -> str:
    """A batch script that runs the user's own training script at the plan's point."""
    lines = [
        "#!/bin/bash",
        f"# Tula's plan: N={p['workers']} workers, global batch B={p['global_batch']} "
        f"({p['local_batch']} per worker), objective {p['objective']}.",
        f"# Predicted: step {p['predicted_step_time_s']:.4g} s, training "
        f"{p['predicted_train_time_s']:.4g} s, cost {p['predicted_cost']:.4g} {p['currency']} "
        "(results/plan/plan.json).",
        f"# LR {p['lr']:.6g} ({p['lr_note']}); {p['warmup_steps']} warm-up steps, then the "
        f"{p['schedule']} schedule; {p['epochs']} epochs of {p['steps_per_epoch']} steps.",
        "#SBATCH --job-name=tula-plan",
        f"#SBATCH --nodes={p['nodes']}",
        "#SBATCH --ntasks-per-node=1  # one torchrun per node; it starts the node's workers",
        f"#SBATCH --cpus-per-task={p['cpus_per_node']}",
    ]
    if p["gpus_per_node"]:
        lines.append(f"#SBATCH --gpus-per-node={p['gpus_per_node']}")
    if p["time_limit_min"]:
        lines.append(f"#SBATCH --time={int(p['time_limit_min'])}")
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if account:
        lines.append(f"#SBATCH --account={account}")
    if mem_mb:
        lines.append(f"#SBATCH --mem={int(mem_mb)}M")
    lines += [
        "",
        "# YOUR_TRAIN_SCRIPT and YOUR_ARGS are placeholders: put your own training script and",
        "# its arguments there. Pass it the batch per worker and the LR above (your script's",
        "# flags for them). Tula's method (AGS, static, lars, polo) is not in your script: it",
        "# runs only where Tula trains (snakemake without the plan target).",
        "set -euo pipefail",
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
        read_json(selection),
        pd.read_csv(predictions),
        int(read_json(workload)["train_samples"]),
        timeout,
    )
    p["partition"], p["account"] = partition, account
    if not timeout:  # no limit given: half as much again as the prediction's upper end, +5 min
        hi = (p["predicted_wall_time_interval_s"] or [p["predicted_wall_time_s"] or 0.0])[-1]
        p["time_limit_min"] = math.ceil(1.5 * hi / 60) + 5
        p["time_limit_why"] = "1.5 x the predicted wall time's upper end, + 5 min"
    else:
        p["time_limit_why"] = "launch.timeout_min" if L.timeout_min else "the profile's runtime"
    p["cpus_per_node"] = p["workers_per_node"] * cfg.hardware.threads_per_worker
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "plan.json", p)
    with atomic_write(out / "train.sbatch") as fh:
        fh.write(sbatch_script(p, partition, account, mem_mb))
    print(
        f"[plan] N={p['workers']} B={p['global_batch']} on {p['nodes']} node(s) of "
        f"{p['workers_per_node']} worker(s), LR {p['lr']:.4g}: {out / 'plan.json'}, "
        f"{out / 'train.sbatch'} (no training ran)"
    )
    return p
