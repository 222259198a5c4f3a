"""What the production job's safety costs: checkpoints, the per-step agreement,
and a requeue or an OOM relaunch end to end.

A. Checkpoint size, write time (torch.save + SHA-256 + atomic write + fsync + manifest) and
   verified-load time per model family, with the AGS optimizer state (momentum buffers and
   per-parameter scale factors) filled. Median of REPS.
B. The per-step agreement all-reduce (N+1 floats, MAX) against a whole DDP training step,
   2 processes, gloo, small_cnn on digits at B=128: median per-step times, interleaved.
C. `tula launch` end to end (2 workers, digits, 2 epochs, B=64): uninterrupted, with a USR2
   at step 20 (checkpoint, submitit requeue, resume), and with an OOM at step 20 (relaunch
   at B=32 from the step-15 checkpoint). Wall times, medians of --runs.

    .venv/bin/python bench/launch_overhead.py [--reps 5] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as torch_dist
import torch.multiprocessing as mp
import yaml

from tula import checkpoint, config
from tula.runtime.input import data
from tula.runtime.step.nets import build_model
from tula.runtime.train.methods import build_method
from tula.runtime.train.refresh import refresh_scales

MODELS = ("small_cnn", "resnet_tiny", "vgg_tiny", "alexnet_tiny", "mobilenet_tiny")


def part_a(reps: int) -> None:
    print("\n## A. Checkpoint per model (AGS state filled; digits input shape)\n")
    print("| model | parameters | checkpoint | write (median) | verified load (median) |")
    print("|---|---:|---:|---:|---:|")
    ds = data.load_config(config.from_dict({"workload": {"dataset": "digits"}}))
    cfg = config.from_dict({})
    loss_fn = torch.nn.CrossEntropyLoss()
    for name in MODELS:
        torch.manual_seed(0)
        model = build_model(name, ds.input_shape, ds.num_classes)
        opt, _ = build_method("ags", cfg.train, list(model.parameters()), 256, 6)
        x, y = ds.train.x[:256], ds.train.y[:256]
        loss_fn(model(x), y).backward()
        refresh_scales(model, opt, loss_fn, x[:32], y[:32])
        opt.step()
        state = {
            "fingerprint": "bench",
            "epoch": 1,
            "offset": 256,
            "global_batch": 256,
            "workers": 1,
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "ranks": [checkpoint.rng_state()],
        }
        writes, loads = [], []
        with tempfile.TemporaryDirectory() as d:
            for i in range(reps):
                t0 = time.perf_counter()
                pt = checkpoint.save(d, state, i + 1, keep=2)
                writes.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                loaded, _ = checkpoint.load_latest(d)
                loads.append(time.perf_counter() - t0)
                assert loaded.step == i + 1
            size = pt.stat().st_size
        n_params = sum(p.numel() for p in model.parameters())
        print(
            f"| {name} | {n_params:,} | {size / 2**20:.2f} MiB | "
            f"{1e3 * statistics.median(writes):.1f} ms | {1e3 * statistics.median(loads):.1f} ms |"
        )


def _part_b_worker(rank: int, world: int, port: int, steps: int, rounds: int, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch_dist.init_process_group("gloo", rank=rank, world_size=world)
    ds = data.load_config(config.from_dict({"workload": {"dataset": "digits"}}))
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(
        build_model("small_cnn", ds.input_shape, ds.num_classes)
    )
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    b = 128 // world
    x, y = ds.train.x[rank * b : (rank + 1) * b], ds.train.y[rank * b : (rank + 1) * b]
    flags = torch.zeros(world + 1)
    step_t, agree_t = [], []
    for r in range(rounds + 1):
        t0 = time.perf_counter()
        for _ in range(steps):
            opt.zero_grad()
            loss_fn(ddp(x), y).backward()
            opt.step()
        t1 = time.perf_counter()
        for _ in range(steps):
            torch_dist.all_reduce(flags, op=torch_dist.ReduceOp.MAX)
        t2 = time.perf_counter()
        if r:  # the first round warms up
            step_t.append((t1 - t0) / steps)
            agree_t.append((t2 - t1) / steps)
    if rank == 0:
        q.put((statistics.median(step_t), statistics.median(agree_t)))
    torch_dist.barrier()
    torch_dist.destroy_process_group()


def part_b(rounds: int) -> None:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = 29000 + os.getpid() % 1000
    mp.start_processes(
        _part_b_worker, args=(2, port, 20, rounds, q), nprocs=2, join=True, start_method="spawn"
    )
    step, agree = q.get()
    print(
        "\n## B. Per-step agreement (OOM / stop flags) vs a DDP step, 2 processes, gloo, "
        "small_cnn, B=128\n"
    )
    print("| DDP training step (median) | agreement all-reduce (median) | overhead |")
    print("|---:|---:|---:|")
    print(f"| {1e3 * step:.2f} ms | {1e3 * agree:.3f} ms | {100 * agree / step:.1f} % |")


def part_c(runs: int) -> None:
    tula = str(Path(sys.executable).parent / "tula")
    cases = {
        "uninterrupted": "",
        "USR2 at step 20 (requeue)": "signal:step=20,sig=USR2",
        "OOM at step 20 (relaunch at B=32)": "oom:step=20,rank=1,batch=64",
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    with tempfile.TemporaryDirectory() as d:
        cfgp = Path(d) / "c.yaml"
        cfgp.write_text(
            yaml.safe_dump(
                {
                    "workload": {"model": "small_cnn", "dataset": "digits", "epochs": 2},
                    "grid": {"workers": [1, 2], "batch_min": 32, "batch_max": 128},
                    "launch": {"checkpoint_every_steps": 5, "poll_s": 0.5},
                }
            )
        )
        sel = Path(d) / "sel.json"
        sel.write_text('{"selected": {"workers": 2, "global_batch": 64}}')
        for i in range(runs):
            for name, fault in cases.items():  # interleaved
                out = Path(d) / f"run{i}-{len(times[name])}-{abs(hash(name))}"
                env = dict(os.environ, TULA_INJECT_FAULT=fault)
                t0 = time.perf_counter()
                subprocess.run(
                    [
                        tula,
                        "launch",
                        "--config",
                        str(cfgp),
                        "--selection",
                        str(sel),
                        "--out-dir",
                        str(out),
                    ],
                    check=True,
                    env=env,
                    capture_output=True,
                )
                times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["uninterrupted"])
    print(
        f"\n## C. `tula launch` wall time, 2 workers, digits, 2 epochs, B=64 (median of {runs})\n"
    )
    print("| run | wall time | vs uninterrupted |")
    print("|---|---:|---:|")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"| {name} | {m:.1f} s | {m / base:.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs")
    part_a(a.reps)
    part_b(a.rounds)
    part_c(a.runs)


if __name__ == "__main__":
    main()
