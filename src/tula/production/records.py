"""What the training job leaves for the launcher and the user besides its checkpoints:
final.json's record at the end, and, after an out-of-memory error, the record that names the
step and the place (every rank agreed on it, or it happened where they cannot agree)."""

from __future__ import annotations

import time
from typing import Any

import torch.distributed as torch_dist

from tula.config import Config
from tula.io import write_json
from tula.model.grid import micro_steps
from tula.production import jobdir
from tula.production.ledger import Ledger
from tula.production.monitor import Monitor
from tula.runtime.group import dist
from tula.runtime.group.agreement import StepOOM, oom_place
from tula.runtime.step.replica import Replica


def run_settings(cfg: Config) -> dict[str, Any]:
    """The settings final.json echoes (workload and train.*), read once as the job starts."""
    t = cfg.train
    return {
        "model": cfg.workload.model,
        "dataset": cfg.workload.dataset,
        **t.recipe(),  # optimizer (as train.optimizer names it), schedule, loss, metric, ...
        "method": t.method,
        "precision": t.precision,
        "compile": t.compile,
        "epochs": cfg.workload.epochs,
    }


def final_record(
    settings: dict[str, Any],
    ledger: Ledger,
    replica: Replica,
    backend: str,
    monitor: Monitor | None,
    hosts: list[str],
) -> dict[str, Any]:
    """final.json: the run's settings (:func:`run_settings`), its results, what its parts took
    and every rank's host (in rank order)."""
    times, rows = ledger.times, ledger.rows
    steps = max(replica.steps_done, 1)
    return {
        "workers": replica.world,
        "global_batch": replica.global_batch,
        "local_batch": replica.global_batch // replica.world,
        # train.accumulate: the micro-batches each step ran as
        "accumulate": micro_steps(
            replica.global_batch // replica.world, replica.accumulate, replica.max_micro_batch
        ),
        **settings,
        "channels_last": replica.channels_last,
        "data_workers": replica.loader_workers,
        "ags": replica.update.ags_counters(),
        "fp16_skipped_steps": _skipped(replica),
        "steps": replica.steps_done,
        "eval_batch_size": replica.evaluator.batch,
        "eval_oom_retries": replica.evaluator.retries,
        "train_samples": replica.data.train_size,
        "final_test_acc": rows[-1]["test_acc"],
        # train.ema_decay: the weights' moving average's, beside the weights'
        **({"final_test_acc_ema": rows[-1]["test_acc_ema"]} if "test_acc_ema" in rows[-1] else {}),
        # the best by train.metric_goal
        "best_test_acc": (min if settings["metric_goal"] == "min" else max)(
            x["test_acc"] for x in rows
        ),
        "final_train_loss": rows[-1]["train_loss"],
        **times,
        "mean_step_time_s": times["train_time_s"] / max(steps - times["first_steps"], 1),
        "wall_time_s": ledger.wall_time(),
        "backend": backend,
        "device": str(replica.device),
        "comm_env": dist.comm_env(),
        "hostnames": hosts,
        **(monitor.summary() if monitor else {"monitored_steps": 0, "drift": []}),
    }


def _skipped(replica: Replica) -> int | None:
    """Steps the fp16 GradScaler skipped (overflow), from the optimizer's step counter."""
    counters = replica.update.ags_counters()
    if not replica.update.loss_scaled or counters is None:
        return None
    return replica.steps_done - counters["steps"]


def oom_record(ledger: Ledger, step: int, global_batch: int, where: str, message: str) -> None:
    """This rank ran out of memory at ``step`` (``where``: forward, backward, ...), where its
    peers cannot agree on it: the record the launcher reads the attempt's outcome from."""
    write_json(
        jobdir.oom_record_path(ledger.out, ledger.attempt, ledger.rank),
        {
            "step": step,
            "global_batch": global_batch,
            "where": where,
            "place": oom_place(where, step),
            "message": message,
            "time": time.time(),
        },
    )


def oom_outcome(
    ledger: Ledger, replica: Replica, exc: StepOOM, checkpointed: bool
) -> dict[str, Any]:
    """After an out-of-memory error every rank agreed on: the failing ranks' records, rank 0's
    line and (a checkpointed run) the segment's end; the outcome ``tula launch`` reads."""
    messages: list[Any] = [None] * replica.world
    torch_dist.all_gather_object(messages, exc.message)
    message = next(messages[r] for r in exc.ranks)  # the first failing rank's own words
    step = replica.steps_done
    if ledger.rank in exc.ranks:
        oom_record(ledger, step, replica.global_batch, exc.where, message)
    what = oom_place(exc.where, step)
    if ledger.rank == 0:
        print(
            f"[{ledger.label}] out of memory {what} on rank(s) {exc.ranks}: {message}",
            flush=True,
        )
        if checkpointed:
            jobdir.add_segment(
                ledger.out,
                ledger.segment(
                    end_step=step,
                    outcome="oom",
                    ended=jobdir.utc_now(),
                    reason=f"out of memory {what} on rank(s) {exc.ranks}: {message}",
                ),
            )
    dist.shutdown(ok=True)
    return {
        "outcome": "oom",
        "step": step,
        "ranks": exc.ranks,
        "message": message,
        "where": exc.where,
        "place": what,
    }
