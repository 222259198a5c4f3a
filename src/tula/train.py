"""Production training at the selected (N, B): DDP, per-epoch metrics, final record.

Data order: every epoch draws one permutation of the training set (same seed on every
rank); it is cut into ceil(D / B) global batches and rank r takes every N-th sample of
each, so the N workers together see each sample exactly once per epoch. The step count
matches Eq. 4a's I = E * ceil(D / B). Test accuracy is computed on shards and summed
with an all-reduce.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.distributed as torch_dist
from torch.nn.parallel import DistributedDataParallel as DDP

from tula import config as config_mod
from tula import dist
from tula.config import TrainSettings
from tula.data import Dataset, load_workload_dataset
from tula.io import read_json, write_csv, write_json
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


def refresh_due(t: TrainSettings, step_in_epoch: int, global_step: int) -> bool:
    """AGS refreshes its factors on the first step of each epoch, or every k steps."""
    if t.method != "ags":
        return False
    k = t.ags_refresh_every_steps
    return global_step % k == 0 if k else step_in_epoch == 0


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


def run_worker(cfg: config_mod.Config, nodes: int, global_batch: int, out_dir: Path) -> None:
    wenv, device, backend = dist.init(cfg.hardware)
    rank, world = wenv.rank, wenv.world_size
    if world != nodes:
        raise RuntimeError(f"launched {world} workers for training at N={nodes}")
    ds, ddp, opt, spe = build_replica(cfg, device, global_batch)
    t = cfg.train
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(
        t.method, step, spe, global_batch, t.base_batch, t.warmup_epochs, t.lr_decay_epochs, t.lr_decay_factor))  # fmt: skip
    loss_fn = torch.nn.CrossEntropyLoss()
    small_local = max(1, t.ags_small_batch // world)
    epochs, D = cfg.workload.epochs, ds.train_size
    label = f"train N={nodes} B={global_batch}"
    if rank == 0:
        print(f"[{label}] {cfg.workload.model} on {cfg.workload.dataset}: {D} training samples, "
              f"{spe} steps/epoch x {epochs} epochs, method {t.method}, backend {backend} on {device}", flush=True)  # fmt: skip
    progress = Progress(label, epochs, unit="epoch", every_s=0.0, enabled=rank == 0)
    rows: list[dict[str, Any]] = []
    step = 0
    t_start = time.perf_counter()
    for epoch in range(1, epochs + 1):
        t0 = time.perf_counter()
        perm = torch.randperm(D, generator=torch.Generator().manual_seed(cfg.workload.seed * 100003 + epoch))
        stats = torch.zeros(3, dtype=torch.float64, device=device)  # loss*n, correct, n
        for s in range(spe):
            idx = perm[s * global_batch : (s + 1) * global_batch]
            if len(idx) < world:
                continue  # a tail smaller than N cannot give every worker a sample
            local = idx[rank::world]
            x, y = ds.x_train[local].to(device), ds.y_train[local].to(device)
            opt.zero_grad(set_to_none=True)
            logits = ddp(x)
            loss = loss_fn(logits, y)
            loss.backward()
            if refresh_due(t, s, step):
                refresh_scales(ddp, opt, loss_fn, x[:small_local], y[:small_local])
            opt.step()
            sched.step()
            step += 1
            stats += torch.tensor([loss.item() * len(y), (logits.argmax(1) == y).sum().item(), len(y)], dtype=torch.float64, device=device)
        torch_dist.all_reduce(stats)
        epoch_time = time.perf_counter() - t0
        test_loss, test_acc = _evaluate(ddp, ds, rank, world, device)
        lr = opt.param_groups[0]["lr"]
        row = {
            "epoch": epoch, "step": step, "lr": lr,
            "train_loss": stats[0].item() / stats[2].item(), "train_acc": stats[1].item() / stats[2].item(),
            "test_loss": test_loss, "test_acc": test_acc,
            "epoch_time_s": epoch_time, "samples_per_s": stats[2].item() / epoch_time,
        }  # fmt: skip
        rows.append(row)
        if rank == 0:
            write_csv(out_dir / "metrics.csv", pd.DataFrame(rows, columns=METRIC_COLUMNS))
            progress.update(epoch, "epoch ", extra=f"loss {row['train_loss']:.4f}  test acc {100 * test_acc:.2f}%  "
                                                   f"{row['samples_per_s']:.0f} samples/s")  # fmt: skip
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
            "steps": step,
            "train_samples": D,
            "final_test_acc": rows[-1]["test_acc"],
            "best_test_acc": max(r["test_acc"] for r in rows),
            "final_train_loss": rows[-1]["train_loss"],
            "train_time_s": time.perf_counter() - t_start,
            "mean_step_time_s": sum(r["epoch_time_s"] for r in rows) / max(step, 1),
            "backend": backend,
            "device": str(device),
        }
        write_json(out_dir / "final.json", final)
        print(f"[{label}] done in {fmt_duration(final['train_time_s'])}: test accuracy "
              f"{100 * final['final_test_acc']:.2f}% (best {100 * final['best_test_acc']:.2f}%)", flush=True)  # fmt: skip
    dist.shutdown()


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
