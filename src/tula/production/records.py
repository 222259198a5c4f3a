"""What the training job leaves for the launcher and the user besides its checkpoints:
final.json's record at the end, and, after an out-of-memory error, the record that names the
step and the place (every rank agreed on it, or it happened where they cannot agree)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch.distributed as torch_dist

from tula.io import write_json
from tula.production import history
from tula.runtime import dist
from tula.runtime.agreement import StepOOM, oom_place
from tula.runtime.optim import TulaOptimizer
from tula.runtime.replica import Replica

if TYPE_CHECKING:
    from tula.production.trainer import Trainer


def final_record(tr: Trainer) -> dict[str, Any]:
    """final.json: the run's settings, its results and what its parts took."""
    replica, t = tr.replica, tr.cfg.train
    steps = max(replica.pos.step, 1)
    return {
        "workers": tr.workers,
        "global_batch": tr.global_batch,
        "local_batch": tr.global_batch // tr.workers,
        "model": tr.cfg.workload.model,
        "dataset": tr.cfg.workload.dataset,
        "optimizer": t.optimizer,
        "method": t.method,
        "precision": t.precision,
        "compile": t.compile,
        "channels_last": replica.channels_last,
        "data_workers": replica.loader.num_workers,
        "ags": dict(replica.opt.counters) if isinstance(replica.opt, TulaOptimizer) else None,
        "fp16_skipped_steps": _skipped(replica),
        "epochs": tr.cfg.workload.epochs,
        "steps": replica.pos.step,
        "eval_batch_size": replica.eval_batch,
        "eval_oom_retries": replica.eval_retries,
        "train_samples": replica.data.train_size,
        "final_test_acc": tr.rows[-1]["test_acc"],
        "best_test_acc": max(x["test_acc"] for x in tr.rows),
        "final_train_loss": tr.rows[-1]["train_loss"],
        **tr.times,
        "mean_step_time_s": tr.times["train_time_s"] / max(steps - tr.times["first_steps"], 1),
        "wall_time_s": tr.wall_time(),
        "backend": tr.backend,
        "device": str(tr.device),
        "comm_env": dist.comm_env(),
        **(tr.monitor.summary() if tr.monitor else {"monitored_steps": 0, "drift": []}),
    }


def _skipped(replica: Replica) -> int | None:
    """Steps the fp16 GradScaler skipped (overflow), from the optimizer's step counter."""
    if not replica.scaler.is_enabled() or not isinstance(replica.opt, TulaOptimizer):
        return None
    return replica.pos.step - replica.opt.counters["steps"]


def oom_record(tr: Trainer, where: str, message: str) -> None:
    step = tr.replica.pos.step
    write_json(
        history.oom_record_path(tr.out, tr.attempt, tr.rank),
        {
            "step": step,
            "global_batch": tr.global_batch,
            "where": where,
            "place": oom_place(where, step),
            "message": message,
            "time": time.time(),
        },
    )


def oom_outcome(tr: Trainer, exc: StepOOM) -> dict[str, Any]:
    messages: list[Any] = [None] * tr.workers
    torch_dist.all_gather_object(messages, exc.message)
    exc.message = next(messages[replica] for replica in exc.ranks)
    step = tr.replica.pos.step
    if tr.rank in exc.ranks:
        oom_record(tr, exc.where, exc.message)
    what = oom_place(exc.where, step)
    if tr.rank == 0:
        print(
            f"[{tr.label}] out of memory {what} on rank(s) {exc.ranks}: {exc.message}",
            flush=True,
        )
        if tr.ckpt:
            history.add_segment(
                tr.out,
                {
                    **tr.seg,
                    "end_step": step,
                    "outcome": "oom",
                    "ended": history.utc_now(),
                    "reason": f"out of memory {what} on rank(s) {exc.ranks}: {exc.message}",
                },
            )
    dist.shutdown(ok=True)
    return {
        "outcome": "oom",
        "step": step,
        "ranks": exc.ranks,
        "message": exc.message,
        "where": exc.where,
        "place": what,
    }
