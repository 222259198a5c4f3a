"""Production training at the selected (N, B): DDP, per-epoch metrics, final record.

Data order: every epoch draws one permutation of the training set (same seed on every
rank); it is cut into ceil(D / B) global batches and rank r takes every N-th sample of
each, so the N workers together see each sample exactly once per epoch. The step count
matches Eq. 4a's I = E * ceil(D / B). Test accuracy is computed on shards and summed
with an all-reduce.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.distributed as torch_dist
from torch.nn.parallel import DistributedDataParallel as DDP

from tula import checkpoint, dist
from tula import config as config_mod
from tula import faults as tula_faults
from tula.config import TrainSettings
from tula.data import Dataset, load_workload_dataset
from tula.io import read_json, write_bytes, write_csv, write_json
from tula.models import build_model
from tula.optim import TulaOptimizer, build_method, lr_factor, refresh_scales
from tula.progress import Progress, fmt_duration
from tula.select import selected_point

METRIC_COLUMNS = [
    "epoch", "step", "lr", "train_loss", "train_acc", "test_loss", "test_acc", "epoch_time_s", "samples_per_s",
]  # fmt: skip


def build_replica(
    cfg: config_mod.Config, device: torch.device, global_batch: int
) -> tuple[Dataset, DDP, torch.optim.Optimizer, int]:
    """Dataset, DDP model (same seed on every rank), the ``train.method`` optimizer (its DDP
    hook registered) and the steps per epoch, for one worker."""
    ds = load_workload_dataset(cfg.workload)
    torch.manual_seed(cfg.workload.seed)
    model = build_model(cfg.workload.model, ds.input_shape, ds.num_classes).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    spe = steps_per_epoch(ds.train_size, global_batch)
    opt, prepare_ddp = build_method(cfg.train.method, cfg.train, list(ddp.parameters()), global_batch, spe)
    prepare_ddp(ddp)
    return ds, ddp, opt, spe


def refresh_due(t: TrainSettings, epoch_start: bool, global_step: int) -> bool:
    """AGS refreshes its factors on the first step of each epoch, or every k steps."""
    if t.method != "ags":
        return False
    k = t.ags_refresh_every_steps
    return global_step % k == 0 if k else epoch_start


def steps_per_epoch(train_samples: int, global_batch: int) -> int:
    return math.ceil(train_samples / global_batch)


def _evaluate(ddp: DDP, ds: Dataset, rank: int, world: int, device: torch.device, batch: int = 1024) -> tuple[float, float]:
    ddp.eval()
    loss_sum = torch.zeros(3, dtype=torch.float64, device=device)  # loss, correct, count
    x, y = ds.x_test[rank::world], ds.y_test[rank::world]
    with torch.no_grad():
        for i in range(0, len(x), batch):
            xb, yb = x[i : i + batch].to(device), y[i : i + batch].to(device)
            logits = ddp.module(xb)
            loss_sum[0] += torch.nn.functional.cross_entropy(logits, yb, reduction="sum").double()
            loss_sum[1] += (logits.argmax(1) == yb).sum().double()
            loss_sum[2] += len(yb)
    torch_dist.all_reduce(loss_sum)
    ddp.train()
    n = max(loss_sum[2].item(), 1.0)
    return loss_sum[0].item() / n, loss_sum[1].item() / n


@dataclass
class Position:
    """Where training stands: optimizer steps taken, the epoch in progress (1-based) and how
    many samples of that epoch's permutation are consumed. Independent of the batch size, so
    a relaunch at a smaller batch continues with the next unseen sample."""

    step: int = 0
    epoch: int = 1
    offset: int = 0

    def epochs_done(self, train_samples: int) -> float:
        return (self.epoch - 1) + min(self.offset, train_samples) / train_samples


@dataclass(frozen=True)
class Checkpointing:
    """How a worker checkpoints (None for runs that do not, like `tula compare`'s)."""

    directory: Path
    fingerprint: str  # config + N + selected B: a checkpoint of another run is never resumed
    every_steps: int | None
    every_epochs: int | None
    keep: int
    attempt: int = 1


class StopSignals:
    """SIGTERM / SIGUSR2 set a flag; the training loop acts on it at the next step boundary
    once every rank agrees, so a checkpoint is never taken in the middle of a step.

    USR2 is what SLURM sends before the time limit or on preemption (``--signal=USR2@...``,
    set by submitit); after the checkpoint submitit's own handler requeues the job. TERM is
    scancel, ``scontrol requeue`` or a preemption without grace: checkpoint, then exit.
    """

    CODES = {signal.SIGTERM: 1, signal.SIGINT: 1, signal.SIGUSR2: 2}  # SIGINT: Ctrl-C on a local run

    def __init__(self) -> None:
        self.code, self.name = 0, ""
        self.previous = {sig: signal.getsignal(sig) for sig in self.CODES}
        for sig in self.CODES:
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        sig = signal.Signals(signum)
        if self.CODES[sig] >= self.code:
            self.code, self.name = self.CODES[sig], sig.name

    def requeue_handler(self):
        """submitit's checkpoint-and-requeue handler, when running under submitit."""
        h = self.previous[signal.SIGUSR2]
        return h if callable(h) and type(getattr(h, "__self__", None)).__name__ == "SignalHandler" else None


class StepOOM(Exception):
    """Every rank agreed that some rank ran out of memory in this step."""

    def __init__(self, ranks: list[int], message: str):
        super().__init__(message)
        self.ranks, self.message = ranks, message


def fingerprint(cfg: config_mod.Config, nodes: int, global_batch: int) -> str:
    """What a checkpoint must match to be resumed: the training settings, N, and the B the
    run was launched at (relaunches at a smaller B keep the launch's fingerprint)."""
    text = json.dumps([config_mod.stage_settings(cfg, "train"), nodes, global_batch])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _record_segment(out_dir: Path, seg: dict[str, Any]) -> None:
    """Append this run's segment (start/end step, outcome) to segments.json (rank 0)."""
    path = out_dir / "segments.json"
    segs = read_json(path) if path.exists() else []
    write_json(path, [*segs, seg])


def oom_marker(out_dir: Path, attempt: int, rank: int) -> Path:
    return out_dir / "oom" / f"attempt{attempt}-rank{rank}.json"


def run_worker(cfg: config_mod.Config, nodes: int, global_batch: int, out_dir: Path,
               ckpt: Checkpointing | None = None) -> dict[str, Any]:  # fmt: skip
    """One DDP worker of the production run. Returns ``{"outcome": "completed" | "oom", ...}``;
    on a stop signal it checkpoints and exits (SystemExit) without returning."""
    wenv, device, backend = dist.init(cfg.hardware)
    rank, world = wenv.rank, wenv.world_size
    if world != nodes:
        raise RuntimeError(f"launched {world} workers for training at N={nodes}")
    attempt = ckpt.attempt if ckpt else 1
    faults = tula_faults.from_env()
    stops = StopSignals() if ckpt else None
    ds, ddp, opt, spe = build_replica(cfg, device, global_batch)
    t = cfg.train
    D = ds.train_size
    pos = Position()

    def factor(_: int) -> float:  # LR multiplier at the current position (epochs done, any batch)
        return lr_factor(t.method, pos.epochs_done(D) * spe, spe, global_batch, t.base_batch, t.warmup_epochs,
                         t.lr_decay_epochs, t.lr_decay_factor)  # fmt: skip

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    loss_fn = torch.nn.CrossEntropyLoss()
    small_local = max(1, t.ags_small_batch // world)
    epochs = cfg.workload.epochs
    rows: list[dict[str, Any]] = []
    stats = torch.zeros(3, dtype=torch.float64, device=device)  # loss*n, correct, n of the epoch in progress
    epoch_time = train_time = 0.0
    force_refresh = False
    resumed_from = 0
    label = f"train N={nodes} B={global_batch}"
    if ckpt:
        state = _load_checkpoint(ckpt, rank)
        if state:
            ddp.module.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            sched.load_state_dict(state["scheduler"])
            checkpoint.set_rng_state(state["ranks"][rank]["rng"])
            pos = Position(state["step"], state["epoch"], state["offset"])
            rows, epoch_time, train_time = state["rows"], state["epoch_time_s"], state["train_time_s"]
            stats = state["ranks"][rank]["epoch_stats"].to(device)
            resumed_from = pos.step
            if state["global_batch"] != global_batch:
                force_refresh = _follow_new_batch(opt, sched, state["global_batch"], global_batch, rank)
            set_post_local_iter(ddp, pos.step)
            if rank == 0:
                print(f"[{label}] resumed from the checkpoint of step {pos.step} (epoch {pos.epoch}, "
                      f"{pos.offset}/{D} samples; written at B={state['global_batch']})", flush=True)  # fmt: skip
    if rank == 0:
        print(f"[{label}] {cfg.workload.model} on {cfg.workload.dataset}: {D} training samples, "
              f"{spe} steps/epoch x {epochs} epochs, method {t.method}, backend {backend} on {device}"
              + (f", attempt {attempt}" if ckpt else ""), flush=True)  # fmt: skip
    if any(f.kind == "oom" for f in faults):  # inside the module's forward, where activations are allocated
        ddp.module.register_forward_pre_hook(lambda m, a: tula_faults.maybe_oom(faults, pos.step, rank, global_batch))
    progress = Progress(label, epochs, unit="epoch", every_s=0.0, enabled=rank == 0, start=pos.epoch - 1)
    seg = {"attempt": attempt, "global_batch": global_batch, "start_step": pos.step, "host": dist.hostname(),
           "job_id": os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID"),
           "started": _now()}  # fmt: skip

    def save(complete: bool = False) -> None:
        per_rank: list[Any] = [None] * world  # RNG states and partial-epoch sums differ per rank
        torch_dist.all_gather_object(per_rank, {"rng": checkpoint.rng_state(), "epoch_stats": stats.cpu().clone()})
        if rank != 0:
            return
        state = {"fingerprint": ckpt.fingerprint, "global_batch": global_batch, "nodes": nodes, "epoch": pos.epoch,
                 "offset": pos.offset, "complete": complete, "model": ddp.module.state_dict(),
                 "optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "ranks": per_rank, "rows": rows,
                 "epoch_time_s": epoch_time, "train_time_s": train_time,
                 "method": t.method, "attempt": attempt}  # fmt: skip
        hook = checkpoint.truncate if tula_faults.truncate_due(faults, pos.step) else None
        checkpoint.save(ckpt.directory, state, pos.step, keep=ckpt.keep, after_write=hook)

    try:
        while pos.epoch <= epochs:
            perm = torch.randperm(D, generator=torch.Generator().manual_seed(cfg.workload.seed * 100003 + pos.epoch))
            while pos.offset < D:
                t0 = time.perf_counter()
                idx = perm[pos.offset : pos.offset + global_batch]
                if len(idx) < world:
                    pos.offset = D  # a tail smaller than N cannot give every worker a sample
                    break
                tula_faults.maybe_signal(faults, pos.step, rank, resumed_from)
                local = idx[rank::world]
                x, y = ds.x_train[local].to(device), ds.y_train[local].to(device)
                opt.zero_grad(set_to_none=True)
                oom = ""
                try:
                    logits = ddp(x)
                    loss = loss_fn(logits, y)
                except torch.OutOfMemoryError as exc:
                    oom, logits, loss = str(exc) or "CUDA out of memory", None, None  # drop what was allocated
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                # One tiny all-reduce per step: did any rank run out of memory, was a stop asked?
                flags = torch.zeros(world + 1, device=device)
                flags[rank], flags[world] = float(bool(oom)), float(stops.code if stops else 0)
                torch_dist.all_reduce(flags, op=torch_dist.ReduceOp.MAX)
                if flags[:world].any():
                    raise StepOOM([r for r in range(world) if flags[r] > 0], oom)
                _backward(loss, out_dir, attempt, rank, pos.step)
                if force_refresh or refresh_due(t, pos.offset == 0, pos.step):
                    refresh_scales(ddp, opt, loss_fn, x[:small_local], y[:small_local])
                    force_refresh = False
                opt.step()
                pos.step += 1
                pos.offset += len(idx)
                sched.step()
                stats += torch.tensor([loss.item() * len(y), (logits.argmax(1) == y).sum().item(), len(y)],
                                      dtype=torch.float64, device=device)  # fmt: skip
                dt = time.perf_counter() - t0
                epoch_time, train_time = epoch_time + dt, train_time + dt
                stop = int(flags[world].item())
                if ckpt and (stop or (ckpt.every_steps and pos.step % ckpt.every_steps == 0)):
                    save()
                if stop:
                    _stop(stop, stops, seg, pos, out_dir, rank, label)
            torch_dist.all_reduce(stats)
            test_loss, test_acc = _evaluate(ddp, ds, rank, world, device)
            row = {
                "epoch": pos.epoch, "step": pos.step, "lr": opt.param_groups[0]["lr"],
                "train_loss": stats[0].item() / stats[2].item(), "train_acc": stats[1].item() / stats[2].item(),
                "test_loss": test_loss, "test_acc": test_acc,
                "epoch_time_s": epoch_time, "samples_per_s": stats[2].item() / max(epoch_time, 1e-9),
            }  # fmt: skip
            rows.append(row)
            pos.epoch, pos.offset, epoch_time = pos.epoch + 1, 0, 0.0
            stats.zero_()
            if rank == 0:
                write_csv(out_dir / "metrics.csv", pd.DataFrame(rows, columns=METRIC_COLUMNS))
                progress.update(row["epoch"], "epoch ", extra=f"loss {row['train_loss']:.4f}  test acc "
                                f"{100 * test_acc:.2f}%  {row['samples_per_s']:.0f} samples/s")  # fmt: skip
            if ckpt and ckpt.every_epochs and row["epoch"] % ckpt.every_epochs == 0 and pos.epoch <= epochs:
                save()
    except StepOOM as exc:
        messages: list[Any] = [None] * world
        torch_dist.all_gather_object(messages, exc.message)
        exc.message = next(messages[r] for r in exc.ranks)
        if rank in exc.ranks:
            write_json(oom_marker(out_dir, attempt, rank), {"step": pos.step, "global_batch": global_batch,
                                                            "message": exc.message})  # fmt: skip
        if rank == 0:
            print(f"[{label}] out of memory at step {pos.step} on rank(s) {exc.ranks}: {exc.message}", flush=True)
            if ckpt:
                _record_segment(out_dir, {**seg, "end_step": pos.step, "outcome": "oom", "ended": _now(),
                                          "reason": f"out of memory on rank(s) {exc.ranks}: {exc.message}"})  # fmt: skip
        dist.shutdown(ok=True)
        return {"outcome": "oom", "step": pos.step, "ranks": exc.ranks, "message": exc.message}
    if ckpt:
        save(complete=True)
    if rank == 0:
        final = {
            "nodes": nodes,
            "global_batch": global_batch,
            "local_batch": global_batch // nodes,
            "model": cfg.workload.model,
            "dataset": cfg.workload.dataset,
            "optimizer": cfg.train.optimizer,
            "method": t.method,
            "ags": dict(opt.counters) if isinstance(opt, TulaOptimizer) else None,
            "epochs": epochs,
            "steps": pos.step,
            "train_samples": D,
            "final_test_acc": rows[-1]["test_acc"],
            "best_test_acc": max(r["test_acc"] for r in rows),
            "final_train_loss": rows[-1]["train_loss"],
            "train_time_s": train_time,
            "mean_step_time_s": train_time / max(pos.step, 1),
            "backend": backend,
            "device": str(device),
        }
        write_bytes(out_dir / "model.pt", checkpoint.to_bytes(ddp.module.state_dict()))
        write_json(out_dir / "final.json", final)
        if ckpt:
            _record_segment(out_dir, {**seg, "end_step": pos.step, "outcome": "completed", "ended": _now(),
                                      "reason": "trained every epoch"})  # fmt: skip
        print(f"[{label}] done in {fmt_duration(final['train_time_s'])}: test accuracy "
              f"{100 * final['final_test_acc']:.2f}% (best {100 * final['best_test_acc']:.2f}%)", flush=True)  # fmt: skip
    dist.shutdown()
    return {"outcome": "completed", "step": pos.step}


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _backward(loss: torch.Tensor, out_dir: Path, attempt: int, rank: int, step: int) -> None:
    """Backward pass. An OOM here cannot be agreed on (the other ranks are inside DDP's
    gradient all-reduce): this rank records it and exits, which ends the peers' collectives
    (gloo at once; NCCL through its watchdog), and the launcher reads the record."""
    try:
        loss.backward()
    except torch.OutOfMemoryError as exc:
        write_json(oom_marker(out_dir, attempt, rank), {"step": step, "message": str(exc), "phase": "backward"})
        raise


def _load_checkpoint(ckpt: Checkpointing, rank: int) -> dict[str, Any] | None:
    """Rank 0 picks the newest usable checkpoint of this run; every rank loads that one."""
    chosen: list[Any] = [None]
    if rank == 0:

        def accept(state: dict[str, Any]) -> str:
            if state.get("fingerprint") != ckpt.fingerprint:
                return "written by a run with other settings, N or selected B"
            return "the run it belongs to had finished" if state.get("complete") else ""

        loaded, warnings = checkpoint.load_latest(ckpt.directory, accept)
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr, flush=True)
            print(f"warning: {w}", flush=True)
        chosen[0] = str(loaded.path) if loaded else None
        state = loaded.state if loaded else None
    torch_dist.broadcast_object_list(chosen, src=0)
    if rank != 0 and chosen[0] is not None:
        state = checkpoint.from_bytes(Path(chosen[0]).read_bytes())  # rank 0 verified this file
    return state if chosen[0] is not None else None


def _follow_new_batch(opt, sched, old_batch: int, new_batch: int, rank: int) -> bool:
    """Adapt the restored optimizer to a relaunch at a smaller global batch (paper rules):

    - AGS: s_max = sqrt(B / ags_small_batch) is recomputed for the new B (build_method did);
      the per-parameter factors, ratios measured at the old B, are dropped and re-measured on
      the first step, and the previous gradient norm is forgotten (its scale depends on B),
      so that first step counts as sensitive and is not scaled.
    - LRS / LARS: the linear-scaling factor k = B / base_batch follows the new B from this
      step on; LBT, static and AGS keep their LR (they do not scale it with B).
    - Momentum buffers and the step count carry over; the data position is in samples.
    Returns True: the AGS factors must be refreshed at the next step.
    """
    if isinstance(opt, TulaOptimizer):
        opt.scales, opt.prev_sq_norm = None, None
    for group, base, lam in zip(opt.param_groups, sched.base_lrs, sched.lr_lambdas):
        group["lr"] = base * lam(sched.last_epoch)
    if rank == 0:
        print(f"[train] global batch {old_batch} -> {new_batch}: LR {opt.param_groups[0]['lr']:.4g}"
              + (f", AGS s_max {opt.s_max:.3g}, scale factors re-measured" if isinstance(opt, TulaOptimizer) else ""),
              flush=True)  # fmt: skip
    return isinstance(opt, TulaOptimizer)


def set_post_local_iter(ddp: DDP, step: int) -> None:
    """Post-local SGD's hook counts steps in its own state; a resumed run continues the count."""
    state = getattr(ddp, "tula_polo_state", None)
    if state is not None:
        state.iter = step


def _stop(code: int, stops: StopSignals, seg: dict[str, Any], pos: Position, out_dir: Path, rank: int,
          label: str) -> None:  # fmt: skip
    """After the stop checkpoint: record the segment, leave the process group, and either let
    submitit requeue the job (USR2 under submitit) or exit (TERM). Never returns."""
    sig = stops.name.removeprefix("SIG") if stops.name and stops.CODES[signal.Signals[stops.name]] == code else (
        "USR2" if code == 2 else "TERM")  # this rank's own signal, else the one the peers agreed on
    requeue = stops.requeue_handler() if code == 2 else None
    if rank == 0:
        what = "checkpointed; submitit requeues the job" if requeue else "checkpointed; exiting"
        print(f"[{label}] SIG{sig} received: stopped after step {pos.step}, {what}", flush=True)
        _record_segment(out_dir, {**seg, "end_step": pos.step, "outcome": "requeued" if requeue else "stopped",
                                  "ended": _now(), "reason": f"SIG{sig} (preemption, time limit or cancel): {what}"})  # fmt: skip
    dist.shutdown(ok=True)
    sys.stdout.flush()
    if requeue is not None:
        requeue(signal.SIGUSR2, None)  # rank 0: scontrol requeue (or the local executor's requeue) and exit
    raise SystemExit(0 if requeue is not None else 128 + signal.SIGTERM)


def run(cfg_path: str | Path, selection: str | Path, out_dir: str | Path) -> dict:
    """Train at the (N, B) of ``selection.json``; writes metrics.csv and final.json in out_dir."""
    cfg = config_mod.load(cfg_path)
    nodes, global_batch = selected_point(selection)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    final = out / "final.json"
    started = time.time()  # a previous final.json stays until this run replaces it
    args = ["tula.train", "--config", str(cfg_path), "--nodes", str(nodes),
            "--global-batch", str(global_batch), "--out-dir", str(out)]  # fmt: skip
    res = dist.launch(nodes, args, threads_per_worker=cfg.hardware.threads_per_worker, timeout_s=7 * 24 * 3600)
    if res.returncode != 0 or not final.exists() or final.stat().st_mtime < started:
        raise RuntimeError(f"training at N={nodes} B={global_batch} failed (workers exited with code {res.returncode}); "
                           f"see the log above")  # fmt: skip
    return read_json(final)


def _worker_main(argv: list[str] | None = None) -> None:
    a = dist.parse_worker_args("tula.train", "--out-dir", argv)
    run_worker(config_mod.load(a.config), a.nodes, a.global_batch, Path(a.out_dir))


if __name__ == "__main__":
    sys.exit(_worker_main())
